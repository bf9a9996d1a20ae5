"""``semimig.enable``'s side of re-sharding: what a mode needs, and the re-sharder it gets.

:func:`check_reshard` returns the model's plan in units when the mode re-shards, or refuses by
name what stops it; :func:`make_resharder` builds the :class:`~semimig.resharder.core.Resharder`
(one plan per data-parallel replica under plain DP, one shared plan under ZeRO, whose flat buckets
need equal shapes across the DP group) and the function that rebuilds the controller on the new
shapes after a move.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

import torch.distributed as dist

from semimig.comm import primitives as P
from semimig.controller.reshard import ReshardConfig
from semimig.errors import ConfigError
from semimig.resharder.core import Resharder
from semimig.resharder.plans import reshardable_plan

__all__ = ["check_reshard", "make_resharder", "resizing_mode"]

logger = logging.getLogger(__name__)


def resizing_mode(config: Any) -> str:
    """Mode semi on uneven shards: the zero-* mode of its resizing variant (migration assumes equal K)."""
    return "zero-" + config.resizing.variant


def check_reshard(mode: str, model: Any, plugin: Any, reshard: Any, optimizer: Any) -> Optional[Any]:
    """The model's plan in units when this mode re-shards (``None`` for semi on a model that cannot),
    or :class:`ConfigError` naming what stops it."""
    if reshard is not None and not isinstance(reshard, ReshardConfig):
        raise ConfigError(f"reshard must be a semimig.controller.reshard.ReshardConfig or None, got {reshard!r}")
    if mode not in ("reshard", "semi") or plugin.tp_size == 1:
        return None
    try:
        plan = reshardable_plan(model, plugin, block_size=getattr(reshard, "block_size", None))
    except ConfigError as err:
        if mode == "reshard":
            raise ConfigError(f"mode='reshard': {err}") from None
        logger.info("semimig: mode=semi without re-sharding (%s)", err)
        return None
    blockers = [(plugin.pp_size > 1, f"pp_size={plugin.pp_size} (each stage would re-plan alone)"),
                (getattr(plugin, "dp_size", 1) > 1 and plugin.tp_size * plugin.dp_size != dist.get_world_size(),
                 f"tp_size={plugin.tp_size} x dp_size={getattr(plugin, 'dp_size', 1)} != world size "
                 f"{dist.get_world_size()} (the replicas agree on one plan over the whole world)"),
                (getattr(plugin, "zero_stage", 0) > 0 and getattr(plugin, "zero_config", {}).get("overlap_allgather"),
                 "zero_stage>0 with overlap_allgather=True (pending all-gather handles on the parameters)"),
                (getattr(plugin, "zero_stage", 0) > 0 and getattr(plugin, "cpu_offload", False),
                 "zero_stage>0 with cpu_offload=True (its masters live on the host)")]
    for blocked, why in blockers:
        if blocked:
            if mode == "reshard":
                raise ConfigError(f"mode='reshard' cannot re-plan with {why}")
            logger.info("semimig: mode=semi without re-sharding: %s", why)
            return None
    try:
        import semimig.shardformer.replan  # noqa: F401  (the mechanics that move weights and optimizer state)
    except ImportError:
        if mode == "reshard":
            raise ConfigError("mode='reshard' needs semimig.shardformer.replan (apply_plan), which this install "
                              "lacks") from None
        logger.info("semimig: mode=semi without re-sharding: semimig.shardformer.replan is missing")
        return None
    if optimizer is None:
        if mode == "reshard":
            raise ConfigError("mode='reshard' moves the optimizer state with the weights: pass optimizer= (the "
                              "boosted optimizer)")
        logger.info("semimig: mode=semi without re-sharding: no optimizer= to move the state of")
        return None
    return plan


def make_resharder(model: Any, optimizer: Any, plugin: Any, plan: Any, mode: str, balance_config: Any,
                   reshard: Any, iterations_per_epoch: Optional[int], *, batch: Any = None):
    """The :class:`~semimig.resharder.Resharder` and the function that rebuilds the controller on
    the new shapes after a move (the controller's binding caches every layer's shape).  ``batch`` (a
    :class:`~semimig.hybrid.split.BatchSplit`, plain DP with several replicas): the re-sharder also owns
    the split, every replica's plan and it chosen by one planner (:mod:`semimig.resharder.joint`)."""
    from semimig.controller import BalanceController
    from semimig.nn.balanced import BalancedLinearMixin

    group = plugin.tp_group
    config = getattr(model, "unwrap", lambda: model)().config

    def move(new_plan: Any) -> tuple[int, float]:
        from semimig.shardformer.replan import apply_plan

        report = apply_plan(model, optimizer, new_plan, group=group)
        return int(report.bytes_sent), float(report.seconds)

    def rebuild(old: Any, new_plan: Any, *, settled: bool):
        """A controller on the new shapes (``None``: keep ``old``).  Mode semi on uneven shards: only
        measuring until the policy has a full window under the new plan (``settled``), then resizing
        only, comparing each rank's busy time to the share of it the new plan gives the rank."""
        even = len(set(new_plan.mlp_units)) == 1 and len(set(new_plan.kv_units)) == 1
        if mode == "semi":
            wanted = "semi" if even else (resizing_mode(balance_config) if settled else "baseline")
        else:
            wanted = balance_config.mode
        if settled and wanted == old.config.mode:
            return None
        for layer in (m for m in model.modules() if isinstance(m, BalancedLinearMixin)):
            layer.directive = None
        old.close()
        base = balance_config if wanted == balance_config.mode else dataclasses.replace(balance_config, mode=wanted)
        if mode == "semi" and old.rank == 0 and wanted != old.config.mode:
            logger.info("semimig: shards %s: %s", "even again, migration back on (semi)" if even else
                        "uneven, resizing only (%s) for what varies from step to step, against the busy times "
                        "measured under the new plan (migration assumes equal K per rank)" % wanted if settled else
                        "uneven: resizing paused until a window of steps is measured under the new plan", new_plan)
        new = BalanceController(model, base, process_group=group, iterations_per_epoch=iterations_per_epoch)
        new.iteration, new.epoch = old.iteration, old.epoch
        for timing, before in zip(new.timings, old.timings):
            timing.carry_history(before)  # warm: a slowdown after the move is seen within a few steps
        new.injector.set_position(old.epoch, old.iteration)  # a time-varying straggler keeps its phase
        # resizing compares what varies, not the planned split
        new.busy_scale = resharder.busy_scale() if settled and not even else (1.0,) * resharder.size
        return new, [m for m in model.modules() if isinstance(m, BalancedLinearMixin)]

    reshard = reshard or ReshardConfig()  # the same policy in both modes: the config is taken as given
    replicas = int(getattr(plugin, "dp_size", 1))
    zero_stage = int(getattr(plugin, "zero_stage", 0))
    if zero_stage > 0 and reshard.min_units < 1:
        # LowLevelZero cuts every parameter into equal flat shards per DP rank; a parameter with no
        # elements has none to cut, so under ZeRO every rank keeps at least one unit of each kind
        reshard = dataclasses.replace(reshard, min_units=1)
        if dist.get_rank() == 0:
            logger.info("semimig: zero_stage=%d: every rank keeps at least one unit of each kind (ZeRO's flat "
                        "master shards cannot hold an empty parameter); zero_stage=0 lets a slow rank hold none",
                        zero_stage)

    def move_replicas(plans: tuple) -> tuple[int, float]:
        from semimig.shardformer.replicas import apply_replica_plans

        report = apply_replica_plans(model, optimizer, plans)
        return int(report.bytes_sent), float(report.seconds)

    if replicas > 1 and zero_stage > 0 and dist.get_rank() == 0:
        logger.info("semimig: zero_stage=%d with dp_size=%d: the replicas share one plan, planned for the slowest "
                    "rank at each TP position (ZeRO's flat gradient buckets and master shards need equal shapes "
                    "across the data-parallel group; zero_stage=0 lets each replica plan for itself)",
                    zero_stage, replicas)
    joint = None
    if batch is not None and replicas > 1 and zero_stage == 0:
        from semimig.resharder.joint import joint_setup
        from semimig.resharder.plans import params_per_unit
        from semimig.shardformer.uneven import model_dims

        units = params_per_unit(config, model_dims(config), plan.block_size)
        joint = joint_setup(model, optimizer, plugin, plan, batch, units=units, min_units=reshard.min_units)
    resharder = Resharder(plan, config, group=group, move=move, config=reshard, replicas=replicas,
                          world_group=None, dp_rank=P.group_rank(plugin.dp_group) if replicas > 1 else 0,
                          dp_group=plugin.dp_group if replicas > 1 else None,
                          move_replicas=move_replicas if replicas > 1 and zero_stage == 0 else None, joint=joint)
    return resharder, rebuild
