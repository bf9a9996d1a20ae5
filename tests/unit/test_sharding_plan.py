"""ShardPlan validation and the plan solver (DESIGN §8), pure: no process group.

The solver is checked against the closed forms of §8 (two ranks, one χ times slower:
``t/t_healthy = 2χ/(χ+1)`` while ``R ≤ 2/(χ+1)``), against brute force over every whole-unit
plan for small groups, and by property: sums, minimum units, no single-unit move lowers the max.
"""
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semimig.errors import ConfigError
from semimig.sharding import (
    ShardPlan,
    StepModel,
    continuous_shares,
    fit_step_model,
    kv_group_unit,
    predicted_step,
    solve_plan,
    speeds_from_times,
    units_of,
)
from semimig.sharding.split import gather, gather_packed, shard, shard_packed, split_attention, split_mlp

REL = 1e-9  # float64 closed forms: a few ulps of reassociation
speeds_st = st.lists(st.floats(min_value=0.05, max_value=1.0, allow_nan=False), min_size=1, max_size=6)


# ----------------------------------------------------------------------------- the plan
def test_even_plan_is_colossalai_chunk():
    plan = ShardPlan.even(8, 4, unit_size=16)
    assert plan.units == (2, 2, 2, 2) and plan.is_even and plan.dimension == 128
    full = torch.arange(128 * 3).reshape(128, 3)
    for r in range(4):
        assert torch.equal(shard(full, plan, r, dim=0), full.chunk(4, dim=0)[r])
    assert plan.offsets() == (0, 32, 64, 96) and plan.column_range(3) == (96, 128)


def test_offsets_and_ranges_of_an_uneven_plan():
    plan = ShardPlan(units=(5, 1, 2), unit_size=4)
    assert plan.sizes == (20, 4, 8) and plan.offsets() == (0, 20, 24)
    assert [plan.column_range(r) for r in range(3)] == [(0, 20), (20, 24), (24, 32)]
    assert plan.shares() == (5 / 8, 1 / 8, 2 / 8) and not plan.is_even and plan.tp == 3


@pytest.mark.parametrize("units, needle", [
    ((), "units"), ((0, 0), "hold no unit"), ((2, -1), "units[1]"), ((2, 1.5), "units[1]"), ((True, 1), "units[0]"),
    ("12", "units"), (None, "units"),
])
def test_plan_refuses_bad_units(units, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        ShardPlan(units=units)


def test_plan_refusals_name_the_value():
    with pytest.raises(ConfigError, match="unit_size must be an int >= 1, got 0"):
        ShardPlan(units=(1, 1), unit_size=0)
    with pytest.raises(ConfigError, match="total_units=6 is not divisible by the tensor-parallel size tp=4"):
        ShardPlan.even(6, 4)
    with pytest.raises(ConfigError, match=r"units \(3, 2\) sum to 5"):
        ShardPlan.for_dimension((3, 2), dimension=24, unit_size=4)
    with pytest.raises(ConfigError, match="intermediate=30 is not divisible by the unit size 4"):
        units_of("intermediate", 30, 4)
    with pytest.raises(ConfigError, match="num_heads=12 is not divisible by num_kv_heads=5"):
        kv_group_unit(num_heads=12, num_kv_heads=5, head_dim=8)
    with pytest.raises(ConfigError, match="tp=4"):
        ShardPlan(units=(1, 1)).check_tp(4)
    with pytest.raises(ConfigError, match="rank must be an int >= 0 and <= 1, got 2"):
        ShardPlan(units=(1, 1)).column_range(2)
    assert ShardPlan.for_dimension([3, 2], dimension=20, unit_size=4).units == (3, 2)
    assert kv_group_unit(num_heads=12, num_kv_heads=4, head_dim=8) == (24, 8)


def test_split_and_gather_round_trip():
    torch.manual_seed(0)
    plan = ShardPlan(units=(3, 1, 2), unit_size=2)
    wc, bc, wr = torch.randn(12, 5), torch.randn(12), torch.randn(5, 12)
    parts = [split_mlp(wc, bc, wr, plan, r) for r in range(3)]
    assert [p.column_weight.shape for p in parts] == [(6, 5), (2, 5), (4, 5)]
    assert [p.row_weight.shape for p in parts] == [(5, 6), (5, 2), (5, 4)]
    assert torch.equal(gather([p.column_weight for p in parts], plan, dim=0), wc)
    assert torch.equal(gather([p.column_bias for p in parts], plan, dim=0), bc)
    assert torch.equal(gather([p.row_weight for p in parts], plan, dim=1), wr)
    with pytest.raises(ConfigError, match=r"row weight \(5, 10\) must be \[H, I\]"):
        split_mlp(wc, bc, wr[:, :10], plan, 0)
    with pytest.raises(ConfigError, match="shards\\[1\\] has 3"):
        gather([parts[0].column_weight, torch.zeros(3, 5), parts[2].column_weight], plan, dim=0)
    with pytest.raises(ConfigError, match=r"column_weight.shape\[0\]=14 is 7 units of 2"):
        split_mlp(torch.zeros(14, 5), None, torch.zeros(5, 14), plan, 0)


def test_packed_split_and_gather_round_trip():
    """[Q, K, V] with Q twice K and V, one plan per part: rank r holds [Q_r, K_r, V_r]; gathered back exactly."""
    q_plan, kv_plan = ShardPlan(units=(1, 3), unit_size=4), ShardPlan(units=(1, 3), unit_size=2)
    parts, plans = [16, 8, 8], [q_plan, kv_plan, kv_plan]
    full = torch.arange(32 * 3).reshape(3, 32)  # packed along dim 1
    pieces = [shard_packed(full, parts, plans, r, dim=1) for r in range(2)]
    assert torch.equal(pieces[0], torch.cat([full[:, 0:4], full[:, 16:18], full[:, 24:26]], dim=1))
    assert torch.equal(pieces[1], torch.cat([full[:, 4:16], full[:, 18:24], full[:, 26:32]], dim=1))
    assert torch.equal(gather_packed(pieces, parts, plans, dim=1), full)
    with pytest.raises(ConfigError, match=r"parts \[16, 8, 4\] sum to 28"):
        shard_packed(full, [16, 8, 4], plans, 0, dim=1)
    with pytest.raises(ConfigError, match="one plan per part"):
        shard_packed(full, parts, plans[:2], 0, dim=1)


# ----------------------------------------------------------------------------- the solver
@pytest.mark.parametrize("chi", [1.5, 2.0, 4.0, 8.0])
def test_two_ranks_one_chi_slower_reach_the_limit(chi):
    """t/t_healthy = 2χ/(χ+1) whatever R is, as long as R ≤ 2/(χ+1) (§8: 1.6 at χ = 4 while R ≤ 0.4)."""
    limit = 2 * chi / (chi + 1)
    for fraction in (0.0, 0.25, 0.5, 1.0):  # of the largest R the limit holds for
        rho = fraction * 2 / (chi + 1)
        model = StepModel.normalised((1.0, 1.0 / chi), replicated_share=rho)
        shares = continuous_shares(model)
        assert model.step(shares) == pytest.approx(limit, rel=REL)
        assert shares[1] >= -1e-12 and math.isclose(sum(shares), 1.0, rel_tol=REL)
        # both ranks finish together
        assert model.rank_time(0, shares[0]) == pytest.approx(model.rank_time(1, shares[1]), rel=REL)
    if chi == 4.0:
        assert limit == pytest.approx(1.6)


def test_replicated_share_above_the_limit_pins_the_slow_rank():
    """χ = 4, R = 0.5 > 0.4: the slow rank cannot finish R alone in 1.6; it keeps the minimum and sets the step
    (by default none: ``R/v = 2``; with ``min_units=1`` one unit)."""
    model = StepModel.normalised((1.0, 0.25), replicated_share=0.5)
    assert continuous_shares(model) == pytest.approx((1.0, 0.0))
    assert model.step(continuous_shares(model)) == pytest.approx(2.0)
    plan = solve_plan(model, total_units=64)
    assert plan.units == (64, 0)
    assert predicted_step(model, plan) == pytest.approx(0.5 / 0.25)
    plan = solve_plan(model, total_units=64, min_units=1)
    assert plan.units == (63, 1)
    assert predicted_step(model, plan) == pytest.approx((0.5 + 1.0 / 64) / 0.25)


def test_healthy_group_gets_the_even_plan():
    for tp, units in ((2, 16), (4, 8), (8, 64)):
        model = StepModel.normalised((1.0,) * tp, replicated_share=0.3)
        plan = solve_plan(model, total_units=units, unit_size=128)
        assert plan == ShardPlan.even(units, tp, unit_size=128)
        assert predicted_step(model, plan) == pytest.approx(1.0)


def test_fit_speeds_from_measured_times():
    """Times measured under the even plan with rank 1 four times slower give back its speed and the 1.6 plan."""
    rho, even = 0.2, ShardPlan.even(32, 2)
    truth = StepModel.normalised((1.0, 0.25), replicated_share=rho)
    times = [truth.rank_time(r, p) for r, p in enumerate(even.shares())]
    model = speeds_from_times(times, even, replicated=truth.replicated, shardable=truth.shardable)
    assert model.speeds == pytest.approx(truth.speeds)
    plan = solve_plan(model, total_units=32)
    assert plan.units == (28, 4)  # p_slow = (1.6·0.25 − 0.2)/1.6 = 0.125 → 4 of 32
    assert predicted_step(model, plan) == pytest.approx(1.6)


@settings(max_examples=200, deadline=None)
@given(speeds=speeds_st, rho=st.floats(min_value=0.0, max_value=0.9), scale=st.floats(min_value=1e-3, max_value=1e3),
       data=st.data())
def test_fit_from_split_times_recovers_the_model(speeds, rho, scale, data):
    """Per-rank replicated and shardable seconds measured under any plan give back R, S and v (up to the
    scale fixed by R + S/e = 1, here undone by ``scale``), hence a plan as good."""
    truth = StepModel.normalised(speeds, replicated_share=rho)
    e = truth.tp
    units = tuple(data.draw(st.lists(st.integers(1, 9), min_size=e, max_size=e)))
    plan = ShardPlan(units=units)
    a = [scale * truth.replicated / v for v in truth.speeds]
    b = [scale * truth.shardable * p / v for p, v in zip(plan.shares(), truth.speeds)]
    model = fit_step_model(a, b, plan)
    assert model.replicated == pytest.approx(truth.replicated, rel=1e-9, abs=1e-12)
    assert model.shardable == pytest.approx(truth.shardable, rel=1e-9)
    assert model.speeds == pytest.approx(tuple(v / scale for v in truth.speeds), rel=1e-9)
    # the same plan up to ties (ulps apart in the fitted speeds may break them differently): the same step
    fitted, best = solve_plan(model, total_units=32), solve_plan(truth, total_units=32)
    assert predicted_step(truth, fitted) == pytest.approx(predicted_step(truth, best), rel=1e-9)


def test_solver_refusals():
    with pytest.raises(ConfigError, match=r"speeds\[1\] must be a finite number > 0, got 0"):
        StepModel(speeds=(1.0, 0), replicated=0.1, shardable=1.0)
    with pytest.raises(ConfigError, match="shardable must be a finite number > 0, got 0"):
        StepModel(speeds=(1.0,), replicated=0.1, shardable=0)
    with pytest.raises(ConfigError, match="total_units=3 cannot give each of tp=4 ranks min_units=1"):
        solve_plan(StepModel.normalised((1, 1, 1, 1), replicated_share=0.1), total_units=3, min_units=1)
    with pytest.raises(ConfigError, match="min_units must be an int >= 0, got -1"):
        solve_plan(StepModel.normalised((1, 1), replicated_share=0.1), total_units=3, min_units=-1)
    with pytest.raises(ConfigError, match="times must have one entry per rank"):
        speeds_from_times([1.0], ShardPlan.even(2, 2), replicated=0.1, shardable=1.0)
    with pytest.raises(ConfigError, match=r"shardable_times\[1\] must be a finite number > 0, got 0"):
        fit_step_model([0.1, 0.1], [1.0, 0], ShardPlan.even(2, 2))



@settings(max_examples=300, deadline=None)
@given(speeds=speeds_st, rho=st.floats(min_value=0.0, max_value=0.95), extra=st.integers(0, 200),
       min_units=st.integers(0, 3), unit_size=st.integers(1, 64))
def test_rounded_plan_properties(speeds, rho, extra, min_units, unit_size):
    """Sums to the total, every rank ≥ min_units, no single-unit move lowers the max, never worse than the
    continuous optimum by more than one unit of the slowest rank, never worse than even (when even exists)."""
    model = StepModel.normalised(speeds, replicated_share=rho)
    e, total = model.tp, max(1, len(speeds) * min_units + extra)
    plan = solve_plan(model, total_units=total, unit_size=unit_size, min_units=min_units)
    assert plan.total_units == total and min(plan.units) >= min_units and plan.unit_size == unit_size
    best = predicted_step(model, plan)
    for src, dst in itertools.permutations(range(e), 2):
        if plan.units[src] > min_units:
            moved = list(plan.units)
            moved[src] -= 1
            moved[dst] += 1
            assert best <= model.step([n / total for n in moved]) * (1 + 1e-12)
    continuous = model.step(continuous_shares(model, min_share=min_units / total))
    assert continuous <= best * (1 + 1e-12)
    assert best <= continuous + model.shardable / total / min(speeds) * (1 + 1e-9)
    if total % e == 0:
        assert best <= predicted_step(model, ShardPlan.even(total, e)) * (1 + 1e-12)


@settings(max_examples=150, deadline=None)
@given(speeds=st.lists(st.floats(min_value=0.05, max_value=1.0), min_size=2, max_size=3),
       rho=st.floats(min_value=0.0, max_value=0.9), total=st.integers(3, 12), min_units=st.integers(0, 1))
def test_rounded_plan_is_the_brute_force_optimum(speeds, rho, total, min_units):
    """Against every whole-unit plan with ≥ ``min_units`` units per rank (small groups only)."""
    model = StepModel.normalised(speeds, replicated_share=rho)
    e = model.tp
    plans = [c for c in itertools.product(range(min_units, total + 1), repeat=e) if sum(c) == total]
    optimum = min(model.step([n / total for n in c]) for c in plans)
    plan = solve_plan(model, total_units=total, min_units=min_units)
    assert predicted_step(model, plan) == pytest.approx(optimum, rel=1e-12)


@settings(max_examples=300, deadline=None)
@given(speeds=speeds_st, rho=st.floats(min_value=0.0, max_value=0.95))
def test_continuous_optimum_equalises_the_free_ranks(speeds, rho):
    """Shares sum to 1 and are ≥ 0; the ranks above the minimum finish together, the pinned ones no earlier."""
    model = StepModel.normalised(speeds, replicated_share=rho)
    shares = continuous_shares(model)
    assert math.isclose(sum(shares), 1.0, rel_tol=1e-9) and min(shares) >= -1e-12
    step = model.step(shares)
    free = [model.rank_time(r, p) for r, p in enumerate(shares) if p > 1e-9]
    pinned = [model.rank_time(r, p) for r, p in enumerate(shares) if p <= 1e-9]
    assert max(free) == pytest.approx(min(free), rel=1e-9)  # the free ranks finish together ...
    assert all(t >= max(free) * (1 - 1e-9) for t in pinned)  # ... no later than a pinned rank (its R alone)
    # the closed form when nothing is pinned: t = (S + e·R)/Σ v
    if min(shares) > 1e-9:
        assert step == pytest.approx((model.shardable + model.tp * model.replicated) / sum(model.speeds), rel=1e-9)


@settings(max_examples=150, deadline=None)
@given(speeds=st.lists(st.floats(min_value=0.05, max_value=1.0), min_size=2, max_size=3),
       paces=st.lists(st.floats(min_value=0.0, max_value=2.0), min_size=3, max_size=3),
       rho=st.floats(min_value=0.0, max_value=0.9), total=st.integers(3, 12))
def test_two_paces_per_rank_the_plan_is_the_brute_force_optimum(speeds, paces, rho, total):
    """A rank whose replicated work runs at ``(v/V)^φ`` of the fastest rank's pace: the solved plan against every
    whole-unit plan, the continuous optimum's free ranks finishing together, and each rank's time against
    ``R/(V·(v/V)^φ) + S·p/v`` written out."""
    base = StepModel.normalised(speeds, replicated_share=rho)
    model = StepModel(speeds=base.speeds, replicated=base.replicated, shardable=base.shardable,
                      replicated_pace=tuple(paces[:len(speeds)]))
    fastest = max(model.speeds)
    for r, (v, phi) in enumerate(zip(model.speeds, model.replicated_pace)):
        written = model.replicated / (fastest * (v / fastest) ** phi) + model.shardable * 0.25 / v
        assert model.rank_time(r, 0.25) == pytest.approx(written, rel=1e-12)
    e = model.tp
    plans = [c for c in itertools.product(range(total + 1), repeat=e) if sum(c) == total]
    optimum = min(model.step([n / total for n in c]) for c in plans)
    assert predicted_step(model, solve_plan(model, total_units=total)) == pytest.approx(optimum, rel=1e-12)
    shares = continuous_shares(model)
    free = [model.rank_time(r, p) for r, p in enumerate(shares) if p > 1e-9]
    assert math.isclose(sum(shares), 1.0, rel_tol=1e-9) and min(shares) >= -1e-12
    assert max(free) == pytest.approx(min(free), rel=1e-9)
    assert model.step(shares) <= optimum * (1 + 1e-12)


def test_a_replicated_pace_is_one_per_rank_and_within_its_range():
    with pytest.raises(ConfigError, match=r"replicated_pace must be one number >= 0 per rank \(2\), got \(0.5,\)"):
        StepModel(speeds=(1.0, 0.5), replicated=0.1, shardable=1.0, replicated_pace=(0.5,))
    with pytest.raises(ConfigError, match=r"replicated_pace\[1\] must be .*got -0.5"):
        StepModel(speeds=(1.0, 0.5), replicated=0.1, shardable=1.0, replicated_pace=(1.0, -0.5))
    paced = StepModel(speeds=(1.0, 0.25), replicated=0.2, shardable=1.6, replicated_pace=(1.0, 1.0))
    assert paced.replicated_work == (0.2, 0.2)  # φ = 1: every rank's replicated work is R
    assert StepModel(speeds=(1.0, 0.25), replicated=0.2, shardable=1.6,
                     replicated_pace=(1.0, 0.5)).replicated_work == pytest.approx((0.2, 0.1))


# ----------------------------------------------------------------------------- attention, one process
def _attention(x, q, k, v, o, n_q, n_kv, d):
    """Causal GQA attention of x [B, T, H] with projection weights q [n_q·d, H], k, v [n_kv·d, H], o [H, n_q·d]."""
    b, t, _ = x.shape
    qh = (x @ q.T).view(b, t, n_q, d).transpose(1, 2)
    kh = (x @ k.T).view(b, t, n_kv, d).transpose(1, 2).repeat_interleave(n_q // n_kv, dim=1)
    vh = (x @ v.T).view(b, t, n_kv, d).transpose(1, 2).repeat_interleave(n_q // n_kv, dim=1)
    a = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
    return a.transpose(1, 2).reshape(b, t, n_q * d) @ o.T


@settings(max_examples=25, deadline=None)
@given(n_kv=st.sampled_from([2, 3, 4, 6]), q_per_kv=st.sampled_from([1, 2, 4]), tp=st.integers(2, 4),
       data=st.data())
def test_uneven_kv_groups_sum_to_the_full_attention(n_kv, q_per_kv, tp, data):
    """Σ_r attention_r(x) @ o_r^T equals the full attention: heads are independent, o's columns follow them.
    fp64, so the only difference is the order of the sum over heads (≤ 1e-12)."""
    if tp > n_kv:
        return
    cut = sorted(data.draw(st.sets(st.integers(1, n_kv - 1), min_size=tp - 1, max_size=tp - 1)))
    units = tuple(b - a for a, b in zip([0] + cut, cut + [n_kv]))
    d, hidden = 4, 16
    n_q = n_kv * q_per_kv
    q_cols, _ = kv_group_unit(num_heads=n_q, num_kv_heads=n_kv, head_dim=d)
    plan = ShardPlan.for_dimension(units, dimension=n_q * d, unit_size=q_cols)
    g = torch.Generator().manual_seed(sum(units) * 31 + tp)
    x = torch.randn(2, 5, hidden, generator=g, dtype=torch.float64)
    q, o = torch.randn(n_q * d, hidden, generator=g, dtype=torch.float64), torch.randn(hidden, n_q * d, generator=g,
                                                                                       dtype=torch.float64)
    k, v = (torch.randn(n_kv * d, hidden, generator=g, dtype=torch.float64) for _ in range(2))
    full = _attention(x, q, k, v, o, n_q, n_kv, d)
    total = torch.zeros_like(full)
    for r in range(tp):
        part = split_attention(q, k, v, o, plan, r, head_dim=d)
        assert part.num_kv_heads == units[r] and part.num_heads == units[r] * q_per_kv
        total += _attention(x, part.q, part.k, part.v, part.o, part.num_heads, part.num_kv_heads, d)
    torch.testing.assert_close(total, full, rtol=1e-12, atol=1e-12)
