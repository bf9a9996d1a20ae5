"""An idle rank skips its steps under per-replica plans (semimig.shardformer.skip with .replicas): tp 2 x dp 2.

The tiny Llama of tests/multirank/test_replica_plans.py (8 heads, 4 KV groups, MLP 256 in blocks of 32),
``semimig.enable(mode="off")`` (skipping needs enable's optimizer hook), SGD with momentum, a global batch
of 8 rows, replica ``d`` taking rows ``4d … 4d+3``.  One replica leaves a TP rank idle and the other does
not, so the idle rank's DP group holds a rank that computes: DDP is set aside and every gradient
(paired, vocabulary rows, norms) is reduced across the layouts.  Checked against one dense process
training on all 8 rows from the same seed (losses: the idle rank's is its replica's, received):

- every weight after the steps, gathered by each rank's own layout, on every rank, and bit-equal
  across the ranks (every holder of a column sums the replicas in one order);
- the idle rank runs no layer and takes no gradient;
- a re-plan into the idle plan and back out between steps trains like the uninterrupted run, and
  gradient accumulation (``no_sync``) reduces once, at the last micro-batch.
"""
from __future__ import annotations

import pytest
import torch

from dist_harness import run_pooled
from tiny_lms import SEQ, VOCAB, boost_lm, gather_like, tiny_lm

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU/gloo path")

BLOCK = 32
EVEN = ((4, 4), (2, 2))          # (mlp blocks, kv groups) per TP rank
SECOND_IDLE = ((8, 0), (4, 0))
FIRST_IDLE = ((0, 8), (0, 4))
TOL = dict(atol=2e-5, rtol=1e-4)  # fp32: the uneven splits reorder sums over the intermediate dim and heads
TIMEOUT_S = 300
STEPS = 3


def _plan(units):
    from semimig.shardformer import UnevenPlan

    return UnevenPlan(mlp_units=units[0], kv_units=units[1], block_size=BLOCK)


def _optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _global_batch(step):
    gen = torch.Generator().manual_seed(2000 + step)
    ids = torch.randint(0, VOCAB, (8, SEQ), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def _boost():
    import semimig
    from semimig.shardformer import SemiMigPolicy

    model = tiny_lm("llama")
    booster, model, optimizer, plugin = boost_lm(model, optimizer=_optimizer(model),
                                                 policy=SemiMigPolicy(shard_plan=_plan(EVEN)))
    balancer = semimig.enable(model, plugin, optimizer=optimizer, mode="off")
    return plugin, booster, model, optimizer, balancer


def _train(schedule, micro=1):
    """``schedule[step]``: the replicas' plans applied before that step (``None``: keep).  Returns
    ``(losses, weights, what the idle rank did, the skipping ranks at each step)``."""
    from semimig.shardformer.replicas import apply_replica_plans
    from semimig.shardformer.skip import skipping_ranks

    plugin, booster, model, optimizer, balancer = _boost()
    d = plugin.dp_group.rank()
    fired, grads = [], []
    hooks = [m.register_forward_hook(lambda *_: fired.append(1)) for m in model.unwrap().modules()]
    losses, skipping = [], []
    for step in range(STEPS):
        if schedule[step] is not None:
            apply_replica_plans(model, optimizer, [_plan(p) for p in schedule[step]])
        skipping.append(skipping_ranks(model))
        hooks += [p.register_hook(lambda g: grads.append(1)) for p in model.unwrap().parameters()]
        rows = 4 // micro
        for m in range(micro):
            batch = {k: v[4 * d + rows * m:4 * d + rows * (m + 1)] for k, v in _global_batch(step).items()}
            if m < micro - 1:
                with booster.no_sync(model, optimizer):
                    loss = model(**batch).loss / micro
                    booster.backward(loss, optimizer)
            else:
                loss = model(**batch).loss / micro
                booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()) * micro)
        for hook in hooks[-len(list(model.unwrap().parameters())):]:
            hook.remove()
        skipping[-1] = (skipping[-1], len(fired), len(grads))
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
        for step, (ranks, fired, grads) in enumerate(skipping):
            skips = idle[step] == rank
            assert ranks == (() if idle[step] is None or idle[step] // 2 != rank // 2 else (idle[step] % 2,)), \
                (rank, step, ranks)
            assert (fired == 0 and grads == 0) if skips else (fired > 0 and grads > 0), (rank, step, fired, grads)
        assert losses == every[rank - rank % 2][0], f"rank {rank} reads another loss than its replica's first rank"
