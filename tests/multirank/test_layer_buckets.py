"""The per-layer buckets of the overlapped cross-layout reduction (semimig.shardformer.layer_buckets), driven
by hand on gloo: each rank marks its buckets' parameters ready in its own order (as backwards that finish
layers in different orders would), one parameter is never marked (unused: its bucket is posted at the end),
and every holder of a column ends with ``((g_0 + g_1) + … + g_{D-1}) / D`` bit for bit:

- three replicas of one rank (``reduce`` plans: each chunk summed by one replica, phase 1 sending the sums
  back for all buckets at once);
- two replicas of tp 2 where replica 1's TP rank 1 holds no column (zero-width parameters): that rank
  exchanges nothing, posts nothing and waits for nothing, and no other rank waits for it.
"""
from __future__ import annotations

import pytest
import torch

from dist_harness import run_pooled

BUCKETS = 3
ROWS, COLS, UNIT = 12, 5, 3


def _full(replica, bucket, which):
    gen = torch.Generator().manual_seed(100 * replica + 10 * bucket + which)
    return torch.randn((ROWS, COLS) if which == 0 else (ROWS,), generator=gen)


def _mean(bucket, which, replicas):
    acc = _full(0, bucket, which) + _full(1, bucket, which)
    for d in range(2, replicas):
        acc = acc + _full(d, bucket, which)
    return acc / replicas


def _body(rank, world, units):
    from semimig.sharding.exchange import reduction_plan
    from semimig.sharding.plan import ShardPlan
    from semimig.shardformer.layer_buckets import LayerBuckets

    tp = len(units[0])
    replica, tp_rank = divmod(rank, tp)
    grid = [[d * tp + t for t in range(tp)] for d in range(len(units))]
    plans = [ShardPlan(units=u, unit_size=UNIT) for u in units]
    plan = reduction_plan([(p,) for p in plans])
    start = plans[replica].offsets()[tp_rank]
    width = plans[replica].sizes[tp_rank]
    buckets, params = [], []
    for b in range(BUCKETS):
        weight = torch.nn.Parameter(torch.empty(width, COLS))
        bias = torch.nn.Parameter(torch.empty(width))
        for which, p in enumerate((weight, bias)):
            if (b, which) != (1, 1):  # bucket 1's bias: unused, its gradient None until the end
                p.grad = _full(replica, b, which)[start:start + width].clone()
        buckets.append((plan, [(weight, 0), (bias, 0)]))
        params.append((weight, bias))
    overlap = LayerBuckets(buckets, replica=replica, tp_rank=tp_rank, grid=grid)
    order = [(b, which) for b in range(BUCKETS) for which in (0, 1) if (b, which) != (1, 1)]
    if rank % 2:
        order.reverse()  # this rank's backward completes the layers in the other order
    for b, which in order:
        overlap.ready(params[b][which])
    moved = overlap.finish()
    got = [[p.grad.clone() for p in pair] for pair in params]
    expected = [[_mean(b, which, len(units))[start:start + width] if (b, which) != (1, 1)
                 else torch.zeros((width, COLS) if which == 0 else (width,)) for which in (0, 1)]
                for b in range(BUCKETS)]
    out = dict(equal=all(torch.equal(g, e) for gs, es in zip(got, expected) for g, e in zip(gs, es)),
               posted=overlap.last, moved=moved, width=width)
    import torch.distributed as dist

    every = [None] * world
    dist.all_gather_object(every, out)
    return every


@pytest.mark.parametrize("units", [((4,), (4,), (4,)), ((2, 2), (4, 0))],
                         ids=["three-replicas-reduce", "zero-width-rank"])
def test_buckets_completed_in_any_order_reduce_every_column_to_the_replicas_mean(units):
    every = run_pooled(_body, len(units) * len(units[0]), units, timeout_s=120)
    for rank, out in enumerate(every):
        assert out["equal"], (rank, out)
        if out["width"] == 0:  # holds no column: nothing to exchange, nothing posted, nothing moved
            assert out["posted"] == (0, 0) and out["moved"] == (0, 0), (rank, out)
            continue
        # numbered in the reverse of the layer order (2, 1, 0): layer 2 is posted from the hooks whatever order
        # they came in, layer 1 never completes (its bias unused), so it and layer 0 after it are posted at the end
        assert out["posted"] == (1, 2), (rank, out)
