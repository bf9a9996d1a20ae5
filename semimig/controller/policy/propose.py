"""The plan the policy proposes for a step model (DESIGN §8): whole units per paired dimension, a rank
possibly holding none of a kind.

A rank's share of the shardable work under plans ``(P_d)`` with weights ``w_d`` is
``p_r = Σ_d w_d·n_{d,r}/U_d / Σ_d w_d`` (:func:`shares`).  The proposal is the best, on the step
model, of the plan solved per dimension (:func:`~semimig.sharding.solve_plan`) and its joint roundings
(each dimension in turn handed out around the others' solved units, each unit to the rank that finishes
it soonest); the even plan when that best does not beat it by ``margin`` (the step model's own error
would eat a smaller gain) or when no rank is slow (what is left between the ranks is noise).
"""
from __future__ import annotations

import heapq
import statistics
from typing import AbstractSet, Optional, Sequence, Tuple

from semimig.sharding.plan import ShardPlan
from semimig.sharding.solver import StepModel, solve_plan

__all__ = ["shares", "even_plans", "propose", "pooled"]


def shares(weights: Sequence[float], plans: Sequence[ShardPlan]) -> Tuple[float, ...]:
    """``p_r`` of each rank under ``plans`` (module docstring)."""
    total, tp = sum(weights), plans[0].tp
    return tuple(sum(w * p.shares()[r] for w, p in zip(weights, plans)) / total for r in range(tp))


def pooled(model: StepModel, slow: AbstractSet[int]) -> StepModel:
    """``model`` with every rank outside ``slow`` at their median speed: the slow set's test found them
    alike within the noise, so what is left between them is noise, and a plan solved on it would move
    units between healthy ranks to fit it."""
    healthy = [v for r, v in enumerate(model.speeds) if r not in slow]
    if len(healthy) < 2:
        return model
    common = statistics.median(healthy)
    return StepModel(speeds=tuple(v if r in slow else common for r, v in enumerate(model.speeds)),
                     replicated=model.replicated, shardable=model.shardable)


def even_plans(plans: Sequence[ShardPlan]) -> Optional[Tuple[ShardPlan, ...]]:
    """Every rank an equal part of each dimension; ``None`` when some dimension does not divide."""
    if not all(p.total_units % p.tp == 0 for p in plans):
        return None
    return tuple(ShardPlan.even(p.total_units, p.tp, unit_size=p.unit_size) for p in plans)


def propose(model: StepModel, plans: Sequence[ShardPlan], weights: Sequence[float], *, slow: bool,
            min_units: int, margin: float) -> Tuple[ShardPlan, ...]:
    """The proposal for ``model`` from the dimensions of ``plans`` (module docstring); ``slow``: some
    rank is slow."""
    even = even_plans(plans)
    if even is not None and not slow:
        return even
    solved = tuple(solve_plan(model, total_units=p.total_units, unit_size=p.unit_size, min_units=min_units)
                   for p in plans)
    candidates = [solved] + [solved[:d] + (_around(model, solved, weights, d, min_units),) + solved[d + 1:]
                             for d in range(len(solved))]
    best = min(candidates, key=lambda c: model.step(shares(weights, c)))
    if even is not None and model.step(shares(weights, best)) * (1.0 + margin) >= model.step(shares(weights, even)):
        return even
    return best


def _around(model: StepModel, plans: Tuple[ShardPlan, ...], weights: Sequence[float], d: int,
            floor: int) -> ShardPlan:
    """Dimension ``d``'s units, each to the rank that finishes it soonest on top of the other
    dimensions' shares in ``plans`` (at least ``floor`` each)."""
    total, plan, tp = sum(weights), plans[d], plans[d].tp
    unit = weights[d] / total / plan.total_units
    base = [sum(w * p.shares()[r] for q, (w, p) in enumerate(zip(weights, plans)) if q != d) / total + floor * unit
            for r in range(tp)]
    units = [floor] * tp
    heap = [(model.rank_time(r, base[r] + unit), r) for r in range(tp)]
    heapq.heapify(heap)
    for _ in range(plan.total_units - floor * tp):
        _, r = heapq.heappop(heap)
        units[r] += 1
        heapq.heappush(heap, (model.rank_time(r, base[r] + (units[r] - floor + 1) * unit), r))
    return ShardPlan(units=tuple(units), unit_size=plan.unit_size)
