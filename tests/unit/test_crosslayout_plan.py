"""The cross-layout gradient reduction's plan (semimig.sharding.exchange), checked without processes.

Each case simulates the plan on numbers: every replica's gradient of a dimension is a random vector,
each rank holds its plan's slices, the transfers are carried out as the plan says, and every rank's
result must equal the replicas' mean of the full vectors at its columns (summed in replica order,
bit for bit alike on every holder).
"""
from __future__ import annotations

import itertools

import pytest
import torch

from semimig.errors import ConfigError
from semimig.sharding.exchange import even_allreduce_columns, reduction_plan
from semimig.sharding.plan import ShardPlan

EVEN = ShardPlan(units=(2, 2))
THREE_ONE = ShardPlan(units=(3, 1))
ONE_THREE = ShardPlan(units=(1, 3))


def _simulate(plan, grads):
    """Run ``plan`` on ``grads[d][i]`` (replica d's full gradient of part i); returns each rank's packed shard."""
    replicas, tp = plan.replicas, plan.tp
    shards = {(d, t): torch.cat([grads[d][i][p.offsets()[t]:p.offsets()[t] + p.sizes[t]]
                                 for i, p in enumerate(plan.plans[d])]) for d in range(replicas) for t in range(tp)}
    received = {}
    for tr in plan.transfers:
        if tr.phase == 0:
            seg = plan.segments[tr.segment]
            src = shards[(tr.src, seg.owners[tr.src])]
            received[(tr.segment, tr.dst, tr.src)] = src[seg.offsets[tr.src]:seg.offsets[tr.src] + seg.length].clone()
    sums = {}
    for s, seg in enumerate(plan.segments):
        for r in seg.reducers:
            own = shards[(r, seg.owners[r])][seg.offsets[r]:seg.offsets[r] + seg.length]
            parts = [own.clone() if d == r else received[(s, r, d)] for d in range(replicas)]
            acc = parts[0].clone()
            for p in parts[1:]:
                acc += p
            sums[(s, r)] = acc / replicas
    out = {k: v.clone() for k, v in shards.items()}
    for (s, r), value in sums.items():
        seg = plan.segments[s]
        out[(r, seg.owners[r])][seg.offsets[r]:seg.offsets[r] + seg.length] = value
    for tr in plan.transfers:
        if tr.phase == 1:
            seg = plan.segments[tr.segment]
            out[(tr.dst, seg.owners[tr.dst])][seg.offsets[tr.dst]:seg.offsets[tr.dst] + seg.length] = \
                sums[(tr.segment, tr.src)]
    return out


def _expected(plans, grads, d, t):
    replicas = len(plans)
    pieces = []
    for i, p in enumerate(plans[d]):
        acc = grads[0][i].clone()
        for e in range(1, replicas):
            acc += grads[e][i]
        mean = acc / replicas
        pieces.append(mean[p.offsets()[t]:p.offsets()[t] + p.sizes[t]])
    return torch.cat(pieces)


CASES = [
    ((EVEN,), (EVEN,)),
    ((EVEN,), (THREE_ONE,)),
    ((ONE_THREE,), (THREE_ONE,)),
    ((ShardPlan(units=(4, 0)),), (ShardPlan(units=(0, 4)),)),                      # a rank holding no unit
    ((EVEN, EVEN, EVEN), (THREE_ONE,) * 3),                                           # packed parts (GPT-2 QKV)
    ((EVEN,), (THREE_ONE,), (ONE_THREE,)),                                             # three replicas
    ((ShardPlan(units=(1, 1, 2)),), (ShardPlan(units=(2, 1, 1)),), (ShardPlan(units=(1, 2, 1)),),
     (ShardPlan(units=(1, 1, 2)),)),                                                   # tp 3 x dp 4
]


@pytest.mark.parametrize("plans", CASES, ids=lambda p: "|".join(",".join(str(x) for x in r) for r in p))
@pytest.mark.parametrize("mode", ["direct", "reduce"])
def test_every_rank_gets_the_replicas_mean_at_its_columns(plans, mode):
    plan = reduction_plan([[q.with_unit_size(3) for q in parts] for parts in plans], mode=mode)
    gen = torch.Generator().manual_seed(0)
    grads = [[torch.randn(q.dimension, generator=gen, dtype=torch.float64) for q in parts] for parts in plan.plans]
    out = _simulate(plan, grads)
    for (d, t), value in out.items():
        assert torch.equal(value, _expected(plan.plans, grads, d, t)), (d, t)


@pytest.mark.parametrize("plans", CASES, ids=lambda p: "|".join(",".join(str(x) for x in r) for r in p))
def test_every_column_is_one_segment_with_one_owner_per_replica(plans):
    for mode in ("direct", "reduce"):
        plan = reduction_plan(plans, mode=mode)
        for i, part in enumerate(plan.plans[0]):
            covered = sorted((s.start, s.start + s.length) for s in plan.segments if s.part == i)
            assert covered[0][0] == 0 and covered[-1][1] == part.dimension
            assert all(a[1] == b[0] for a, b in zip(covered, covered[1:])), covered
        for seg in plan.segments:
            for d, parts in enumerate(plan.plans):
                lo, hi = parts[seg.part].column_range(seg.owners[d])
                assert lo <= seg.start and seg.start + seg.length <= hi
            if mode == "direct":
                assert seg.reducers == tuple(range(plan.replicas))
            else:
                assert len(seg.reducers) == 1


@pytest.mark.parametrize("replicas", [2, 3, 4])
def test_equal_plans_stay_inside_the_dp_groups_at_the_even_all_reduce_bytes(replicas):
    plan = reduction_plan([(EVEN.with_unit_size(12),)] * replicas)  # shards every D divides: equal chunks
    for t in plan.transfers:
        seg = plan.segments[t.segment]
        assert seg.owners[t.src] == seg.owners[t.dst]  # the same TP position: the DP group's own exchange
    assert plan.ratio_to_even() == pytest.approx(1.0)
    assert plan.max_rank_ratio() == pytest.approx(1.0)
    assert plan.mode == ("direct" if replicas == 2 else "reduce")


def test_bytes_against_the_even_all_reduce():
    # tp 2 x dp 2, (even, 3:1): the total is the even all-reduce's; the rank holding three quarters carries 1.5x
    plan = reduction_plan([(EVEN,), (THREE_ONE,)])
    assert plan.total_columns() == even_allreduce_columns((EVEN,), 2) == 8
    assert plan.ratio_to_even() == 1.0 and plan.max_rank_ratio() == 1.5
    assert plan.columns(1, 0) == (3, 3) and plan.columns(1, 1) == (1, 1) and plan.columns(0, 0) == (2, 2)
    # reduce mode at two replicas: the same bytes, in two phases
    assert reduction_plan([(EVEN,), (THREE_ONE,)], mode="reduce").total_columns() == 8
    # direct at four replicas would carry D/2 = 2x; the default (reduce) stays at the even all-reduce's
    four = [(EVEN,), (THREE_ONE,), (ONE_THREE,), (EVEN,)]
    assert reduction_plan(four, mode="direct").ratio_to_even() == 2.0
    assert reduction_plan(four).ratio_to_even() == pytest.approx(1.0)
    for plans in itertools.product((EVEN, THREE_ONE, ONE_THREE), repeat=3):
        plan = reduction_plan([(p,) for p in plans])
        assert plan.ratio_to_even() == pytest.approx(1.0)
        assert plan.max_rank_ratio() <= 1.5 + 1e-9


def test_plans_that_do_not_cover_the_same_columns_are_refused_by_name():
    with pytest.raises(ConfigError, match="replica 1's part 0 plan"):
        reduction_plan([(EVEN,), (ShardPlan(units=(2, 3)),)])
    with pytest.raises(ConfigError, match="replica 1 has 2 parts"):
        reduction_plan([(EVEN,), (EVEN, EVEN)])
    with pytest.raises(ConfigError, match="mode must be one of"):
        reduction_plan([(EVEN,)], mode="ring")
    with pytest.raises(ConfigError, match="ShardPlans"):
        reduction_plan([((2, 2),)])
