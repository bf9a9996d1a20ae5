"""One step clock on the device's own time (DESIGN §3b): regions of a step, resolved one step late.

A step is the span between two calls of :meth:`StepClock.step`.  Inside it, semimig marks its own
work with :meth:`StepClock.region`: ``"gemm"`` around its GEMM passes, ``"comm"`` around its own
collectives (the time they block the compute stream for), ``"dp"`` around the data-parallel gradient
reduction's wait (inside a ``"comm"`` region: the part of the collectives spent waiting for the other
replicas), ``"update"`` around the optimizer's step (the parameters' update: work per step, whatever the
batch), ``"off"`` around what runs between two steps but is no step's work (an evaluation inside
``balancer.dense()``: no region inside it is recorded), and the layers' pair spans with
:meth:`StepClock.open_span` / :meth:`StepClock.close_span` (kind ``"gap"``).  Per step::

    wall_s  = t(boundary ending the step) − t(boundary starting it) − Σ "off" regions
    gemm_s  = Σ over outermost "gemm" regions of t(end) − t(start)
    comm_s  = Σ over outermost "comm" regions of t(end) − t(start)
    dp_s    = Σ over outermost "dp" regions of t(end) − t(start)      (a part of comm_s)
    update_s = Σ over outermost "update" regions of t(end) − t(start) (a part of wall_s)
    compute = wall_s − comm_s

A region nested in one of the same kind records nothing (its time is inside the outer one), so
nested regions are counted once.  Regions of one kind on one stream never overlap, so their sum is
their union.

Two marker backends carry the same bookkeeping:

- host (:class:`HostClock`): a marker is ``time.perf_counter()`` when recorded; the work a CPU
  rank timed is finished when its call returns, so a marker is complete at once;
- CUDA (:class:`CudaEventClock`): a marker is a ``torch.cuda.Event(enable_timing=True)`` recorded
  on ``torch.cuda.current_stream()``, drawn from a pool of at most ``pool_size`` events; it is
  complete when ``Event.query()`` says so, and times are ``Event.elapsed_time``.

Nothing inside a step waits.  :meth:`StepClock.step` closes the open step and resolves the step
``lag`` boundaries back (``lag=1`` by default: the step before the one that just ended) once the
last marker it recorded on each stream is complete (a stream runs its work in order, so the
earlier markers are complete too); with ``wait=True`` it waits for one such marker at most
(:attr:`StepClock.host_syncs` counts the waits), else an incomplete step stays pending and is
resolved by a later call.  A resolved step's markers go back to the pool.  When the pool runs dry
inside a step, the rest of that step's regions are not recorded and its times carry the number
dropped (:attr:`StepTimes.dropped`): its sums are short, and a reader must not take them as the
step's.  :meth:`StepClock.reset` drops every pending step and restarts the open one (a re-plan,
the pretest or the probe between steps: their time is no step's work).

:meth:`StepClock.live` reads the open step so far: exact at once on the host backend, which the
step reflex and the pretest need; on CUDA only with ``wait=True`` (one wait), which only code that
runs once per re-plan may use.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch

from semimig._validate import check_int

__all__ = ["KINDS", "CudaEventClock", "HostClock", "Span", "StepClock", "StepTimes", "make_clock"]

logger = logging.getLogger(__name__)

KINDS: tuple[str, ...] = ("gemm", "comm", "gap", "dp", "update", "off")
"""What a region marks: semimig's GEMM passes, its own collectives, the spans between a pair's layers, the
data-parallel wait, the optimizer's update, and time that is no step's work."""


@dataclass(frozen=True)
class StepTimes:
    """One step's device times (module docstring)."""

    step: int
    """Index of the step these times belong to (0 for the first step after construction)."""
    wall_s: float
    """Boundary to boundary, less the ``"off"`` regions."""
    gemm_s: float
    """Union of the ``"gemm"`` regions."""
    comm_s: float
    """Union of the ``"comm"`` regions: what semimig's collectives blocked the stream for."""
    gap_s: float = 0.0
    """Sum of the closed pair spans (kind ``"gap"``)."""
    dp_s: float = 0.0
    """Union of the ``"dp"`` regions: the data-parallel gradient reduction's wait, a part of ``comm_s``."""
    update_s: float = 0.0
    """Union of the ``"update"`` regions: the optimizer's step."""
    regions: int = 0
    """Regions recorded (outermost ones; spans included)."""
    dropped: int = 0
    """Regions not recorded because the marker pool ran dry (their time is missing from the sums)."""

    @property
    def compute_s(self) -> float:
        """The rank's own work: ``wall_s − comm_s`` (never negative)."""
        return max(self.wall_s - self.comm_s, 0.0)


# ----------------------------------------------------------------------------- marker backends
class _HostMarker:
    __slots__ = ("t", "done")

    def __init__(self) -> None:
        self.t, self.done = 0.0, True


class _HostMarks:
    """Markers read from ``time.perf_counter()``; complete at once unless :attr:`holding` (tests:
    a step whose markers are not complete yet, released by :meth:`release`)."""

    kind = "host"
    immediate = True  # a marker's time is known when recorded

    def __init__(self) -> None:
        self.holding = False
        self._held: list[_HostMarker] = []

    def new(self) -> _HostMarker:
        return _HostMarker()

    def record(self, marker: _HostMarker) -> Optional[int]:
        """Record ``marker`` now; the stream it went on (``None``: the host has one)."""
        marker.t = time.perf_counter()
        marker.done = not self.holding
        if self.holding:
            self._held.append(marker)
        return None

    def done(self, marker: _HostMarker) -> bool:
        return marker.done

    def wait(self, marker: _HostMarker) -> None:
        """The host's work is finished when recorded; a held marker completes here (as a wait would)."""
        marker.done = True

    def seconds(self, start: _HostMarker, end: _HostMarker) -> float:
        return end.t - start.t

    def release(self) -> None:
        """Complete every held marker (tests)."""
        for marker in self._held:
            marker.done = True
        self._held = []


class _CudaMarks:
    """CUDA events with timing, recorded on the current stream."""

    kind = "cuda-events"
    immediate = False

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def new(self) -> Any:
        return torch.cuda.Event(enable_timing=True)

    def record(self, marker: Any) -> int:
        """Record ``marker`` on the current stream; that stream's handle (one stream lookup per marker: a
        step records dozens, and at small shards the host's time per marker is the step's)."""
        stream = torch.cuda.current_stream(self.device)
        marker.record(stream)
        return stream.cuda_stream

    def done(self, marker: Any) -> bool:
        return marker.query()

    def wait(self, marker: Any) -> None:
        marker.synchronize()

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1000.0


# ----------------------------------------------------------------------------- bookkeeping
@dataclass
class _Step:
    index: int
    start: Any
    end: Any = None
    regions: list = field(default_factory=list)  # (kind, start marker, end marker)
    last: dict = field(default_factory=dict)  # stream -> last marker recorded on it
    dropped: int = 0
    live: dict = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))  # host: closed regions' sums so far
    exact: bool = True  # live holds every closed region (host markers, none held)


class StepClock:
    """Regions and step boundaries over a marker backend (module docstring).

    Single-threaded, like the training step it times.  Use :func:`make_clock`, :class:`HostClock`
    or :class:`CudaEventClock`.
    """

    def __init__(self, marks: Any, *, pool_size: int = 4096, lag: int = 1) -> None:
        self._marks = marks
        self.backend: str = marks.kind
        self.pool_size = check_int("pool_size", pool_size, minimum=4)
        self.lag = check_int("lag", lag, minimum=0, maximum=16)
        """How many boundaries after its end a step is resolved (0: at its own end, the host's
        controller; 1: one step late, never waiting for work just enqueued)."""
        self.host_syncs = 0
        """Blocking waits the clock itself has done (at most one per :meth:`step`)."""
        self._free: list = []
        self._made = 0
        self._pending: collections.deque[_Step] = collections.deque()
        self._depth = dict.fromkeys(KINDS, 0)
        self._open: dict[str, Any] = {}  # kind -> start marker of its outermost region (None: not recorded)
        self._warned = False
        self.late: collections.deque[StepTimes] = collections.deque(maxlen=16)
        """Steps older than the one :meth:`step` returns, resolved late (their markers completed after
        their own turn); the most recent 16."""
        self._index = 0
        self._stream: Optional[int] = None  # the stream the latest marker was recorded on
        self._step: _Step = self._new_step(0)

    # ------------------------------------------------------------------ markers
    def _take(self, *, boundary: bool = False) -> Any:
        """A marker from the pool, recorded now; ``None`` when the pool is dry (boundaries always get one)."""
        if self._free:
            marker = self._free.pop()
        elif self._made < self.pool_size or boundary:
            marker = self._marks.new()
            self._made += 1
        else:
            return None
        self._stream = self._marks.record(marker)
        self._step.last[self._stream] = marker
        return marker

    def _give(self, markers: list) -> None:
        self._free.extend(m for m in markers if m is not None)

    def _new_step(self, index: int) -> _Step:
        step = _Step(index=index, start=None, exact=self._marks.immediate)
        self._step = step
        step.start = self._take(boundary=True)
        return step

    # ------------------------------------------------------------------ regions
    def start(self, kind: str) -> None:
        """Open a region of ``kind`` (nested in one of the same kind: counted once, by the outer one)."""
        depth = self._depth[kind]
        self._depth[kind] = depth + 1
        if depth == 0:
            if kind != "off" and self._depth["off"]:  # inside time that is no step's work: not timed
                self._open[kind] = None
                return
            marker = self._take()
            if marker is None:
                self._dry()
            self._open[kind] = marker

    def stop(self, kind: str) -> None:
        """Close the innermost open region of ``kind``."""
        depth = self._depth[kind] - 1
        if depth < 0:
            raise RuntimeError(f"clock: stop({kind!r}) without a start")
        self._depth[kind] = depth
        if depth == 0:
            start = self._open.pop(kind, None)
            if start is None:
                return
            end = self._take()
            if end is None:
                self._give([start])
                self._dry()
                return
            step = self._step
            step.regions.append((kind, start, end))
            if step.exact and self._marks.done(end):
                step.live[kind] += self._marks.seconds(start, end)
            else:
                step.exact = False

    @contextlib.contextmanager
    def region(self, kind: str) -> Iterator[None]:
        """Time the block as ``kind`` (one of :data:`KINDS`); never waits."""
        if kind not in KINDS:
            raise ValueError(f"region kind must be one of {KINDS}, got {kind!r}")
        self.start(kind)
        try:
            yield
        finally:
            self.stop(kind)

    def open_span(self) -> None:
        """A pair span starts (kind ``"gap"``); a span still open is replaced."""
        self.drop_span()
        self.start("gap")

    def close_span(self) -> None:
        """The open pair span ends and counts (nothing when none is open)."""
        if self._depth["gap"]:
            self.stop("gap")

    def drop_span(self) -> None:
        """The open pair span is not counted (nothing when none is open)."""
        if self._depth["gap"]:
            self._depth["gap"] = 0
            self._give([self._open.pop("gap", None)])

    def _dry(self) -> None:
        self._step.dropped += 1
        if not self._warned:
            self._warned = True
            logger.warning("step clock: the pool of %d markers ran dry in step %d; regions are dropped from the "
                           "steps that run out (raise pool_size)", self.pool_size, self._step.index)

    # ------------------------------------------------------------------ steps
    def step(self, *, wait: bool = False) -> Optional[StepTimes]:
        """Close the open step; return the times of the step ``lag`` boundaries back when complete
        (``wait=True``: after waiting for one marker at most), else ``None`` (it stays pending)."""
        closing = self._step
        self._depth = dict.fromkeys(KINDS, 0)
        self._give(list(self._open.values()))
        self._open = {}
        self._index += 1
        nxt = self._new_step(self._index)
        closing.end = nxt.start
        closing.last[self._stream] = nxt.start  # the stream its boundary marker went on
        self._pending.append(closing)
        wanted = self._index - 1 - self.lag
        while self._pending and self._pending[0].index < wanted:  # older: resolved late, or dropped
            old = self._pending[0]
            if not self._complete(old):
                break
            self.late.append(self._resolve(self._pending.popleft()))
        if not self._pending or self._pending[0].index != wanted:
            return None
        target = self._pending[0]
        if not self._complete(target) and wait:
            self._wait_one(target)
        if not self._complete(target):
            return None
        return self._resolve(self._pending.popleft())

    def _complete(self, step: _Step) -> bool:
        return all(self._marks.done(m) for m in step.last.values())

    def _wait_one(self, step: _Step) -> None:
        for marker in step.last.values():
            if not self._marks.done(marker):
                self._marks.wait(marker)
                self.host_syncs += 1
                return

    def _resolve(self, step: _Step) -> StepTimes:
        sums = dict.fromkeys(KINDS, 0.0)
        seconds = self._marks.seconds
        for kind, start, end in step.regions:
            sums[kind] += seconds(start, end)
        times = StepTimes(step=step.index, wall_s=max(seconds(step.start, step.end) - sums["off"], 0.0),
                          gemm_s=sums["gemm"],
                          comm_s=sums["comm"], gap_s=sums["gap"], dp_s=sums["dp"], update_s=sums["update"],
                          regions=len(step.regions), dropped=step.dropped)
        self._give([step.start] + [m for _, a, b in step.regions for m in (a, b)])  # end: the next step's start
        return times

    def live(self, kind: str, *, wait: bool = False) -> Optional[float]:
        """Seconds of ``kind`` in the open step so far (closed regions), or ``None`` when its markers
        are not complete (``wait=True``: after one wait at most; once-per-re-plan code only)."""
        step = self._step
        if step.exact:
            return step.live[kind]
        if not self._complete(step):
            if not wait:
                return None
            self._wait_one(step)
            if not self._complete(step):
                return None
        seconds = self._marks.seconds
        return sum(seconds(a, b) for k, a, b in step.regions if k == kind)

    def reset(self) -> None:
        """Drop every pending step and restart the open one from now (same index)."""
        for step in self._pending:
            self._give([step.start] + [m for _, a, b in step.regions for m in (a, b)])
        self._pending.clear()
        old = self._step
        self._give([old.start] + [m for _, a, b in old.regions for m in (a, b)] + list(self._open.values()))
        self._open = {}
        self._depth = dict.fromkeys(KINDS, 0)
        self._new_step(old.index)

    @property
    def step_index(self) -> int:
        """Index of the open step."""
        return self._index

    @property
    def pending(self) -> int:
        """Closed steps not resolved yet."""
        return len(self._pending)

    @property
    def markers_made(self) -> int:
        """Markers created so far (the pool's size in use)."""
        return self._made


class HostClock(StepClock):
    """The step clock on ``time.perf_counter()`` markers (CPU ranks; tests of the bookkeeping)."""

    def __init__(self, *, pool_size: int = 4096, lag: int = 1) -> None:
        super().__init__(_HostMarks(), pool_size=pool_size, lag=lag)

    def hold(self) -> None:
        """Markers recorded from now on stay incomplete until :meth:`release` (tests)."""
        self._marks.holding = True

    def release(self) -> None:
        """Complete every held marker and stop holding."""
        self._marks.holding = False
        self._marks.release()


class CudaEventClock(StepClock):
    """The step clock on CUDA events recorded on the current stream of ``device``."""

    def __init__(self, device: torch.device | str | int = "cuda", *, pool_size: int = 4096, lag: int = 1) -> None:
        device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if device.type != "cuda":
            raise ValueError(f"CudaEventClock needs a CUDA device, got {device}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        super().__init__(_CudaMarks(device), pool_size=pool_size, lag=lag)


class Span:
    """Seconds of one piece of work between two points, on ``device``'s own time: the same markers as the step
    clock (module docstring) — CUDA events on the current stream, or ``time.perf_counter()`` on the host.

    Made, it marks its start; :meth:`seconds` marks the end and reads the span, waiting once on CUDA for the end
    marker (for work that runs once per re-plan: a move, the device probe).  On CUDA the start marker completes
    when the work queued before it does, so the span is the delay the work adds to the device's timeline —
    its kernels and collectives, and any time the device idled waiting for the host to issue them — where the
    host's clock would read only the issuing (a collective returns before the device has run it)."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        device = torch.device(device) if device is not None else torch.device("cpu")
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self._marks = _CudaMarks(device) if device.type == "cuda" else _HostMarks()
        self._start = self._marks.new()
        self._marks.record(self._start)

    def seconds(self) -> float:
        """Seconds from the start to now on the device (one wait on CUDA)."""
        end = self._marks.new()
        self._marks.record(end)
        self._marks.wait(end)
        return self._marks.seconds(self._start, end)


def make_clock(device: torch.device | str | None = None, *, pool_size: int = 4096,
               lag: Optional[int] = None) -> StepClock:
    """The clock for ``device``: :class:`CudaEventClock` on a CUDA device, else :class:`HostClock`.
    ``lag`` defaults to 1 (resolve a step one boundary late)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    lag = 1 if lag is None else lag
    if device.type == "cuda":
        return CudaEventClock(device, pool_size=pool_size, lag=lag)
    return HostClock(pool_size=pool_size, lag=lag)
