"""The joint re-plan's pure parts (semimig.resharder.joint) and BatchSplit's memory field."""
from __future__ import annotations

import math

import pytest

from semimig.controller.reshard import ReshardSample
from semimig.errors import ConfigError
from semimig.hybrid.split import BatchSplit
from semimig.resharder.joint import JointSetup, even_samples, per_mean_batch


def test_memory_bytes_is_checked_by_name_and_read_back():
    for bad in (0, -1.0, "8G", math.nan):
        with pytest.raises(ConfigError, match="BatchSplit.memory_bytes"):
            BatchSplit(global_batch_size=8, memory_bytes=bad)
    assert BatchSplit(global_batch_size=8, memory_bytes=2e9).capacity() == 2e9
    assert BatchSplit(global_batch_size=8, memory_bytes=math.inf).capacity() == math.inf
    assert BatchSplit(global_batch_size=8).capacity("cpu") == math.inf  # no CUDA device: unlimited


def test_even_samples_and_a_batch_too_small_for_the_replicas():
    assert even_samples(8, 2) == (4, 4) and even_samples(7, 3) == (3, 2, 2)
    with pytest.raises(ConfigError, match="global_batch_size=1"):
        JointSetup(global_batch=1, dp=2, bytes_per_unit=(1.0, 1.0), fixed_bytes=0.0, capacity_bytes=None)


def test_per_mean_batch_scales_the_work_not_the_collectives():
    sample = ReshardSample((2.0, 4.0), (1.0, 3.0), (0.5, 0.5), gemm_s=(0.8, 2.0))
    scaled = per_mean_batch(sample, 2, 4.0)  # 2 samples read at the mean batch of 4: twice the work
    assert scaled.compute_s == (4.0, 8.0) and scaled.shardable_s == (2.0, 6.0) and scaled.gemm_s == (1.6, 4.0)
    assert scaled.comm_s == sample.comm_s
    assert per_mean_batch(sample, 4, 4.0) is sample


def test_the_joint_problem_reads_every_rank_s_compute_as_measured():
    """The step clock times a fast replica's wait for a slower one as communication, so its compute is its own
    work: replica 0 (healthy, 2 s) reads as fast as replica 1's healthy rank, replica 1's rank 1 a quarter of it."""
    from semimig.controller.reshard import ReshardConfig, ReshardPolicy
    from semimig.resharder.joint import joint_problem
    from semimig.sharding.plan import ShardPlan

    plans = (ShardPlan.even(8, 2), ShardPlan.even(4, 2))
    policies = [ReshardPolicy(plans, weights=(3.0, 1.0), bytes_per_unit=(1, 1), config=ReshardConfig(window=4))
                for _ in range(2)]
    for _ in range(4):  # a warm-up step and three measured: the policies' window when they first decide
        policies[0].observe(ReshardSample((2.0, 2.0), (1.0, 1.0), (6.0, 6.0)))
        policies[1].observe(ReshardSample((2.0, 8.0), (1.0, 4.0), (0.1, 0.1)))
    assert policies[1].slowdown.slow == {1} and not policies[0].slowdown.slow
    setup = JointSetup(global_batch=8, dp=2, bytes_per_unit=(1.0, 1.0), fixed_bytes=0.0, capacity_bytes=None)
    problem = joint_problem(setup, policies, (4, 4))
    speeds = problem.speeds
    assert speeds[0][0] == pytest.approx(speeds[1][0]) and speeds[0][1] == pytest.approx(speeds[1][0])
    assert speeds[1][1] == pytest.approx(speeds[1][0] / 4)
    # seats: replica 1's fast rank measures 0.1 s of reductions at 4 samples with its rank 1 seated in both kinds
    # at a quarter speed (seat_scale 4 + 4); replica 0, with no rank slow, measures no seat
    assert problem.seat_per_sample == pytest.approx(0.1 / (4 * 8.0))


def _policies(rows_by_replica, steps: int = 4):
    from semimig.controller.reshard import ReshardConfig, ReshardPolicy
    from semimig.sharding.plan import ShardPlan

    plans = (ShardPlan.even(8, 2), ShardPlan.even(4, 2))
    policies = [ReshardPolicy(plans, weights=(3.0, 1.0), bytes_per_unit=(1, 1), config=ReshardConfig(window=4))
                for _ in rows_by_replica]
    for i in range(steps):
        for policy, rows in zip(policies, rows_by_replica):
            policy.observe(rows[i % len(rows)])
    return policies


def test_a_healthy_replica_s_uneven_readings_are_noise_to_the_planner():
    """A healthy replica whose ranks read apart by waits the step clock counts as compute (collectives not
    semimig's own), within what its policy's slow-set test calls noise, is read at one speed: the planner
    keeps it even; rank 3 (replica 1's rank 1, four times slower) gives up its MLP seat; the split balances."""
    from semimig.resharder.joint import joint_problem
    from semimig.sharding.joint import job_step, plan_job
    from semimig.sharding.plan import ShardPlan

    healthy = [ReshardSample((2.0, 2.2), (1.0, 1.0), (0.3, 0.1)), ReshardSample((2.15, 2.0), (1.0, 1.0), (0.1, 0.3))]
    slow = [ReshardSample((2.0, 8.0), (1.0, 4.0), (1.0, 0.1))]
    policies = _policies([healthy, slow])
    assert not policies[0].slowdown.slow
    setup = JointSetup(global_batch=8, dp=2, bytes_per_unit=(1.0, 1.0), fixed_bytes=0.0, capacity_bytes=None)
    problem = joint_problem(setup, policies, (4, 4))
    assert problem.speeds[0][0] == problem.speeds[0][1]
    answer = plan_job(problem, reference=[p.plans for p in policies])
    assert answer.plans[0] == (ShardPlan.even(8, 2), ShardPlan.even(4, 2))
    mlp, kv = answer.plans[1]
    assert mlp.units == (8, 0) and kv.units[1] <= 2  # its MLP seat dropped; KV kept where the job's step allows
    assert answer.samples[0] > answer.samples[1]
    for shift in (-1, 1):  # the split balances the replicas as far as whole samples go
        other = (answer.samples[0] + shift, answer.samples[1] - shift)
        assert job_step(problem, other, answer.plans) > answer.step


def test_with_no_rank_slow_the_planner_moves_nothing():
    from semimig.resharder.joint import joint_problem
    from semimig.sharding.joint import plan_job

    rows = [ReshardSample((2.0, 2.1), (1.0, 1.0), (0.2, 0.1)), ReshardSample((2.1, 2.0), (1.0, 1.0), (0.1, 0.2))]
    policies = _policies([rows, rows[::-1]], steps=8)
    setup = JointSetup(global_batch=8, dp=2, bytes_per_unit=(1.0, 1.0), fixed_bytes=0.0, capacity_bytes=None)
    problem = joint_problem(setup, policies, (4, 4))
    assert problem.seat_per_sample == 0.0
    answer = plan_job(problem, reference=[p.plans for p in policies])
    assert answer.samples == (4, 4) and [tuple(row) for row in answer.plans] == [p.plans for p in policies]



def test_the_seat_fit_outlives_the_move_that_empties_the_slow_rank():
    """Emptied, the slow rank leaves no pace in its partner's reductions; the fit read while it sat is kept, so
    the planner does not hand it units back, and it is forgotten once no rank is slow."""
    from semimig.controller.reshard import ReshardConfig, ReshardPolicy
    from semimig.resharder.joint import SeatMemory, joint_problem
    from semimig.sharding.joint import plan_job
    from semimig.sharding.plan import ShardPlan

    setup = JointSetup(global_batch=8, dp=2, bytes_per_unit=(1.0, 1.0), fixed_bytes=0.0, capacity_bytes=None)
    healthy = [ReshardSample((2.0, 2.0), (1.0, 1.0), (0.1, 0.1))]
    memory = SeatMemory()
    seated = joint_problem(setup, _policies([healthy, [ReshardSample((2.0, 8.0), (1.0, 4.0), (1.0, 0.1))]]),
                           (4, 4), memory)
    assert seated.seat_per_sample > 0.0 and memory.seat_per_sample == seated.seat_per_sample

    emptied = (ShardPlan(units=(8, 0)), ShardPlan(units=(4, 0)))
    policies = [ReshardPolicy(plans, weights=(3.0, 1.0), bytes_per_unit=(1, 1), config=ReshardConfig(window=4))
                for plans in ((ShardPlan.even(8, 2), ShardPlan.even(4, 2)), emptied)]
    for _ in range(4):  # rank 1 of replica 1 holds nothing: its replicated work alone (1 s), four times slower
        policies[0].observe(healthy[0])
        policies[1].observe(ReshardSample((3.0, 4.0), (2.0, 0.0), (0.01, 0.4)))
    assert policies[1].slowdown.slow == {1}
    assert joint_problem(setup, policies, (5, 3)).seat_per_sample == 0.0  # nothing read: seats unpriced
    kept = joint_problem(setup, policies, (5, 3), memory)
    assert kept.seat_per_sample == seated.seat_per_sample
    answer = plan_job(kept, reference=[p.plans for p in policies])
    assert answer.plans[1][0].units[1] == 0  # no MLP back to the slow rank

    calm = _policies([healthy, healthy])
    assert joint_problem(setup, calm, (4, 4), memory).seat_per_sample == 0.0 and memory.seat_per_sample == 0.0
