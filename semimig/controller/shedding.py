"""Who sheds work, and how much, from the timing models of every rank (DESIGN §3a; paper Eq. 1).

Pure and deterministic: every rank feeds the same all-gathered observations into the same
:class:`ShedPolicy`, so every rank holds the same decision.  Per decision, with ``S_i``, ``f_i``,
``σ_i`` the estimates of :mod:`semimig.controller.timing`:

Evidence (no phantom stragglers).  ``S_fast = min_j S_j`` (ties: lowest rank).  ``S`` is a median
over the ``n`` observations of the window and a rank's noise is relative (``σ_j / S_j``: a slower
device is noisier in absolute terms), so the test is on a log scale, where the standard error of
``ln S_j`` is ``ε_j = 1.2533 (σ_j / S_j) / sqrt(n_j)`` (the median of normal samples).  Rank ``i``
looks slow when

    ln(S_i / S_fast) > max( ln(1 + tol) ,  noise_sigmas · sqrt(ε_i² + ε_fast²) )

and looks normal when the log ratio is below half that margin (hysteresis).  For a small
imbalance this is the linear test ``S_i − S_fast > noise_sigmas · (standard errors)``; on an
absolute scale the margin grows with ``S_i`` itself, so at 43 % relative noise (a loaded
machine) no ratio at all could flag a rank, not even one 4.5x slower.  It is *flagged* after
``patience`` consecutive slow-looking decisions and unflagged after ``patience`` normal-looking
ones.  The fast path: when the rank's or the fastest rank's timing model declared a change point
within the last ``patience`` observations (``react_steps > 0``, :mod:`semimig.controller.timing`;
that change already took ``react_steps`` consecutive observations beyond its own noise), the rank
is flagged at once when ``ln(S_i / S_fast) > max(ln(1 + change_ratio), change_sigmas ·
hypot(σ_ln,i, σ_ln,fast))`` (both ranks' log-noise) and unflagged at once below half that; so a
throttle that switches on or off is acted on ``react_steps`` observations after it switched, with
hysteresis — except for a rank whose ended slow regimes lasted a median of at most
``short_burst`` observations: a rise flags it, by this path or its patience, only once it
outlasts that median plus ``react_steps`` and while its latest observation has not already left
it downward (the plan would arrive as such a burst ends; the step reflex serves it).  In the
run's first ``2·patience`` observations (no change point yet) a rank is
flagged at once when every observation of its window lies beyond twice that band: a device slow
from the first step has no change to show, and is slow at every step, where a loaded machine's
warm-up delays some of them.
A shedding rank whose own regime just turned faster is unflagged when the smallest ``S`` its
possible ``f`` gives (``RankEstimate.unpruned_low_s``) lies within the half band: its
dense-equivalent time rests on ``f`` (a few points off at γ 0.9 move it by a fifth), and dense it
is measured directly — flagged again if it still straggles.  The fast path has its own band
because the standard error of a median of a few observations of a loaded machine's heavy-tailed
noise can otherwise hold even a 12x slower rank unflagged (a ``scope=device`` burst on a heavily
overloaded machine).  The unpruned time ``S`` is the reference of every
comparison, so ranks that prune never drag the reference down and fast ranks never look slow.

Shed share (Eq. 1 with a fixed cost).  A flagged rank should finish in ``T_ref``, the time the
rest of the group needs: in modes semi and mig ``T_ref = max_r S_r · max(1, w_r)`` over the
unflagged ranks ``r`` (``T_min`` of paper IV-B while nobody migrates; once columns migrate, the
receivers' time with their extra columns, so a migrating straggler does not shed past the point
where its receivers become the bottleneck: with one straggler of time ``S_k`` and ``e − 1``
receivers of time ``S_r`` the fixed point is ``S_k(1 − m) = S_r(1 + m/(e − 1))``); in mode zero
the mean ``S`` of the unflagged ranks (``zero_reference="mean"``, the fixed point of the paper's
group average) or their minimum.  Solving
``S_i (f_i + (1 − f_i) w) = T_ref`` for the kept work ``w``,

    γ_i = clamp( 1 − (T_ref / S_i − f_i) / (1 − f_i) ,  0 ,  γ_max )

which is the paper's ``(T_i − T_ref) / M_i`` with ``M_i = (1 − f_i) S_i`` the time that scales with
the kept columns.

The rest of a rank's own work.  ``S`` and ``T_ref`` are GEMM time (the busy meter's), but the step
waits for every rank's whole own work: a whole slow device (DESIGN §5) is slow at its norms,
attention core and optimizer step too, which no column shed shrinks.  So when the ranks report
``O_r``, the seconds of their own work outside the timed GEMMs (the device clock's compute minus
busy time, median over recent iterations), a flagged rank aims its GEMM time at

    T_ref,i = T_ref + O_ref − O_i           (O_ref: the median O of the unflagged ranks)

so that its whole work ends with theirs; below ``f_i S_i`` that asks for more than shedding can
give, and γ_i goes to ``γ_max``.  For a straggler slow only at its GEMMs (the paper's, ``scope=gemm``)
``O_i ≈ O_ref`` and nothing changes.  For a whole slow device (a CPU throttle, ``scope=device``) the
term matters: without it the straggler's GEMM time is balanced while its step stays ~1.5x
healthy's, because its slower optimizer step and other work are not in ``S``.

Under an uneven plan.  Given each rank's ``baseline`` ``B_r`` (its busy seconds measured under an
uneven shard plan, :meth:`ReshardPolicy`-settled), the runtime feeds the timing models ``busy_r / s_r``
with ``s_r = B_r / min B``, so at its baseline every rank reads ``B_min``: a rank is compared with its
own baseline, and ``S_fast`` is at least ``B_min``.  A rank that got faster than its baseline (a
throttle lifting under a plan made for it) thus makes no other rank look slow: the plan no longer
fits, which re-sharding answers exactly, and a lossy shed cannot.  A flagged rank aims at the others'
*real* times, ``T_ref`` taken over ``S_r·s_r`` (seconds) and divided by its own ``s_i``, never below
its baseline (``B_min`` in its units): it sheds only what its own slowdown added, and nothing while
the others' real times are longer than its own.  Without a baseline (even shards) ``s_r = 1`` and
nothing changes.

``γ_i`` moves only by steps of at least ``gamma_step`` (with regimes, at least half the regime
test's same-work band, so the test keeps a baseline at the rank's work).  Unflagged ranks: 0.

Shedding must pay.  Once a rank's ``f`` has been fitted from iterations at reduced work and has
exceeded ``max_fixed_fraction`` for ``patience`` consecutive decisions, shedding saves less than
half of its proportional share (small layers, where the gather's fixed cost dominates, or a
slower pruned path): the rank backs off to 0 for ``backoff_iterations · 2^(k−1)`` decisions at
its ``k``-th back-off, is logged, and may try again afterwards if it still straggles.
"""
from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass, field
from typing import Optional, Sequence

from semimig.controller.config import ControllerConfig
from semimig.controller.timing import SAME_WORK, RankEstimate

__all__ = ["RankState", "ShedDecision", "ShedPolicy"]

logger = logging.getLogger(__name__)


@dataclass
class RankState:
    """Evidence bookkeeping of one rank (mutable, identical on every rank)."""

    flagged: bool = False
    streak: int = 0
    """Consecutive decisions that contradict ``flagged`` (slow-looking while not flagged, or
    normal-looking while flagged)."""
    shed: float = 0.0
    unpaid: int = 0
    """Consecutive decisions at which shedding did not pay (see the module docstring)."""
    backoff_until: int = -1
    backoffs: int = 0


@dataclass(frozen=True)
class ShedDecision:
    """One decision for the whole group (identical on every rank)."""

    iteration: int
    shed: tuple[float, ...]
    """Shed share per rank (Eq. 1), 0 for ranks that do not straggle."""
    flagged: tuple[int, ...]
    """Stragglers, slowest first (by ``S``), ties by rank."""
    unpruned_s: tuple[float, ...]
    """``S_i`` of every rank (seconds); NaN where a rank has no estimate yet."""
    fixed_fraction: tuple[float, ...]
    reference_s: float
    """``T_ref`` the stragglers aim at (NaN before every rank has an estimate)."""
    backed_off: tuple[int, ...] = ()
    """Ranks that straggle but do not prune because pruning did not pay (see module docstring)."""
    events: tuple[str, ...] = field(default=(), compare=False)
    """What changed at this decision (flagged, unflagged, backed off), for logs."""
    other_s: tuple[float, ...] = ()
    """``O_r`` of every rank (seconds of own work outside the timed GEMMs; NaN where unknown), as
    given to :meth:`ShedPolicy.decide`; empty when none were."""


def _log_median_error(est: RankEstimate) -> float:
    """Standard error of ``ln`` of a median of ``n`` observations of relative noise ``σ / S``
    (``1.2533 σ / sqrt(n)`` for normal samples, divided by ``S``)."""
    if not est.unpruned_s > 0.0:
        return 0.0
    return 1.2533 * (est.noise_s / est.unpruned_s) / math.sqrt(est.observations)


def _log_ratio(est: RankEstimate, s_fast: float) -> float:
    return _log_ratio_of(est.unpruned_s, s_fast)


def _log_ratio_of(s: float, s_fast: float) -> float:
    return math.log(s / s_fast) if s > 0.0 and s_fast > 0.0 else 0.0


def _log_band(cfg: ControllerConfig, est: RankEstimate, fast: RankEstimate) -> float:
    """The fresh-regime test's band on a log scale: ``max(ln(1 + change_ratio), change_sigmas ·
    hypot(σ_ln,i, σ_ln,fast))`` — both ranks' noise, since both times are measured."""
    if not math.isfinite(est.change_margin):
        return math.inf
    return max(math.log1p(cfg.change_ratio), cfg.change_sigmas * math.hypot(est.log_noise, fast.log_noise))


class ShedPolicy:
    """The evidence state machine of the module docstring, for a group of ``size`` ranks."""

    def __init__(self, size: int, config: ControllerConfig, *, fixed_shed: Optional[float] = None,
                 mode: Optional[str] = None, baseline: Optional[Sequence[float]] = None) -> None:
        """``fixed_shed``: a flagged rank sheds this share instead of Eq. 1 (PriDiff-E's empirical γ);
        ``mode``: the plan mode it decides for (``config.mode`` unless given: the runtime's phase may
        act in another than the configured one); ``baseline``: each rank's busy seconds under the
        uneven plan in force (module docstring, "Under an uneven plan"), ``None`` on even shards."""
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        if baseline is not None and (len(baseline) != size or not all(b > 0.0 for b in baseline)):
            raise ValueError(f"baseline must hold {size} positive seconds, got {baseline!r}")
        low = min(baseline) if baseline is not None else 1.0
        self.scale = tuple(b / low for b in baseline) if baseline is not None else (1.0,) * size
        """``s_r``: what the timing models' busy times were divided by."""
        self.floor = low if baseline is not None else 0.0
        """``B_min``: a rank at its baseline, in the timing models' units (0: no baseline)."""
        self.size = size
        self.config = config
        self.mode = config.mode if mode is None else mode
        self.fixed_shed = fixed_shed
        self.states = [RankState() for _ in range(size)]

    def decide(self, iteration: int, estimates: Sequence[Optional[RankEstimate]],
               other_s: Optional[Sequence[float]] = None) -> ShedDecision:
        """Update the evidence with ``estimates`` (one per rank) and return the shed shares;
        ``other_s``: each rank's seconds of own work outside the timed GEMMs (module docstring, "The
        rest of a rank's own work"; NaN where unknown), or ``None``."""
        if len(estimates) != self.size:
            raise ValueError(f"expected {self.size} estimates, got {len(estimates)}")
        others = () if other_s is None else tuple(float(o) for o in other_s)
        if others and len(others) != self.size:
            raise ValueError(f"expected {self.size} other_s, got {len(others)}")
        cfg = self.config
        unpruned = tuple(math.nan if e is None else e.unpruned_s for e in estimates)
        fixed = tuple(math.nan if e is None else e.fixed_fraction for e in estimates)
        if any(e is None or max(e.seen, e.observations) < min(cfg.patience, cfg.window) for e in estimates) \
                or self.size == 1:
            return ShedDecision(iteration, tuple(s.shed for s in self.states), self._flagged(unpruned), unpruned,
                                fixed, math.nan, other_s=others)
        fast = min(range(self.size), key=lambda r: (unpruned[r], r))
        s_fast, error_fast = max(unpruned[fast], self.floor), _log_median_error(estimates[fast])
        events = []
        for r, (state, est) in enumerate(zip(self.states, estimates)):
            log_margin = max(math.log1p(cfg.tol), cfg.noise_sigmas * math.hypot(_log_median_error(est), error_fast))
            excess = _log_ratio(est, s_fast)
            contradicts = excess <= 0.5 * log_margin if state.flagged else excess > log_margin
            margin = math.expm1(log_margin) * s_fast  # for the log line: the excess in seconds it took
            state.streak = state.streak + 1 if contradicts else 0
            if not state.flagged and self._short_burst(est):
                continue  # a burst the plan cannot follow: the step reflex serves it
            if state.streak >= cfg.patience or self._at_once(state.flagged, est, estimates[fast], s_fast):
                state.flagged, state.streak = not state.flagged, 0
                events.append(f"rank {r} {'straggles' if state.flagged else 'no longer straggles'}: "
                              f"unpruned {est.unpruned_s * 1e3:.3g} ms vs fastest {s_fast * 1e3:.3g} ms "
                              f"(margin {margin * 1e3:.2g} ms)")
        reference = self._reference(estimates, s_fast * self.scale[fast])  # real seconds, as other_ref
        other_ref = self._other_reference(others)
        backed = []
        for r, (state, est) in enumerate(zip(self.states, estimates)):
            if not state.flagged:
                state.shed = 0.0
                continue
            if iteration < state.backoff_until:
                state.shed = 0.0
                backed.append(r)
                continue
            unpaid = state.shed > 0.0 and est.informed and est.work < 1.0 and est.fixed_fraction > cfg.max_fixed_fraction
            state.unpaid = state.unpaid + 1 if unpaid else 0
            if state.unpaid >= cfg.patience:
                state.backoffs, state.unpaid = state.backoffs + 1, 0
                length = cfg.backoff_iterations * 2 ** (state.backoffs - 1)
                state.backoff_until, state.shed = iteration + length, 0.0
                backed.append(r)
                events.append(f"rank {r}: shedding work does not pay (a fixed fraction {est.fixed_fraction:.2f} > "
                              f"{cfg.max_fixed_fraction:g} of its busy time does not shrink with the columns it "
                              f"keeps); dense for {length} iterations")
                continue
            own = others[r] * self.scale[r] if others else math.nan
            aim = reference + other_ref - own if math.isfinite(other_ref) and math.isfinite(own) else reference
            target = self._target(est, max(aim / self.scale[r], self.floor) if self.floor > 0.0 else aim)
            # with regimes, γ holds within half the regime test's same-work band, so a rank keeps
            # running at one work fraction and the test can see its speed change (a throttle lifting)
            step = max(cfg.gamma_step, 0.5 * SAME_WORK) if math.isfinite(est.change_margin) else cfg.gamma_step
            if abs(target - state.shed) >= step or target in (0.0, cfg.gamma_max) or state.shed == 0.0:
                state.shed = target
        for event in events:
            (logger.warning if "does not pay" in event else logger.info)("iteration %d: %s", iteration, event)
        return ShedDecision(iteration, tuple(s.shed for s in self.states), self._flagged(unpruned), unpruned, fixed,
                            reference, tuple(backed), tuple(events), other_s=others)

    def _at_once(self, flagged: bool, est: RankEstimate, fast: RankEstimate, s_fast: float) -> bool:
        """The fast path: whether the rank's flag turns at this decision without its patience."""
        cfg = self.config
        band, ratio = _log_band(cfg, est, fast), _log_ratio(est, s_fast)
        own_fall = est.change_direction < 0 and est.regime_age <= cfg.patience
        fresh = min(est.regime_age, fast.regime_age) <= cfg.patience  # of this rank or of the fastest
        if flagged:
            # a fresh regime back within half the band
            if fresh and ratio <= 0.5 * band:
                return True
            # a shedding rank whose own time just fell (a throttle lifted) is released when the
            # smallest S its f may give lies within the half band: its dense-equivalent time rests
            # on f, and a few points off at high γ move it by a fifth (f 0.19 for 0.25 at w = 0.1:
            # 1.19x; unknown, T/w may overstate it 2x); dense, it is measured directly and is
            # flagged again if it still straggles
            low = _log_ratio_of(est.unpruned_low_s, s_fast) if math.isfinite(est.unpruned_low_s) else ratio
            return own_fall and est.work < 1.0 and low <= 0.5 * band
        # a fresh regime beyond both ranks' log-noise, unless it is this rank's own fall (it just
        # got faster)
        if fresh and ratio > band and not own_fall:
            return True
        # the opening: a rank slow from the first step has no regime change to show, so its first
        # decisions flag it when every one of its steps lies beyond twice the band (2.25x at the
        # default) instead of waiting out the patience (4 decisions: the 4-5x steps of a device slow
        # from the start); a device slow from the start is slow at every step, while a loaded
        # machine's warm-up delays some of them
        fastest = est.fastest_s if math.isfinite(est.fastest_s) else est.unpruned_s
        return est.regime_age > est.seen and est.seen <= 2 * cfg.patience and ratio > 2.0 * band \
            and _log_ratio_of(fastest, s_fast) > 2.0 * band

    def _short_burst(self, est: RankEstimate) -> bool:
        """A rise of a rank whose ended slow regimes lasted a median of at most ``short_burst``
        observations, while the new one is no longer than that median plus ``react_steps`` (a dense
        fall takes that many observations to declare, and the regime's median stays slow
        meanwhile) or its latest observation already left it downward (the burst is ending; a plan
        made then would arrive as the burst ends and prune the free steps after it)
        (:attr:`ControllerConfig.short_burst`)."""
        return (est.change_direction > 0 and est.burst_length <= self.config.short_burst
                and (est.regime_age <= est.burst_length + self.config.react_steps or est.leaving < 0))

    def forgive(self, rank: int) -> None:
        """Undo ``rank``'s latest back-off (it will shed again at the next decision with evidence):
        the runtime changes how the rank sheds (mode semi: resizing only) instead of going dense."""
        state = self.states[rank]
        if state.backoff_until >= 0:
            state.backoff_until, state.backoffs = -1, max(0, state.backoffs - 1)
        state.unpaid = 0

    def _reference(self, estimates: Sequence[RankEstimate], s_fast: float) -> float:
        """``T_ref`` in real seconds (the unflagged ranks' ``S_r·s_r``; ``s_fast`` already real)."""
        normal = [(est, scale) for est, state, scale in zip(estimates, self.states, self.scale) if not state.flagged]
        if not normal:
            return s_fast
        if self.mode == "zero":
            if self.config.zero_reference == "mean":
                return math.fsum(est.unpruned_s * scale for est, scale in normal) / len(normal)
            return min(est.unpruned_s * scale for est, scale in normal) if self.floor > 0.0 else s_fast
        return max(est.unpruned_s * scale * max(1.0, est.work) for est, scale in normal)

    def _other_reference(self, others: Sequence[float]) -> float:
        """``O_ref``: the median real ``O`` of the unflagged ranks that report one (NaN: none does)."""
        values = [o * scale for o, state, scale in zip(others, self.states, self.scale)
                  if not state.flagged and math.isfinite(o)]
        return statistics.median(values) if values else math.nan

    def _target(self, est: RankEstimate, reference: float) -> float:
        if self.fixed_shed is not None:
            return min(self.fixed_shed, self.config.gamma_max)
        work = est.work_for(reference)
        return float(min(max(1.0 - work, 0.0), self.config.gamma_max))

    def _flagged(self, unpruned: Sequence[float]) -> tuple[int, ...]:
        flagged = [r for r, s in enumerate(self.states) if s.flagged]
        return tuple(sorted(flagged, key=lambda r: (-unpruned[r], r)))
