"""Short demo: a tiny ViT on digits through ``HybridParallelPlugin(tp_size=2)``, trained twice from
the same seed, once with Colossal-AI's own policy and once with :class:`SemiMigPolicy`; the
losses must agree step for step (no straggler, so semimig computes what Colossal-AI computes).
"""
from __future__ import annotations

import logging

import torch

from semimig.models import VitSize, digits_split, tiny_vit

logger = logging.getLogger(__name__)


def train_hybrid(rank: int, world: int, policy: str, steps: int, batch: int, seed: int, tp: int) -> list[float]:
    """Train ``steps`` SGD steps with ``HybridParallelPlugin(tp_size=tp)``; return the losses.

    ``policy`` is ``"colossalai"`` (the auto policy) or ``"semimig"`` (``SemiMigPolicy()``).
    Runs inside an initialised process group (see :func:`semimig.launch.run_on_ranks`).
    """
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    import semimig.nn  # noqa: F401 - applies the CPU compatibility shim
    from semimig.shardformer import SemiMigPolicy

    if policy not in ("colossalai", "semimig"):
        raise ValueError(f"policy must be 'colossalai' or 'semimig', got {policy!r}")
    custom = SemiMigPolicy() if policy == "semimig" else None
    plugin = HybridParallelPlugin(tp_size=tp, pp_size=1, precision="fp32", custom_policy=custom)
    model = tiny_vit(VitSize(), seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(model, optimizer)
    x_train, y_train, _, _ = digits_split(seed=seed)
    losses = []
    for step in range(steps):
        lo = (step * batch) % (len(y_train) - batch)
        out = model(pixel_values=x_train[lo:lo + batch], labels=y_train[lo:lo + batch])
        booster.backward(out.loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(out.loss.detach()))
    return losses


def _demo_body(rank: int, world: int, steps: int, batch: int, seed: int) -> dict:
    return {
        policy: train_hybrid(rank, world, policy, steps, batch, seed, tp=world)
        for policy in ("colossalai", "semimig")
    }


def run_demo(*, steps: int = 5, batch: int = 32, seed: int = 0, tp: int = 2) -> dict:
    """Run the demo on ``tp`` local gloo ranks; returns ``{"colossalai": [...], "semimig": [...]}``."""
    from semimig.launch import run_on_ranks

    return run_on_ranks(_demo_body, tp, steps, batch, seed, timeout_s=300)
