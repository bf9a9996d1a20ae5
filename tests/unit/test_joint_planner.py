"""The joint planner (semimig.sharding.joint): every replica's shard plan and the batch split, one step model.

The planner's step is checked against a brute force over every batch split and every plan of small jobs
(with and without memory capacities), its limits against the closed forms, and the tp 2 x dp 2 job with one
rank 4x slower against the job's limit ``n/(n − 1 + 1/χ) = 4/3.25``.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest

from semimig.errors import ConfigError
from semimig.sharding.jobmodel import rank_times, replica_step
from semimig.sharding.joint import (JointProblem, UnitKind, continuous_limit, from_measured, job_limit, job_step,
                                    peak_bytes, plan_job, state_bytes_per_param, unit_counts)
from semimig.sharding.plan import ShardPlan


def _problem(speeds, *, rho=0.2, batch=64, mlp=32, kv=8, attention=0.35, **kw) -> JointProblem:
    """A healthy even step of 1 at ``batch/dp`` samples per replica, ``rho`` of it replicated."""
    tp, dp = len(speeds[0]), len(speeds)
    per = batch / dp
    shardable = tp * (1.0 - rho)
    kinds = (UnitKind(name="mlp", total_units=mlp, work_per_sample=shardable * (1 - attention) / per,
                      bytes_per_unit=kw.pop("mlp_bytes", 0.0)),
             UnitKind(name="kv", total_units=kv, work_per_sample=shardable * attention / per,
                      bytes_per_unit=kw.pop("kv_bytes", 0.0)))
    return JointProblem(speeds=speeds, kinds=kinds, global_batch=batch, replicated_per_sample=rho / per, **kw)


def _plans_of(total: int, tp: int, least: int = 0):
    return [ShardPlan(units=u) for u in itertools.product(range(least, total + 1), repeat=tp) if sum(u) == total]


def _brute_force(problem: JointProblem) -> float:
    """The least job step over every split (multiples of the micro-batch) and every plan that fits."""
    m, dp, tp = problem.micro_batch, problem.dp, problem.tp
    rows = list(itertools.product(*[_plans_of(k.total_units, tp, k.min_units) for k in problem.kinds]))
    best = math.inf
    for granules in itertools.product(range(1, problem.global_batch // m + 1), repeat=dp):
        if sum(granules) * m != problem.global_batch:
            continue
        samples = tuple(g * m for g in granules)
        per_replica = []  # replicas are independent given the split: each one's least fitting step
        for d, b in enumerate(samples):
            least = math.inf
            for row in rows:
                plans = [row if e == d else rows[0] for e in range(dp)]
                fits = all(x <= problem.capacity(d, r) for r, x in enumerate(peak_bytes(problem, samples, plans)[d]))
                if fits:
                    least = min(least, _replica_step(problem, d, b, row))
            per_replica.append(least)
        best = min(best, max(per_replica) + problem.comm_s)
    return best


def _replica_step(problem: JointProblem, d: int, b: int, row) -> float:
    """Kind by kind, the slowest rank's segment: its units' work and the kind's share of the replicated work
    (a rank holding nothing where idle ranks skip: none)."""
    work = problem.unit_work(b)
    whole = [c * k.total_units for c, k in zip(work, problem.kinds)]
    step = 0.0
    for c, plan, share in zip(work, row, whole):
        holders = sum(1 for r in range(problem.tp) if any(p.units[r] for p in row))
        speeds = problem.lone_speeds[d] if problem.idle_free and holders == 1 and problem.lone_speeds else \
            problem.speeds[d]
        step += max(0.0 if problem.idle_free and not any(p.units[r] for p in row) else
                    (problem.replicated(b) * share / sum(whole) + c * plan.units[r]) / speeds[r]
                    for r in range(problem.tp))
    return step


def _random_case(seed: int) -> JointProblem:
    rng = random.Random(seed)
    dp, tp = rng.choice([(2, 2), (1, 3), (3, 1), (2, 1)])
    speeds = tuple(tuple(rng.choice([1.0, 1.0, 0.5, 0.25, 0.8]) for _ in range(tp)) for _ in range(dp))
    micro = rng.choice([1, 2])
    batch = micro * rng.randint(dp, 4)
    kinds = (UnitKind(name="mlp", total_units=rng.randint(max(tp, 2), 4), work_per_sample=rng.uniform(0.5, 2.0),
                      work_fixed=rng.choice([0.0, 0.3]), min_units=rng.choice([0, 0, 1]),
                      bytes_per_unit=rng.choice([0.0, 10.0]), activation_bytes_per_unit_sample=rng.choice([0.0, 1.0])),
             UnitKind(name="kv", total_units=rng.randint(tp, 3), work_per_sample=rng.uniform(0.2, 1.0),
                      bytes_per_unit=rng.choice([0.0, 20.0])))
    capacity = None
    if seed % 2:  # some ranks short of memory
        capacity = tuple(tuple(rng.choice([math.inf, 60.0, 90.0]) for _ in range(tp)) for _ in range(dp))
    idle = seed % 3 == 0
    lone = None  # a lone holder at its own pace, in a replica with a slower rank to empty (tp 2)
    if idle and tp == 2:
        lone = tuple(tuple(v / (rng.uniform(0.7, 1.4) if min(row) < max(row) else 1.0) for v in row) for row in speeds)
    return JointProblem(speeds=speeds, kinds=kinds, global_batch=batch, micro_batch=micro,
                        replicated_per_sample=rng.uniform(0.0, 0.3), replicated_fixed=rng.choice([0.0, 0.2]),
                        comm_s=0.01, capacity_bytes=capacity, fixed_bytes=5.0, activation_bytes_per_sample=2.0,
                        idle_free=idle, lone_speeds=lone)


@pytest.mark.parametrize("seed", range(30))
def test_the_planner_finds_the_brute_force_optimum_and_its_plan_fits(seed):
    problem = _random_case(seed)
    expected = _brute_force(problem)
    if not math.isfinite(expected):
        with pytest.raises(ConfigError, match="no plan fits memory"):
            plan_job(problem)
        return
    plan = plan_job(problem)
    assert plan.step == pytest.approx(expected, rel=1e-12)
    assert job_step(problem, plan.samples, plan.plans) == pytest.approx(plan.step, rel=1e-12)
    assert sum(plan.samples) == problem.global_batch and all(b % problem.micro_batch == 0 and b > 0 for b in plan.samples)
    for d, row in enumerate(plan.peak_bytes):
        assert all(x <= problem.capacity(d, r) for r, x in enumerate(row))
    assert plan.peak_bytes == peak_bytes(problem, plan.samples, plan.plans)


@pytest.mark.parametrize("seed", range(20))
def test_a_lone_holder_at_its_own_pace_is_found_where_it_is_the_fastest_plan(seed):
    """tp 2 x dp 2 where an emptied rank skips the step: one replica's slow rank, the lone holder left by
    emptying it read at a pace of its own (faster or slower than the meeting ranks'); the planner's step is
    the brute-force optimum over every split and plan."""
    rng = random.Random(1000 + seed)
    slow = rng.choice([0.125, 0.25, 0.5])
    speeds = ((1.0, 1.0), (1.0, slow))
    lone = ((1.0, 1.0), tuple(v / rng.uniform(0.6, 1.5) for v in speeds[1]))
    problem = JointProblem(speeds=speeds, lone_speeds=lone, global_batch=rng.choice([6, 8]), idle_free=True,
                           kinds=(UnitKind(name="mlp", total_units=4, work_per_sample=rng.uniform(0.5, 2.0)),
                                  UnitKind(name="kv", total_units=2, work_per_sample=rng.uniform(0.2, 1.0))),
                           replicated_per_sample=rng.uniform(0.0, 0.3), comm_s=0.01)
    plan = plan_job(problem)
    assert plan.step == pytest.approx(_brute_force(problem), rel=1e-12)
    assert job_step(problem, plan.samples, plan.plans) == pytest.approx(plan.step, rel=1e-12)


def test_lone_speeds_are_checked_against_the_speeds_shape():
    with pytest.raises(ConfigError, match="lone_speeds must be 1 replicas x 2 ranks"):
        JointProblem(speeds=((1.0, 1.0),), lone_speeds=((1.0,),), global_batch=2, idle_free=True,
                     kinds=(UnitKind(name="mlp", total_units=2, work_per_sample=1.0),))


@pytest.mark.parametrize("tp,dp", [(2, 1), (2, 2), (4, 2), (2, 4), (8, 1)])
@pytest.mark.parametrize("chi", [2.0, 4.0])
def test_the_job_limit_is_n_over_n_minus_1_plus_1_over_chi(tp, dp, chi):
    healthy = _problem(((1.0,) * tp,) * dp)
    slow = _problem(((1.0,) * tp,) * (dp - 1) + ((1.0,) * (tp - 1) + (1.0 / chi,),))
    n = tp * dp
    assert job_limit(slow) / job_limit(healthy) == pytest.approx(n / (n - 1 + 1 / chi), rel=1e-12)
    assert plan_job(healthy).step == pytest.approx(job_limit(healthy), rel=1e-12) == pytest.approx(1.0)
    assert continuous_limit(healthy) == pytest.approx(1.0, rel=1e-9)


def test_with_no_straggler_nothing_moves():
    plan = plan_job(_problem(((1.0, 1.0),) * 2))
    assert plan.samples == (32, 32)
    assert all(row == (ShardPlan.even(32, 2), ShardPlan.even(8, 2)) for row in plan.plans)
    assert plan.memory_bound is None


def test_tp2_dp2_one_rank_4x_slower_gets_fewer_samples_and_units_near_the_job_limit():
    problem = _problem(((1.0, 1.0), (1.0, 0.25)))
    plan = plan_job(problem)
    assert plan.samples[1] < plan.samples[0]
    (mlp0, kv0), (mlp1, kv1) = plan.plans
    assert (mlp0, kv0) == (ShardPlan.even(32, 2), ShardPlan.even(8, 2))  # the healthy replica keeps its plan
    assert mlp1.units[1] < mlp1.units[0] and kv1.units[1] < kv1.units[0]
    limit = 4 / (3 + 1 / 4)  # a healthy step is 1
    assert continuous_limit(problem) == pytest.approx(limit, rel=1e-6)  # the replicated work is small enough
    assert job_limit(problem) == pytest.approx(limit, rel=1e-12)
    assert limit <= plan.step <= 1.03 * limit
    assert plan.step < 1.6  # one plan shared by both replicas reaches 2·4/(4 + 1) at best


def test_a_replica_steps_each_kinds_segment_at_its_slowest_rank():
    """Totals balanced, kinds not: the slow rank holds half the attention and little MLP.  Its ranks meet at
    every reduction, so the step is the sum of each kind's slowest segment, not the slowest total."""
    problem = _problem(((1.0, 0.25),), batch=8, rho=0.2, mlp=24, kv=8, attention=0.2)
    b, (mlp, kv) = 8, problem.unit_work(8)
    A = problem.replicated(b)
    w_mlp = 24 * mlp / (24 * mlp + 8 * kv)
    mixed = (ShardPlan(units=(23, 1)), ShardPlan(units=(4, 4)))
    segments = [max((A * w_mlp + mlp * 23) / 1.0, (A * w_mlp + mlp * 1) / 0.25),
                max((A * (1 - w_mlp) + kv * 4) / 1.0, (A * (1 - w_mlp) + kv * 4) / 0.25)]
    totals = max(A + mlp * 23 + kv * 4, (A + mlp + kv * 4) / 0.25)
    assert replica_step(problem, 0, b, mixed) == pytest.approx(sum(segments), rel=1e-12)
    assert replica_step(problem, 0, b, mixed) > 1.2 * totals
    proportional = (ShardPlan(units=(21, 3)), ShardPlan(units=(7, 1)))  # the same share of each kind
    p0 = [(A + mlp * 21 + kv * 7) / 1.0, (A + mlp * 3 + kv * 1) / 0.25]
    assert replica_step(problem, 0, b, proportional) == pytest.approx(max(p0), rel=1e-12)
    answer = plan_job(problem)
    assert replica_step(problem, 0, b, answer.plans[0]) <= replica_step(problem, 0, b, proportional)
    assert answer.plans[0][1].units[1] <= 1  # attention follows the speeds too


def test_a_faster_replica_keeps_the_plan_in_force_when_it_meets_the_job_step():
    problem = _problem(((1.0, 1.0), (1.0, 0.25)), micro_batch=32)  # 32 samples each: replica 1 sets the step
    kept = (ShardPlan(units=(17, 15)), ShardPlan(units=(4, 4)))
    plan = plan_job(problem, reference=(kept, (ShardPlan.even(32, 2), ShardPlan.even(8, 2))))
    assert plan.samples == (32, 32) and plan.replica_steps[0] < plan.replica_steps[1]
    assert plan.plans[0] == kept  # slower than even, still within the job's step: not moved
    assert plan_job(problem).plans[0] == (ShardPlan.even(32, 2), ShardPlan.even(8, 2))


def test_memory_bounds_the_plan_never_exceeds_a_capacity_and_names_the_rank():
    free = plan_job(_problem(((1.0, 1.0), (1.0, 0.25)), mlp_bytes=1000.0, kv_bytes=4000.0, fixed_bytes=10_000.0))
    heavy = free.peak_bytes[1][0]  # the slow rank's partner takes most units
    cap = 45_000.0  # a little above the even plan's 10 000 + 16·1000 + 4·4000 bytes
    problem = _problem(((1.0, 1.0), (1.0, 0.25)), mlp_bytes=1000.0, kv_bytes=4000.0, fixed_bytes=10_000.0,
                       capacity_bytes=((math.inf, math.inf), (cap, math.inf)))
    plan = plan_job(problem)
    assert plan.peak_bytes[1][0] <= cap
    assert all(x <= problem.capacity(d, r) for d, row in enumerate(plan.peak_bytes) for r, x in enumerate(row))
    assert plan.step > free.step
    assert plan.memory_bound is not None
    assert f"replica 1 TP rank 0 would hold {heavy:.0f} bytes over its capacity {cap:.0f}" in plan.memory_bound
    loose = _problem(((1.0, 1.0), (1.0, 0.25)), mlp_bytes=1000.0, kv_bytes=4000.0, fixed_bytes=10_000.0,
                     capacity_bytes=((1e9, 1e9), (1e9, 1e9)))
    assert plan_job(loose).memory_bound is None and plan_job(loose).step == pytest.approx(free.step)


def test_no_plan_fits_is_refused_naming_the_rank_and_its_bytes():
    problem = _problem(((1.0, 1.0), (1.0, 0.25)), fixed_bytes=500.0, capacity_bytes=((1e9, 1e9), (1e9, 400.0)))
    with pytest.raises(ConfigError, match=r"replica 1 TP rank 1 needs at least 500 bytes .* capacity 400"):
        plan_job(problem)


def test_state_bytes_per_param():
    assert state_bytes_per_param() == 16 and state_bytes_per_param("bf16") == 16
    assert state_bytes_per_param("fp32", "sgd") == 8
    with pytest.raises(ConfigError, match="precision must be one of .* got 'int8'"):
        state_bytes_per_param("int8")


@pytest.mark.parametrize("change,match", [
    (dict(speeds=((1.0, 0.0),)), r"speeds\[0\]\[1\] must be .* got 0.0"),
    (dict(speeds=((1.0, 1.0), (1.0,))), "every replica the same number of ranks"),
    (dict(speeds=()), "speeds must be a non-empty tuple"),
    (dict(global_batch=7, micro_batch=2), "global_batch=7 must be a multiple of micro_batch=2"),
    (dict(global_batch=1), "giving each of the 2 replicas at least one"),
    (dict(capacity_bytes=((1.0,),)), "capacity_bytes must be 2 replicas x 2 ranks"),
    (dict(capacity_bytes=((1.0, -3.0), (1.0, 1.0))), r"capacity_bytes\[0\]\[1\] must be .* got -3.0"),
    (dict(replicated_per_sample=float("nan")), "replicated_per_sample must be a finite number .* got nan"),
    (dict(kinds=()), "kinds must be a non-empty tuple of UnitKind"),
    (dict(kinds=(UnitKind(name="mlp", total_units=3, work_per_sample=1.0, min_units=2),)),
     r"UnitKind\(mlp\).total_units=3 cannot give each of tp=2 ranks min_units=2"),
])
def test_bad_problems_are_refused_naming_the_value(change, match):
    base = dict(speeds=((1.0, 1.0), (1.0, 1.0)), kinds=(UnitKind(name="mlp", total_units=4, work_per_sample=1.0),),
                global_batch=8)
    with pytest.raises(ConfigError, match=match):
        JointProblem(**(base | change))


@pytest.mark.parametrize("change,match", [
    (dict(total_units=0), r"UnitKind\(mlp\).total_units must be .* got 0"),
    (dict(work_per_sample=-1.0), r"UnitKind\(mlp\).work_per_sample must be .* got -1.0"),
    (dict(work_per_sample=0.0), r"UnitKind\(mlp\) has no work"),
    (dict(bytes_per_unit=float("inf")), r"UnitKind\(mlp\).bytes_per_unit must be .* got inf"),
    (dict(name=""), "UnitKind.name must be a non-empty string"),
])
def test_bad_unit_kinds_are_refused_naming_the_value(change, match):
    with pytest.raises(ConfigError, match=match):
        UnitKind(**(dict(name="mlp", total_units=4, work_per_sample=1.0) | change))


def test_plans_that_do_not_match_the_problem_are_refused():
    problem = _problem(((1.0, 1.0),) * 2)
    even = (ShardPlan.even(32, 2), ShardPlan.even(8, 2))
    with pytest.raises(ConfigError, match=r"samples must give 2 replicas the global batch 64, got \(30, 30\)"):
        job_step(problem, (30, 30), (even, even))
    with pytest.raises(ConfigError, match="does not hold its 32 units"):
        plan_job(problem, reference=((ShardPlan(units=(10, 10)), even[1]), even))


@pytest.mark.parametrize("measured_samples", [(32, 32), (40, 24)])
def test_a_problem_read_from_measured_compute_gives_the_same_plan(measured_samples):
    """Compute seconds generated by a known problem under some plans and split, read back through the
    policy's numbers (``k = R/S`` and the kinds' weights): the same speeds up to one scale, the same answer."""
    truth = _problem(((1.0, 1.0), (1.0, 0.25)), rho=0.1)
    measured = ((ShardPlan.even(32, 2), ShardPlan.even(8, 2)), (ShardPlan(units=(20, 12)), ShardPlan(units=(5, 3))))
    units = unit_counts(truth, measured)
    compute = [list(rank_times(truth, d, b, units[d])) for d, b in enumerate(measured_samples)]
    k = truth.replicated_per_sample / sum(kind.work_per_sample for kind in truth.kinds)
    read = from_measured(compute, measured_samples, measured, replicated_over_shardable=k, kinds=truth.kinds,
                         global_batch=64)
    scale = read.speeds[0][0] / truth.speeds[0][0]
    assert all(v == pytest.approx(scale * t, rel=1e-12) for row, true in zip(read.speeds, truth.speeds)
               for v, t in zip(row, true))
    assert plan_job(read).samples == plan_job(truth).samples and plan_job(read).plans == plan_job(truth).plans
    with pytest.raises(ConfigError, match=r"compute_s\[1\]\[0\] must be .* got 0.0"):
        from_measured([compute[0], [0.0, 1.0]], measured_samples, measured, replicated_over_shardable=k,
                      kinds=truth.kinds, global_batch=64)


def _with_update(problem: JointProblem, tau: float) -> JointProblem:
    """``problem`` whose ranks also update their parameters once a step: ``τ`` seconds (at speed 1) per byte of
    the state they hold, whatever their samples."""
    kinds = tuple(dataclasses.replace(k, work_fixed=tau * k.bytes_per_unit * k.total_units) for k in problem.kinds)
    return dataclasses.replace(problem, kinds=kinds, replicated_fixed=tau * problem.fixed_bytes)


def test_the_optimizers_update_read_apart_is_work_per_step_and_prices_a_lone_holder_at_fewer_samples():
    """Compute and update seconds generated by a problem whose ranks update their state once a step, measured at
    an even split and read back with the update timed apart: every replica step the truth gives, at any split
    and plan, the lone holder at fewer samples included, and the same plan.  Read as per-sample work (no update
    timed) the lone holder at fewer samples is priced short: it updates every unit whatever its samples."""
    base = _problem(((1.0, 1.0), (1.0, 0.25)), rho=0.1, batch=8, mlp=24, kv=8, mlp_bytes=4.0, kv_bytes=2.0,
                    fixed_bytes=10.0, idle_free=True)
    truth = _with_update(base, tau=0.004)
    measured = ((ShardPlan.even(24, 2), ShardPlan.even(8, 2)), (ShardPlan(units=(22, 2)), ShardPlan(units=(8, 0))))
    samples = (4, 4)
    units = unit_counts(truth, measured)
    compute = [list(rank_times(truth, d, b, units[d])) for d, b in enumerate(samples)]
    state = [[truth.fixed_bytes + units[d, r] @ [k.bytes_per_unit for k in truth.kinds] for r in range(2)]
             for d in range(2)]
    update = [[0.004 * state[d][r] / truth.speeds[d][r] for r in range(2)] for d in range(2)]
    k = truth.replicated_per_sample / sum(kind.work_per_sample for kind in truth.kinds)
    fields = dict(replicated_over_shardable=k, kinds=base.kinds, global_batch=8, fixed_bytes=10.0, idle_free=True)
    read = from_measured(compute, samples, measured, update_s=update, **fields)
    untimed = from_measured(compute, samples, measured, **fields)
    emptied = (ShardPlan(units=(24, 0)), ShardPlan(units=(8, 0)))
    for b in (2, 3, 4, 5):
        for plans in (measured[0], measured[1], emptied):
            assert replica_step(read, 1, b, plans) == pytest.approx(replica_step(truth, 1, b, plans), rel=1e-9)
    assert replica_step(untimed, 1, 3, emptied) < 0.95 * replica_step(truth, 1, 3, emptied)
    assert plan_job(read).plans == plan_job(truth).plans and plan_job(read).samples == plan_job(truth).samples
    with pytest.raises(ConfigError, match=r"update_s\[1\]\[0\]=9.0 leaves no compute of compute_s\[1\]\[0\]"):
        from_measured(compute, samples, measured, update_s=[update[0], [9.0, update[1][1]]], **fields)
    with pytest.raises(ConfigError, match=r"update_s must be 2 replicas x 2 ranks like the plans, got 1 x 1"):
        from_measured(compute, samples, measured, update_s=[[0.1]], **fields)
    with pytest.raises(ConfigError, match=r"update_s\[0\]\[1\] must be .* got -0.1"):
        from_measured(compute, samples, measured, update_s=[[0.1, -0.1], [0.1, 0.1]], **fields)


def test_a_rank_that_skips_when_empty_is_emptied_when_its_replicated_work_alone_would_bound_the_step():
    """A third of the work replicated and one rank 8x slower: seated at all it takes at least the replicated
    work at its pace (a third of a step, times 8); skipping when it holds nothing, the replica runs on its
    other rank, whose whole share of the batch the split then sizes."""
    problem = _problem(((1.0, 1.0), (1.0, 0.125)), rho=1 / 3)
    idle = plan_job(dataclasses.replace(problem, idle_free=True))
    seated = plan_job(problem)
    assert [p.units[1] for p in idle.plans[1]] == [0, 0]
    assert idle.step < seated.step
    # the replica of one working rank: (R + S)·b at speed 1 against the other's (R + S/2)·b
    b0, b1 = idle.samples
    assert idle.replica_steps[1] == pytest.approx(b1 / 32 * (1 / 3 + 2 * 2 / 3), rel=1e-12)
