"""The plan a model can re-plan from: its layers' current plan in units, and the even one.

Re-sharding moves MLP blocks (``block_size`` columns of the intermediate size) and KV groups
(a KV head with its query heads); a model built with ``SemiMigPolicy(shard_plan=...)`` in units
can move, and :func:`params_per_unit` gives what one unit weighs (its parameters over the layers).
"""
from __future__ import annotations

from typing import Any, Optional

from semimig.errors import ConfigError
from semimig.sharding.plan import units_of

__all__ = ["even_reshardable_plan", "params_per_unit", "reshardable_plan"]


def even_reshardable_plan(config: Any, tp: int, *, block_size: int = 128):
    """The even plan written out in units (MLP blocks of ``block_size``, KV groups), which the
    policy can re-plan: build the model with ``SemiMigPolicy(shard_plan=even_reshardable_plan(...))``."""
    from semimig.shardformer.uneven import UnevenPlan, model_dims

    dims = model_dims(config)
    blocks = units_of(f"the MLP intermediate size (block_size={block_size})", dims.intermediate, block_size)
    for name, total in (("MLP blocks", blocks), ("KV groups", dims.num_kv_heads)):
        if total % tp:
            raise ConfigError(f"an even re-shardable plan needs tp={tp} to divide the model's {total} {name}")
    return UnevenPlan(mlp_units=(blocks // tp,) * tp, kv_units=(dims.num_kv_heads // tp,) * tp,
                      block_size=block_size)


def reshardable_plan(model: Any, plugin: Any, *, block_size: Optional[int] = None):
    """The plan the model was built with, as an :class:`~semimig.shardformer.UnevenPlan` with units
    in both dimensions, or :class:`ConfigError` saying how to build a model that can re-plan."""
    try:
        from semimig.shardformer.replan import current_plan  # the mechanics (branch replan)
    except ImportError:
        current_plan = None
    built = getattr(getattr(plugin, "custom_policy", None), "shard_plan", None)  # the plan the model was built with
    plan = None
    if current_plan is not None:
        try:  # what the layers hold now, in the built plan's block size when there is one
            plan = current_plan(model, block_size=getattr(built, "block_size", None) or block_size)
        except ConfigError:
            plan = None
    if plan is None:
        plan = built
    if plan is None or plan.mlp_units is None or plan.kv_units is None:
        raise ConfigError("re-sharding needs the model built with a plan in units: "
                          "HybridParallelPlugin(custom_policy=SemiMigPolicy(shard_plan="
                          "semimig.resharder.even_reshardable_plan(model.config, tp))), got shard_plan="
                          f"{plan}")
    return plan


def params_per_unit(config: Any, dims: Any, block_size: int) -> tuple[float, float]:
    """Parameters of one MLP block and one KV group, summed over the decoder layers."""
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd")
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer")
    group_q = dims.num_heads // dims.num_kv_heads * dims.head_dim
    if dims.family == "llama":  # gate, up, down; q, o (group_q each) and k, v (head_dim each)
        mlp, kv = 3 * hidden * block_size, 2 * hidden * group_q + 2 * hidden * dims.head_dim
    else:  # GPT-2: c_fc, c_proj; c_attn (3 parts) and attn.c_proj (ViT: the same as separate layers)
        mlp, kv = 2 * hidden * block_size, 4 * hidden * group_q
    return float(mlp * layers), float(kv * layers)

