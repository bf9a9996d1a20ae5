"""Each rank's busy time as a function of the work it keeps, estimated from observations (DESIGN §3a).

Per rank and iteration the runtime observes ``(w, T)``:

    w   work fraction: FLOPs the rank computed / its unbalanced FLOPs (1 dense, < 1 when it pruned
        or handed columns away, > 1 for a migration receiver)
    T   measured busy time: its own GEMMs with gathers, index copies, imputation and any injected
        delay; never time blocked in collectives

(and ``O``, its own work outside the timed GEMMs in the iteration: :data:`OTHER_WINDOW`) and models,
on the rank's current speed,

    T(w) = S · ( f + (1 − f) · w )        for w ≤ 1 (own work, possibly pruned)
    T(w) = S · w                          for w > 1 (a receiver's extra columns are plain GEMMs)

``S`` is the rank's *unpruned* time (its busy time at ``w = 1``) and ``f`` the fixed fraction of the
balanced path — the part that does not shrink with the kept columns (gathers, copies, launches,
host work).  The paper's Eq. 1 assumes ``f = 0``; dividing a measured time by the kept fraction
under that assumption inflates ``S`` the more a rank prunes whenever ``f > 0``, so here:

    f  least squares ``T_k = a + b·w_k`` over the window's observations with ``w_k ≤ 1`` (dense
       ones included: pruning is judged against the dense path), ``f = a / (a + b)`` clamped to
       ``[0, 1]``; refitted only while the window holds an observation at full work (``w = 1``)
       and the ``w_k`` spread by at least ``MIN_SPREAD``, otherwise the last fit (or the prior, 0)
       is kept — a rank pruning steadily keeps its ``f``.  The dense anchor matters: from points
       at one work fraction only ``S·(f + (1 − f)·w)`` is identified, and a line through two
       nearby pruned clusters (``w`` = 0.22 and 0.1 while Eq. 1 raises γ) extrapolates the busy
       times' relative noise to ``w = 1`` amplified by about ``1/Δw`` (15 % noise over
       ``Δw ≈ 0.1`` puts ``f`` anywhere in its range), enough to back a real straggler off to dense
       (a phantom "does not pay").  So ``f`` — a property of the code path and the shapes — is fitted
       in the iterations right after the rank starts pruning, and ``S`` alone follows its speed.
    S  ``median_k T_k / (f + (1 − f)·w_k)`` over the last ``window`` observations: robust to a
       descheduled iteration, and it follows a change of speed within ``window / 2`` iterations
       whatever the rank is pruning meanwhile (an injected or real slowdown scales every term).
    σ  the rank's noise: ``1.4826 · median |S_k / S_(k) − 1| · S`` over the last ``NOISE_HISTORY``
       observations, each ``S_k`` compared with the window median ``S_(k)`` current when it
       arrived — relative, so a change of speed does not read as noise, and over a longer
       history than the window, so a few quiet iterations do not shrink the noise band.

Regimes (a straggler that comes and goes).  A throttle that switches on or off changes ``S`` by a
factor at one iteration; a median over ``window`` observations follows it only after ``window / 2``
of them.  With ``react_steps = k > 0`` every observation is first tested against the current
regime: with ``S_j`` the dense-equivalent time of observation ``j`` (``T_j / (f + (1 − f)·w_j)``,
``f`` as it stood before the observation), a *change point* is declared when the last ``k``
observations all lie beyond ``(1 + m)`` times (or below ``1 / (1 + m)`` times) the median ``S`` of
the regime's earlier observations at the same work (``|w − w_j| ≤ SAME_WORK``; a slowdown only
after ``2·window`` observations, so warm-up iterations start nothing and the noise below is known; a
speed-up after ``window``: a throttle present from the first step that lifts within ``2·window``
still meets a change point, where otherwise γ would only decay as the window's median follows, or
stay above 0 for long where ``f`` had been fitted across the lift; the opening flags such a rank,
the speed-up releases it), with

    m = max( change_ratio ,  exp(change_sigmas · σ_ln) − 1 )

``σ_ln`` the rank's noise on a log scale, from the median of ``|ln(S_j / S_(j−1))|`` over
successive observations at the same work (a change of level adds one large step to that history,
not a run of them, so a throttle during the warm-up does not widen the band for long).

Comparing at the same work makes the test independent of ``f`` (a pruned rank whose ``f`` is not
yet known does not look like a changed speed), and it needs at least ``MIN_BASELINE`` such earlier
observations.  Where the regime has none (a throttle shorter than a window: the regime holds its
dense observations, then the rank prunes and the throttle lifts, and γ would fall only as fast as
the window's median follows), the regime's observations at any work are
the baseline, and the test compares bounds over the ``f`` the rank may have (``f ± F_TOLERANCE``
once fitted, ``[0, 1]`` before): faster only when the observation's largest dense-equivalent
lies below the baseline's smallest by the margin, slower only the other way round, so a wrong
``f`` alone never makes a change.  The run of ``k`` is compared with the regime before the run
(its own first observations are not its baseline).  At a change point the window restarts with
the ``k`` observations of the new regime: ``S`` is their median at once (so γ is sized from the
measured ratio within ``k`` iterations), ``f`` is refitted from the new regime only (it keeps its
value where the new regime has no dense anchor: ``f`` belongs to the code path, not to the
speed).  A *sharp* fall of a rank that sheds (``w < 1``) needs no run: one observation at least
``(1 + m)²`` times below the regime's observations at the same work (2.25x at the default; a χ = 4
throttle lifting reads 4x; never across work, where it would rest on ``f``) is a change point on its
own, so a pruned rank whose throttle lifted is released one decision after its first free step, not
``k`` (with the run, each burst's end would prune ``k`` more free steps at the burst's γ).
A wrong release costs little: the step reflex prunes a slow step from its second slow call, while a
late one prunes steps a healthy rank did not need to.  A *sudden* rise is the same on the way up,
for an observation that carries the rank's own evidence from within the step (``sudden``: its step
reflex fired, :mod:`semimig.controller.reflex`, on consecutive slow layer calls that together made
a tenth of a step — never one descheduled call): at least ``(1 + m)²`` above the regime at the same
work, it is a change point on its own, so the plan prunes from the third throttled step instead of
the fifth (the all-gather's lag is the rest): until the plan prunes, each throttled step runs at
the reflex's pace, above the plan's, and a plan that arrives late may arrive as a short throttle
lifts and prune free steps.  Other slowdowns keep the run of ``k`` (a descheduled step is slow).
``regime_age`` (observations since the last change point; ``change_direction`` says
whether the rank got slower or faster there) lets the policy act at once on a fresh,
significant regime instead of waiting out its ``patience``.  Noise alone needs ``k`` consecutive
excursions beyond ``m`` in the same direction (with 15 % normal noise ``m = exp(0.6) − 1``, a 4σ
excursion: about ``(3·10⁻⁵)^k`` per iteration; a loaded machine's heavy tail is what ``k`` and the
policy's band against the other ranks are for) and, even then, only restarts the median;
whether a rank is flagged is still decided against the other ranks with the noise band.

Everything here is pure float arithmetic on the observations in a fixed order, so every rank of a
group, fed the same all-gathered observations, holds the same estimates (the plan depends on them).
"""
from __future__ import annotations

import collections
import math
import numbers
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

from semimig._fit import line_fit

__all__ = ["MIN_SPREAD", "OTHER_WINDOW", "RankEstimate", "RankTiming", "dense_equivalent", "fit_fixed_fraction",
           "observation_problem"]

SAME_WORK = 0.15
"""Work fractions this close count as the same work for the change test."""
MIN_BASELINE = 2
"""Earlier observations of the regime at the same work the change test needs."""

F_TOLERANCE = 0.05
"""How far a fitted ``f`` may be off, for the change test across work fractions."""

MIN_SPREAD = 0.05
"""Smallest spread of the work fractions in the window for which ``f`` is refitted."""
NOISE_HISTORY = 64
"""Relative deviations kept for the noise estimate."""
MIX_TOLERANCE = 0.1
"""A fitted line whose intercept is below this share of its full-work time mixes two speeds."""
OTHER_WINDOW = 3
"""Observations whose median is a rank's ``O`` (its own work outside the timed GEMMs,
:attr:`RankTiming.other_s`).  Short: a throttle that switches on slows ``O`` at once, and the aim
follows within two observations (a median over the timing window's 7 would need four, and the
rank would shed too little until then); a median of three still passes over one spike (an
evaluation, a checkpoint between steps).  And ``O`` restarts with the regime at a change point, as
``S`` does: a sudden rise (the step reflex's evidence) restarts ``S`` from one observation, and the
reflex's own step posts no ``O`` (its GEMMs were not all timed), so without the restart ``O`` would
keep the free phase's median for two more steps.  (An ``f`` not yet fitted in the new regime, the
prior 0, holds γ low in those first steps too.)"""
BURST_HISTORY = 5
"""Ended slow regimes whose lengths give :attr:`RankEstimate.burst_length`."""
_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation


@dataclass(frozen=True)
class RankEstimate:
    """The model of one rank after its latest observation."""

    unpruned_s: float
    """``S``: busy time at full work on the rank's current speed (seconds)."""
    fixed_fraction: float
    """``f`` in ``[0, 1]``: share of ``S`` that pruning does not remove."""
    noise_s: float
    """Robust standard deviation of the per-observation ``S_k`` (seconds)."""
    informed: bool
    """True once ``f`` was fitted from observations at two or more work fractions."""
    observations: int
    """Observations in the window."""
    work: float
    """The latest work fraction."""
    seen: int = 0
    """Observations ever kept (the window may have restarted at a change point)."""
    regime_age: int = 10**9
    """Observations since the latest change point (huge when none was ever declared)."""
    change_margin: float = math.inf
    """``m`` of the regime test (relative; ``inf`` without regimes)."""
    log_noise: float = 0.0
    """``σ_ln`` of the regime test (0 without regimes)."""
    change_direction: int = 0
    """+1 when the latest change point found the rank slower, -1 faster, 0 before any."""
    unpruned_low_s: float = math.nan
    """The smallest ``S`` the window's observations allow over the ``f`` the rank may have (the
    median dense-equivalent at the range's largest ``f``; ``S`` itself where every observation is
    dense).  NaN when not computed."""
    burst_length: float = math.inf
    """The median length, in observations, of the rank's latest slow regimes (a rise later ended by
    a fall), over the last ``BURST_HISTORY`` of them; ``inf`` until two have ended."""
    leaving: int = 0
    """-1 / +1 when the latest observation left the regime downward / upward without (yet) making
    a change point (the first of a possible run), 0 inside it or at a change point."""
    fastest_s: float = math.nan
    """The smallest dense-equivalent time of the window (NaN when not computed)."""

    def time_at(self, work: float) -> float:
        """Predicted busy time at work fraction ``work``."""
        if work > 1.0:
            return self.unpruned_s * work
        return self.unpruned_s * (self.fixed_fraction + (1.0 - self.fixed_fraction) * work)

    def work_for(self, target_s: float) -> float:
        """The work fraction ``w <= 1`` whose predicted time is ``target_s`` (may be < 0 or > 1)."""
        variable = 1.0 - self.fixed_fraction
        if variable <= 0.0 or self.unpruned_s <= 0.0:
            return 1.0 if target_s >= self.unpruned_s else -math.inf
        return (target_s / self.unpruned_s - self.fixed_fraction) / variable


def dense_equivalent(busy_s: float, work: float, fixed_fraction: float) -> float:
    """Busy seconds at full work from ``busy_s`` measured at work fraction ``work``:
    ``T / (f + (1 − f)·w)`` for ``w ≤ 1`` (the fixed part ``f`` does not shrink with the kept
    columns), ``T / w`` above 1 (a receiver's migrated columns scale whole)."""
    if work > 1.0:
        return busy_s / work
    return busy_s / (fixed_fraction + (1.0 - fixed_fraction) * work)


def observation_problem(work: float, busy_s: float) -> Optional[str]:
    """``None`` when ``(w, T)`` observes the rank's speed, else why it does not (it is then skipped).

    Not observations: a non-finite ``w`` or ``T`` (a NaN loss can make every GEMM produce NaN, a
    broken clock inf; acting on them would shed work for nothing), ``T <= 0`` (nothing timed), and
    ``w <= 0``: a rank that kept no column (a forced full prune, ``γ = 1``) computed nothing, so its
    time is the fixed part ``S·f`` alone and says nothing about ``S`` while ``f`` is unknown.
    """
    if not (isinstance(work, numbers.Real) and isinstance(busy_s, numbers.Real)):
        return f"not numbers (w={work!r}, T={busy_s!r})"
    if not (math.isfinite(work) and math.isfinite(busy_s)):
        return f"non-finite measurement (w={work!r}, T={busy_s!r} s)"
    if work <= 0.0:
        return f"no work kept (w={work!r}): a full prune times only the fixed part"
    if busy_s <= 0.0:
        return f"no busy time (T={busy_s!r} s)"
    return None


def fit_fixed_fraction(points: Sequence[tuple[float, float]]) -> Optional[float]:
    """``f = a / (a + b)`` of the least-squares line ``T = a + b·w`` through ``points`` (w ≤ 1).

    ``None`` when the work fractions spread by less than :data:`MIN_SPREAD`, the line predicts
    no positive time at full work, or its intercept is below ``−MIX_TOLERANCE`` of that time: the
    time fell more than in proportion to the work, which no fixed fraction does — the points mix
    two speeds (dense steps of a throttle and pruned steps after it lifted; fitted as ``f = 0``,
    every free pruned step would read ``1/w`` times slow).  A slope ``b <= 0`` (pruning did not make the rank faster) gives
    ``f = 1``; a slightly negative intercept (noise about ``f = 0``) gives ``f = 0``.
    """
    if len(points) < 2:
        return None
    ws = [w for w, _ in points]
    if max(ws) - min(ws) < MIN_SPREAD:
        return None
    intercept, slope = line_fit(ws, [t for _, t in points])
    full = intercept + slope
    if full <= 0.0:
        return None
    if slope <= 0.0:
        return 1.0
    if intercept < -MIX_TOLERANCE * full:
        return None
    return min(1.0, max(0.0, intercept / full))


class RankTiming:
    """The timing model of one rank: a window of observations and the estimates of the docstring."""

    def __init__(self, window: int, *, prior_fixed_fraction: float = 0.0, react_steps: int = 0,
                 change_ratio: float = 0.5, change_sigmas: float = 4.0) -> None:
        """``react_steps``: ``k`` of the regime test in the module docstring (0: no regimes, one
        sliding window); ``change_ratio``, ``change_sigmas``: its margin ``m``."""
        if window < 3:
            raise ValueError(f"window must be >= 3, got {window}")
        if not 0.0 <= prior_fixed_fraction <= 1.0:
            raise ValueError(f"prior_fixed_fraction must be in [0, 1], got {prior_fixed_fraction}")
        if not 0 <= react_steps < window:
            raise ValueError(f"react_steps must be in [0, window={window}), got {react_steps}")
        if not (change_ratio > 0.0 and change_sigmas >= 0.0):
            raise ValueError(f"change_ratio must be > 0 and change_sigmas >= 0, got {change_ratio}, {change_sigmas}")
        self.react_steps, self.change_ratio, self.change_sigmas = react_steps, change_ratio, change_sigmas
        self.seen, self.regime_age, self.changes, self.change_direction = 0, 10**9, 0, 0
        self.leaving = 0
        self.window = window
        self.prior_fixed_fraction = prior_fixed_fraction
        self.fixed_fraction = prior_fixed_fraction
        self.informed = False
        self._obs: collections.deque = collections.deque(maxlen=window)
        self._other: collections.deque = collections.deque(maxlen=min(OTHER_WINDOW, window))
        self._deviations: collections.deque = collections.deque(maxlen=NOISE_HISTORY)
        self._steps: collections.deque = collections.deque(maxlen=NOISE_HISTORY)
        """``|ln(S_k / S_(k−1))|`` of successive observations at the same work: the regime test's
        noise.  A change of level adds one large step, not a run of large deviations (a throttle
        during the warm-up would otherwise inflate the noise band for the next 64 iterations)."""
        self._bursts: collections.deque = collections.deque(maxlen=BURST_HISTORY)
        """Lengths (observations) of the latest slow regimes, each a rise that a fall ended."""

    def observe(self, work: float, busy_s: float, *, sudden: bool = False, other_s: float = math.nan) -> bool:
        """Add one iteration's ``(w, T)`` if it is an observation (:func:`observation_problem`).

        ``sudden``: the rank's own step reflex found it slowing within this iteration (its
        evidence of consecutive slow calls; the module docstring's sudden rise).  ``other_s``: the
        rank's own work outside the timed GEMMs in the iteration (:attr:`other_s`; NaN: unknown).
        Returns whether it was kept; a skipped pair leaves the model exactly as it was.
        """
        if observation_problem(work, busy_s) is not None:
            return False
        changes = self.changes
        self._observe(work, busy_s, sudden=sudden)
        if self.changes != changes:
            self._other.clear()  # O restarts with the regime, as S does (:data:`OTHER_WINDOW`)
        if math.isfinite(other_s):
            self._other.append(float(other_s))
        return True

    @property
    def other_s(self) -> float:
        """``O``: the median of the rank's latest :data:`OTHER_WINDOW` seconds of own work outside the
        timed GEMMs in the regime in force (NaN: none known)."""
        return statistics.median(self._other) if self._other else math.nan

    def _observe(self, work: float, busy_s: float, *, sudden: bool) -> None:
        self._obs.append((float(work), float(busy_s)))
        self.seen += 1
        self.regime_age += 1
        excursion = self._excursion()
        alone = (excursion == -1 and work < 1.0) or (excursion == 1 and sudden)
        run = 1 if alone and self._sharp(excursion) else self.react_steps
        changed = excursion is not None and (run == 1 or self._changed())
        self.leaving = 0 if changed or excursion is None else excursion
        if changed:
            if excursion == -1 and self.change_direction == 1:
                # the slow regime held every observation since its rise except this run's
                self._bursts.append(self.regime_age - run)
            self._obs = collections.deque(list(self._obs)[-run:], maxlen=self.window)
            self.regime_age, self.changes, self.change_direction = run, self.changes + 1, excursion
        fitted = None
        # f is not refitted across a regime boundary: an observation that left the regime may be
        # the first of a new one (a line through two speeds is no fixed fraction); nor in a regime
        # too young for the change test (fewer than react_steps + MIN_BASELINE observations: it
        # calls every observation "inside"), where a throttle's dense steps and the pruned steps
        # after its lift read as one line through the origin (f = 0: the free pruned steps then
        # read 1/w times slow and would hold the plan through a short throttle's free phases); and only with a dense
        # anchor (see ``f`` in the module docstring)
        young = self.react_steps > 0 and len(self._obs) < self.react_steps + MIN_BASELINE
        if (excursion is None or changed) and not young and any(w == 1.0 for w, _ in self._obs):
            fitted = fit_fixed_fraction([(w, t) for w, t in self._obs if w <= 1.0])
        if fitted is not None:
            self.fixed_fraction, self.informed = fitted, True
        per_obs = self._per_observation()
        if len(self._obs) >= 2 and abs(self._obs[-1][0] - self._obs[-2][0]) <= SAME_WORK:
            self._steps.append(abs(math.log(per_obs[-1] / per_obs[-2])))
        if len(per_obs) >= 3 and excursion is None:  # a step into another regime is not noise
            self._deviations.append(abs(per_obs[-1] / statistics.median(per_obs) - 1.0))

    def _margin(self) -> float:
        """``m`` of the regime test: the relative change that is more than noise."""
        return max(self.change_ratio, math.expm1(self.change_sigmas * self._step_sigma()))

    def _step_sigma(self) -> float:
        """Relative noise from successive steps: median ``|difference of two normals|`` = 0.6745·√2·σ."""
        return _MAD_TO_SIGMA * statistics.median(self._steps) / math.sqrt(2.0) if self._steps else 0.0

    def _direction(self, index: int, run_start: int, margin: Optional[float] = None,
                   same_work_only: bool = False) -> int:
        """+1 / -1 when observation ``index`` of the window lies beyond the margin above / below
        the median of the regime's observations before ``run_start`` at the same work, 0 inside it.

        Without ``MIN_BASELINE`` of them (the rank's work changed since the regime began: a
        throttle shorter than a window leaves a regime of dense observations, then the rank prunes
        and the throttle lifts), the regime's observations at any work are the baseline, compared
        on the bounds of the dense-equivalent over the ``f`` the rank may have (:meth:`_f_range`):
        faster only when the observation's largest dense-equivalent lies below the baseline's
        smallest by the margin, slower only the other way round — never a change that a wrong ``f``
        alone could make.  ``margin``: another ``m`` than the regime test's; ``same_work_only``: 0
        without the same-work baseline (no bounds over ``f``)."""
        obs, per_obs = list(self._obs), self._per_observation()
        w, m = obs[index][0], self._margin() if margin is None else margin
        base = [s for (wb, _), s in zip(obs[:run_start], per_obs[:run_start]) if abs(wb - w) <= SAME_WORK]
        if len(base) >= MIN_BASELINE:
            ratio = per_obs[index] / statistics.median(base)
            return 1 if ratio > 1.0 + m else -1 if ratio < 1.0 / (1.0 + m) else 0
        if run_start < MIN_BASELINE or same_work_only:
            return 0
        low_f, high_f = self._f_range()
        t = obs[index][1]
        earlier = obs[:run_start]
        base_low = statistics.median(dense_equivalent(tb, wb, high_f) for wb, tb in earlier)
        base_high = statistics.median(dense_equivalent(tb, wb, low_f) for wb, tb in earlier)
        if dense_equivalent(t, w, high_f) > base_high * (1.0 + m):
            return 1
        if dense_equivalent(t, w, low_f) < base_low / (1.0 + m):
            return -1
        return 0

    def _f_range(self) -> tuple[float, float]:
        """The fixed fractions the rank may have: ``f ± F_TOLERANCE`` once fitted, ``[0, 1]`` before."""
        if not self.informed:
            return 0.0, 1.0
        return max(0.0, self.fixed_fraction - F_TOLERANCE), min(1.0, self.fixed_fraction + F_TOLERANCE)

    def _excursion(self) -> Optional[int]:
        """The latest observation's direction when it leaves the regime (``None`` inside it)."""
        if self.react_steps == 0 or len(self._obs) <= self.react_steps or self.seen < self.window:
            return None  # before window observations: the first iterations start nothing
        # against the regime before the run a change would start from (what :meth:`_changed`
        # compares with), so the run's own first observations are not its baseline
        direction = self._direction(len(self._obs) - 1, len(self._obs) - self.react_steps)
        if direction > 0 and self.seen < 2 * self.window:
            return None  # a slowdown waits for the noise history of 2·window observations
        return direction or None

    def _sharp(self, direction: int) -> bool:
        """The latest observation alone lies beyond the regime's observations at the same work, in
        ``direction``, by twice the margin on a log scale (``(1 + m)²``: 2.25x at the default).  A
        fall that far is a throttle that lifted, not noise — descheduling makes a step slower, never
        several times faster at the same work; a rise counts only with the reflex's evidence
        (:meth:`observe`'s ``sudden``).  Only at the same work: across work fractions the
        comparison rests on the fitted ``f``, and a wrong one (a fit across a phantom's pruned steps
        at w 0.8 beside dense ones amplifies the noise ~5x) can make a pruned throttled step read
        fast (one device-burst run released mid-burst, its first pruned step with no same-work
        baseline)."""
        n, m = len(self._obs), self._margin()
        return self._direction(n - 1, n - 1, margin=(1.0 + m) ** 2 - 1.0, same_work_only=True) == direction

    def _changed(self) -> bool:
        """All of the last ``react_steps`` observations left the regime, in the same direction."""
        n = len(self._obs)
        directions = {self._direction(i, n - self.react_steps) for i in range(n - self.react_steps, n)}
        return len(directions) == 1 and 0 not in directions

    def carry_history(self, old: "RankTiming") -> None:
        """Continue ``old``'s history on new shapes (a controller rebuilt after a re-plan): its count
        of observations, its noise (the log steps and relative deviations) and the lengths of its
        ended slow regimes (a property of the straggler, not of the shapes), not its observations
        or ``f`` — times and the fixed fraction belong to the old shapes.  So the new window needs
        ``MIN_BASELINE`` observations and the run, not ``2·window`` more, before a slowdown can be a
        change: a fresh model is blind to one for 14 steps at the default, so a throttle that
        returns soon after a re-plan would run unserved at the pace of no balancing at all."""
        self.seen = max(self.seen, old.seen)
        self._steps.extend(old._steps)
        self._deviations.extend(old._deviations)
        self._bursts.extend(old._bursts)

    def forget_reduced_work(self) -> None:
        """Drop the observations at ``w != 1`` and the fitted ``f`` (back to the prior): the rank's
        balanced path changes (mode semi stops migrating), so its old fixed fraction no longer holds."""
        self._obs = collections.deque(((w, t) for w, t in self._obs if w == 1.0), maxlen=self.window)
        self.fixed_fraction, self.informed = self.prior_fixed_fraction, False

    def _per_observation(self) -> list[float]:
        return [dense_equivalent(t, w, self.fixed_fraction) for w, t in self._obs]

    @property
    def observations(self) -> int:
        return len(self._obs)

    def estimate(self) -> Optional[RankEstimate]:
        """The current :class:`RankEstimate`, or ``None`` before the first observation."""
        if not self._obs:
            return None
        f = self.fixed_fraction
        unpruned = statistics.median(self._per_observation())
        high_f = self._f_range()[1]
        unpruned_low = statistics.median(dense_equivalent(t, w, high_f) for w, t in self._obs)
        sigma = _MAD_TO_SIGMA * (statistics.median(self._deviations) if self._deviations else 0.0)
        return RankEstimate(unpruned_s=unpruned, fixed_fraction=f, noise_s=sigma * unpruned,
                            informed=self.informed, observations=len(self._obs), work=self._obs[-1][0],
                            seen=self.seen, regime_age=self.regime_age,
                            change_margin=self._margin() if self.react_steps else math.inf,
                            log_noise=self._step_sigma() if self.react_steps else 0.0,
                            change_direction=self.change_direction, unpruned_low_s=min(unpruned, unpruned_low),
                            burst_length=statistics.median(self._bursts) if len(self._bursts) >= 2 else math.inf,
                            leaving=self.leaving, fastest_s=min(self._per_observation()))
