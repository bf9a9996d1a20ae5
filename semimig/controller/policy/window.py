"""The window of the plan in force, and the change-point test that decides how much of it each rank's
reading rests on (DESIGN §9).

The window holds the latest steps of one plan (at most ``size``; a move empties it).  Each rank ``r``
reads only its *fresh* steps, the ones since its speed last changed: its time is their lower tercile
(:func:`~semimig.controller.policy.stepmodel.tercile`).  A change is a step in a rank's log compute:
the last ``m`` steps all away from the median of the rank's earlier fresh steps (at least ``N_MIN``
of them), on the same side, by more than ``z·σ̂/√m`` (``z``: :data:`CHANGE_Z`; ``σ̂`` the one noise
estimator, :class:`~semimig.controller.policy.gain.Noise`).  A large change clears that band in one step, a small
one only as ``m`` grows: the detection delay scales as ``(σ̂ / size of the change)²``, and the false
alarms per rank and step stay near ``Φ(−z/√m)^m``.

Outlier steps are slow steps (an interrupt, a collection, a page fault never makes a step faster), so
one step faster than the band is a change while one step slower is as likely an outlier: a rank is
believed faster after one step and slower after :data:`SLOW_STEPS`.  A change resets only that rank's
fresh steps; the other ranks keep their readings and their precision.  The steps that made a change
were chosen for being far from the earlier ones: the noise of a reading is counted over the fresh
steps after them (:attr:`Window.independent`), so a run of outliers that passes for a change does not
also pass for a slow rank.
"""
from __future__ import annotations

import collections
import math
import statistics
from typing import Any, List, Optional, Tuple

from semimig.controller.policy.states import N_MIN
from semimig.controller.policy.stepmodel import tercile

__all__ = ["Window", "CHANGE_Z", "SLOW_STEPS"]

CHANGE_Z = 3.0
"""Standard errors a change of speed must clear: its own false-alarm rate (``Φ(−z)`` per rank and step),
apart from the gain test's ``noise_z``, so a gain test opened wide does not also read every step's noise
as a change and keep each rank's reading a step or two long."""

SLOW_STEPS = 2
"""Fewest steps a slowdown is believed on: one slower step may be an outlier, two in a row on one rank
rarely are (``q²`` for an outlier rate ``q``)."""


class Window:
    """The steps of the plan in force, and each rank's fresh steps among them (module docstring)."""

    def __init__(self, size: int, tp: int) -> None:
        self.samples: collections.deque = collections.deque(maxlen=size)
        self.fresh: List[int] = [0] * tp
        self.trigger: List[int] = [0] * tp
        """Per rank, the steps among its fresh ones that made its last change: chosen for being far from
        the earlier ones, they tell that the speed changed, not by how much."""
        self.pending = False
        """Some rank's last step is slower than the band, not yet told apart from an outlier."""

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self):
        return iter(self.samples)

    def __getitem__(self, i: int) -> Any:
        return self.samples[i]

    def clear(self) -> None:
        self.samples.clear()
        self.fresh = [0] * len(self.fresh)
        self.trigger = [0] * len(self.fresh)
        self.pending = False

    @property
    def steps(self) -> int:
        """Steps every rank's reading rests on (the fewest fresh steps of any rank)."""
        return min(self.fresh)

    @property
    def independent(self) -> int:
        """Steps the noise of every rank's reading is counted over: its fresh steps after the ones that
        made its last change (at least 1; the fewest of any rank)."""
        return min(max(f - t, 1) for f, t in zip(self.fresh, self.trigger))

    def add(self, sample: Any, *, sigma: float, z: float = CHANGE_Z) -> bool:
        """Append one step; ``True`` when some rank's speed changed (module docstring)."""
        self.samples.append(sample)
        n = len(self.samples)
        self.trigger = [t - 1 if f + 1 > n and t > 0 else t for f, t in zip(self.fresh, self.trigger)]
        self.fresh = [min(f + 1, n) for f in self.fresh]
        changed, self.pending = False, False
        for r, fresh in enumerate(self.fresh):
            m, slower = self._change(r, fresh, sigma, z)
            if m:
                self.fresh[r], self.trigger[r], changed = m, m, True
            self.pending |= slower and not m
        return changed

    def _change(self, r: int, fresh: int, sigma: float, z: float) -> Tuple[int, bool]:
        """The most recent steps of rank ``r`` that differ from its earlier fresh steps (0: none), and
        whether its last step alone is slower than the band."""
        times = [s.compute_s[r] for s in list(self.samples)[-fresh:]]
        slower = False
        for m in range(min(N_MIN, fresh - N_MIN), 0, -1):
            base = statistics.median(times[:-m])
            devs = [math.log(t / base) for t in times[-m:]]
            band = z * sigma / math.sqrt(m)
            if all(d < -band for d in devs) or (m >= SLOW_STEPS and all(d > band for d in devs)):
                return m, False
            slower = m == 1 and devs[0] > band
        return 0, slower

    def times(self) -> Tuple[Tuple[float, ...], float]:
        """Every rank's compute (the lower tercile of its fresh steps) and the median of the step's
        smallest collective time over the window."""
        window = list(self.samples)
        compute = tuple(tercile([s.compute_s[r] for s in window[-max(f, 1):]]) for r, f in enumerate(self.fresh))
        return compute, statistics.median(min(s.comm_s) for s in window)

    def after_change(self) -> Tuple[Optional[float], ...]:
        """Every rank's compute over its fresh steps after the ones that made its last change (the lower
        tercile; ``None`` while there is none): the steps that made a change were chosen for being far from
        the earlier ones, so only the steps after them tell a slowdown from a run of outliers."""
        window = list(self.samples)
        return tuple(tercile([s.compute_s[r] for s in window[-(f - t):]]) if f > t else None
                     for r, (f, t) in enumerate(zip(self.fresh, self.trigger)))

