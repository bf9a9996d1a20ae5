"""Busy time of one rank: its own GEMM compute (plus injected delay), never collective waits.

In tensor parallelism every collective synchronises the group, so wall time per iteration is the
same on every rank.  A rank's slowness is therefore measured as the time it spends in its own
linear GEMMs (including the straggler delay injected after each one), accumulated per iteration:

    busy_s           = sum over timed work g of  wall(g) + delay(g)
    work_fraction    = flops_done / full_flops          (1 when nothing was pruned or migrated)

"Timed work" is everything on the rank's own balanced path — gathers, index copies, GEMMs,
imputation — so a pruned iteration costs what it really cost.  The meter does not estimate the
unpruned time: dividing ``busy_s`` by ``work_fraction`` would charge the fixed cost of the pruned
path (gathers, launches) to the columns it dropped and inflate the estimate the more a rank
prunes; :mod:`semimig.controller.timing` fits the fixed part instead (DESIGN §3a).  Time blocked
in collectives is reported through :meth:`BusyMeter.add_collective_wait` and kept apart: a rank
that only waited must never look slow.

The paired gaps.  Between a column layer's forward and the row layer it feeds, a Megatron pair
runs work that is split with the pair's shards but is not a GEMM: the attention core (RoPE,
softmax(QK^T)V over the rank's heads) between ``q/k/v`` and ``o``, the activation between
``gate/up`` and ``down``; in backward the same work runs between the row layer's backward and the
column layer's.  The layers mark those spans (:meth:`BusyMeter.open_gap` when the column forward
or the row backward ends, :meth:`BusyMeter.close_gap` when the row forward or the column backward
starts) and the meter sums them apart from ``busy_s`` — only a meter built with
``marks_spans=True`` (the re-sharding policy's, :class:`semimig.balancer.Balancer`; nothing else reads
the spans):

    paired_gap_s     = sum over pairs of  t(row forward starts) − t(column forward ended)
                                        + t(column backward starts) − t(row backward ended)

A span is counted only from a column forward to a row forward, or from a row backward to a
column backward (never across a pair: the norms, residuals and collectives between one pair and
the next are replicated work), and it is dropped (:meth:`BusyMeter.drop_gap`) when a layer runs a
collective inside it (a column layer's ``gather_output``, the backward of a row layer's
``parallel_input=False`` split).  The re-sharding policy counts it as shardable work
(:mod:`semimig.resharder`); the resizing controller never sees it (pruning does not shrink it).

Device time (DESIGN §3b).  Every time the meter takes is a region of its
:class:`~semimig.straggler.clock.StepClock`: a GEMM closure is a ``"gemm"`` region, a pair span a
``"gap"`` one, and :meth:`BusyMeter.comm` marks a semimig collective as ``"comm"``.  No region
waits: on CUDA its markers are events on the current stream, resolved at :meth:`BusyMeter.end_step`
with the clock's lag.  With an injected straggler (benchmarks and tests only) a GEMM's own time
decides its delay, so the meter then reads it at once: the device is synchronised around the GEMM
on CUDA, as the injector's whole purpose is to be measured, never in a user's run.
"""
from __future__ import annotations

import collections
import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator, Optional, TypeVar

import torch

from semimig.straggler.clock import StepClock, StepTimes, make_clock
from semimig.straggler.injection import StragglerInjector

__all__ = ["BusyStats", "BusyMeter"]

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class BusyStats:
    """One iteration's accounting for one rank (see the module docstring for the formulas)."""

    busy_s: float
    """Seconds in this rank's GEMMs, injected delays included."""
    work_fraction: float
    """``flops_done / full_flops`` (1.0 when no GEMM was timed)."""
    gemm_count: int
    """Number of GEMMs timed."""
    collective_wait_s: float
    """Seconds reported as blocked in collectives; not part of ``busy_s``."""
    paired_gap_s: float = 0.0
    """Seconds between the layers of a column/row pair (module docstring); not part of ``busy_s``."""


class BusyMeter:
    """Accumulates a rank's own compute time over one iteration and injects straggler delays.

    Usage inside a layer::

        y = meter.timed(lambda: x[:, keep] @ w[:, keep].T, flops=2*M*N*len(keep), full_flops=2*M*N*K)

    ``clock``: the step clock the regions go to (default: :func:`~semimig.straggler.clock.make_clock`
    for ``device``, resolving a host step at its own end and a CUDA step one step late).  Close a
    step with :meth:`end_step`; :meth:`snapshot` reads the open one (on CUDA it waits once: only code
    that runs once per re-plan, the pretest, reads it there).
    """

    def __init__(self, injector: Optional[StragglerInjector] = None, *, device: torch.device | str = "cpu",
                 marks_spans: bool = False, clock: Optional[StepClock] = None) -> None:
        self.injector = injector
        self.marks_spans = marks_spans
        """Whether the layers mark the pair spans on this meter (module docstring); off, they skip
        :meth:`open_gap` / :meth:`close_gap` / :meth:`drop_gap` altogether."""
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        if clock is None:
            clock = make_clock(self.device, lag=1 if self._cuda else 0)
        if not isinstance(clock, StepClock):
            raise TypeError(f"clock must be a StepClock or None, got {clock!r}")
        self.clock = clock
        self._closed: collections.deque[tuple[int, tuple]] = collections.deque(maxlen=64)
        self.reset()

    def reset(self) -> None:
        """Start a new iteration from now: all counters to zero, the clock's open step restarted and
        its pending steps dropped."""
        self._zero()
        self._closed.clear()
        self.clock.reset()

    def _zero(self) -> None:
        self._charged_s = 0.0  # injected runs: the busy time the injector charges (module docstring)
        self._flops_done = 0.0
        self._full_flops = 0.0
        self._gemm_count = 0
        self._wait_s = 0.0
        self._gap_phase: Optional[str] = None  # phase of the pair span in progress

    def _check(self, flops: float, full_flops: float) -> None:
        if not (flops >= 0 and math.isfinite(flops)):
            raise ValueError(f"flops must be a finite number >= 0, got {flops!r}")
        # full_flops < flops is extra work: a migration receiver computing a straggler's columns
        # (full_flops = 0).  Its work fraction then exceeds 1.
        if not (full_flops >= 0 and math.isfinite(full_flops)):
            raise ValueError(f"full_flops must be a finite number >= 0, got {full_flops!r}")

    def _sync(self) -> None:
        """Injected stragglers only (module docstring)."""
        if self._cuda:
            torch.cuda.synchronize(self.device)

    def _count(self, flops: float, full_flops: float) -> None:
        self._flops_done += flops
        self._full_flops += full_flops
        self._gemm_count += 1

    @contextlib.contextmanager
    def measure(self, *, flops: float, full_flops: float) -> Iterator[None]:
        """Context-manager form of :meth:`timed`: times the block, then injects and counts the delay."""
        self._check(flops, full_flops)
        with self.clock.region("gemm"):
            if self.injector is None:
                yield
            else:
                self._sync()
                start = time.perf_counter()
                yield
                self._sync()
                self._after_injected(start, time.perf_counter() - start, flops)
        self._count(flops, full_flops)

    def _after_injected(self, start: float, elapsed: float, flops: float) -> None:
        """Inject the GEMM's delay and count its charge (test stragglers only)."""
        injector = self.injector
        delay = injector.delay_for(elapsed, flops)
        injector.inject(delay, self.device)
        if injector.config.mode == "measured" and injector.config.scope == "gemm":
            # Actual wall time of GEMM + delay, so sleep overshoot counts as the slowness it is.
            self._sync()
            self._charged_s += time.perf_counter() - start
        else:
            # Emulated: the nominal device's own time, deterministic whatever the host scheduler
            # does to the few real CPU cycles around it (4 ranks on 2 cores would otherwise add
            # noise).  scope=device: chi times the GEMM's wall (slept at the next collective).
            self._charged_s += injector.charged_s(elapsed, delay)

    def timed(self, fn: Callable[[], T], *, flops: float, full_flops: float) -> T:
        """Run the GEMM closure ``fn``, count it (and its injected delay) as busy; return its result.

        ``flops``: work actually done (after pruning / migration); ``full_flops``: the unpruned
        work of the same GEMM.  The injected delay is proportional to ``flops``.  (No context
        manager here: this runs several times per layer and iteration.)
        """
        self._check(flops, full_flops)
        clock = self.clock
        clock.start("gemm")
        try:
            if self.injector is None:
                result = fn()
            else:
                self._sync()
                start = time.perf_counter()
                result = fn()
                self._sync()
                self._after_injected(start, time.perf_counter() - start, flops)
        finally:
            clock.stop("gemm")
        self._count(flops, full_flops)
        return result

    def comm(self) -> ContextManager[None]:
        """A region around one of semimig's own collectives: the time it blocks the stream is
        communication (:attr:`StepTimes.comm_s`), never this rank's work."""
        return self.clock.region("comm")

    @property
    def busy_s(self) -> float:
        """Busy seconds so far in this iteration (what :meth:`snapshot` reports, without building it;
        NaN on CUDA, where the open step's events are not read before they complete)."""
        if self.injector is not None:
            return self._charged_s
        live = self.clock.live("gemm")
        return math.nan if live is None else live

    def open_gap(self, phase: str) -> None:
        """A column forward (``phase="forward"``) or a row backward (``"backward"``) ended: the pair's
        own non-GEMM work starts (module docstring)."""
        self._gap_phase = phase
        self.clock.open_span()

    def close_gap(self, phase: str) -> None:
        """A row forward (``"forward"``) or a column backward (``"backward"``) starts: the span opened
        in the same phase is counted; any other span is dropped."""
        opened, self._gap_phase = self._gap_phase, None
        if opened == phase:
            self.clock.close_span()
        else:
            self.clock.drop_span()

    def drop_gap(self) -> None:
        """A collective runs inside the span in progress (an output gathered, an input split whose
        backward gathers): the span is not the pair's own work; drop it."""
        self._gap_phase = None
        self.clock.drop_span()

    def add_collective_wait(self, seconds: float) -> None:
        """Record time blocked in a collective; reported, never counted as busy."""
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"seconds must be a finite number >= 0, got {seconds!r}")
        self._wait_s += seconds

    def _stats(self, counters: tuple, gemm_s: float, gap_s: float) -> BusyStats:
        charged, done, full, count, wait = counters
        return BusyStats(busy_s=gemm_s if self.injector is None else charged,
                         work_fraction=done / full if full > 0 else 1.0, gemm_count=count,
                         collective_wait_s=wait, paired_gap_s=gap_s)

    def _counters(self) -> tuple:
        return (self._charged_s, self._flops_done, self._full_flops, self._gemm_count, self._wait_s)

    def snapshot(self) -> BusyStats:
        """This iteration's numbers so far (work fraction 1.0 when nothing was timed).  On CUDA the
        open step's regions are read after one wait (once-per-re-plan code only)."""
        gemm = self.clock.live("gemm", wait=True) if self.injector is None else 0.0
        gap = self.clock.live("gap", wait=True)
        return self._stats(self._counters(), math.nan if gemm is None else gemm, math.nan if gap is None else gap)

    def end_step(self, *, wait: bool = False) -> Optional[tuple[BusyStats, StepTimes]]:
        """Close the iteration: the clock's step boundary; returns the iteration the clock resolves
        now (its lag back; ``wait``: at most one wait, :meth:`StepClock.step`) as its busy
        numbers and its device times, or ``None`` when it is not complete yet."""
        self._closed.append((self.clock.step_index, self._counters()))
        self._zero()
        times = self.clock.step(wait=wait)
        if times is None:
            return None
        while self._closed and self._closed[0][0] < times.step:
            self._closed.popleft()
        if not self._closed or self._closed[0][0] != times.step:
            return None
        _, counters = self._closed.popleft()
        return self._stats(counters, times.gemm_s, times.gap_s), times
