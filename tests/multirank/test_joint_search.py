"""The joint planner's search on four gloo ranks (tp 2 x dp 2): one rank searches (the fastest,
:func:`~semimig.resharder.joint.search_root`, tested on its own) and every rank receives the answer
:func:`~semimig.sharding.joint.plan_job` gives on the same problem, whichever rank that is."""
from __future__ import annotations

import pytest

from dist_harness import run_pooled

TP, DP = 2, 2


def _problem(speeds):
    from semimig.sharding.joint import JointProblem, UnitKind

    kinds = (UnitKind(name="mlp", total_units=24, work_per_sample=0.05),
             UnitKind(name="kv", total_units=8, work_per_sample=0.02))
    return JointProblem(speeds=speeds, kinds=kinds, global_batch=8, replicated_per_sample=0.01, comm_s=0.01)


def _body(rank, world, speeds):
    import torch.distributed as dist

    from semimig.resharder.jointmoves import JointMoves
    from semimig.sharding.joint import plan_job

    me = rank

    class Seat(JointMoves):  # what JointMoves._search reads of its re-sharder
        world_group, dp_rank, rank, _world_seats = None, me // TP, me % TP, None

    problem = _problem(speeds)
    reference = tuple(tuple(plan for plan in row) for row in plan_job(problem).plans)
    got = Seat()._search(problem, reference)
    every = [None] * world
    dist.all_gather_object(every, (got, plan_job(problem, reference=reference)))
    return every


@pytest.mark.parametrize("speeds", [((1.0, 0.5), (1.0, 0.125)),   # the fastest: world rank 0
                                    ((0.5, 0.9), (1.0, 0.125)),   # world rank 2 (replica 1, TP rank 0)
                                    ((0.2, 0.5), (0.5, 1.0))])    # world rank 3, a tie broken by the replica
def test_the_fastest_rank_searches_and_every_rank_gets_its_answer(speeds):
    every = run_pooled(_body, TP * DP, speeds)
    for got, own in every:
        assert got is not None and got == own, (speeds, got, own)
