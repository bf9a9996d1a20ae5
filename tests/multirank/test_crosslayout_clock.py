"""The cross-layout gradient reduction's waits are communication on the step clock: a replica that reaches
it before a slower one waits inside the comm region, as in DDP's all-reduce it replaces, and does not read
that wait as its own compute (gloo, two replicas of one rank each)."""
import time

import torch

from comm_regions import recorded_comm
from dist_harness import run_pooled

LATE_S = 0.4


def _reduce(rank, world):
    from semimig.sharding.exchange import reduction_plan
    from semimig.sharding.plan import ShardPlan
    from semimig.shardformer.crosslayout import reduce_across_layouts

    with recorded_comm() as inside:
        plan = reduction_plan([[ShardPlan(units=(2,), unit_size=3)]] * 2)
        grad = torch.full((6, 5), float(rank + 1))
        if rank == 1:
            time.sleep(LATE_S)  # the slow replica's backward
        started = time.perf_counter()
        reduce_across_layouts([(plan, [(grad, 0)])], replica=rank, tp_rank=0, grid=[[0], [1]])
        waited = time.perf_counter() - started
    return sum(inside), waited, grad


def test_the_wait_for_a_slower_replica_is_read_as_communication():
    inside, waited, grad = run_pooled(_reduce, 2)  # rank 0's: the early replica
    torch.testing.assert_close(grad, torch.full((6, 5), 1.5))  # the mean over the replicas
    assert waited > LATE_S / 2, waited
    assert inside >= 0.9 * waited, (inside, waited)
