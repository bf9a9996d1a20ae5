"""Plans in which a rank holds zero units of a kind (DESIGN §8): the pure parts, single process.

The solver: with ``min_units = 0`` (the default) a rank whose ``t·v_r − R < 0`` is pinned at share 0
and rounds to no unit; its time is then ``R/v_r``.  At tp 4 with 8 KV groups and one rank 8× slower
(``R + S/4 = 1``, ``R = 0.05``): ``t = 4/3.125 = 1.28``, ``p_slow = (1.28/8 − 0.05)/3.8 < 1/8``; one
unit would cost it ``8·(0.05 + 3.8/8) = 4.2``, none ``8·0.05 = 0.4``, while the others hold ``3, 3, 2``
units and take ``0.05 + 3.8·3/8 = 1.475``.  The layout helpers (offsets, cuts, gathers, move
schedules) treat an empty shard as an interval of length 0.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semimig.errors import ConfigError
from semimig.sharding import ShardPlan, StepModel, continuous_shares, fit_step_model, predicted_step, solve_plan
from semimig.sharding.move import move_schedule
from semimig.sharding.split import (PARTS, SPLIT_DIM, gather, gather_packed, packed_shard_functions, shard,
                                    shard_packed, split_attention)

SLOW_8X = (1.0, 1.0, 1.0, 0.125)


def test_a_plan_may_give_a_rank_zero_units():
    plan = ShardPlan(units=(3, 0, 5), unit_size=4)
    assert plan.sizes == (12, 0, 20) and plan.offsets() == (0, 12, 12)
    assert [plan.column_range(r) for r in range(3)] == [(0, 12), (12, 12), (12, 32)]
    assert plan.shares() == (3 / 8, 0.0, 5 / 8) and not plan.is_even and plan.total_units == 8
    with pytest.raises(ConfigError, match=r"units=\(0, 0\) hold no unit at all"):
        ShardPlan(units=(0, 0))
    with pytest.raises(ConfigError, match=r"units\[0\] must be an int >= 0, got -1"):
        ShardPlan(units=(-1, 3))


def test_an_8x_slower_rank_at_tp_4_gets_no_kv_group_when_the_replicated_work_is_small():
    model = StepModel.normalised(SLOW_8X, replicated_share=0.05)
    shares = continuous_shares(model)
    assert 0.0 < shares[3] < 1 / 8 and sum(shares) == pytest.approx(1.0, abs=1e-12)  # less than one unit's worth
    zero = solve_plan(model, total_units=8)
    assert zero.units == (3, 3, 2, 0) and zero.total_units == 8
    assert predicted_step(model, zero) == pytest.approx(0.05 + 3.8 * 3 / 8, rel=1e-12)
    kept = solve_plan(model, total_units=8, min_units=1)
    assert kept.units[3] == 1 and kept.total_units == 8
    assert predicted_step(model, kept) == pytest.approx(8 * (0.05 + 3.8 / 8), rel=1e-12)
    even = ShardPlan.even(8, 4)
    assert predicted_step(model, zero) < predicted_step(model, kept) < predicted_step(model, even) == 8.0
    # deterministic: the same numbers give the same plan, and the time of the empty rank is R / v
    assert all(solve_plan(model, total_units=8) == zero for _ in range(3))
    assert model.rank_time(3, 0.0) == pytest.approx(0.4)


def test_a_rank_that_can_afford_a_unit_keeps_one():
    model = StepModel.normalised((1.0, 1.0, 1.0, 0.5), replicated_share=0.05)
    assert continuous_shares(model)[3] > 1 / 8
    assert solve_plan(model, total_units=8).units[3] >= 1


def test_pinned_ranks_follow_the_closed_form():
    # two ranks at 1/8 with R large: both pinned at 0 once t·v_r < R; the rest share S
    model = StepModel(speeds=(1.0, 1.0, 0.125, 0.125), replicated=0.5, shardable=2.0)
    shares = continuous_shares(model)
    t = (2.0 + 2 * 0.5) / 2.0  # the free ranks alone: (S + |A|·R) / Σ_A v
    assert shares[2] == shares[3] == 0.0
    assert shares[0] == pytest.approx((t - 0.5) / 2.0) and shares[1] == pytest.approx(0.5)
    assert solve_plan(model, total_units=16).units == (8, 8, 0, 0)


@settings(max_examples=200, deadline=None)
@given(speeds=st.lists(st.floats(min_value=0.05, max_value=1.0), min_size=2, max_size=8),
       rho=st.floats(min_value=0.0, max_value=0.9), total=st.integers(1, 64))
def test_zero_floor_plans_sum_to_the_total_and_no_single_move_helps(speeds, rho, total):
    model = StepModel.normalised(speeds, replicated_share=rho)
    plan = solve_plan(model, total_units=total)
    assert plan.total_units == total and min(plan.units) >= 0
    assert solve_plan(model, total_units=total) == plan
    best = predicted_step(model, plan)
    for src, dst in itertools.permutations(range(model.tp), 2):
        if plan.units[src] > 0:
            moved = list(plan.units)
            moved[src] -= 1
            moved[dst] += 1
            assert best <= model.step([n / total for n in moved]) * (1 + 1e-12)
    assert best <= predicted_step(model, solve_plan(model, total_units=total, min_units=min(1, total // model.tp))) \
        * (1 + 1e-12)


def test_fit_step_model_reads_a_rank_holding_nothing():
    plan = ShardPlan(units=(4, 0))
    truth = StepModel(speeds=(1.0, 0.25), replicated=0.2, shardable=1.6)
    a = [truth.replicated / v for v in truth.speeds]
    b = [truth.shardable * p / v for p, v in zip(plan.shares(), truth.speeds)]
    fitted = fit_step_model(a, b, plan)
    assert fitted.replicated == pytest.approx(truth.replicated) and fitted.shardable == pytest.approx(truth.shardable)
    assert fitted.speeds == pytest.approx(truth.speeds)


# ----------------------------------------------------------------------------- cuts, gathers, moves
def test_cuts_and_gathers_with_an_empty_shard():
    full = torch.arange(6 * 5, dtype=torch.float32).reshape(6, 5)
    plan = ShardPlan(units=(0, 2, 1), unit_size=2)
    pieces = [shard(full, plan, r, dim=0) for r in range(3)]
    assert [tuple(p.shape) for p in pieces] == [(0, 5), (4, 5), (2, 5)]
    assert torch.equal(gather(pieces, plan, dim=0), full)
    parts, plans = [6, 3], [plan, ShardPlan(units=(0, 2, 1))]
    packed = torch.arange(9 * 2, dtype=torch.float32).reshape(9, 2)
    per_rank = [shard_packed(packed, parts, plans, r, dim=0) for r in range(3)]
    assert [p.shape[0] for p in per_rank] == [0, 6, 3]
    assert torch.equal(gather_packed(per_rank, parts, plans, dim=0), packed)
    shard_fn, gather_fn = packed_shard_functions(parts, plans, 0, dim=0)
    assert getattr(shard_fn, PARTS) == getattr(gather_fn, PARTS) == (6, 3)
    assert getattr(gather_fn, SPLIT_DIM) == 0


def test_an_attention_rank_with_no_kv_group_holds_no_head():
    d, h = 4, 16
    q, k, v, o = torch.randn(8 * d, h), torch.randn(4 * d, h), torch.randn(4 * d, h), torch.randn(h, 8 * d)
    part = split_attention(q, k, v, o, ShardPlan(units=(4, 0), unit_size=2 * d), 1, head_dim=d)
    assert (part.num_heads, part.num_kv_heads) == (0, 0)
    assert part.q.shape == (0, h) and part.k.shape == (0, h) and part.o.shape == (h, 0)


@pytest.mark.parametrize("old, new", [((2, 2, 2, 2), (4, 0, 2, 2)), ((4, 0, 2, 2), (0, 2, 2, 4)),
                                      ((0, 8, 0, 0), (2, 2, 2, 2))])
def test_move_schedules_to_and_from_a_rank_holding_nothing(old, new):
    full = torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3)
    a, b = ShardPlan(units=old), ShardPlan(units=new)
    before = [shard(full, a, r, dim=0) for r in range(4)]
    after = [torch.full((n, 3), -1.0) for n in new]
    for piece in move_schedule([a], [b]):
        assert piece.length > 0 and old[piece.src] > 0 and new[piece.dst] > 0
        after[piece.dst][piece.dst_offset:piece.dst_offset + piece.length] = \
            before[piece.src][piece.src_offset:piece.src_offset + piece.length]
    assert all(torch.equal(after[r], shard(full, b, r, dim=0)) for r in range(4))
