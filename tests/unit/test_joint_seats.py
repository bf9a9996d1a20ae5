"""Seats in the joint planner: a reduction runs at its slowest member's pace, so a slow rank holding one unit
of a kind slows every reduction of that kind; the planner weighs emptying it as the re-shard policy does.

Checked against a brute force over every batch split and every plan (the step with seats of
:func:`~semimig.sharding.jobmodel.job_step`), against the policy's own pricing, and on the tp 2 x dp 2 job
with rank 3 four times slower.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest

from semimig.controller.policy.propose import seat_delta as policy_seat_delta
from semimig.controller.policy.propose import seat_scale as policy_seat_scale
from semimig.errors import ConfigError
from semimig.sharding.joint import JointProblem, UnitKind, job_step, plan_job, replica_step, seat_scale, with_seats
from semimig.sharding.plan import ShardPlan


def _problem(speeds, *, seat=0.0, rho=0.2, batch=8, mlp=32, kv=8, attention=0.35, **kw) -> JointProblem:
    """A healthy even step of 1 at ``batch/dp`` samples per replica (seats aside), ``rho`` of it replicated."""
    tp, dp = len(speeds[0]), len(speeds)
    per = batch / dp
    shardable = tp * (1.0 - rho)
    kinds = (UnitKind(name="mlp", total_units=mlp, work_per_sample=shardable * (1 - attention) / per),
             UnitKind(name="kv", total_units=kv, work_per_sample=shardable * attention / per))
    return JointProblem(speeds=speeds, kinds=kinds, global_batch=batch, replicated_per_sample=rho / per,
                        seat_per_sample=seat, **kw)


def _plans_of(total: int, tp: int, least: int = 0):
    return [ShardPlan(units=u) for u in itertools.product(range(least, total + 1), repeat=tp) if sum(u) == total]


def _brute_force(problem: JointProblem) -> float:
    """The least job step (compute and seats) over every split and every replica's every plan: given the
    split the replicas are independent, each at its least step."""
    m, dp, tp = problem.micro_batch, problem.dp, problem.tp
    rows = list(itertools.product(*[_plans_of(k.total_units, tp, k.min_units) for k in problem.kinds]))
    best = math.inf
    for granules in itertools.product(range(1, problem.global_batch // m + 1), repeat=dp):
        if sum(granules) * m == problem.global_batch:
            samples = tuple(g * m for g in granules)
            best = min(best, max(min(replica_step(problem, d, b, row) for row in rows)
                                 for d, b in enumerate(samples)) + problem.comm_s)
    return best


def _random_case(seed: int) -> JointProblem:
    rng = random.Random(seed)
    dp, tp = rng.choice([(2, 2), (1, 3), (1, 2), (2, 2)])
    speeds = [[1.0] * tp for _ in range(dp)]
    d, r = rng.randrange(dp), rng.randrange(tp)
    speeds[d][r] = rng.choice([0.5, 0.25, 0.125])  # one slow rank, as the policy's candidates assume
    micro = rng.choice([1, 2])
    kinds = (UnitKind(name="mlp", total_units=rng.randint(max(tp, 2), 4), work_per_sample=rng.uniform(0.5, 2.0),
                      min_units=rng.choice([0, 0, 1])),
             UnitKind(name="kv", total_units=rng.randint(tp, 3), work_per_sample=rng.uniform(0.2, 1.0)))
    return JointProblem(speeds=tuple(map(tuple, speeds)), kinds=kinds, global_batch=micro * rng.randint(dp, 4),
                        micro_batch=micro, replicated_per_sample=rng.uniform(0.0, 0.3), comm_s=0.01,
                        seat_per_sample=rng.choice([0.05, 0.2, 0.6]), idle_free=seed % 2 == 1)


@pytest.mark.parametrize("seed", range(16))
def test_the_planner_with_seats_finds_the_brute_force_optimum(seed):
    problem = _random_case(seed)
    plan = plan_job(problem)
    assert plan.step == pytest.approx(_brute_force(problem), rel=1e-12)
    assert job_step(problem, plan.samples, plan.plans) == pytest.approx(plan.step, rel=1e-12)


def test_seat_scale_is_the_policy_s_pricing_each_kind_at_its_slowest_seated_rank():
    assert policy_seat_scale is seat_scale  # one definition for the planner and the policy
    rng = random.Random(3)
    for _ in range(50):
        tp = rng.choice([2, 4, 8])
        speeds = [rng.choice([1.0, 0.5, 0.25, 0.9]) for _ in range(tp)]
        plans = [ShardPlan(units=tuple(rng.randint(0, 3) for _ in range(tp - 1)) + (1,)) for _ in range(2)]
        slowest = [min(v for v, n in zip(speeds, p.units) if n) for p in plans] + [min(speeds)]  # + the vocabulary
        assert seat_scale(speeds, plans) == pytest.approx(sum(max(speeds) / v for v in slowest))


def test_tp2_dp2_rank_3_slow_replica_0_even_rank_3_emptied_and_the_split_balanced():
    """Rank 3 (replica 1, TP rank 1) at a quarter speed; the layers' reductions take 0.16 of a healthy step of 1
    at full speed: replica 0 stays even, rank 3 holds nothing, and one sample moved either way would
    lengthen the job."""
    problem = _problem(((1.0, 1.0), (1.0, 0.25)), seat=0.02)
    plan = plan_job(problem)
    assert plan.plans[0] == (ShardPlan.even(32, 2), ShardPlan.even(8, 2))
    assert plan.plans[1] == (ShardPlan(units=(32, 0)), ShardPlan(units=(8, 0)))
    assert plan.samples[0] > plan.samples[1]
    for moved in ((1, -1), (-1, 1)):
        other = tuple(b + m for b, m in zip(plan.samples, moved))
        if min(other) > 0:
            assert plan.step <= \
                job_step(problem, other, plan.plans) + 1e-12
    unpriced = plan_job(_problem(((1.0, 1.0), (1.0, 0.25))))
    assert unpriced.plans[1][0].units[1] > 0  # without seats rank 3 keeps some MLP, which its seat then costs
    assert plan.step < job_step(problem, unpriced.samples, unpriced.plans)


def test_with_no_slow_rank_seats_change_nothing():
    plan = plan_job(_problem(((1.0, 1.0), (1.0, 1.0)), seat=0.05))
    assert plan.samples == (4, 4)
    assert all(row == (ShardPlan.even(32, 2), ShardPlan.even(8, 2)) for row in plan.plans)


def test_with_seats_fits_the_reductions_per_sample_from_what_was_measured():
    problem = _problem(((1.0, 1.0), (1.0, 0.25)))
    plans = [(ShardPlan.even(32, 2), ShardPlan.even(8, 2)), (ShardPlan(units=(30, 2)), ShardPlan(units=(8, 0)))]
    s = 0.01
    measured = [4 * s * 3.0, 2 * s * (4.0 + 1.0 + 4.0)]  # replica 0 at 4 samples seated evenly; replica 1's rank 3
    # in MLP and, as every rank, in the vocabulary
    fitted = with_seats(problem, (4, 4), plans, [measured[0], measured[1] * 2])  # replica 1 measured at 4 samples
    assert fitted.seat_per_sample == pytest.approx(s)
    assert with_seats(problem, (4, 4), plans, [0.0, 0.0]).seat_per_sample == 0.0
    with pytest.raises(ConfigError, match="comm_s"):
        with_seats(problem, (4, 4), plans, [0.1])
    with pytest.raises(ConfigError, match=r"comm_s\[1\]"):
        with_seats(problem, (4, 4), plans, [0.1, -1.0])
    with pytest.raises(ConfigError, match="seat_per_sample"):
        _problem(((1.0, 1.0),), seat=-0.1)


def test_with_ranks_that_skip_the_vocabulary_seats_every_rank_holding_a_unit():
    """A rank holding no unit skips the step and sits in no collective; one holding any unit sits in the
    vocabulary's (the embedding's, the head's and the loss's) as well as its kinds'."""
    speeds = (1.0, 0.25)
    seated = (ShardPlan(units=(3, 1)), ShardPlan(units=(2, 0)))
    emptied = (ShardPlan(units=(4, 0)), ShardPlan(units=(2, 0)))
    assert seat_scale(speeds, seated, idle_free=True) == pytest.approx(4 + 1 + 4)
    assert seat_scale(speeds, emptied, idle_free=True) == 0.0  # the lone holder runs no collective at all
    assert seat_scale(speeds, emptied) == pytest.approx(1 + 1 + 4)  # it does not skip: still in the vocabulary's
    four = (1.0, 1.0, 1.0, 0.25)
    assert seat_scale(four, (ShardPlan(units=(4, 4, 0, 0)), ShardPlan(units=(2, 0, 0, 0))),
                      idle_free=True) == pytest.approx(1 + 1 + 1)  # two holders: their reductions remain
    assert seat_scale(four, (ShardPlan(units=(8, 0, 0, 0)), ShardPlan(units=(2, 0, 0, 0))), idle_free=True) == 0.0
    problem = _problem(((1.0, 1.0), (1.0, 0.25)), seat=0.05, idle_free=True, mlp=4, kv=2)
    assert replica_step(problem, 1, 4, seated) - replica_step(dataclasses.replace(problem, seat_per_sample=0.0), 1, 4,
                                                                seated) == pytest.approx(4 * 0.05 * 9)


def test_a_replica_left_with_one_holder_pays_no_seat_and_fits_none():
    """Every rank but one skips: the holder's sums and vocabulary are whole on it, so the replica's step is its
    compute alone, and what it measures in collectives (the replicated parameters' sends) prices no seat."""
    problem = _problem(((1.0, 1.0), (1.0, 0.25)), seat=0.05, idle_free=True, mlp=4, kv=2)
    lone = (ShardPlan(units=(4, 0)), ShardPlan(units=(2, 0)))
    unpriced = dataclasses.replace(problem, seat_per_sample=0.0)
    assert replica_step(problem, 1, 3, lone) == pytest.approx(replica_step(unpriced, 1, 3, lone))
    even = (ShardPlan.even(4, 2), ShardPlan.even(2, 2))
    fitted = with_seats(problem, (5, 3), (even, lone), [5 * 0.01 * 3.0, 0.2])
    assert fitted.seat_per_sample == pytest.approx(0.01)  # replica 0's reading alone
    assert with_seats(problem, (5, 3), (even, lone), [0.0, 0.2]).seat_per_sample == 0.0
    assert policy_seat_delta((1.0, 0.25), lone, even, 0.2, idle_free=True) == 0.0  # nothing to scale from
