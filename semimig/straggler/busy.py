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
the spans, and on CUDA each mark synchronises the device once more):

    paired_gap_s     = sum over pairs of  t(row forward starts) − t(column forward ended)
                                        + t(column backward starts) − t(row backward ended)

A span is counted only from a column forward to a row forward, or from a row backward to a
column backward (never across a pair: the norms, residuals and collectives between one pair and
the next are replicated work), and it is dropped (:meth:`BusyMeter.drop_gap`) when a layer runs a
collective inside it (a column layer's ``gather_output``, the backward of a row layer's
``parallel_input=False`` split).  The re-sharding policy counts it as shardable work
(:mod:`semimig.resharder`); the resizing controller never sees it (pruning does not shrink it).
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, TypeVar

import torch

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

    On CUDA the device is synchronised before and after each timed GEMM (and its delay), so the
    wall time is the GEMM's own; this serialises the stream, which is the price of measuring.
    """

    def __init__(self, injector: Optional[StragglerInjector] = None, *, device: torch.device | str = "cpu",
                 marks_spans: bool = False) -> None:
        self.injector = injector
        self.marks_spans = marks_spans
        """Whether the layers mark the pair spans on this meter (module docstring); off, they skip
        :meth:`open_gap` / :meth:`close_gap` / :meth:`drop_gap` altogether."""
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        """Start a new iteration: all counters to zero."""
        self._busy_s = 0.0
        self._flops_done = 0.0
        self._full_flops = 0.0
        self._gemm_count = 0
        self._wait_s = 0.0
        self._gap_s = 0.0
        self._gap_open: Optional[tuple[str, float]] = None  # (phase, time) of the span in progress

    def _start(self, flops: float, full_flops: float) -> float:
        if not (flops >= 0 and math.isfinite(flops)):
            raise ValueError(f"flops must be a finite number >= 0, got {flops!r}")
        # full_flops < flops is extra work: a migration receiver computing a straggler's columns
        # (full_flops = 0).  Its work fraction then exceeds 1.
        if not (full_flops >= 0 and math.isfinite(full_flops)):
            raise ValueError(f"full_flops must be a finite number >= 0, got {full_flops!r}")
        if self._cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _finish(self, start: float, flops: float, full_flops: float) -> None:
        if self._cuda:
            torch.cuda.synchronize(self.device)
        injector = self.injector
        if injector is None:
            self._busy_s += time.perf_counter() - start
        else:
            elapsed = time.perf_counter() - start
            delay = injector.delay_for(elapsed, flops)
            injector.inject(delay, self.device)
            if self._cuda:
                torch.cuda.synchronize(self.device)
            if injector.config.mode == "measured" and injector.config.scope == "gemm":
                # Actual wall time of GEMM + delay, so sleep overshoot counts as the slowness it is.
                self._busy_s += time.perf_counter() - start
            else:
                # Emulated: the nominal device's own time, deterministic whatever the host scheduler
                # does to the few real CPU cycles around it (4 ranks on 2 cores would otherwise add
                # noise).  scope=device: chi times the GEMM's wall (slept at the next collective).
                self._busy_s += injector.charged_s(elapsed, delay)
        self._flops_done += flops
        self._full_flops += full_flops
        self._gemm_count += 1

    @contextlib.contextmanager
    def measure(self, *, flops: float, full_flops: float) -> Iterator[None]:
        """Context-manager form of :meth:`timed`: times the block, then injects and counts the delay."""
        start = self._start(flops, full_flops)
        yield
        self._finish(start, flops, full_flops)

    def timed(self, fn: Callable[[], T], *, flops: float, full_flops: float) -> T:
        """Run the GEMM closure ``fn``, count it (and its injected delay) as busy; return its result.

        ``flops``: work actually done (after pruning / migration); ``full_flops``: the unpruned
        work of the same GEMM.  The injected delay is proportional to ``flops``.  (No context
        manager here: this runs several times per layer and iteration.)
        """
        start = self._start(flops, full_flops)
        result = fn()
        self._finish(start, flops, full_flops)
        return result

    @property
    def busy_s(self) -> float:
        """Busy seconds so far in this iteration (what :meth:`snapshot` reports, without building it)."""
        return self._busy_s

    def open_gap(self, phase: str) -> None:
        """A column forward (``phase="forward"``) or a row backward (``"backward"``) ended: the pair's
        own non-GEMM work starts (module docstring)."""
        if self._cuda:
            torch.cuda.synchronize(self.device)
        self._gap_open = (phase, time.perf_counter())

    def close_gap(self, phase: str) -> None:
        """A row forward (``"forward"``) or a column backward (``"backward"``) starts: the span opened
        in the same phase is counted; any other span is dropped."""
        opened, self._gap_open = self._gap_open, None
        if opened is None or opened[0] != phase:
            return
        if self._cuda:
            torch.cuda.synchronize(self.device)
        self._gap_s += time.perf_counter() - opened[1]

    def drop_gap(self) -> None:
        """A collective runs inside the span in progress (an output gathered, an input split whose
        backward gathers): the span is not the pair's own work; drop it."""
        self._gap_open = None

    def add_collective_wait(self, seconds: float) -> None:
        """Record time blocked in a collective; reported, never counted as busy."""
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"seconds must be a finite number >= 0, got {seconds!r}")
        self._wait_s += seconds

    def snapshot(self) -> BusyStats:
        """This iteration's numbers so far (work fraction 1.0 when nothing was timed)."""
        fraction = self._flops_done / self._full_flops if self._full_flops > 0 else 1.0
        return BusyStats(
            busy_s=self._busy_s,
            work_fraction=fraction,
            gemm_count=self._gemm_count,
            collective_wait_s=self._wait_s,
            paired_gap_s=self._gap_s,
        )
