"""Gradient clipping that counts every tensor-parallel shard once, uneven ones included.

Colossal-AI's ``HybridParallelPlugin`` optimizers (naive, AMP and ZeRO: ``_compute_grad_norm``)
sum ``‖g‖²`` over a rank's gradients, divide it by ``tp`` for every parameter that is not
``is_distributed_tensor`` (``hasattr(p, "dist_layout")``: "replicated, every rank has it") and
all-reduce the sum over the TP group.  A shard with no ``dist_layout`` is then counted ``1/tp``
times instead of once.  Two kinds of shards have none: semimig's uneven shards (a customised
distributed tensor, ``shard_fn``/``gather_fn``, since Colossal-AI's layout type describes only
even splits) and Colossal-AI's own customised shards (the packed ``GPT2FusedLinearConv1D_Col``,
``FusedLinear1D_Col``: GPT-2's ``c_attn`` and ``c_fc``, whose gradient norms stock Colossal-AI
under-counts by ``tp``).

:func:`mark_tp_shards` tags the sharded parameters of semimig's layers (those without
``dist_layout``) with :data:`MARK`; :func:`install` makes the plugin module's
``is_distributed_tensor`` also accept the tag.  Parameters without the tag are judged exactly as
before, so a model the policy did not mark (``shard_plan=None``) clips bit for bit as Colossal-AI.
"""
from __future__ import annotations

import logging

import torch.nn as nn

logger = logging.getLogger(__name__)

__all__ = ["MARK", "mark_tp_shards", "install", "counts_as_sharded"]

MARK = "semimig_tp_shard"
"""Attribute set (``True``) on a parameter that is one rank's shard of a tensor-parallel tensor."""


def counts_as_sharded(tensor) -> bool:
    """Colossal-AI's ``is_distributed_tensor`` or semimig's :data:`MARK`."""
    return hasattr(tensor, "dist_layout") or getattr(tensor, MARK, False) is True


counts_as_sharded.semimig = True  # type: ignore[attr-defined]


def install() -> None:
    """Let the plugin's grad-norm code see :data:`MARK` (idempotent; only the plugin module's name changes)."""
    from colossalai.booster.plugin import hybrid_parallel_plugin as hpp

    if getattr(hpp.is_distributed_tensor, "semimig", False):
        return
    hpp.is_distributed_tensor = counts_as_sharded
    logger.debug("semimig: HybridParallelPlugin's grad norm counts semimig-marked shards once")


def mark_tp_shards(model: nn.Module) -> int:
    """Tag the sharded parameters of semimig's layers that have no ``dist_layout``; return how many.

    Sharded: a column layer's weight and bias, a row layer's weight (its bias is replicated).
    """
    from semimig.nn.balanced import BalancedLinearMixin

    count = 0
    for module in model.modules():
        if not isinstance(module, BalancedLinearMixin):
            continue
        params = [module.weight] + ([module.bias] if module.matrix_kind == "column" else [])
        for param in params:
            if param is None or hasattr(param, "dist_layout"):
                continue
            if not (hasattr(param, "shard_fn") and hasattr(param, "gather_fn")):
                continue  # not a shard (e.g. a layer left whole because out < tp)
            setattr(param, MARK, True)
            count += 1
    return count
