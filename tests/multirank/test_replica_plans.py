"""A shard plan per data-parallel replica, exact (semimig.shardformer.replicas): tp 2 x dp 2 on gloo.

Each case trains the tiny Llama (8 heads, 4 KV groups, MLP 256 in blocks of 32) for two SGD-with-momentum steps
on a global batch of 8 rows, replica ``d`` taking rows ``4d … 4d+3``, with the replicas at different
plans, and compares with one dense process training on all 8 rows from the same seed: the paired
parameters' gradients of step 2 (gathered to full tensors by each rank's own plan) and every weight
after the two steps, on every rank (fp32: within reassociation of sums, the uneven splits reorder the
sums over the intermediate dimension and the heads).  Also: a re-plan of one replica between the two
steps; equal plans leave Colossal-AI's DP all-reduce alone (bit for bit); checkpoints written under
per-replica plans are the even full tensors and load back under any plans; ZeRO is refused by name.
"""
from __future__ import annotations

import os

import pytest
import torch

from dist_harness import run_pooled
from replica_cases import EVEN, global_batch as _global_batch, plan as _plan, replica_backward, sgd as _optimizer
from tiny_lms import boost_lm, gather_like, tiny_lm

THREE_ONE = ((6, 2), (3, 1))
ONE_THREE = ((2, 6), (1, 3))
TOL = dict(atol=2e-5, rtol=1e-4)  # fp32: the uneven splits reorder sums over the intermediate dim and heads
TIMEOUT_S = 300


def _gather_float(param, tensor):
    return gather_like(param, tensor).float()


def _boost(precision="fp32", zero_stage=0):
    from semimig.shardformer import SemiMigPolicy

    model = tiny_lm("llama")
    booster, model, optimizer, plugin = boost_lm(model, precision=precision, optimizer=_optimizer(model),
                                                 policy=SemiMigPolicy(shard_plan=_plan(EVEN)), zero_stage=zero_stage)
    return plugin, booster, model, optimizer


def _weights(model):
    return {n: _gather_float(p, p.data) for n, p in model.unwrap().named_parameters()}


def _momenta(model, optimizer):
    state = optimizer.optim.state
    return {n: _gather_float(p, state[p]["momentum_buffer"]) for n, p in model.unwrap().named_parameters()}


def _paired_grads(model):
    from semimig.shardformer.replan import _layers

    names = {id(p): n for n, p in model.unwrap().named_parameters()}
    _, layers = _layers(model)
    return {names[id(p)]: _gather_float(p, p.grad) for layer in layers for _, p, _ in layer.params()}


def _train(plans_before, plans_between=None, precision="fp32", micro=1, run=None):
    """Two steps on this replica's rows (in ``micro`` micro-batches, all but the last under ``no_sync``);
    ``(losses, step-2 grads of the paired parameters, weights)``."""
    from semimig.shardformer.replicas import apply_replica_plans

    plugin, booster, model, optimizer = run or _boost(precision)
    d = plugin.dp_group.rank()
    if plans_before is not None:
        apply_replica_plans(model, optimizer, [_plan(p) for p in plans_before])
    losses, grads = [], None
    for step in range(2):
        if step == 1 and plans_between is not None:
            apply_replica_plans(model, optimizer, [_plan(p) for p in plans_between])
        loss = replica_backward(booster, model, optimizer, step, d, micro)
        if step == 1:
            grads = _paired_grads(model)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses, grads, _weights(model)


def _dense():
    model = tiny_lm("llama")
    optimizer = _optimizer(model)
    grads = None
    for step in range(2):
        loss = model(**_global_batch(step)).loss
        loss.backward()
        if step == 1:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
    return grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def _gathered(value):
    import torch.distributed as dist

    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, value)
    return every


def _exact_body(rank, world, before, between, micro):
    from semimig.shardformer.replicas import replica_reduction

    run = _boost()
    losses, grads, weights = _train(before, between, micro=micro, run=run)
    reduction = replica_reduction(run[2])
    sent = reduction.bytes_sent / reduction.reductions if reduction is not None else 0
    return _gathered((losses, grads, weights, sent))


@pytest.mark.parametrize("before,between,micro", [((EVEN, THREE_ONE), None, 1), ((ONE_THREE, THREE_ONE), None, 1),
                                                  ((EVEN, EVEN), (EVEN, THREE_ONE), 1),
                                                  ((ONE_THREE, THREE_ONE), None, 2),
                                                  ((ONE_THREE, THREE_ONE), (EVEN, EVEN), 1)],
                         ids=["even|3:1", "1:3|3:1", "re-plan-one-replica-between-steps", "accumulated-1:3|3:1",
                              "back-to-one-plan-between-steps"])
def test_per_replica_plans_train_the_global_batch_exactly(before, between, micro):
    every = run_pooled(_exact_body, 4, before, between, micro, timeout_s=TIMEOUT_S)
    grads, weights = _dense()
    # the bytes of one reduction, all ranks together: the even layout's DP all-reduce of the paired
    # parameters under the ring model, 2(D-1)/D of every shard from every rank = 2 x their full fp32 bytes
    paired = sum(weights[n].numel() * 4 for n in every[0][1])
    assert sum(out[3] for out in every) == (0 if between == (EVEN, EVEN) else 2 * paired)
    for rank, (_, rank_grads, rank_weights, _) in enumerate(every):
        assert rank_grads, rank
        for name, grad in rank_grads.items():
            torch.testing.assert_close(grad, grads[name], **TOL, msg=lambda m, n=name, r=rank: f"rank {r} {n}: {m}")
        assert rank_weights.keys() == weights.keys()
        for name, value in rank_weights.items():
            torch.testing.assert_close(value, weights[name], **TOL, msg=lambda m, n=name, r=rank: f"rank {r} {n}: {m}")
    for rank in (2, 3):  # replica 1's ranks hold replica 0's bits (every holder sums in replica order)
        assert all(torch.equal(every[rank][2][n], every[rank - 2][2][n]) for n in weights), rank


def _calm_body(rank, world):
    return _gathered({"stock": _train(None), "equal": _train((EVEN, EVEN))})


def test_equal_plans_leave_colossal_ai_bit_for_bit():
    every = run_pooled(_calm_body, 4, timeout_s=TIMEOUT_S)
    for out in every:
        stock, equal = out["stock"], out["equal"]
        assert stock[0] == equal[0]
        assert all(torch.equal(stock[2][n], equal[2][n]) for n in stock[2])
        assert all(torch.equal(stock[1][n], equal[1][n]) for n in stock[1])


def _zero_body(rank, world):
    from semimig.errors import ConfigError
    from semimig.shardformer.replicas import apply_replica_plans

    _, _, model, optimizer = _boost("bf16", zero_stage=1)  # Colossal-AI runs ZeRO in mixed precision only
    apply_replica_plans(model, optimizer, [_plan(EVEN), _plan(EVEN)])  # one plan: ZeRO as it is
    try:
        apply_replica_plans(model, optimizer, [_plan(EVEN), _plan(THREE_ONE)])
    except ConfigError as err:
        return _gathered(str(err))
    return _gathered(None)


def test_zero_refuses_per_replica_plans_by_name():
    for message in run_pooled(_zero_body, 4, timeout_s=TIMEOUT_S):
        assert message is not None and "zero_stage=1" in message, message


def _checkpoint_body(rank, world, root):
    """Train under (1:3, 3:1), save; load into the even plan, into (3:1, 1:3) and into stock Colossal-AI."""
    import torch.distributed as dist
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    from semimig.shardformer.replicas import apply_replica_plans

    run = _boost()
    _train((ONE_THREE, THREE_ONE), run=run)
    _, booster, model, optimizer = run
    saved, momenta = _weights(model), _momenta(model, optimizer)
    booster.save_model(model, os.path.join(root, "model"), shard=True, size_per_shard=1)
    booster.save_optimizer(optimizer, os.path.join(root, "optim"), shard=True, size_per_shard=1)
    dist.barrier()
    out = {"saved": saved, "momenta": momenta}
    for target in ("even", "swapped"):
        plugin, booster, model, optimizer = _boost()
        if target == "swapped":
            apply_replica_plans(model, optimizer, [_plan(THREE_ONE), _plan(ONE_THREE)])
        booster.load_model(model, os.path.join(root, "model"))
        booster.load_optimizer(optimizer, os.path.join(root, "optim"))
        out[target] = _weights(model)
        out[target + "-momenta"] = _momenta(model, optimizer)
    stock = HybridParallelPlugin(tp_size=2, pp_size=1, precision="fp32", overlap_communication=False)
    booster = Booster(plugin=stock)
    model, optimizer, *_ = booster.boost(tiny_lm("llama"), _optimizer(tiny_lm("llama")))
    booster.load_model(model, os.path.join(root, "model"))
    out["stock"] = _weights(model)
    return _gathered(out)


def test_checkpoints_from_per_replica_plans_are_the_even_full_tensors_and_load_into_any_plans(tmp_path):
    every = run_pooled(_checkpoint_body, 4, str(tmp_path), timeout_s=TIMEOUT_S)
    _, weights = _dense()
    for rank, out in enumerate(every):
        for name, value in weights.items():
            torch.testing.assert_close(out["saved"][name], value, **TOL)
            for target in ("even", "swapped", "stock"):
                assert torch.equal(out[target][name], out["saved"][name]), (rank, target, name)
            for target in ("even", "swapped"):
                assert torch.equal(out[target + "-momenta"][name], out["momenta"][name]), (rank, target, name)


def _bf16_body(rank, world):
    return _gathered({"stock": _train(None, precision="bf16"),
                      "replicas": _train((ONE_THREE, THREE_ONE), precision="bf16")})


def test_bf16_per_replica_plans_follow_colossal_ai_bf16():
    """bf16 (Colossal-AI's mixed precision: bf16 working gradients reduced, fp32 masters): against the stock
    bf16 run on the same rows.  Tolerance: a bf16 gradient holds 8 significant bits, and the uneven splits and
    the replica-order sum round differently from the even layout's, so elements differ by a few bf16 ulps
    (2^-8 relative each); the weights after two steps by at most one ulp of the bf16 working copy."""
    for out in run_pooled(_bf16_body, 4, timeout_s=TIMEOUT_S):
        (stock_losses, stock_grads, stock_weights), (losses, grads, weights) = out["stock"], out["replicas"]
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(stock_losses), atol=0, rtol=2e-2)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, stock_grads[name], atol=2e-3, rtol=5e-2, msg=name)
        for name, value in weights.items():
            torch.testing.assert_close(value, stock_weights[name], atol=1e-3, rtol=2 ** -7, msg=name)
