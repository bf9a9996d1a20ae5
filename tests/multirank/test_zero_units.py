"""A rank may hold zero units of a kind (DESIGN §8): exact training, re-plans and checkpoints.

The tiny Llama (hidden 64, 8 heads, 4 KV groups, intermediate 256 = 4 blocks of 64, 2 layers) under
``HybridParallelPlugin(tp_size=e)`` with ``SemiMigPolicy(shard_plan=UnevenPlan(...))``, gloo, fp32,
AdamW (lr 1e-3); one spawn per case, ``e`` 2 and 4.  The zero plans give one rank no MLP block and no
KV group (:data:`ZERO`: rank 0 at tp 2, a middle rank at tp 4, so an empty shard sits at offset 0
and between two others).  That rank's ``q/k/v/gate/up`` produce ``[M, 0]`` outputs and a zero
``dx``, its ``o/down`` a zero partial; it joins none of the layers' reductions and receives their sums from
the first holder (:mod:`semimig.comm.holders`; the message counts are checked).

Checked against the dense single-process Hugging Face model from the same seed (:func:`tiny_lms.dense_llama_run`):
- step 0's loss (the forward), every parameter's gradient after step 0's backward (gathered to the
  full tensor by the run's own layout) and every parameter after two AdamW steps, and the losses of
  3 steps;
- a re-plan from even to the zero plan after 2 steps (the zero rank's weights and AdamW moments
  become ``[0, ·]`` / ``[·, 0]``) gives the uninterrupted even run's losses, there and straight back bit
  for bit, and every gathered weight and moment is bit-equal across the move;
- a checkpoint saved under the zero plan (sharded model and optimizer files) loads into the even
  layout and back into the zero plan: every full weight and moment bit-equal to the source's, and the
  next two steps give the source's continued losses.

Tolerances.  A plan changes only the order of the sums over the intermediate dimension and over the
heads' columns of ``o`` (the zero rank adds an exact zero): ~1e-7 relative per step in fp32.  Losses
(~4.85): ``atol = 2e-5`` as in tests/multirank/test_uneven_policy.py.  Gradients: ``rtol = 1e-4`` with
``atol = 1e-7`` (the smallest entries are sums whose cancellation leaves the reassociation visible
in relative terms).  Weights after two AdamW steps: AdamW's first steps move each weight by about
``lr · sign(g)`` whatever ``|g|`` is, so an entry whose gradient is at the reassociation level could
move differently; ``atol = 1e-5`` (a hundredth of one step's move), ``rtol = 0``.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from dist_harness import run_on_ranks

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU/gloo path")

from tiny_lms import boost_lm, dense_llama_run, gather_like, tiny_lm, token_batch  # noqa: E402
LOSS = dict(atol=2e-5, rtol=0.0)
GRAD = dict(atol=1e-7, rtol=1e-4)
WEIGHT = dict(atol=1e-5, rtol=0.0)
BLOCK = 64
ZERO = {2: dict(mlp_units=(0, 4), kv_units=(0, 4), block_size=BLOCK),
        4: dict(mlp_units=(2, 0, 1, 1), kv_units=(1, 0, 2, 1), block_size=BLOCK)}
TWO_SETS = dict(mlp_units=(2, 0, 1, 1), kv_units=(2, 0, 2, 0), block_size=BLOCK)
"""tp 4 with two holder sets: the MLP on ranks 0, 2, 3, the KV groups on 0 and 2 only."""
TIMEOUT_S = 420


def _boost(world, plan):
    """``plan``: ``None`` (the even layout) or :data:`ZERO`-style keywords."""
    from semimig.shardformer import SemiMigPolicy, UnevenPlan

    shard_plan = UnevenPlan() if plan is None else UnevenPlan(**plan)
    # the vocabulary (128) padded to a multiple of 64·tp would differ from the dense model's
    booster, model, optimizer, _ = boost_lm(tiny_lm("llama"), tp=world, policy=SemiMigPolicy(shard_plan=shard_plan),
                                            make_vocab_size_divisible_by=8)
    return booster, model, optimizer


def _step(run, step):
    booster, model, optimizer = run
    loss = model(**token_batch(step)).loss
    booster.backward(loss, optimizer)
    optimizer.step()
    optimizer.zero_grad()
    return float(loss.detach())


def _full(model, of=lambda p: p.data):
    return {name: gather_like(p, of(p)) for name, p in model.unwrap().named_parameters()}


def _moments(run):
    _, model, optimizer = run
    state = optimizer.optim.state
    return {name: {key: gather_like(p, state[p][key]) for key in ("exp_avg", "exp_avg_sq")}
            for name, p in model.unwrap().named_parameters()}


def _save(rank, out, root):
    if rank == 0:  # tensors through a file: the pipe would share their storage with a process that exits
        torch.save(out, os.path.join(root, "results.pt"))


# ----------------------------------------------------------------------------- exactness against dense
def _exact_body(rank, world, root, plan):
    run = _boost(world, plan)
    booster, model, optimizer = run
    shapes = {n: tuple(p.shape) for n, p in model.unwrap().named_parameters() if "layers.0." in n}
    loss = model(**token_batch(0)).loss
    booster.backward(loss, optimizer)
    out = {"grads": _full(model, lambda p: p.grad), "shapes": shapes, "losses": [float(loss.detach())]}
    optimizer.step()
    optimizer.zero_grad()
    out["losses"].append(_step(run, 1))
    out["weights"] = _full(model)
    out["losses"].append(_step(run, 2))
    _save(rank, out, root)
    return rank


@pytest.fixture(scope="module")
def dense():
    return dense_llama_run(3)


@pytest.mark.parametrize("world, plan", [(2, ZERO[2]), (4, ZERO[4]), (4, TWO_SETS)], ids=["tp2", "tp4", "tp4-two-sets"])
def test_a_zero_unit_plan_trains_like_the_dense_model(world, plan, dense, tmp_path: Path):
    """``tp4-two-sets``: the ranks holding both kinds make one holder group more than the rank holding MLP
    blocks only; every rank of the group still meets the others under the same group names."""
    run_on_ranks(_exact_body, world, str(tmp_path), plan, timeout_s=TIMEOUT_S)
    out = torch.load(tmp_path / "results.pt")
    torch.testing.assert_close(out["losses"], dense["losses"], **LOSS)
    assert out["grads"].keys() == dense["grads"].keys()
    for name, want in dense["grads"].items():
        torch.testing.assert_close(out["grads"][name], want, **GRAD, msg=f"gradient of {name}")
    for name, want in dense["weights"].items():
        torch.testing.assert_close(out["weights"][name], want, **WEIGHT, msg=f"{name} after two steps")
    if world == 2:  # rank 0 holds nothing of the paired dimensions
        shapes = out["shapes"]
        assert shapes["model.layers.0.self_attn.q_proj.weight"] == (0, 64)
        assert shapes["model.layers.0.self_attn.k_proj.weight"] == (0, 64)
        assert shapes["model.layers.0.self_attn.o_proj.weight"] == (64, 0)
        assert shapes["model.layers.0.mlp.up_proj.weight"] == (0, 64)
        assert shapes["model.layers.0.mlp.down_proj.weight"] == (64, 0)


# ----------------------------------------------------------------------------- the holders' sum
def _traffic_body(rank, world):
    import torch.distributed as dist

    from semimig.comm.traffic import count_traffic
    from semimig.nn.balanced import BalancedLinearMixin

    run = _boost(world, ZERO[world])
    _step(run, 0)  # the holder groups are made at the first step
    with count_traffic() as counter:
        _step(run, 1)
    layers = [m for m in run[1].unwrap().modules() if isinstance(m, BalancedLinearMixin) and m.shard_plans]
    calls = {op: int(v["calls"]) for op, v in counter.totals().items()}
    every = [None] * world
    dist.all_gather_object(every, (calls, len(layers)))
    return every


@pytest.mark.parametrize("world", [2, 4])
def test_a_rank_holding_nothing_receives_the_sums_and_joins_no_reduction(world):
    """Every planned layer's sum (row forward, column backward) reaches the idle rank as one message from
    the first holder; the idle rank is in none of the layers' reductions, the holders reduce among
    themselves (at tp 2 the one holder has nothing to reduce)."""
    every = run_on_ranks(_traffic_body, world, timeout_s=TIMEOUT_S)
    idle = 0 if world == 2 else 1
    holders = [r for r in range(world) if r != idle]
    calls, layers = every[idle]
    assert layers > 0
    assert calls.get("recv") == layers and "all_reduce" not in calls and "send" not in calls
    for r in holders:
        mine, _ = every[r]
        assert "recv" not in mine
        assert mine.get("send", 0) == (layers if r == holders[0] else 0)
        assert mine.get("all_reduce", 0) == (layers if len(holders) > 1 else 0)


# ----------------------------------------------------------------------------- a re-plan to and from zero
def _replan_body(rank, world):
    from semimig.sharding import apply_plan, current_plan
    from semimig.shardformer import UnevenPlan

    zero, even = UnevenPlan(**ZERO[world]), UnevenPlan(mlp_units=(4 // world,) * world,
                                                        kv_units=(4 // world,) * world, block_size=BLOCK)
    out = {"uninterrupted": [_step(r, s) for r in [_boost(world, None)] for s in range(5)]}
    run = _boost(world, None)
    losses = [_step(run, s) for s in range(2)]
    before = (_full(run[1]), _moments(run))
    report = apply_plan(run[1], run[2], zero)
    out["copied"] = all(torch.equal(a, b) for a, b in zip(before[0].values(), _full(run[1]).values())) and all(
        torch.equal(a[k], b[k]) for a, b in zip(before[1].values(), _moments(run).values()) for k in a)
    out["plan"] = str(current_plan(run[1], block_size=BLOCK))
    out["moved"] = report.layers_changed
    out["empty_shapes"] = {n: (tuple(p.shape), tuple(run[2].optim.state[p]["exp_avg"].shape))
                           for n, p in run[1].unwrap().named_parameters() if n.startswith("model.layers.0.self_attn.q")}
    out["replanned"] = losses + [_step(run, s) for s in range(2, 5)]
    run = _boost(world, None)
    losses = [_step(run, s) for s in range(2)]
    apply_plan(run[1], run[2], zero)
    apply_plan(run[1], run[2], even)
    out["there-and-back"] = losses + [_step(run, s) for s in range(2, 5)]
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_a_replan_to_a_zero_unit_plan_mid_run_is_exact(world):
    out = run_on_ranks(_replan_body, world, timeout_s=TIMEOUT_S)
    reference = out["uninterrupted"]
    torch.testing.assert_close(out["replanned"], reference, **LOSS)
    assert reference[-1] < reference[0]
    assert out["there-and-back"] == reference
    assert out["copied"]
    assert out["moved"] == 14  # every paired layer of both blocks
    z = ZERO[world]
    assert out["plan"] == f"UnevenPlan(mlp={list(z['mlp_units'])} x {BLOCK}, kv_groups={list(z['kv_units'])})"
    if world == 2:  # rank 0 reports and holds nothing: its weight and moments are empty
        assert out["empty_shapes"] == {"model.layers.0.self_attn.q_proj.weight": ((0, 64), (0, 64))}


# ----------------------------------------------------------------------------- checkpoints
def _ckpt_body(rank, world, root):
    source = _boost(world, ZERO[world])
    for s in range(2):
        _step(source, s)
    booster, model, optimizer = source
    booster.save_model(model, os.path.join(root, "model"), shard=True, size_per_shard=1)
    booster.save_optimizer(optimizer, os.path.join(root, "optim"), shard=True, size_per_shard=1)
    out = {"source": (_full(model), _moments(source)), "continued": [_step(source, s) for s in (2, 3)]}
    for name, plan in (("even", None), ("zero", ZERO[world])):
        run = _boost(world, plan)
        run[0].load_model(run[1], os.path.join(root, "model"))
        run[0].load_optimizer(run[2], os.path.join(root, "optim"))
        out[name] = {"states": (_full(run[1]), _moments(run)), "losses": [_step(run, s) for s in (2, 3)]}
    _save(rank, out, root)
    return rank


@pytest.mark.parametrize("world", [2, 4])
def test_a_zero_unit_checkpoint_loads_into_the_even_layout_and_back(world, tmp_path: Path):
    run_on_ranks(_ckpt_body, world, str(tmp_path), timeout_s=TIMEOUT_S)
    out = torch.load(tmp_path / "results.pt")
    weights, moments = out["source"]
    for target in ("even", "zero"):
        got_weights, got_moments = out[target]["states"]
        for name, want in weights.items():
            assert torch.equal(got_weights[name], want), (target, name)
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(got_moments[name][key], moments[name][key]), (target, name, key)
    torch.testing.assert_close(out["even"]["losses"], out["continued"], **LOSS)
    assert out["zero"]["losses"] == out["continued"]
