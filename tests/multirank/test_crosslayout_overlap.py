"""The cross-layout reduction overlapped with the backward, one bucket per TP layer
(semimig.shardformer.layer_buckets): tp 2 x dp 2 on gloo.

The tiny Llama of tests/multirank/test_replica_plans.py (2 layers, 8 heads, 4 KV groups, MLP 256 in blocks of
32) under a plan per replica, SGD with momentum, a global batch of 8 rows, replica ``d`` taking rows
``4d … 4d+3``, for three steps:

- step 0: layer 0's ``up_proj`` switched off (a forward hook replaces its output with ones, a constant), so
  its weight takes no gradient (every parameter DDP reduces still does): its bucket, and the ones after
  it in the backward's order, are posted at the end of the backward, its gradient zero;
- step 1: two micro-batches, the first (under ``no_sync``) with layer 0's ``up_proj``, the last without it:
  its hook never fires in the synchronised backward, and the gradient it accumulated under ``no_sync`` is
  reduced at the end;
- step 2: two micro-batches, every layer in use: every bucket this rank exchanges anything in is posted
  from the parameters' hooks, during the backward.

Checked: every step's paired gradients (gathered by each rank's own plan) and every weight after the
steps against one dense process running the same micro-batches and switches on all 8 rows from the same
seed (fp32, within reassociation); the same run with the reduction in one shot at the end of backward
(``reduction.overlap`` unset: the synchronous path) gives the same gradients and weights bit for bit;
and the counts of buckets posted from the hooks and at the end.  With a plan giving replica 1's TP rank 1
no MLP unit (zero-width gate/up/down), that rank exchanges nothing in the MLP buckets and no rank waits
for them.
"""
from __future__ import annotations

import pytest
import torch

from dist_harness import run_pooled
from replica_cases import EVEN, global_batch, plan, sgd
from tiny_lms import boost_lm, gather_like, tiny_lm

TOL = dict(atol=2e-5, rtol=1e-4)  # fp32: the uneven splits reorder sums over the intermediate dim and heads
TIMEOUT_S = 300
SCHEDULE = [(1, (True,)), (2, (False, True)), (2, (False, False))]  # per step: micro-batches, layer 0's up off
LAYER_BUCKETS = 7  # q, k, v, o, gate, up, down
THREE_ONE = ((6, 2), (3, 1))
ONE_THREE = ((2, 6), (1, 3))
NO_MLP = ((8, 0), (2, 2))  # TP rank 1 holds no MLP block


def _switch(up, off):
    """Layer 0's ``up_proj`` outputs ones while ``off`` (its weight then takes no gradient); the handle."""
    return up.register_forward_hook(lambda module, args, out: torch.ones_like(out)) if off else None


def _micro_rows(step, micro, m, replicas):
    rows = 4 // micro
    return {k: torch.cat([v[4 * d + rows * m:4 * d + rows * (m + 1)] for d in replicas])
            for k, v in global_batch(step).items()}


def _paired(model):
    from semimig.shardformer.replan import _layers

    names = {id(p): n for n, p in model.unwrap().named_parameters()}
    _, layers = _layers(model)
    return {names[id(p)]: gather_like(p, p.grad).float() for layer in layers for _, p, _ in layer.params()}


def _train(plans, overlap):
    from semimig.shardformer import SemiMigPolicy
    from semimig.shardformer.replicas import apply_replica_plans, replica_reduction

    model = tiny_lm("llama")
    booster, model, optimizer, plugin = boost_lm(model, optimizer=sgd(model),
                                                 policy=SemiMigPolicy(shard_plan=plan(EVEN)))
    d = plugin.dp_group.rank()
    apply_replica_plans(model, optimizer, [plan(p) for p in plans])
    reduction = replica_reduction(model)
    if not overlap:
        reduction.overlap = None  # the one-shot reduction at the end of the backward
    up = model.unwrap().model.layers[0].mlp.up_proj
    grads, posted = [], []
    for step, (micro, offs) in enumerate(SCHEDULE):
        for m, off in enumerate(offs):
            handle = _switch(up, off)
            batch = _micro_rows(step, micro, m, [d])
            if m < micro - 1:
                with booster.no_sync(model, optimizer):
                    booster.backward(model(**batch).loss / micro, optimizer)
            else:
                booster.backward(model(**batch).loss / micro, optimizer)
            if handle is not None:
                handle.remove()
        grads.append(_paired(model))
        posted.append(reduction.overlap.last if overlap else None)
        optimizer.step()
        optimizer.zero_grad()
    weights = {n: gather_like(p, p.data).float() for n, p in model.unwrap().named_parameters()}
    exchanging = sum(reduction.overlap._exchanges) if overlap else None
    return grads, weights, posted, exchanging, reduction.reductions


def _body(rank, world, plans):
    import torch.distributed as dist

    out = {"overlap": _train(plans, True), "one-shot": _train(plans, False)}
    every = [None] * world
    dist.all_gather_object(every, out)
    return every


def _dense():
    model = tiny_lm("llama")
    optimizer = sgd(model)
    up = model.model.layers[0].mlp.up_proj
    grads = []
    for step, (micro, offs) in enumerate(SCHEDULE):
        for m, off in enumerate(offs):
            handle = _switch(up, off)
            (model(**_micro_rows(step, micro, m, [0, 1])).loss / micro).backward()
            if handle is not None:
                handle.remove()
        grads.append({n: torch.zeros_like(p) if p.grad is None else p.grad.clone()
                      for n, p in model.named_parameters()})
        optimizer.step()
        optimizer.zero_grad()
    return grads, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("plans", [(ONE_THREE, THREE_ONE), (EVEN, NO_MLP)], ids=["1:3|3:1", "even|no-mlp-on-rank-1"])
def test_overlapped_buckets_reduce_as_the_one_shot_reduction_and_post_during_backward(plans):
    every = run_pooled(_body, 4, plans, timeout_s=TIMEOUT_S)
    dense_grads, dense_weights = _dense()
    for rank, out in enumerate(every):
        grads, weights, posted, exchanging, reductions = out["overlap"]
        one_grads, one_weights, _, _, one_reductions = out["one-shot"]
        assert reductions == one_reductions == len(SCHEDULE), (rank, reductions, one_reductions)
        for step, step_grads in enumerate(grads):
            assert step_grads.keys() == one_grads[step].keys()
            for name, grad in step_grads.items():
                assert torch.equal(grad, one_grads[step][name]), (rank, step, name)
                torch.testing.assert_close(grad, dense_grads[step][name], **TOL,
                                           msg=lambda m, n=name, r=rank, s=step: f"rank {r} step {s} {n}: {m}")
        for name, value in weights.items():
            assert torch.equal(value, one_weights[name]), (rank, name)
            torch.testing.assert_close(value, dense_weights[name], **TOL,
                                       msg=lambda m, n=name, r=rank: f"rank {r} {n}: {m}")
        # the buckets this rank exchanges in: all 14 layers', but the MLP's where it holds no MLP column
        assert exchanging == (2 * LAYER_BUCKETS - 2 * 3 if plans[1] == NO_MLP and rank == 3 else 2 * LAYER_BUCKETS), \
            (rank, exchanging)
        for step, (hooks, end) in enumerate(posted):
            assert hooks + end == exchanging, (rank, step, posted)
        # layer 0's up_proj off in the synchronised backward: layer 1's 7 buckets and layer 0's down_proj (the
        # backward completes them first) are posted from the hooks, up_proj and the 5 after it at the end; a
        # rank holding no MLP column exchanges nothing in up_proj's bucket, so no bucket of its waits for it
        expected = (8, 0) if exchanging < 2 * LAYER_BUCKETS else (8, 6)
        assert posted[0] == posted[1] == expected, (rank, posted)
        assert posted[2] == (exchanging, 0), (rank, posted)  # every layer in use: all from the hooks
