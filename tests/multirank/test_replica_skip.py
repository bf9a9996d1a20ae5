"""An idle rank skips its steps under per-replica plans (semimig.shardformer.skip with .replicas): tp 2 x dp 2.

The tiny Llama of tests/multirank/test_replica_plans.py (8 heads, 4 KV groups, MLP 256 in blocks of 32),
``semimig.enable(mode="off")`` (skipping needs enable's optimizer hook), SGD with momentum, a global batch
of 8 rows, replica ``d`` taking rows ``4d … 4d+3``.  One replica leaves a TP rank idle and the other does
not, so the idle rank's DP group holds a rank that computes: DDP is set aside and every gradient
(paired, vocabulary rows, norms) is reduced across the layouts.  Checked against one dense process
training on all 8 rows from the same seed (losses: the idle rank's is its replica's, received):

- every weight after the steps, gathered by each rank's own layout, on every rank, and bit-equal
  across the ranks (every holder of a column sums the replicas in one order);
- the idle rank runs no layer and takes no gradient, and the other ranks post their paired gradients'
  per-layer buckets during the backward (DDP set aside, the rest reduced at its end);
- a re-plan into the idle plan and back out between steps trains like the uninterrupted run, and
  gradient accumulation (``no_sync``) reduces once, at the last micro-batch.
"""
from __future__ import annotations

import pytest
import torch

from dist_harness import run_pooled
from replica_cases import EVEN, global_batch as _global_batch, plan as _plan, replica_backward, sgd as _optimizer
from tiny_lms import boost_lm, gather_like, tiny_lm

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU/gloo path")

SECOND_IDLE = ((8, 0), (4, 0))
FIRST_IDLE = ((0, 8), (0, 4))
TOL = dict(atol=2e-5, rtol=1e-4)  # fp32: the uneven splits reorder sums over the intermediate dim and heads
TIMEOUT_S = 300
STEPS = 3


def _boost(precision="fp32"):
    import semimig
    from semimig.shardformer import SemiMigPolicy

    model = tiny_lm("llama")
    booster, model, optimizer, plugin = boost_lm(model, optimizer=_optimizer(model), precision=precision,
                                                 policy=SemiMigPolicy(shard_plan=_plan(EVEN)))
    balancer = semimig.enable(model, plugin, optimizer=optimizer, mode="off")
    return plugin, booster, model, optimizer, balancer


def _train(schedule, micro=1, precision="fp32"):
    """``schedule[step]``: the replicas' plans applied before that step (``None``: keep).  Returns
    ``(losses, weights, what the idle rank did, the skipping ranks at each step)``."""
    from semimig.shardformer.replicas import apply_replica_plans, replica_reduction
    from semimig.shardformer.skip import skipping_ranks

    plugin, booster, model, optimizer, balancer = _boost(precision)
    d = plugin.dp_group.rank()
    fired, grads = [], []
    hooks = [m.register_forward_hook(lambda *_: fired.append(1)) for m in model.unwrap().modules()]
    losses, skipping = [], []
    for step in range(STEPS):
        if schedule[step] is not None:
            apply_replica_plans(model, optimizer, [_plan(p) for p in schedule[step]])
        skipping.append(skipping_ranks(model))
        hooks += [p.register_hook(lambda g: grads.append(1)) for p in model.unwrap().parameters()]
        loss = replica_backward(booster, model, optimizer, step, d, micro)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()) * micro)
        for hook in hooks[-len(list(model.unwrap().parameters())):]:
            hook.remove()
        reduction = replica_reduction(model)
        hooked = reduction.overlap.last[0] if reduction is not None and reduction.idle is not None else None
        skipping[-1] = (skipping[-1], len(fired), len(grads), hooked)
        fired.clear(), grads.clear()
    for hook in hooks:
        hook.remove()
    weights = {n: gather_like(p, p.data).float() for n, p in model.unwrap().named_parameters()}
    balancer.close()
    return losses, weights, skipping


def _dense():
    model = tiny_lm("llama")
    optimizer = _optimizer(model)
    for step in range(STEPS):
        model(**_global_batch(step)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _body(rank, world, schedule, micro):
    import torch.distributed as dist

    out = _train(schedule, micro)
    every = [None] * world
    dist.all_gather_object(every, out)
    return every


CASES = {  # the replicas' plans before each step, gradient accumulation, the global rank idle at each step
    "second-rank-idle-from-the-start": ([(EVEN, SECOND_IDLE), None, None], 1, [3, 3, 3]),
    "first-rank-idle-accumulated": ([(FIRST_IDLE, EVEN), None, None], 2, [0, 0, 0]),
    "into-and-out-of-the-idle-plan": ([None, (EVEN, SECOND_IDLE), (EVEN, EVEN)], 1, [None, 3, None]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_idle_rank_of_one_replica_skips_and_training_is_the_dense_models(case):
    schedule, micro, idle = CASES[case]
    every = run_pooled(_body, 4, schedule, micro, timeout_s=TIMEOUT_S)
    weights = _dense()
    for rank, (losses, rank_weights, skipping) in enumerate(every):
        for name, value in weights.items():
            torch.testing.assert_close(rank_weights[name], value, **TOL, msg=lambda m, n=name, r=rank: f"rank {r} {n}: {m}")
            assert torch.equal(rank_weights[name], every[0][1][name]), (rank, name)
        for step, (ranks, fired, grads, hooked) in enumerate(skipping):
            skips = idle[step] == rank
            assert ranks == (() if idle[step] is None or idle[step] // 2 != rank // 2 else (idle[step] % 2,)), \
                (rank, step, ranks)
            assert (fired == 0 and grads == 0) if skips else (fired > 0 and grads > 0), (rank, step, fired, grads)
            if idle[step] is not None and not skips:  # the paired buckets overlap the backward with DDP set aside
                assert hooked, (rank, step, hooked)
        assert losses == every[rank - rank % 2][0], f"rank {rank} reads another loss than its replica's first rank"


def _bf16_body(rank, world):
    import torch.distributed as dist

    out = {"even": _train([(EVEN, EVEN), None, None], precision="bf16"),
           "skipping": _train([(EVEN, SECOND_IDLE), None, None], precision="bf16")}
    every = [None] * world
    dist.all_gather_object(every, out)
    return every


def test_bf16_with_an_idle_rank_follows_the_even_bf16_run():
    """bf16 (Colossal-AI's mixed precision: bf16 working gradients reduced, fp32 masters), against the even
    layout's bf16 run on the same rows.  Tolerances as for per-replica plans: the uneven splits and the
    replica-order sums round differently, elements by a few bf16 ulps, the weights after the steps by about
    one ulp of the bf16 working copy."""
    every = run_pooled(_bf16_body, 4, timeout_s=TIMEOUT_S)
    for rank, out in enumerate(every):
        (even_losses, even_weights, _), (losses, weights, skipping) = out["even"], out["skipping"]
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(even_losses), atol=0, rtol=2e-2)
        for name, value in weights.items():
            torch.testing.assert_close(value, even_weights[name], atol=1e-3, rtol=2 ** -7, msg=name)
            assert torch.equal(value, every[0]["skipping"][1][name]), (rank, name)
        assert all(ranks == ((1,) if rank >= 2 else ()) for ranks, *_ in skipping), (rank, skipping)
