"""The cross-layout gradient reduction gives every holder of a column the replicas' mean of it, summed in
replica order in the gradient's own dtype: bit-equal to ``((g_0 + g_1) + … + g_{D-1}) / D`` computed on one
process from the same seeds (gloo; replicas of one rank each, with two and three replicas, so a reducer
that is a later replica sums into a scratch before its own slice is overwritten)."""
import pytest
import torch

from dist_harness import run_pooled

SHAPE = (12, 7)


def _grad(replica, dtype):
    gen = torch.Generator().manual_seed(1000 + replica)
    return torch.randn(SHAPE, generator=gen).to(dtype)


def _reduce(rank, world, dtype):
    from semimig.sharding.exchange import reduction_plan
    from semimig.sharding.plan import ShardPlan
    from semimig.shardformer.crosslayout import reduce_across_layouts

    plan = reduction_plan([[ShardPlan(units=(4,), unit_size=3)]] * world)
    grad = _grad(rank, dtype)
    reduce_across_layouts([(plan, [(grad, 0)])], replica=rank, tp_rank=0, grid=[[r] for r in range(world)])
    import torch.distributed as dist

    every = [None] * world
    dist.all_gather_object(every, grad)
    return every


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_holder_ends_with_the_replicas_mean_in_replica_order(world, dtype):
    every = run_pooled(_reduce, world, dtype)
    expected = _grad(0, dtype)
    for d in range(1, world):
        expected = expected + _grad(d, dtype)
    expected = expected / world
    for grad in every:
        assert torch.equal(grad, expected)
