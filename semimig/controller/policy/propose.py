"""The plan the policy proposes for a step model (DESIGN §8): whole units per paired dimension, a rank
possibly holding none of a kind.

A rank's share of the shardable work under plans ``(P_d)`` with weights ``w_d`` is
``p_r = Σ_d w_d·n_{d,r}/U_d / Σ_d w_d`` (:func:`shares`).  The ranks meet at every layer's reduction, so a
plan's step is taken dimension by dimension (:func:`plan_step`): each dimension's layers, with their share
of the replicated work, at their slowest rank, ``Σ_d ω_d·max_r (R + S·n_{d,r}/U_d)/v_r`` (``ω_d = w_d/Σw``),
which is the step model's ``max_r (R + S·p_r)/v_r`` when every dimension gives each rank the same share
(the joint planner's model, :mod:`semimig.sharding.jobmodel`).  The proposal is the best, by that step, of
the plan solved per dimension (:func:`~semimig.sharding.solve_plan`) and its joint roundings
(each dimension in turn handed out around the others' solved units, each unit to the rank that finishes
it soonest); the even plan when that best does not beat it by ``margin`` (the step model's own error
would eat a smaller gain) or when no rank is slow (what is left between the ranks is noise).

Seats.  A rank holding a unit of a dimension takes part in every reduction of its layers, and a
reduction runs at the pace of its slowest member (each member moves and sums its part of the tensor
at its own speed; a rank holding none only receives the sum, :mod:`semimig.comm.holders`).  With
``b`` the reductions' seconds of one dimension among full-speed ranks, the layers' collectives take
``b·Σ_d 1/min_{r seated in d} v_r`` (``v`` relative to the fastest rank), the vocabulary's collectives
one more such group (every rank's, or only the holders' where a rank holding nothing skips the step):
:func:`seat_scale` is that sum.  Measured as ``m`` under the plan in force (:func:`seat_reading`), a plan ``P`` changes the step by
``m·(seat_scale(P) − seat_scale(now))/seat_scale(now)`` (:func:`seat_delta`), and every candidate
also comes with each slow rank unseated from one dimension or from all of them (its units handed to
the others, each to the rank that finishes it soonest).  One unit gives a slow rank a seat in all of
its dimension's reductions: it is worth it only where the compute it takes off the others beats the
pace it sets.

Idle ranks.  Where a rank holding nothing skips the step (the model's ``idle_free``), the step is the
slowest holder's, a discontinuity the per-dimension solver cannot see: each slow rank emptied, and all
of them together, are candidates too.  Among the candidates within ``margin`` of the best (the step
model's own resolution) the one seating the slow ranks in the fewest dimensions is taken: before a plan
is measured its reductions are not priced, and an emptied rank sits in none.
"""
from __future__ import annotations

import dataclasses
import functools
import statistics
from typing import AbstractSet, Optional, Sequence, Tuple

from semimig.controller.policy.stepmodel import weighted_share
from semimig.sharding.jobmodel import seat_scale
from semimig.sharding.plan import ShardPlan
from semimig.sharding.solver import StepModel, solve_plan, soonest_first

__all__ = ["shares", "plan_step", "healthy_step", "even_plans", "propose", "pooled", "seat_scale", "seat_reading", "seat_delta"]


def shares(weights: Sequence[float], plans: Sequence[ShardPlan]) -> Tuple[float, ...]:
    """``p_r`` of each rank under ``plans`` (module docstring)."""
    return _shares(tuple(weights), tuple(plans))


@functools.lru_cache(maxsize=64)
def _shares(weights: Tuple[float, ...], plans: Tuple[ShardPlan, ...]) -> Tuple[float, ...]:
    """:func:`shares` (the plan in force's are read several times a step)."""
    per = [p.shares() for p in plans]
    return tuple(weighted_share(weights, [s[r] for s in per]) for r in range(plans[0].tp))


def plan_step(model: StepModel, weights: Sequence[float], plans: Sequence[ShardPlan],
              memo: Optional[dict] = None) -> float:
    """``Σ_d ω_d·max_r (R + S·n_{d,r}/U_d)/v_r`` (module docstring), over the ranks holding some unit where
    a rank holding none skips the step (``model.idle_free``); ``memo``: each dimension's term already read for
    ``model`` and ``weights`` (a term depends on its own plan alone unless ranks holding none skip)."""
    total, idle_free = sum(weights), model.idle_free
    ranks = [r for r in range(model.tp) if any(p.units[r] > 0 for p in plans)] if idle_free else range(model.tp)
    if memo is None or idle_free:
        return sum([_step_term(model, w / total, p, ranks) for w, p in zip(weights, plans)])
    terms = []
    for d, (w, p) in enumerate(zip(weights, plans)):
        found = memo.get((d, p))
        if found is None:
            found = memo[d, p] = _step_term(model, w / total, p, ranks)
        terms.append(found)
    return sum(terms)


def _step_term(model: StepModel, omega: float, plan: ShardPlan, ranks: Sequence[int]) -> float:
    """One dimension's term of :func:`plan_step`, ``ω_d·max_r (R + S·n_{d,r}/U_d)/v_r`` over ``ranks``."""
    R, S, v, s = model.replicated_work, model.shardable, model.speeds, plan.shares()  # model.rank_time, inline
    return omega * max([(R[r] + S * s[r]) / v[r] for r in ranks])


def healthy_step(model: StepModel) -> float:
    """The even plan's step with every rank at ``model``'s fastest speed."""
    tp = len(model.speeds)
    return StepModel(speeds=(max(model.speeds),) * tp, replicated=model.replicated,
                     shardable=model.shardable).step((1.0 / tp,) * tp)


def pooled(model: StepModel, slow: AbstractSet[int]) -> StepModel:
    """``model`` with every rank outside ``slow`` at their median speed: the slow set's test found them
    alike within the noise, so what is left between them is noise, and a plan solved on it would move
    units between healthy ranks to fit it."""
    healthy = [v for r, v in enumerate(model.speeds) if r not in slow]
    if len(healthy) < 2:
        return model
    common = statistics.median(healthy)
    return dataclasses.replace(model, speeds=tuple(v if r in slow else common for r, v in enumerate(model.speeds)))


def even_plans(plans: Sequence[ShardPlan]) -> Optional[Tuple[ShardPlan, ...]]:
    """Every rank an equal part of each dimension; ``None`` when some dimension does not divide."""
    return _even(tuple((p.total_units, p.tp, p.unit_size) for p in plans))


@functools.lru_cache(maxsize=64)
def _even(dims: Tuple[Tuple[int, int, int], ...]) -> Optional[Tuple[ShardPlan, ...]]:
    """:func:`even_plans` of dimensions ``(total_units, tp, unit_size)`` (read every step: made once)."""
    if not all(total % tp == 0 for total, tp, _ in dims):
        return None
    return tuple(ShardPlan.even(total, tp, unit_size=size) for total, tp, size in dims)


def seat_reading(window: Sequence, plans: Sequence[ShardPlan]) -> float:
    """``m``, the layers' reductions under ``plans`` as a window of steps measured them: per step the least
    time in collectives of the ranks seated in some dimension, less its wait in the data-parallel gradient
    reduction where a step tells that apart (no seat sets that), the median over the window (0 with none).

    A member's time in a reduction is its wait for the last member to arrive plus the transfer at the
    pace the seats set; the last to arrive waits least, so the least over the members bounds the
    transfer from above without the wait for a slow rank's compute, which no seat causes (a fast
    rank's own reading holds that wait and would price every seat at it)."""
    seated = [r for r in range(len(plans[0].units)) if any(p.units[r] > 0 for p in plans)]
    if not seated or not window:
        return 0.0
    every = len(seated) == len(plans[0].units)
    return statistics.median([(min(s.comm_s) if every else min([s.comm_s[r] for r in seated])) if s.dp_wait_s is None
                              else min([s.comm_s[r] - s.dp_wait_s[r] for r in seated]) for s in window])


def seat_delta(speeds: Sequence[float], now: Sequence[ShardPlan], plans: Sequence[ShardPlan], comm: float, *,
               idle_free: bool = False, here: Optional[float] = None, memo: Optional[dict] = None) -> float:
    """Seconds ``plans`` add to the step's collectives against ``now``, measured at ``comm`` (module docstring;
    ``idle_free``: a rank holding nothing skips the step, and the vocabulary's collectives with it; ``here``:
    ``seat_scale`` of ``now``, and ``memo`` its terms at ``speeds``, where the caller prices many plans against it)."""
    if comm <= 0.0:
        return 0.0
    here = seat_scale(speeds, now, idle_free=idle_free) if here is None else here
    if here <= 0.0:
        return 0.0  # a lone holder: what it measured is no reduction's pace, so nothing to scale from
    return comm * (seat_scale(speeds, plans, idle_free=idle_free, memo=memo) - here) / here


def propose(model: StepModel, plans: Sequence[ShardPlan], weights: Sequence[float], *, slow: bool,
            min_units: int, margin: float, unseat: AbstractSet[int] = frozenset(),
            comm: float = 0.0) -> Tuple[ShardPlan, ...]:
    """The proposal for ``model`` from the dimensions of ``plans`` (module docstring); ``slow``: some
    rank is slow; ``unseat``: the slow ranks a candidate may take out of a dimension's reductions,
    ``comm`` the seconds those reductions measure under ``plans`` (0: seats not weighed)."""
    return _propose(model, tuple(plans), tuple(weights), bool(slow), min_units, margin, frozenset(unseat), comm)


@functools.lru_cache(maxsize=8)
def _propose(model: StepModel, plans: Tuple[ShardPlan, ...], weights: Tuple[float, ...], slow: bool, min_units: int,
             margin: float, unseat: AbstractSet[int], comm: float) -> Tuple[ShardPlan, ...]:
    """:func:`propose`, a function of its arguments: a bet's proposal and its decision's ask one question."""
    even = even_plans(plans)
    if even is not None and not slow:
        return even
    solved = tuple(solve_plan(model, total_units=p.total_units, unit_size=p.unit_size, min_units=min_units)
                   for p in plans)
    # a candidate reached twice is priced once: its first place is kept, so ties resolve as in the full list
    memo: dict = {}  # one rounding of a dimension around the same others, reached from several candidates
    candidates = _distinct([solved] + [solved[:d] + (_around(model, solved, weights, d, min_units),) + solved[d + 1:]
                                       for d in range(len(solved))])
    if min_units == 0 and comm > 0.0:
        candidates = _distinct(candidates + [c for base in candidates for r in sorted(unseat)
                                             for c in _unseated(model, base, weights, r, memo)])
    if min_units == 0 and model.idle_free:  # a slow rank emptied skips the step: it bounds none
        sets = [[r] for r in sorted(unseat)] + ([sorted(unseat)] if len(unseat) > 1 else [])
        for ranks in sets:
            emptied = solved
            for r in ranks:
                emptied = _unseated(model, emptied, weights, r, memo)[-1] if any(p.units[r] for p in emptied) else emptied
            candidates.append(emptied)
        candidates = _distinct(candidates)
    cost = _Prices(model, weights, plans, comm)
    priced = [(cost(c), c) for c in candidates]
    best_cost, best = min(priced, key=lambda pc: pc[0])
    if model.idle_free and unseat:  # within the margin: the fewest seats of the slow ranks (module docstring)
        # ``or [best]``: seats measured longer than the compute can price a candidate below 0 s, under its margin
        close = [pc for pc in priced if pc[0] <= best_cost * (1.0 + margin)] or [(best_cost, best)]
        best_cost, best = min(close, key=lambda pc: (sum(p.units[r] > 0 for p in pc[1] for r in unseat), pc[0]))
    if even is not None and best_cost * (1.0 + margin) >= cost(even):
        return even
    return best


class _Prices:
    """What :func:`_propose` ranks a candidate by: ``plan_step + seat_delta`` against the plan in force ``now``,
    each dimension's step term and each plan's seat term read once for all the candidates holding that plan,
    and summed as :func:`plan_step` and :func:`seat_delta` sum them (the same floats).  Where a rank holding
    none skips the step (``idle_free``) a step term depends on every dimension: a candidate is priced whole."""

    def __init__(self, model: StepModel, weights: Sequence[float], now: Sequence[ShardPlan], comm: float) -> None:
        self.model, self.weights, self.now, self.comm = model, weights, now, comm
        self.here = seat_scale(model.speeds, now, idle_free=model.idle_free) if comm > 0.0 else None  # scaled once
        total = sum(weights)
        self.omegas, self.ranks = [w / total for w in weights], range(model.tp)
        self.steps: dict = {}  # (dimension, plan): its step term
        self.seats: dict = {}  # plan: its seat term

    def __call__(self, plans: Tuple[ShardPlan, ...]) -> float:
        model, comm = self.model, self.comm
        if model.idle_free:
            return plan_step(model, self.weights, plans) + seat_delta(model.speeds, self.now, plans, comm,
                                                                      idle_free=True, here=self.here, memo=self.seats)
        terms = []
        for key in enumerate(plans):
            found = self.steps.get(key)
            if found is None:
                found = self.steps[key] = _step_term(model, self.omegas[key[0]], key[1], self.ranks)
            terms.append(found)
        if comm <= 0.0:
            return sum(terms) + 0.0
        return sum(terms) + comm * (seat_scale(model.speeds, plans, memo=self.seats) - self.here) / self.here


def _distinct(candidates: list) -> list:
    """``candidates`` with each plan at its first place only."""
    return list(dict.fromkeys(candidates))


def _unseated(model: StepModel, plans: Tuple[ShardPlan, ...], weights: Sequence[float],
              rank: int, memo: Optional[dict] = None) -> list[Tuple[ShardPlan, ...]]:
    """``plans`` with ``rank`` out of one dimension, for each dimension it holds units of, and out of all of them."""
    held = [d for d, p in enumerate(plans) if p.units[rank] > 0]
    out = [plans[:d] + (_around(model, plans, weights, d, 0, skip=rank, memo=memo),) + plans[d + 1:] for d in held]
    if len(held) > 1:  # out of every one in turn: the first step is the first candidate's
        every = out[0]
        for d in held[1:]:
            every = every[:d] + (_around(model, every, weights, d, 0, skip=rank, memo=memo),) + every[d + 1:]
        out.append(every)
    return out


def _around(model: StepModel, plans: Tuple[ShardPlan, ...], weights: Sequence[float], d: int,
            floor: int, skip: Optional[int] = None, memo: Optional[dict] = None) -> ShardPlan:
    """Dimension ``d``'s units, each to the rank that finishes it soonest on top of the other
    dimensions' shares in ``plans`` (at least ``floor`` each; ``skip``: a rank given none; ``memo``: the
    roundings already made for ``model``, ``weights`` and plans of the same dimensions, by what they depend on)."""
    if memo is not None:
        key = (plans[:d], plans[d + 1:], d, floor, skip)
        found = memo.get(key)
        if found is None:
            found = memo[key] = _around(model, plans, weights, d, floor, skip)
        return found
    total, plan, tp = sum(weights), plans[d], plans[d].tp
    count = plan.total_units
    unit = weights[d] / total / count
    held = [0] * tp  # Σ_{q≠d} w_q·s_{q,r}, summed in dimension order
    for q, (w, p) in enumerate(zip(weights, plans)):
        if q != d:
            held = [h + w * x for h, x in zip(held, p.shares())]
    lowest = floor * unit
    base = [h / total + lowest for h in held]
    handed = soonest_first(model, base, unit, [r for r in range(tp) if r != skip], count - floor * tp)
    return ShardPlan(units=tuple(floor + n for n in handed) if floor else tuple(handed), unit_size=plan.unit_size)
