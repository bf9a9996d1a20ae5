"""Time spent inside ``torch.distributed`` collectives, so that waiting is not counted as compute.

Poplar (ZeRO-2/3 profiling): every micro-step's backward is interleaved with reduce-scatters
(and, for ZeRO-3, all-gathers).  A fast device reaches each collective early and waits there for
the slow ones, so its wall time equals theirs.  Its own compute time is the wall time minus the
time spent inside collectives:

    compute = wall - Σ (time inside each collective call)

:func:`timed_collectives` measures the subtrahend: while it is open, the collectives of
``torch.distributed`` (looked up by Colossal-AI and torch at call time as ``dist.<name>``) are
wrapped by a timer.  Asynchronous calls (``async_op=True``) are timed up to their ``wait()``.
On CUDA a collective returns at enqueue and ``wait()`` only orders the stream, so the timer
synchronises the device before each call (the compute queued before it stays compute) and after it
returns or its ``wait()`` does (its transfer, not its enqueue, is timed).  This is profiling code,
run before training (Poplar's probes), never inside a training step.

:func:`measure_collective_time` measures the collectives' own cost (``t_comm`` of the allocator)
with every rank entering at the same moment (after a barrier), so no waiting is included.
"""
from __future__ import annotations

import contextlib
import functools
import statistics
import time
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist

from semimig._validate import check_int

COLLECTIVES: tuple[str, ...] = (
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
)


def _sync() -> None:
    """Wait for the device's queued work (profiling only, never inside a training step): on CUDA a
    collective returns at enqueue, so its time is read between two synchronisations, and the work
    queued before it is not counted as its transfer."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class CollectiveClock:
    """Accumulated seconds inside collectives (``seconds``) and the number of calls (``calls``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def _add(self, seconds: float) -> None:
        self.seconds += seconds
        self.calls += 1


class _TimedWork:
    """Wraps an async work handle so that ``wait()`` is charged to the clock."""

    def __init__(self, work: Any, clock: CollectiveClock, started: float) -> None:
        self._work = work
        self._clock = clock
        self._started = started

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        result = self._work.wait(*args, **kwargs)
        _sync()
        self._clock._add(time.perf_counter() - self._started)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _timed(fn: Callable[..., Any], clock: CollectiveClock) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _sync()  # the compute queued before the collective is compute, not communication
        started = time.perf_counter()
        work = fn(*args, **kwargs)
        if kwargs.get("async_op") and work is not None:
            return _TimedWork(work, clock, started)
        _sync()
        clock._add(time.perf_counter() - started)
        return work

    wrapper.__semimig_timed__ = True  # type: ignore[attr-defined]
    return wrapper


@contextlib.contextmanager
def timed_collectives() -> Iterator[CollectiveClock]:
    """Time every ``torch.distributed`` collective called while open; restores them on exit.

    Not re-entrant: nesting raises ``RuntimeError`` (the inner timer would double count).
    """
    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
    if any(getattr(fn, "__semimig_timed__", False) for fn in originals.values()):
        raise RuntimeError("timed_collectives() is already active; it cannot be nested")
    clock = CollectiveClock()
    try:
        for name, fn in originals.items():
            setattr(dist, name, _timed(fn, clock))
        yield clock
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def measure_collective_time(
    fn: Callable[[], Any], *, group: Optional[dist.ProcessGroup] = None, repeats: int = 3
) -> float:
    """Median wall time of ``fn()`` (a collective step) entered by all ranks of ``group`` together.

    Collective: every rank of ``group`` must call it with the same ``repeats``.  A barrier precedes
    each run so that no rank waits for a late peer inside ``fn``; the result is the max over the
    ranks of each run (the step is done when the last rank is done), then the median over runs.
    """
    check_int("repeats", repeats, minimum=1)
    samples = []
    for _ in range(repeats):
        dist.barrier(group=group)
        _sync()
        started = time.perf_counter()
        fn()
        _sync()
        elapsed = time.perf_counter() - started
        gathered: list[Optional[float]] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, elapsed, group=group)
        samples.append(max(float(x) for x in gathered if x is not None))
    return statistics.median(samples)
