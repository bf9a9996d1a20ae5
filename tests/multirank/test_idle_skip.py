"""A rank holding no unit skips the step (DESIGN §8, :mod:`semimig.shardformer.skip`): exact, and idle.

The tiny Llama of tests/multirank/test_zero_units.py (hidden 64, 8 heads, 4 KV groups, intermediate 256 =
4 blocks of 64, 2 layers, vocabulary 128) under ``HybridParallelPlugin(tp_size=e)`` with
``SemiMigPolicy(shard_plan=...)`` and ``semimig.enable(mode="off")`` (a fixed plan: skipping needs
enable's optimizer hook), gloo, fp32, AdamW (lr 1e-3); ``e`` 2 (rank 0 idle: the one holder reduces
alone) and 4 (rank 1 idle: an idle rank between two holders, the vocabulary split 43/43/42 over the
other three).  Checked against the dense single-process Hugging Face model from the same seed:

- every rank's losses of 4 steps (the idle rank's is the first holder's, received) and every full weight
  after 2 steps (gathered by the run's own layout, the vocabulary's uneven rows included);
- the idle rank runs no layer (no forward hook of any module below the model fires on it), no gradient
  reaches any of its parameters, and its replicated parameters (the norms) equal the first holder's
  after every step;
- a re-plan even → idle plan → even (``apply_plan``: the vocabulary rows move with their optimizer
  state, the idle rank takes the replicated parameters' state back) gives the uninterrupted even run's
  losses.

Tolerances as in tests/multirank/test_zero_units.py: a plan changes only the order of sums (the
vocabulary's logsumexp is summed over other parts too), ~1e-7 relative per step in fp32.
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
WEIGHT = dict(atol=1e-5, rtol=0.0)
BLOCK = 64
IDLE = {2: (0, dict(mlp_units=(0, 4), kv_units=(0, 4), block_size=BLOCK)),
        4: (1, dict(mlp_units=(2, 0, 1, 1), kv_units=(1, 0, 2, 1), block_size=BLOCK))}
STEPS = 4
TIMEOUT_S = 420


def _boost(world, plan):
    import semimig
    from semimig.shardformer import SemiMigPolicy, UnevenPlan

    shard_plan = UnevenPlan() if plan is None else UnevenPlan(**plan)
    booster, model, optimizer, plugin = boost_lm(tiny_lm("llama"), tp=world, make_vocab_size_divisible_by=8,
                                                 policy=SemiMigPolicy(shard_plan=shard_plan))
    balancer = semimig.enable(model, plugin, optimizer=optimizer, mode="off")
    return booster, model, optimizer, balancer


def _step(run, step):
    booster, model, optimizer, _ = run
    loss = model(**token_batch(step)).loss
    booster.backward(loss, optimizer)
    optimizer.step()
    optimizer.zero_grad()
    return float(loss.detach())


def _full(model):
    return {name: gather_like(p, p.data) for name, p in model.unwrap().named_parameters()}


def _norms(model):
    return {n: p.detach().clone() for n, p in model.unwrap().named_parameters() if "norm" in n}


def _exact_body(rank, world, root):
    import torch.distributed as dist

    from semimig.shardformer.skip import skipping_ranks

    idle, plan = IDLE[world]
    run = _boost(world, plan)
    model = run[1]
    fired = []
    hooks = [m.register_forward_hook(lambda *_: fired.append(1)) for m in model.unwrap().modules()]
    grads = []
    hooks += [p.register_hook(lambda g: grads.append(1)) for p in model.unwrap().parameters() if p.requires_grad]
    losses, weights, norms_equal = [], None, []
    for step in range(STEPS):
        losses.append(_step(run, step))
        norms = [None] * world
        dist.all_gather_object(norms, _norms(model))
        norms_equal.append(all(torch.equal(norms[r][n], norms[(idle + 1) % world][n]) for r in range(world)
                               for n in norms[0]))
        if step == 1:
            weights = _full(model)
    for hook in hooks:
        hook.remove()
    out = {"losses": losses, "weights": weights, "skipping": skipping_ranks(model), "fired": len(fired),
           "grads": len(grads), "norms_equal": norms_equal}
    every = [None] * world
    dist.all_gather_object(every, {k: v for k, v in out.items() if k != "weights"})
    if rank == 0:
        torch.save({"ranks": every, "weights": weights}, os.path.join(root, "results.pt"))
    return rank


@pytest.fixture(scope="module")
def dense():
    return dense_llama_run(STEPS)


@pytest.mark.parametrize("world", [2, 4])
def test_the_idle_rank_skips_the_step_and_training_is_the_dense_models(world, dense, tmp_path: Path):
    run_on_ranks(_exact_body, world, str(tmp_path), timeout_s=TIMEOUT_S)
    out = torch.load(tmp_path / "results.pt")
    idle = IDLE[world][0]
    for rank, mine in enumerate(out["ranks"]):
        assert mine["skipping"] == (idle,)
        torch.testing.assert_close(mine["losses"], dense["losses"], **LOSS, msg=f"rank {rank}'s losses")
        assert all(mine["norms_equal"]), f"rank {rank}: the replicated parameters differ across ranks"
        if rank == idle:
            assert mine["fired"] == 0 and mine["grads"] == 0, "the idle rank ran a layer or took a gradient"
        else:
            assert mine["fired"] > 0 and mine["grads"] > 0
    for name, want in dense["weights"].items():
        torch.testing.assert_close(out["weights"][name], want, **WEIGHT, msg=f"{name} after two steps")


def _replan_body(rank, world):
    from semimig.sharding import apply_plan
    from semimig.shardformer import UnevenPlan
    from semimig.shardformer.skip import skipping_ranks

    idle, plan = IDLE[world]
    even = UnevenPlan(mlp_units=(4 // world,) * world, kv_units=(4 // world,) * world, block_size=BLOCK)
    uninterrupted = [_step(r, s) for r in [_boost(world, None)] for s in range(6)]
    run = _boost(world, None)
    losses = [_step(run, s) for s in range(2)]
    apply_plan(run[1], run[2], UnevenPlan(**plan))
    skipped = skipping_ranks(run[1])
    losses += [_step(run, s) for s in range(2, 4)]
    apply_plan(run[1], run[2], even)
    back = skipping_ranks(run[1])
    losses += [_step(run, s) for s in range(4, 6)]
    import torch.distributed as dist

    every = [None] * world
    dist.all_gather_object(every, {"uninterrupted": uninterrupted, "losses": losses, "skipped": skipped,
                                   "back": back, "idle": idle})
    return every


@pytest.mark.parametrize("world", [2, 4])
def test_a_replan_into_and_out_of_an_idle_rank_trains_like_the_even_run(world):
    every = run_on_ranks(_replan_body, world, timeout_s=TIMEOUT_S)
    for rank, out in enumerate(every):
        assert out["skipped"] == (out["idle"],) and out["back"] == ()
        torch.testing.assert_close(out["losses"], out["uninterrupted"], **LOSS, msg=f"rank {rank}")
