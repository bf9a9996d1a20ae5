"""The LLM example's record of each rank's step split: every rank of the job, in global order, with its
steady medians and every step's split (under data parallelism the replica that sets the pace is often not
rank 0's, so one TP group's ranks are not enough)."""
from dist_harness import run_pooled

from semimig.bench.llm.record import SPLIT_FIELDS, reflex_by_rank, step_split_by_rank


def _splits(rank, world):
    # four steps; the first half is warm-up and left out of the medians; a step with no measure is None
    own = [(9.0, 9.0, 9.0), None, (1.0 + rank, 0.5, 0.25 * rank), (3.0 + rank, 0.5, 0.75 * rank)]
    return step_split_by_rank(own)


def test_every_rank_is_recorded_in_global_order_with_its_steps():
    medians, steps = run_pooled(_splits, 2)  # rank 0's record (every rank gathers the same)
    assert medians == [dict(zip(SPLIT_FIELDS, (2.0 + r, 0.5, 0.5 * r))) for r in range(2)]
    assert steps[1] == [[9.0, 9.0, 9.0], None, [2.0, 0.5, 0.25], [4.0, 0.5, 0.75]]
    assert len(steps) == 2 and steps[0][2] == [1.0, 0.5, 0.0]


def _reflex(rank, world):
    # rank 1's reflex fired at steps 1 and 3; rank 0's never
    return reflex_by_rank([0.0, 0.25 * rank, 0.0, 0.5 * rank])


def test_the_reflex_steps_of_every_rank_are_recorded_in_global_order():
    assert run_pooled(_reflex, 2) == [[], [[1, 0.25], [3, 0.5]]]
