"""The cross-layout gradient reduction's waits are communication on the step clock: a replica that reaches
it before a slower one waits inside the comm region, as in DDP's all-reduce it replaces, and does not read
that wait as its own compute (gloo, two replicas of one rank each)."""
import contextlib
import time

import torch

from dist_harness import run_pooled

LATE_S = 0.4


def _reduce(rank, world):
    from semimig.comm import primitives as P
    from semimig.sharding.exchange import reduction_plan
    from semimig.sharding.plan import ShardPlan
    from semimig.shardformer.crosslayout import reduce_across_layouts

    inside = []

    @contextlib.contextmanager
    def comm():
        start = time.perf_counter()
        yield
        inside.append(time.perf_counter() - start)

    class Meter:  # a bound method, as the balancing runtime registers its meter's
        def region(self):
            return comm()

    meter = Meter()
    untime = P.time_collectives(meter.region)
    try:
        plan = reduction_plan([[ShardPlan(units=(2,), unit_size=3)]] * 2)
        grad = torch.full((6, 5), float(rank + 1))
        if rank == 1:
            time.sleep(LATE_S)  # the slow replica's backward
        started = time.perf_counter()
        reduce_across_layouts([(plan, [(grad, 0)])], replica=rank, tp_rank=0, grid=[[0], [1]])
        waited = time.perf_counter() - started
    finally:
        untime()
    return sum(inside), waited, grad


def test_the_wait_for_a_slower_replica_is_read_as_communication():
    inside, waited, grad = run_pooled(_reduce, 2)  # rank 0's: the early replica
    torch.testing.assert_close(grad, torch.full((6, 5), 1.5))  # the mean over the replicas
    assert waited > LATE_S / 2, waited
    assert inside >= 0.9 * waited, (inside, waited)
