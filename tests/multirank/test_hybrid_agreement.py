"""Batch-plan agreement: a rank holding another plan stops every rank at once, naming ranks and fields.

A plan that differs on one rank is injected (the plan every rank computes from the same numbers
cannot differ, short of a bug, so the test builds the other one by hand); every rank must raise
:class:`semimig.errors.PlanDisagreement` within seconds, with the ranks and the differing fields
in the message, and no rank may hang in a later collective.
"""
from __future__ import annotations

import time

import pytest

from dist_harness import run_on_ranks
from semimig.allocation import SpeedCurve, allocate
from semimig.errors import PlanDisagreement
from semimig.hybrid import ReplanConfig, describe_batch_plan, verify_batch_plan


def _plan(fast: float):
    curves = [SpeedCurve.constant(peak_speed=s, max_batch_size=8, name=f"group{g}") for g, s in enumerate((1.0, fast))]
    return allocate(curves, 12, zero_stage=1)


def _outcome_on_every_rank(check, world: int, ok: str) -> list[tuple[str, float]]:
    """Run ``check()`` on this rank; every rank's (``ok`` or the PlanDisagreement message, seconds)."""
    import torch.distributed as dist

    started = time.perf_counter()
    try:
        check()
        outcome = ok
    except PlanDisagreement as err:
        outcome = str(err)
    every = [None] * world
    dist.all_gather_object(every, (outcome, time.perf_counter() - started))
    return every


def _verify_body(rank: int, world: int, odd_rank: int):
    plan = _plan(3.0 if rank == odd_rank else 1.0)
    return _outcome_on_every_rank(lambda: verify_batch_plan(plan), world, "agreed")


def test_a_different_plan_on_one_rank_stops_every_rank_naming_ranks_and_fields() -> None:
    outcomes = run_on_ranks(_verify_body, 3, 2, timeout_s=60)
    expected = describe_batch_plan(_plan(1.0)), describe_batch_plan(_plan(3.0))
    differing = sorted(k for k in expected[0] if expected[0][k] != expected[1][k])
    assert differing, "the injected plan must differ"
    for rank, (message, elapsed) in enumerate(outcomes):
        assert elapsed < 5.0, f"rank {rank} took {elapsed:.1f} s to notice"
        assert "ranks [0, 1] vs ranks [2]" in message, message
        for field in differing:
            assert field in message, f"rank {rank}: {field} not named in {message}"


def test_equal_plans_pass() -> None:
    outcomes = run_on_ranks(_verify_body, 2, -1, timeout_s=60)
    assert [o for o, _ in outcomes] == ["agreed", "agreed"]


# ------------------------------------------------------------------ inside a running 2-D balancer
def _balancer_body(rank: int, world: int):
    from colossalai.booster.plugin import HybridParallelPlugin

    from semimig.hybrid import HybridBalancer

    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, zero_stage=0, precision="fp32")
    curves = [SpeedCurve.constant(peak_speed=s, max_batch_size=12, name=f"group{g}") for g, s in enumerate((1.0, 1.0))]
    balancer = HybridBalancer(plugin, curves=curves, global_batch_size=12, replan=ReplanConfig(),
                              busy_source=lambda: 0.1)  # a busy source: the per-iteration gather runs
    balancer.step()  # agreed
    if rank == 3:  # a bug that changes one rank's plan in place, after it was verified
        balancer._plan = _plan(3.0)
    balancer.step()  # iteration 1 ran on the changed plan; its digests are read at the next step (lagged)
    return _outcome_on_every_rank(balancer.step, world, "no error")


def test_the_per_iteration_digest_catches_a_plan_changed_after_verification() -> None:
    outcomes = run_on_ranks(_balancer_body, 4, timeout_s=90)
    for rank, (message, elapsed) in enumerate(outcomes):
        assert elapsed < 5.0, f"rank {rank} took {elapsed:.1f} s"
        assert "Poplar batch plan used in iteration 1" in message and "ranks [3]" in message, message
        assert "group0.micro_batch_size" in message, message


def test_plan_description_names_only_sample_deciding_fields() -> None:
    description = describe_batch_plan(_plan(2.0))
    assert set(description) == {"zero_stage", "global_batch_size", "groups"} | {
        f"group{g}.{f}" for g in (0, 1) for f in ("micro_batch_size", "accumulation_steps", "last_batch_size")}
    with pytest.raises(AttributeError):
        describe_batch_plan("not a plan")


def test_ranks_by_value_names_each_group_of_a_disagreement():
    from semimig.controller.agreement import ranks_by_value

    assert ranks_by_value([7, 9, 7, 8]) == "ranks [0, 2] vs ranks [1] vs ranks [3]"
    assert ranks_by_value([7, 9], [4, 6]) == "ranks [4] vs ranks [6]"  # global ranks of a subgroup
    assert ranks_by_value([5, 5, 5]) == "ranks [0, 1, 2]"


def test_first_refusal_is_raised_verbatim_by_its_rank_and_with_its_origin_by_the_others():
    from semimig.controller.agreement import first_refusal

    gathered = [None, "bad spec", "other"]
    assert first_refusal(gathered, 1, "rank") == "bad spec"
    assert first_refusal(gathered, 0, "rank") == "bad spec (on rank 1; every rank refuses it)"
    assert first_refusal(gathered, 2, "data-parallel replica") == (
        "bad spec (on data-parallel replica 1; every rank refuses it)")
    assert first_refusal([None, None], 0, "rank") is None
