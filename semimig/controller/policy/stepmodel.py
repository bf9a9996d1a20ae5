"""The step model the policy learns (DESIGN §8): ``R/S`` and every rank's speed, from every plan measured.

A rank's compute in a step is ``c_r = (R + S·p_r)/v_r`` (``p_r`` its share of the shardable work under
the plan in force).  Only the ratio ``k = R/S`` matters for a plan; the scale is fixed by ``R + S/e = 1``
(``S = 1/(k + 1/e)``), so ``v_r = (R + S·p_r)/c_r`` is in healthy even steps per second.  Speeds are
work over time: a rank holding less that finishes with the others reads as slow as it is, and a rank
holding nothing (``p_r = 0``) reads ``v_r = R_r/c_r`` from its replicated work alone: ``R_r = R`` until a
move that emptied it was measured at one set of speeds, and then its own replicated work as that move
measured it, ``R_r = v_r·c'_r`` with ``v_r`` its speed read from its work just before the move and
``c'_r`` its compute just after, where that work was mostly shardable (``S·p_r ≥ R``: a speed read from
work that is mostly ``R`` is read through ``k``, and so is ``R_r`` then; :meth:`LearnedModel.calibrate`); or,
where a measured move seated it again and its speed read holding units differs from what its reading while
empty said (the slow set changed by it alone), ``R_r = v_r·c_r`` with ``v_r`` that speed and ``c_r`` its
compute while empty (:meth:`LearnedModel.reseat`): the work it then held bore out one reading and not the
other.  A rank's replicated work need not run at the pace of its shardable work (many small kernels
against a few large GEMMs: a CPU quota that lets short bursts through runs the small ones faster), and
``k``'s error scales ``R`` alone, so an emptied rank read through ``R`` can read twice as fast as it is and
be handed units it cannot carry, or read slow after it recovered and be handed too few.

``k`` comes from three sources, in order of trust:

- plans measured: two at the same speeds, per rank whose share changed, ``c_a·(k + p_b) = c_b·(k + p_a)``
  gives ``k = (c_b·p_a − c_a·p_b)/(c_a − c_b)`` (the median over the ranks; a pair whose ranks disagree by
  more than 2x measured a change of speed, not ``k``, and is dropped); one window's healthy ranks holding
  different shares, by least squares across them; where no window has, every healthy rank's reading of
  every plan so far, one line through them all (:meth:`LearnedModel.fit_across`).  The estimate is the
  median of all of them;
- the split of a step into shardable seconds ``b_r`` and the rest: ``(c_r − b_r)·p_r/b_r`` is an upper
  bound of ``k`` (the timers do not see every shardable second), the smallest over the ranks;
- a prior replicated share ``ρ`` of a healthy even step (``k = ρ/(e·(1 − ρ))``), taken when it is below
  the split's bound and nothing better is measured.

A plan that under-delivers (measured slower than predicted) is what the pair estimate corrects: the
next decision reads the plan in force with the refitted ``k`` and proposes again.  How much the latest
plans under-delivered is the model's own error (:attr:`LearnedModel.error`): a gain below it is not
trusted (:mod:`~semimig.controller.policy.gain`).
"""
from __future__ import annotations

import collections
import math
import statistics
from typing import AbstractSet, Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from semimig.sharding.solver import StepModel

__all__ = ["LearnedModel", "median_times", "ordered_median", "tercile", "weighted_share"]

K_FLOOR = 1e-3
"""Smallest ``R/S`` used: a rank holding no unit is read through ``R``, which must not vanish."""
ERRORS = 3
"""Latest moves whose predicted-against-measured step gives the model's error."""
FIT_Z = 3.0
"""Standard errors every dimension's weight must clear for a fit across the ranks to be taken (and ``R``
too, on a plan's first steps): a weight read from a plan that barely varies among the healthy ranks is
noise, and a plan solved on it hands out the units of the dimension it underrates as if they were free;
``R`` read within its noise reads a rank that holds no unit (read through ``R`` alone) slow or fast by
the fit's error."""
CALIBRATION = 3.0
"""Largest factor between an emptied rank's own replicated work and ``R`` that :meth:`LearnedModel.calibrate`
takes: a move during which the rank's slowdown of ``χ`` ended reads a factor near ``1/χ``, and a straggler
is emptied only where it is several times slower, so such a move is not read as the rank's own work."""
MIN_SHARE_CHANGE = 0.02
"""Smallest change of a rank's share across two plans that measures ``k`` from that rank."""


def weighted_share(weights: Sequence[float], fractions: Sequence[float]) -> float:
    """A rank's share of the shardable work, ``p = Σ_d w_d·x_d / Σ_d w_d``, from its fraction ``x_d`` of each
    dimension's units and the dimensions' weights ``w_d``."""
    return sum(w * x for w, x in zip(weights, fractions)) / sum(weights)


def tercile(values: Sequence[float]) -> float:
    """The lower tercile: the ``⌊(n − 1)/3⌋``-th smallest value.  Outlier steps are slow steps, so up to two
    thirds of them leave it alone (a median of three steps, two of them outliers, would be an outlier); its
    bias under symmetric noise is the same on every rank and cancels in the speed ratios."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 3]


def ordered_median(ordered: Sequence[float]) -> float:
    """The median of values already in order (:func:`statistics.median`'s value), for a reading kept in order
    as its values come and go."""
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def median_times(window: Sequence[Any]) -> Tuple[Tuple[float, ...], float]:
    """Every rank's typical compute over ``window`` (:class:`~semimig.controller.reshard.ReshardSample`\ s:
    :func:`tercile`) and the median of the smallest collective time."""
    tp = len(window[0].compute_s)
    return (tuple(tercile([o.compute_s[r] for o in window]) for r in range(tp)),
            statistics.median(min(o.comm_s) for o in window))


def _regress(x: Sequence[Sequence[float]], y: Sequence[float], se: Optional[float]) -> Optional[np.ndarray]:
    """Least squares of ``y`` on ``x`` (a first column of ones: ``α``, then the ``β``\ s), or ``None`` where
    ``x`` does not vary enough, ``α < 0`` or a ``β ≤ 0``, or a ``β`` (and ``α`` where ``se`` is given: a
    reading's least relative error) is within :data:`FIT_Z` standard errors (:meth:`LearnedModel.fit_across`)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if np.linalg.matrix_rank(x, tol=1e-9) < x.shape[1]:
        return None
    coef, rss, _, _ = np.linalg.lstsq(x, y, rcond=None)
    if coef[0] < 0.0 or np.any(coef[1:] <= 0.0):
        return None
    resid = float(rss[0]) if len(rss) else float(np.sum((y - x @ coef) ** 2))
    floor = 0.0 if se is None else (se * float(np.median(y))) ** 2
    error = np.sqrt(np.diag(np.linalg.pinv(x.T @ x)) * max(resid / (len(y) - x.shape[1]), floor))
    if np.any(coef[1:] < FIT_Z * error[1:]) or (se is not None and coef[0] < FIT_Z * error[0]):
        return None
    return coef


class LearnedModel:
    """``k = R/S`` learned from the plans measured (module docstring); speeds from any window."""

    def __init__(self, tp: int, prior_share: float, weights: Sequence[float]) -> None:
        self.tp = tp
        self.idle_free = False
        """A rank holding no unit skips the step (:attr:`~semimig.sharding.solver.StepModel.idle_free`)."""
        self.prior_weights = tuple(weights)
        self.weight_fits: List[Tuple[float, ...]] = []
        """Every dimension's weight (a share of the shardable work) measured across the healthy ranks."""
        self._weights: Tuple[int, Tuple[float, ...]] = (0, ())  # (fits read, their medians)
        self.prior_k = prior_share / (tp * (1.0 - prior_share))
        self.fits: List[float] = []
        """Every ``k`` measured across two plans or across the ranks of one window."""
        self.readings: Dict[Tuple[Tuple[Tuple[float, ...], ...], int], float] = {}
        """Per plan (every rank's fractions of each dimension's units) and healthy rank read across the ranks: the
        rank's compute (:meth:`fit_across`)."""
        self.pooled: Optional[float] = None
        """``k`` from :attr:`readings` (``None``: they have not said it)."""
        self.bound: Optional[float] = None
        """The split's latest upper bound of ``k``."""
        self.errors: collections.deque = collections.deque(maxlen=ERRORS)
        """How much slower than predicted the latest plans moved to measured (0: as predicted or faster)."""
        self.replicated_at: dict = {}
        """Per rank a measured move emptied: its own replicated work ``R_r`` (module docstring)."""

    @property
    def error(self) -> float:
        """The step model's error: the least under-delivery (a share of the step moved from) of the latest
        :data:`ERRORS` plans moved to — every one of them fell short by at least that; 0 before that many."""
        return min(self.errors) if len(self.errors) == ERRORS else 0.0

    @property
    def k(self) -> float:
        fits = self.fits + ([self.pooled] if self.pooled is not None else [])
        if fits:
            k = statistics.median(fits)
            return max(K_FLOOR, min(k, self.bound) if self.bound is not None else k)
        candidates = [self.prior_k] + ([self.bound] if self.bound is not None else [])
        return max(K_FLOOR, min(candidates))

    def read_bound(self, p: Sequence[float], compute: Sequence[Sequence[float]],
                   shardable: Sequence[Sequence[float]]) -> None:
        """The split's bound of ``k`` from a window measured under shares ``p``: per rank its compute and its
        timed shardable seconds over the window's steps."""
        found = []
        for r in range(self.tp):
            if p[r] <= 0.0:  # a rank holding nothing does no shardable work
                continue
            b, c = tercile(shardable[r]), tercile(compute[r])
            if 0.0 < b < c:
                found.append((c - b) * p[r] / b)
        if found:
            self.bound = min(found)

    def fit(self, pa: Sequence[float], before: Sequence[Any], pb: Sequence[float],
            after: Sequence[Any], se: float = 0.0, doubtful: AbstractSet[int] = frozenset()) -> Optional[float]:
        """``k`` from two windows under shares ``pa`` and ``pb`` at the same speeds; ``None`` when they
        say nothing.  ``doubtful``: ranks whose reading corroborates the ``k`` in use (within a factor 2)
        and never overturns it — a slow rank the move emptied: holding no unit it is read through ``k``
        alone, so a slowdown ending during the move is seen by nothing but this fit, which would read the
        drop of its compute as a ``k`` near 0 and, through it, the recovered rank as slow as before.
        ``se``: the relative standard error of one window's reading of a rank.  A rank's
        ``k = (ρ·p_a − p_b)/(1 − ρ)`` with ``ρ = c_b/c_a`` has the standard error
        ``|p_a − p_b|·ρ·√2·se/(1 − ρ)²``: a move of a few units changes ``ρ`` too little to tell ``k``
        from the noise, and a rank's reading is taken only when ``k`` clears :data:`FIT_Z` of them."""
        ca, cb = median_times(before)[0], median_times(after)[0]
        found, k_now = [], self.k
        for r in range(self.tp):
            dp, dc = pb[r] - pa[r], cb[r] - ca[r]
            if abs(dp) >= MIN_SHARE_CHANGE and dp * dc > 0.0:
                k = (cb[r] * pa[r] - ca[r] * pb[r]) / (ca[r] - cb[r])
                rho = cb[r] / ca[r]
                k_se = abs(dp) * rho * math.sqrt(2.0) * se / (1.0 - rho) ** 2
                plausible = r not in doubtful or 0.5 * k_now <= k <= 2.0 * k_now
                if k >= 0.0 and math.isfinite(k) and k >= FIT_Z * k_se and plausible:
                    found.append(k)
        if not found or (len(found) > 1 and max(found) > 2.0 * max(min(found), K_FLOOR)):
            return None
        k = statistics.median(found)
        self.fits.append(k)
        return k

    @property
    def weights(self) -> Tuple[float, ...]:
        """Each dimension's share of the shardable work: the median of the measured ones, else the prior."""
        if not self.weight_fits:
            return self.prior_weights
        if self._weights[0] != len(self.weight_fits):  # read every step, fitted once a plan: kept until a new fit
            self._weights = (len(self.weight_fits), tuple(statistics.median(w[d] for w in self.weight_fits)
                                                          for d in range(len(self.prior_weights))))
        return self._weights[1]

    def fit_across(self, fractions: Sequence[Sequence[float]], window: Sequence[Any],
                   healthy: Sequence[int], se: Optional[float] = None) -> None:
        """``k`` and the dimensions' weights from one window, across the ``healthy`` ranks (equal speeds):
        ``c_r = α + Σ_d β_d·x_{r,d}`` (``x_{r,d}`` the rank's fraction of dimension ``d``'s units) by least
        squares, ``w_d ∝ β_d`` and ``k = α/Σ_d β_d``; nothing when the plan does not vary enough among
        them or a weight does not clear :data:`FIT_Z` standard errors.  ``se``: the window is a plan's
        first few steps, read before its full window to follow a rank's recovery sooner; a reading's error
        is then at least ``se``, the relative error of a median of those steps (the residuals of a few
        steps can be small by chance), and ``α`` must clear as many standard errors too, for a rank that
        holds nothing is read through it alone.

        Where the window says nothing, the healthy ranks' readings of every plan read so far do
        (:attr:`readings`): ``c = α + β·p`` over them, ``p`` a reading's share under the weights in use, and
        ``k = α/β`` (:attr:`pooled`, the same tests).  A TP group of two has one healthy rank in a window,
        and a plan that moves units off one rank gives the others nearly the same share, but over a run the
        same healthy speed is read at many shares."""
        c, _ = median_times(window)
        plan = tuple(tuple(f) for f in fractions)
        for r in healthy:
            self.readings[plan, r] = c[r]  # a plan read again: its latest reading
        dims = len(self.prior_weights)
        if len(healthy) >= dims + 2:
            found = _regress([[1.0, *fractions[r]] for r in healthy], [c[r] for r in healthy], se)
            if found is not None:  # else a weight (or R, on first steps) within the fit's noise
                alpha, beta = found[0], found[1:]
                self.weight_fits.append(tuple(float(b / beta.sum()) for b in beta))
                self.fits.append(alpha / float(beta.sum()))
                return
        w = self.weights
        rows = [(weighted_share(w, plan[r]), t) for (plan, r), t in self.readings.items()]
        if len(rows) > 2 and max(p for p, _ in rows) - min(p for p, _ in rows) >= MIN_SHARE_CHANGE:
            found = _regress([[1.0, p] for p, _ in rows], [t for _, t in rows], se)
            if found is not None:
                self.pooled = float(found[0] / found[1])

    def scale(self) -> Tuple[float, float]:
        """``(R, S)`` with ``R + S/e = 1``."""
        S = 1.0 / (self.k + 1.0 / self.tp)
        return self.k * S, S

    def calibrate(self, then: Sequence[float], before: Sequence[float], now: Sequence[float],
                  after: Sequence[float]) -> bool:
        """A move from shares ``then`` to ``now`` measured at one set of speeds (each rank's compute
        ``before`` and ``after`` it): every rank it emptied keeps its own replicated work ``R_r`` (module
        docstring), within :data:`CALIBRATION` of ``R``, where its work before the move was mostly shardable (a
        rank that held little was read through ``R``: its ``R_r`` would be ``R``'s error again); ``True`` when it
        kept one."""
        R, S, kept = *self.scale(), False
        for r, (a, b, ca, cb) in enumerate(zip(then, now, before, after)):
            seen = (R + S * a) / max(ca, 1e-12) * cb
            if S * a >= R and b == 0.0 and R / CALIBRATION <= seen <= CALIBRATION * R:
                self.replicated_at[r], kept = seen, True
        return kept

    def reseat(self, now: Sequence[float], before: Sequence[float], after: Sequence[float], ranks) -> None:
        """A move to shares ``now`` measured at one set of speeds seated ``ranks``, each empty before it (every rank's
        compute ``before`` and ``after`` it), and they alone changed the slow set: each keeps its own replicated work
        ``R_r = v_r·c_r``, ``v_r`` its speed read holding units and ``c_r`` its compute while empty (module docstring)."""
        speeds = self.speeds(now, after)
        for r in ranks:
            self.replicated_at[r] = speeds[r] * before[r]

    def speeds(self, shares: Sequence[float], compute: Sequence[float]) -> Tuple[float, ...]:
        """``v_r = (R + S·p_r)/c_r``.  A rank holding no unit is read through its replicated work alone
        (``R``, or its own where a move measured it: :meth:`calibrate`), so ``k``'s error scales its speed
        by as much (``k`` read 3x too high reads it 3x fast, and the ranks holding units as slow beside it):
        it is read no faster than the fastest of two or more ranks holding units, whose readings rest on
        the work they do (one holder may itself be the slow rank, and tells nothing)."""
        R, S = self.scale()
        own = self.replicated_at
        speeds = [(R + S * p if p > 0.0 else own.get(r, R)) / max(c, 1e-12)
                  for r, (p, c) in enumerate(zip(shares, compute))]
        holders = [v for v, p in zip(speeds, shares) if p > 0.0]
        if len(holders) < 2:
            return tuple(speeds)
        return tuple(v if p > 0.0 else min(v, max(holders)) for v, p in zip(speeds, shares))

    def slowest(self, compute: Sequence[float], shares: Sequence[float]) -> float:
        """The measured step's compute: its slowest rank's, or its slowest holder's with :attr:`idle_free`."""
        return max(c for c, p in zip(compute, shares) if p > 0.0 or not self.idle_free)

    def model(self, shares: Sequence[float], c: Sequence[float]) -> StepModel:
        """The step model of every rank's compute ``c`` (the window's reading), measured under ``shares``."""
        R, S = self.scale()
        return StepModel(speeds=self.speeds(shares, c), replicated=R, shardable=S, idle_free=self.idle_free)

    def from_ratios(self, ratios: Sequence[float]) -> StepModel:
        """A model from speed ratios alone (a probe before any step), in healthy even steps."""
        R, S = self.scale()
        return StepModel(speeds=tuple(ratios), replicated=R, shardable=S, idle_free=self.idle_free)
