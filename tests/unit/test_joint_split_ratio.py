"""The joint planner's ``k = R/S`` read from the windows' measured split of compute (split_ratio), and when the
job moves to the planner's answer.

Windows are generated from a known step model (known replicated and shardable work, per-rank speeds, kind
weights) under uneven plans and an uneven split, and read back through real re-shard policies whose own
``R/S`` is deliberately a third of the truth: the problem the joint planner reads must be the generating
model itself, its speeds and its predicted steps under other plans and splits.
"""
from __future__ import annotations

import dataclasses

import pytest

from semimig.controller.reshard import ReshardConfig, ReshardDecision, ReshardPolicy, ReshardSample
from semimig.errors import ConfigError
from semimig.resharder.joint import JointSetup, SeatMemory, joint_problem, per_mean_batch, search_root, split_ratio
from semimig.resharder.jointmoves import JointMoves
from semimig.sharding.joint import JointProblem, UnitKind, from_measured, job_step, plan_job, seat_scale
from semimig.sharding.jobmodel import rank_times, replica_step, unit_counts
from semimig.sharding.plan import ShardPlan

K = 0.6
"""The generating model's ``R/S``."""
WEIGHTS = (3.0, 1.0)
BATCH, DP, TP = 8, 2, 2
SEAT = 0.004
"""Seconds per sample one kind's reductions take among full-speed ranks."""
SPEEDS = ((0.9, 0.9), (1.0, 0.25))
MEASURED = ((ShardPlan.even(24, 2), ShardPlan.even(8, 2)),  # replica 0 even
            (ShardPlan(units=(20, 4)), ShardPlan(units=(8, 0))))  # replica 1's slow rank: few MLP, no KV
SAMPLES = (5, 3)


STATE = (6.0, 2.0, 20.0)
"""Bytes of state of one MLP block, of one KV group, and outside the units (what the optimizer updates)."""


def _truth(tau: float = 0.0) -> JointProblem:
    """The generating model in :func:`~semimig.sharding.jobmodel.from_measured`'s units (a healthy even
    replica step of 1 at the mean batch, less the update); ``tau``: the optimizer's update, seconds at speed 1
    per byte of :data:`STATE` a rank holds, once a step."""
    sigma = 1.0 / ((K + 1.0 / TP) * BATCH / DP)
    kinds = tuple(UnitKind(name=name, total_units=plan.total_units, work_per_sample=sigma * w / sum(WEIGHTS),
                           work_fixed=tau * nbytes * plan.total_units, bytes_per_unit=nbytes)
                  for name, plan, w, nbytes in zip(("mlp", "kv"), MEASURED[0], WEIGHTS, STATE))
    return JointProblem(speeds=SPEEDS, kinds=kinds, global_batch=BATCH, replicated_per_sample=K * sigma,
                        replicated_fixed=tau * STATE[2], fixed_bytes=STATE[2], seat_per_sample=SEAT)


def _windows(truth: JointProblem, steps: int = 5, *, timed: bool = False, plans=MEASURED,
             samples=SAMPLES) -> list[list[ReshardSample]]:
    """Every replica's steps under ``plans`` at ``samples``, per mean batch as the policies read them: each
    rank's compute, its shardable part, and the layers' reductions at the seats' pace (``timed``: and its
    optimizer's update)."""
    units = unit_counts(truth, plans)
    per_sample = [k.work_per_sample / k.total_units for k in truth.kinds]
    windows = []
    for d, b in enumerate(samples):
        compute = rank_times(truth, d, b, units[d])
        shardable = [b * (units[d, r] @ per_sample) / truth.speeds[d][r] for r in range(TP)]
        update = [(truth.replicated_fixed + units[d, r] @ [k.work_fixed / k.total_units for k in truth.kinds])
                  / truth.speeds[d][r] for r in range(TP)]
        comm = b * SEAT * seat_scale(truth.speeds[d], plans[d])
        sample = ReshardSample(tuple(compute), tuple(shardable), (comm,) * TP,
                               update_s=tuple(update) if timed else None)
        windows.append([per_mean_batch(sample, b, BATCH / DP)] * steps)
    return windows


def _policies(windows, *, k_prior: float, plans=MEASURED) -> list[ReshardPolicy]:
    share = k_prior * TP / (1.0 + k_prior * TP)  # the prior replicated share whose R/S is k_prior
    policies = [ReshardPolicy(row, weights=WEIGHTS, bytes_per_unit=(1, 1),
                              config=ReshardConfig(window=8, replicated_share=share)) for row in plans]
    for policy, window in zip(policies, windows):
        for sample in [window[0]] + window:  # a warm-up step, then the window
            policy.observe(sample)
    return policies


def test_the_joint_problem_is_the_generating_model_whatever_the_policies_ratio():
    truth = _truth()
    policies = _policies(_windows(truth), k_prior=K / 3)
    assert [p.replicated_ratio for p in policies] == pytest.approx([K / 3] * DP)  # deliberately wrong
    assert policies[1].slowdown.slow == {1} and not policies[0].slowdown.slow
    setup = JointSetup(global_batch=BATCH, dp=DP, bytes_per_unit=(1.0, 1.0), fixed_bytes=0.0, capacity_bytes=None)
    problem = joint_problem(setup, policies, SAMPLES)

    for row, true in zip(problem.speeds, truth.speeds):
        assert row == pytest.approx(true, rel=1e-6)
    assert problem.replicated_per_sample == pytest.approx(truth.replicated_per_sample, rel=1e-6)
    assert problem.seat_per_sample == pytest.approx(SEAT, rel=1e-6)
    even = (ShardPlan.even(24, 2), ShardPlan.even(8, 2))
    emptied = (ShardPlan(units=(24, 0)), ShardPlan(units=(8, 0)))
    best = plan_job(truth)
    for samples, plans in (((4, 4), (even, even)), ((5, 3), (even, emptied)), ((6, 2), (even, emptied)),
                           ((3, 5), MEASURED), (best.samples, best.plans)):
        assert job_step(problem, samples, plans) == pytest.approx(job_step(truth, samples, plans), rel=1e-6)
    answer = plan_job(problem)
    assert (answer.samples, answer.plans) == (best.samples, best.plans)
    assert answer.step == pytest.approx(best.step, rel=1e-6)


def test_the_optimizers_update_timed_apart_is_read_as_work_per_step():
    """Ranks that update their state once a step, whatever their samples: with the update timed the joint
    problem predicts the generating model's steps under other splits and plans (a lone holder at fewer
    samples, which updates every unit); read as per-sample work it prices the emptied plan short."""
    truth = _truth(tau=0.01)
    setup = JointSetup(global_batch=BATCH, dp=DP, bytes_per_unit=STATE[:2], fixed_bytes=STATE[2], capacity_bytes=None)
    even = (ShardPlan.even(24, 2), ShardPlan.even(8, 2))
    emptied = (ShardPlan(units=(24, 0)), ShardPlan(units=(8, 0)))
    cases = (((4, 4), (even, even)), ((5, 3), (even, emptied)), ((6, 2), (even, emptied)), ((3, 5), MEASURED))
    problem = joint_problem(setup, _policies(_windows(truth, timed=True), k_prior=K / 3), SAMPLES)
    for row, true in zip(problem.speeds, truth.speeds):
        assert row == pytest.approx(true, rel=1e-6)
    for samples, plans in cases:
        assert job_step(problem, samples, plans) == pytest.approx(job_step(truth, samples, plans), rel=1e-6)
    untimed = joint_problem(setup, _policies(_windows(truth), k_prior=K / 3), SAMPLES)
    assert replica_step(untimed, 1, 2, emptied) < 0.97 * replica_step(truth, 1, 2, emptied)


def test_split_ratio_reads_each_rank_s_split_through_its_share():
    """``k_r = p_r·(c_r − b_r)/b_r``; the median over each rank's steps and then over the ranks, so an outlier
    step or a rank with a broken timer moves nothing; ranks holding nothing, or with no split measured, say
    nothing."""
    truth = _truth()
    windows = _windows(truth, steps=3)
    shares = [ReshardPolicy(plans, weights=WEIGHTS, bytes_per_unit=(1, 1)).shares() for plans in MEASURED]
    assert split_ratio(windows, shares) == pytest.approx(K, rel=1e-12)
    bent = ReshardSample(windows[1][0].compute_s, (windows[1][0].shardable_s[0] * 0.5,
                                                   windows[1][0].shardable_s[1]), windows[1][0].comm_s)
    outlier = [windows[0], [bent] + windows[1][1:]]
    assert split_ratio(outlier, shares) == pytest.approx(K, rel=1e-12)
    broken = [windows[0], [bent] * 3]  # one rank's timer off all the window: one reading of four
    assert split_ratio(broken, shares) == pytest.approx(K, rel=1e-12)
    unsplit = [[ReshardSample(s.compute_s, (0.0,) * TP, s.comm_s) for s in w] for w in windows]
    assert split_ratio(unsplit, shares) is None
    assert split_ratio(windows, [(0.0, 0.0), (0.0, 0.0)]) is None


def test_with_no_split_measured_the_policies_ratio_is_used():
    truth = _truth()
    windows = [[ReshardSample(s.compute_s, (0.0,) * TP, s.comm_s) for s in w] for w in _windows(truth)]
    policies = _policies(windows, k_prior=K / 3)
    setup = JointSetup(global_batch=BATCH, dp=DP, bytes_per_unit=(1.0, 1.0), fixed_bytes=0.0, capacity_bytes=None)
    problem = joint_problem(setup, policies, SAMPLES)
    k = sum(p.replicated_ratio for p in policies) / DP
    assert k == pytest.approx(K / 3)
    compute = [list(rank_times(truth, d, b, unit_counts(truth, MEASURED)[d])) for d, b in enumerate(SAMPLES)]
    read = from_measured(compute, SAMPLES, MEASURED, replicated_over_shardable=k, kinds=truth.kinds,
                         global_batch=BATCH)
    assert problem.replicated_per_sample == pytest.approx(read.replicated_per_sample, rel=1e-12)
    assert problem.speeds[1][1] == pytest.approx(read.speeds[1][1], rel=1e-9)


def test_the_job_gain_is_read_at_once_then_at_doubled_ages():
    from semimig.resharder.joint import reading_due

    read, last = [], None
    for age in range(0, 1000):
        if reading_due(age, last):
            read.append(age)
            last = age
    assert read[:1] == [0] and all(b == max(2 * a, 2) for a, b in zip(read, read[1:])), read
    assert len(read) <= 11  # about log2 of the run, not every step
    assert reading_due(5, None)  # after a move, or a policy leaving its plan held: at once


def test_a_gain_only_the_noise_held_back_is_read_again_once_the_noise_allows_it():
    from semimig.controller.policy.gain import gain_test
    from semimig.resharder.joint import noise_blocked, reading_due

    # a 20 % gain that pays its moves many times over, against young windows that ask for 26 % of the step
    test = gain_test(1.0, 0.8, needed=0.26, life=10, move_s=0.2)
    assert not test.passed
    blocked = noise_blocked(test, 1.0)
    assert blocked == pytest.approx(0.2 - 0.4 / 10)  # (g - C/L)/t0: the most noise with which it passes
    assert gain_test(1.0, 0.8, needed=blocked * 0.99, life=10, move_s=0.2).passed
    assert not gain_test(1.0, 0.8, needed=blocked * 1.01, life=10, move_s=0.2).passed
    assert not reading_due(5, 4, needed=0.2, blocked=blocked)  # the noise has not shrunk enough: the schedule
    assert reading_due(5, 4, needed=0.15, blocked=blocked)  # it has: read again before the age doubles
    # a gain that does not pay its moves even without noise, or a test that passed, sets no such reading
    assert noise_blocked(gain_test(1.0, 0.99, needed=0.26, life=10, move_s=0.2), 1.0) == 0.0
    assert noise_blocked(gain_test(1.0, 0.5, needed=0.03, life=10, move_s=0.2), 1.0) == 0.0
    assert not reading_due(5, 4, needed=0.0, blocked=0.0)


def test_the_joint_search_runs_on_the_fastest_rank_ties_to_the_lowest_seat():
    seats = [(0, 0), (0, 1), (1, 0), (1, 1)]  # world-group order: replica-major
    assert search_root(((1.0, 0.5), (1.0, 0.125)), seats) == 0
    assert search_root(((0.5, 0.9), (1.0, 0.125)), seats) == 2
    assert search_root(((0.2, 0.5), (0.5, 1.0)), seats) == 3
    assert search_root(((0.2, 0.5), (0.5, 1.0)), [(1, 1), (0, 0), (0, 1), (1, 0)]) == 0  # any group order
    with pytest.raises(ConfigError, match="exactly one rank"):
        search_root(((1.0, 1.0),), [(0, 1), (1, 1)])


class _Job(JointMoves):
    """What a policy's decision reads of the re-sharder (:meth:`JointMoves._policy_move`): the replicas' policies,
    the split in force, the planner searched in this process (four gloo ranks get its answer alike:
    ``tests/multirank/test_joint_search.py``), and the moves it hands out, recorded instead of carried out."""

    _speaks, dp_rank, _job_moved, _job_read, _job_blocked, _job_held = False, 0, 0, None, 0.0, None

    def __init__(self, policies, samples):
        self.policies, self.policy, self.samples, self._seats = tuple(policies), policies[0], tuple(samples), SeatMemory()
        self.joint = JointSetup(global_batch=BATCH, dp=DP, bytes_per_unit=(1.0, 1.0), fixed_bytes=0.0,
                                capacity_bytes=None)
        self.searched, self.taken = 0, []

    def _search(self, problem, reference):
        self.searched += 1
        return plan_job(problem, reference=reference)

    def _take_joint(self, decisions, *, step, answer, problem):
        self.taken.append((step, answer.samples, answer.plans))
        return answer.plans[self.dp_rank]


def _decided(step: int, life: float = 20.0) -> list[ReshardDecision]:
    """Replica 1's policy decided at ``step`` (a move it proposed, expected to pay over ``life`` steps)."""
    return [ReshardDecision(step), ReshardDecision(step, plans=MEASURED[1], horizon=life)]


def test_a_policy_s_decision_moves_the_job_only_where_the_planner_s_answer_pays():
    """Far from the planner's answer the job moves to it; a sample from it the answer's gain is below the
    least gain a move is taken on, so the policy that decided moves nothing, and its next decisions at the same speeds
    are read again only when the job's reading schedule says so, or at once when the speeds it reads move."""
    truth = _truth()
    far = _Job(_policies(_windows(truth), k_prior=K), SAMPLES)
    best = plan_job(truth)
    assert far._policy_move(_decided(9), step=9) is not None
    assert far.taken == [(9, best.samples, best.plans)] and far.searched == 1

    near_samples = (6, 2)  # the planner's plans, one sample more on the replica that sets the pace
    near = _Job(_policies(_windows(truth, plans=best.plans, samples=near_samples), k_prior=K, plans=best.plans),
                near_samples)
    near_s = job_step(truth, near_samples, best.plans)
    assert best.step < near_s < (1.0 - ReshardConfig().margin) ** -1 * best.step  # better by less than the margin
    assert near._policy_move(_decided(9), step=9) is None
    assert near.taken == [] and near.searched == 1
    for step in (10, 11, 12, 13):  # the same speeds, the age (steps since the job moved) not yet doubled
        assert near._policy_move(_decided(step), step=step) is None
    assert near.searched == 1
    assert near._policy_move(_decided(18), step=18) is None and near.searched == 2  # due: read, still held
    slower = dataclasses.replace(truth, speeds=((0.9, 0.9), (1.0, 0.15)))  # the straggler slows further
    for policy, window in zip(near.policies, _windows(slower, steps=8, plans=best.plans, samples=near_samples)):
        for sample in window:
            policy.observe(sample)
    near._policy_move(_decided(27), step=27)  # the speeds the planner reads moved beyond the band: read at once
    assert near.searched == 3
