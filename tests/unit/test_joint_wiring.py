"""The joint re-plan's pure parts (semimig.resharder.joint) and BatchSplit's memory field."""
from __future__ import annotations

import dataclasses
import math

import pytest

from semimig.controller.reshard import ReshardConfig, ReshardPolicy, ReshardSample
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
    timed = ReshardSample((2.0, 4.0), (1.0, 3.0), (0.5, 0.5), update_s=(0.5, 1.0))
    scaled = per_mean_batch(timed, 2, 4.0)  # the update is work per step: only the rest doubles
    assert scaled.compute_s == (3.5, 7.0) and scaled.update_s == timed.update_s


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
    # at a quarter speed (seat_scale 4 + 4, and 4 for the vocabulary); replica 0, with no rank slow, measures no seat
    assert problem.seat_per_sample == pytest.approx(0.1 / (4 * 12.0))


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


def _emptied_replica(slow_row, healthy_row):
    """Replica 0 even; replica 1's rank 1 slow and holding nothing; each stepping as its row says."""
    from semimig.controller.reshard import ReshardConfig, ReshardPolicy
    from semimig.sharding.plan import ShardPlan

    emptied = (ShardPlan(units=(8, 0)), ShardPlan(units=(4, 0)))
    policies = [ReshardPolicy(plans, weights=(3.0, 1.0), bytes_per_unit=(1, 1), config=ReshardConfig(window=4))
                for plans in ((ShardPlan.even(8, 2), ShardPlan.even(4, 2)), emptied)]
    for _ in range(4):
        policies[0].observe(healthy_row)
        policies[1].observe(slow_row)
    return policies


def test_every_replica_is_read_at_its_own_measured_pace_while_a_rank_is_slow():
    """Replica 1's holder computes 4 s and its emptied slow rank 3 s, yet replica 1 steps 6 s (the slow rank's
    replicated work runs in series with its partner's): the model said 4 s.  Replica 0 computes 2 s and waits
    3.1 s for replica 1 in the data-parallel reduction (0.1 s of its own collectives).  Each read at its own
    measured step, replica 1 gets fewer samples; without the waits told apart nothing is scaled."""
    from semimig.resharder.joint import joint_problem, own_steps
    from semimig.sharding.joint import plan_job
    from semimig.sharding.jobmodel import replica_step

    setup = JointSetup(global_batch=8, dp=2, bytes_per_unit=(1.0, 1.0), fixed_bytes=0.0, capacity_bytes=None)
    healthy = ReshardSample((2.0, 2.0), (1.0, 1.0), (3.2, 3.2), dp_wait_s=(3.1, 3.1))
    slow = ReshardSample((4.0, 3.0), (3.0, 0.0), (2.0, 3.0), dp_wait_s=(0.0, 0.0))
    policies = _emptied_replica(slow, healthy)
    assert policies[1].slowdown.slow == {1}
    plans = [p.plans for p in policies]
    assert own_steps([p.samples for p in policies], (4, 4), 4.0) == [pytest.approx(2.1), pytest.approx(6.0)]
    read = joint_problem(setup, policies, (4, 4))
    assert replica_step(read, 0, 4, plans[0]) == pytest.approx(2.1)
    assert replica_step(read, 1, 4, plans[1]) == pytest.approx(6.0)

    blind = _emptied_replica(dataclasses.replace(slow, dp_wait_s=None), dataclasses.replace(healthy, dp_wait_s=None))
    model = joint_problem(setup, blind, (4, 4))
    assert replica_step(model, 1, 4, plans[1]) == pytest.approx(4.0)  # compute alone: no waits told apart
    assert plan_job(read, reference=plans).samples[1] < plan_job(model, reference=plans).samples[1]

    calm = [ReshardSample((2.0, 2.0), (1.0, 1.0), (0.3, 0.3), dp_wait_s=(0.0, 0.0))]
    even = joint_problem(setup, _policies([calm, calm]), (4, 4))
    assert even.speeds[0] == even.speeds[1] and replica_step(even, 0, 4, plans[0]) == pytest.approx(2.0)


def test_a_seated_slow_replica_is_read_at_its_own_step_seats_included():
    """Replica 1's slow rank holds units (seated): its reductions are priced as seats, which the speeds do not
    scale; the replica's step read back is still its own measured one."""
    from semimig.resharder.joint import joint_problem, own_steps
    from semimig.sharding.jobmodel import replica_step, seat_seconds

    setup = JointSetup(global_batch=8, dp=2, bytes_per_unit=(1.0, 1.0), fixed_bytes=0.0, capacity_bytes=None)
    healthy = [ReshardSample((2.0, 2.0), (1.0, 1.0), (7.0, 7.0), dp_wait_s=(6.9, 6.9))]
    seated = [ReshardSample((2.0, 8.0), (1.0, 4.0), (1.0, 0.1), dp_wait_s=(0.0, 0.0))]
    policies = _policies([healthy, seated])
    plans = [p.plans for p in policies]
    read = joint_problem(setup, policies, (4, 4))
    own = own_steps([p.samples for p in policies], (4, 4), 4.0)
    assert seat_seconds(read, 1, 4, plans[1]) > 0.0
    assert [replica_step(read, d, 4, plans[d]) for d in range(2)] == [pytest.approx(o) for o in own]


def test_a_rank_that_skips_the_step_is_no_part_of_its_replica_s_own_step():
    """Where an emptied rank skips the step, its row is what it would compute if it held work (its probe's
    reading, 5 s here); the replica steps at its holder's pace (1 s of compute, 0.2 s of collectives)."""
    from semimig.resharder.joint import own_steps
    from semimig.sharding.plan import ShardPlan

    emptied = (ShardPlan(units=(8, 0)), ShardPlan(units=(4, 0)))
    even = (ShardPlan.even(8, 2), ShardPlan.even(4, 2))
    idle = [ReshardSample((1.0, 5.0), (1.0, 0.0), (0.2, 0.1), dp_wait_s=(0.0, 0.0))]
    calm = [ReshardSample((1.0, 1.0), (0.5, 0.5), (0.3, 0.3), dp_wait_s=(0.1, 0.1))]
    assert own_steps([calm, idle], (4, 4), 4.0, [even, emptied]) == [pytest.approx(1.2), pytest.approx(1.2)]
    assert own_steps([calm, idle], (4, 4), 4.0) == [pytest.approx(1.2), pytest.approx(5.1)]  # it did not skip


def _idle_free(policies):
    for policy in policies:
        policy.learned.idle_free = True
    return policies


def test_a_pace_read_while_the_ranks_meet_does_not_slow_a_lone_holder():
    """Where an emptied rank skips the step, replica 1 seats its slow rank (a quarter of the speed, holding one
    MLP block) and steps over 1.2 times what the model says, seats priced: the meetings with the slow rank
    cost what the model does not see.  Emptying it leaves its partner alone, meeting no one: that plan is
    priced at the partner's own pace (not the meetings'), so the planner takes it; once there, the meeting
    pace is remembered, so the planner does not hand the slow rank units back on the lone holder's reading,
    and it is forgotten when no rank is slow."""
    from semimig.resharder.joint import SeatMemory, joint_problem, own_steps
    from semimig.sharding.joint import plan_job
    from semimig.sharding.jobmodel import replica_step
    from semimig.sharding.plan import ShardPlan

    setup = JointSetup(global_batch=8, dp=2, bytes_per_unit=(1.0, 1.0), fixed_bytes=0.0, capacity_bytes=None)
    healthy = ReshardSample((2.0, 2.0), (1.0, 1.0), (0.1, 0.1), dp_wait_s=(0.0, 0.0))
    emptied = (ShardPlan(units=(8, 0)), ShardPlan(units=(4, 0)))
    seated_plans = (ShardPlan(units=(7, 1)), ShardPlan(units=(4, 0)))

    def replicas(comm):
        policies = _idle_free([ReshardPolicy(plans, weights=(3.0, 1.0), bytes_per_unit=(1, 1),
                                             config=ReshardConfig(window=4))
                               for plans in ((ShardPlan.even(8, 2), ShardPlan.even(4, 2)), seated_plans)])
        for _ in range(4):  # rank 1 holds 1 of 8 MLP blocks at a quarter of the speed
            policies[0].observe(healthy)
            policies[1].observe(ReshardSample((3.5, 2.6), (3.0, 0.5), (comm, 0.9), dp_wait_s=(0.0, 0.0)))
        assert policies[1].slowdown.slow == {1}
        return policies

    policies = replicas(2.0)  # rank 0 waits 2 s at the meetings, rank 1 (done early) 0.9 s more
    memory = SeatMemory()
    read = joint_problem(setup, policies, (4, 4), memory)
    own = own_steps([p.samples for p in policies], (4, 4), 4.0)[1]
    assert replica_step(read, 1, 4, seated_plans) == pytest.approx(own)
    pace = memory.paces[(1, False)]
    assert pace > 1.2  # the model, its seats priced, says less than replica 1 steps
    blind = dataclasses.replace(read, lone_speeds=None)  # the meetings' pace on the lone holder too
    assert replica_step(read, 1, 4, emptied) == pytest.approx(replica_step(blind, 1, 4, emptied) / pace)
    assert plan_job(read, reference=[p.plans for p in policies]).plans[1] == emptied
    assert plan_job(blind, reference=[p.plans for p in policies]).plans[1] != emptied

    lone = [ReshardPolicy(plans, weights=(3.0, 1.0), bytes_per_unit=(1, 1), config=ReshardConfig(window=4))
            for plans in ((ShardPlan.even(8, 2), ShardPlan.even(4, 2)), emptied)]
    _idle_free(lone)
    for _ in range(4):  # there: the holder steps as the model says; the slow rank's probe reads it slow
        lone[0].observe(healthy)
        lone[1].observe(ReshardSample((4.0, 2.0), (3.5, 0.0), (0.1, 0.0), dp_wait_s=(0.0, 0.0)))
    kept = joint_problem(setup, lone, (4, 4), memory)
    assert memory.paces[(1, False)] == pace and memory.paces[(1, True)] == pytest.approx(1.0, abs=0.05)
    assert plan_job(kept, reference=[p.plans for p in lone]).plans[1] == emptied
    calm = _policies([[healthy], [healthy]])
    joint_problem(setup, calm, (4, 4), memory)
    assert memory.paces == {}
