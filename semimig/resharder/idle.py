"""A skipping rank's speed, read while it skips (DESIGN §8, :mod:`semimig.shardformer.skip`).

A rank that holds no unit and skips the step does no work the step clock could time, so its own row
would read it infinitely fast and the policy would hand it units back at once.  Instead, while it
waits for the holders, it times the device probe's fixed work (:func:`~.observe.probe_times`: ``n``
products of two ``size x size`` matrices, sized at enable time so the fastest rank takes about
``PROBE_TARGET_S``), and its row becomes the time its replicated work would take at that speed:

    c_idle = median_h (c_h − b_h) · t_idle / median_h t_h,0

with ``c_h − b_h`` a holder's non-shardable seconds in this step (its compute less its shardable
seconds), ``t_idle`` the probe's seconds on the idle rank now and ``t_h,0`` the holders' probe seconds
before the first step: the replicated work at the holders' pace, scaled by how much slower the idle
rank runs the same work.  It assumes the holders run at their enable-time speed (their own rows say
when they do not).  Only part of the probe runs when it would take more than a quarter of the last
step (a very slow rank would otherwise hold the group at the step's end), and one product before a step
has been timed; its time is scaled to the whole work.  It runs once between two rows: the rank skips
every forward of the step's micro-steps and of an evaluation between steps, and a row reads one probe,
so a probe at each would only hold the group (eight evaluation batches at a quarter step each).  The step model then prices the idle rank as holding nothing and bounding no step
(:attr:`~semimig.sharding.solver.StepModel.idle_free`), and hands it units back when it is fast again.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Optional, Sequence

from semimig.resharder.observe import ProbeWork

__all__ = ["IdleReader"]

QUARTER = 0.25
"""Most of the last step the idle rank's probe may take."""


class IdleReader:
    """The probe's work and its enable-time seconds ``base[r]`` per rank; :meth:`probe` on an idle rank,
    :meth:`rows` on every rank after the gather (module docstring)."""

    def __init__(self, *, size: int, n: int, base: Sequence[float], device: Any, dtype: Any,
                 clock: Any = None) -> None:
        self.size, self.n, self.base = size, n, tuple(base)
        self.clock = clock  # a test straggler's clock slows the whole device: the probe's work too
        self.device, self.dtype = device, dtype
        self.seconds = math.nan  # this rank's latest probe, whole work; NaN until it probes
        self.wall = 0.0  # the last step's wall time on this rank
        self._per: Optional[float] = None  # seconds per product at the latest probe
        self._last: dict[int, float] = {}  # an idle rank's latest probe, kept for a step that has none

    def count(self) -> int:
        """Products the next probe runs: as many as fit a quarter of the last step at the latest probe's pace
        (at most the whole work), and one until a probe and a step have both been timed, since the whole
        work on a very slow rank could outlast the step and hold the group at its end."""
        if self._per is None or self.wall <= 0.0:
            return 1
        return max(1, min(self.n, int(QUARTER * self.wall / self._per)))

    def probe(self) -> None:
        """Time the probe's work, or the part of it that fits a quarter of the last step (:meth:`count`), unless
        it was timed since the last row was taken (:meth:`take`): one probe a row."""
        if not math.isnan(self.seconds):
            return
        k = self.count()
        # made here, not kept: only an idle rank runs it, and its matrices (up to 3 x 64 MB) need not stay
        elapsed = ProbeWork(self.size, device=self.device, dtype=self.dtype).run(k)
        if self.clock is not None and getattr(self.clock, "slows", False):  # slept at the next collective
            elapsed *= float(self.clock.injector.current_chi())
        self._per = elapsed / k
        self.seconds = elapsed * self.n / k

    def take(self, wall: float) -> float:
        """This rank's probe seconds for its row (NaN when it did not probe), and the step's ``wall``."""
        seconds, self.seconds, self.wall = self.seconds, math.nan, wall
        return seconds

    def rows(self, rows: list[list[float]], idle: Sequence[int], *,
             update: Sequence[float] = ()) -> list[list[float]]:
        """Every rank's gathered row ``[compute, busy, comm, sleep, wall, work, gap, probe]`` as the policy
        reads it ``[compute, ..., gap]``: an idle rank's compute is its replicated work at its probed speed.
        ``update``: each rank's optimizer step (NaN: not timed), which is its own units' update, not
        replicated work: taken off the holders' replicated work where every holder timed it."""
        holders = [r for r in range(len(rows)) if r not in idle]
        timed = len(update) == len(rows) and not any(math.isnan(update[h]) for h in holders)
        replicated = statistics.median(max(0.0, rows[h][0] - rows[h][1] - rows[h][6] - (update[h] if timed else 0.0))
                                       for h in holders)
        base = statistics.median(self.base[h] for h in holders)
        out = []
        for r, row in enumerate(rows):
            row = list(row[:7])
            if r in idle:
                probe = rows[r][7] if not math.isnan(rows[r][7]) else self._last.get(r, math.nan)
                if not math.isnan(probe) and base > 0.0:
                    self._last[r] = probe
                    row[0], row[1], row[3], row[5], row[6] = replicated * probe / base, 0.0, 0.0, 1.0, 0.0
            out.append(row)
        return out
