"""Uneven tensor-parallel shards on the bench's ViT (DESIGN §8): built by the policy and re-planned mid-run.

The ViT of ``semimig bench`` (:func:`semimig.models.tiny_vit`, hidden 64, 4 heads, intermediate
256, 2 layers; separate ``query``/``key``/``value``, one head per KV group) under
``HybridParallelPlugin(tp_size=2)``, fp32, AdamW, gloo, on digits batches; each case builds the
model from the same seed.

Checked: Colossal-AI's own ViT policy, ``SemiMigPolicy()`` and the even plan in units give the
same losses bit for bit; uneven plans (MLP blocks of 32 columns, heads 3:1 and 1:3) give them
within fp32 reassociation tolerance, with each rank's widths and head counts following the plan;
a re-plan even -> uneven after 3 steps and back after 3 more gives the uninterrupted run's losses.

Tolerance.  An uneven plan only reorders the sums over the MLP intermediate dimension and over the
heads' columns of ``attention.output.dense`` (~1e-7 relative per step in fp32), carried by AdamW
(lr 1e-3) into the weights; 9 steps leave the losses (~2.3) within ~1e-6: ``atol = 2e-5`` as for
the language models (tests/multirank/test_uneven_policy.py).
"""
from __future__ import annotations

import pytest
import torch

from dist_harness import run_pooled

ATOL = 2e-5
STEPS = 9
EVEN = dict(mlp_units=(4, 4), kv_units=(2, 2), block_size=32)
UNEVEN = {"mlp6:2-heads3:1": dict(mlp_units=(6, 2), kv_units=(3, 1), block_size=32),
          "mlp1:7-heads1:3": dict(mlp_units=(1, 7), kv_units=(1, 3), block_size=32)}


def _batch(step):
    from semimig.models import digits_split

    x, y, _, _ = digits_split(seed=0)
    gen = torch.Generator().manual_seed(step)
    idx = torch.randperm(len(y), generator=gen)[:32]
    return {"pixel_values": x[idx], "labels": y[idx]}


def _train(policy, plans=None):
    """Losses of :data:`STEPS` steps, each plan in ``plans.get(s, [])`` applied before step ``s``; and rank 0's
    widths of the first layer's ``query`` and ``intermediate.dense`` and its attention's head count."""
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    from semimig.models import VitSize, tiny_vit
    from semimig.sharding import apply_plan

    booster = Booster(plugin=HybridParallelPlugin(tp_size=2, pp_size=1, precision="fp32", custom_policy=policy))
    model = tiny_vit(VitSize(hidden=64, layers=2, heads=4, intermediate=256), seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, *_ = booster.boost(model, optimizer)
    losses = []
    for step in range(STEPS):
        for plan in (plans or {}).get(step, []):
            apply_plan(model, optimizer, plan)
        loss = model(**_batch(step)).loss
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    layer = model.unwrap().vit.encoder.layer[0]
    shape = (tuple(layer.attention.attention.query.weight.shape), tuple(layer.intermediate.dense.weight.shape),
             layer.attention.attention.num_attention_heads, layer.attention.attention.all_head_size)
    return losses, shape


def _body(rank, world):
    """Every case's losses and, per rank, its widths (rank 0 returns them)."""
    import torch.distributed as dist

    from semimig.shardformer import SemiMigPolicy, UnevenPlan

    out = {"cai": _train(None), "none": _train(SemiMigPolicy()),
           "even-plan": _train(SemiMigPolicy(shard_plan=UnevenPlan(**EVEN)))}
    for key, spec in UNEVEN.items():
        out[key] = _train(SemiMigPolicy(shard_plan=UnevenPlan(**spec)))
    first = UnevenPlan(**UNEVEN["mlp6:2-heads3:1"])
    out["replanned"] = _train(SemiMigPolicy(shard_plan=UnevenPlan(**EVEN)), {3: [first], 6: [UnevenPlan(**EVEN)]})
    shapes = [None] * world
    dist.all_gather_object(shapes, {key: shape for key, (_, shape) in out.items()})
    return {key: (losses, [ranks[key] for ranks in shapes]) for key, (losses, _) in out.items()}


@pytest.fixture(scope="module")
def runs():
    return run_pooled(_body, 2, timeout_s=600)


def test_vit_even_plan_is_colossalai_bit_for_bit(runs):
    out = runs
    assert out["none"][0] == out["cai"][0]
    assert out["even-plan"] == out["none"]
    assert out["cai"][0][-1] < out["cai"][0][0]  # it trained


def test_vit_uneven_plans_train_like_the_even_layout_with_the_planned_widths(runs):
    even = runs["cai"][0]
    for key, spec in UNEVEN.items():
        losses, shapes = runs[key]
        torch.testing.assert_close(losses, even, atol=ATOL, rtol=0.0, msg=key)
        for rank, (query, intermediate, heads, width) in enumerate(shapes):
            assert heads == spec["kv_units"][rank] and width == 16 * heads, (key, rank)
            assert query == (width, 64) and intermediate == (32 * spec["mlp_units"][rank], 64), (key, rank)


def test_vit_replan_mid_run_gives_the_uninterrupted_losses(runs):
    out = runs
    losses, shape = out["replanned"]
    torch.testing.assert_close(losses, out["cai"][0], atol=ATOL, rtol=0.0)
    assert shape == out["even-plan"][1]  # back to the even widths
