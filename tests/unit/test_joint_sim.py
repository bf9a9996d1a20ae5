"""The joint planner's simulated jobs (:mod:`semimig.resharder.jointsim`): the re-sharder's decision path on a
known tp x dp model.  The rows it feeds are the model's own steps (read back through real policies, the
joint problem is the model), and the loop it drives keeps the job at the oracle's pace: nothing moves
without a straggler, and a straggler is balanced in few moves."""
from __future__ import annotations

import numpy as np
import pytest

from semimig.resharder.joint import joint_problem
from semimig.resharder.jointsim import (CATEGORIES, SimulatedJob, _rows, make_joint_scenario, run_joint,
                                        summarize_joint)
from semimig.sharding.jobmodel import job_step, replica_step
from semimig.sharding.joint import plan_job


def test_the_rows_are_the_model_s_steps_and_read_back_as_the_model():
    scenario = make_joint_scenario(5, "two")
    job = SimulatedJob(scenario)
    plans = tuple(policy.plans for policy in job.policies)
    rows = _rows(scenario.slow, job.samples, plans, 0.0, np.random.default_rng(0))
    job_s = job_step(scenario.slow, job.samples, plans)
    for d, (row, b) in enumerate(zip(rows, job.samples)):
        own = replica_step(scenario.slow, d, b, plans[d])
        assert max(c + m for c, m in zip(row.compute_s, row.comm_s)) == pytest.approx(job_s, rel=1e-9)
        assert row.dp_wait_s == pytest.approx((job_s - own,) * scenario.tp, rel=1e-9, abs=1e-12)
    for _ in range(6):  # a warm-up step, then a window at one set of speeds
        for policy, row in zip(job.policies, rows):
            policy.observe(row)
    problem = joint_problem(job.joint, job.policies, job.samples)
    for read, true in zip(problem.speeds, scenario.slow.speeds):
        assert np.array(read) / max(read) == pytest.approx(np.array(true) / max(true), rel=1e-6)
    best = plan_job(scenario.slow)
    for samples, layout in ((job.samples, plans), (best.samples, best.plans)):  # what it steps, here and elsewhere
        assert job_step(problem, samples, layout) == pytest.approx(job_step(scenario.slow, samples, layout), rel=1e-6)


def test_without_a_straggler_nothing_moves():
    for seed in range(3):
        record = run_joint(make_joint_scenario(seed, "none"))
        assert record["moves"] == 0 and record["ratio"] == pytest.approx(1.0), record


@pytest.mark.parametrize("category", ["one", "onset", "two"])
def test_a_straggler_is_balanced_in_few_moves_at_the_pace_of_reacting(category):
    """Against the reactive bound (the oracle holding the even layout for the steps any policy reading measured
    steps needs after a change): a late, wrong, undone or repeated move shows as a ratio above it."""
    records = [run_joint(make_joint_scenario(seed, category)) for seed in range(3)]
    for record in records:
        assert record["moves"] <= 3 and record["ratio_to_reactive"] <= 1.10, record
        assert record["ratio"] >= record["ratio_to_reactive"] * (1.0 - 1e-9)  # the bound is no better than the oracle
    summary = summarize_joint(records)
    assert summary["overall"]["scenarios"] == 3 and set(summary["categories"]) == {category}


def test_a_category_outside_the_family_is_refused():
    with pytest.raises(ValueError, match="category must be one of"):
        make_joint_scenario(0, "moving")
    assert set(CATEGORIES) == {"none", "one", "onset", "two"}
