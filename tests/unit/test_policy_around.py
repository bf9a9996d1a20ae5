"""The joint rounding of one dimension around the others (semimig.controller.policy.propose._around): every
unit to the rank that finishes it soonest.  The units below the continuous level are handed out in one pass
before the unit-by-unit heap; checked against the plain soonest-first order, one unit at a time, on
random speeds, replicated work, plans and floors (the same units per rank, bit for bit)."""
from __future__ import annotations

import heapq
import random

import pytest

from semimig.controller.policy.propose import _around
from semimig.sharding.plan import ShardPlan
from semimig.sharding.solver import StepModel


def _one_at_a_time(model, plans, weights, d, floor, skip=None):
    total, plan, tp = sum(weights), plans[d], plans[d].tp
    unit = weights[d] / total / plan.total_units
    per = [p.shares() for p in plans]
    base = [sum(w * s[r] for q, (w, s) in enumerate(zip(weights, per)) if q != d) / total + floor * unit
            for r in range(tp)]
    units = [floor] * tp
    heap = [(model.rank_time(r, base[r] + unit), r) for r in range(tp) if r != skip]
    heapq.heapify(heap)
    for _ in range(plan.total_units - floor * tp):
        _, r = heapq.heappop(heap)
        units[r] += 1
        heapq.heappush(heap, (model.rank_time(r, base[r] + (units[r] - floor + 1) * unit), r))
    return units


def _random_plan(rng, tp, total):
    cuts = sorted(rng.randint(0, total) for _ in range(tp - 1))
    units = [b - a for a, b in zip([0] + cuts, cuts + [total])]
    return ShardPlan(units=tuple(units)) if sum(units) else ShardPlan.even(total, tp)


@pytest.mark.parametrize("seed", range(100))
def test_the_one_pass_fill_hands_out_the_units_of_the_soonest_first_order(seed):
    rng = random.Random(seed)
    tp = rng.choice([2, 3, 4, 8])
    speeds = tuple(rng.choice([1.0, rng.uniform(0.05, 1.0)]) for _ in range(tp))
    model = StepModel(speeds=speeds, replicated=rng.choice([0.0, rng.uniform(0.0, 0.5)]), shardable=rng.uniform(0.5, 8.0))
    plans = (_random_plan(rng, tp, rng.choice([8, 32, 64])), _random_plan(rng, tp, rng.choice([4, 8, 32])))
    weights = (rng.uniform(0.3, 0.8), rng.uniform(0.1, 0.5))
    d = rng.randrange(2)
    floor = rng.choice([0, 0, 1]) if plans[d].total_units >= tp else 0
    skip = rng.choice([None, rng.randrange(tp)]) if floor == 0 else None
    got = _around(model, plans, weights, d, floor, skip=skip)
    assert list(got.units) == _one_at_a_time(model, plans, weights, d, floor, skip=skip)
    assert got.total_units == plans[d].total_units
