"""``semimig.enable``'s side of re-sharding: what a mode needs, and the re-sharder it gets.

:func:`check_reshard` returns the model's plan in units when the mode re-shards, or refuses by
name what stops it; :func:`make_resharder` builds the :class:`~semimig.resharder.core.Resharder`
(one plan per data-parallel replica under plain DP, one shared plan under ZeRO, whose flat buckets
need equal shapes across the DP group) and the function that rebinds the controller to the new
shapes after a move.

With a pipeline (``pp_size > 1``, 1F1B: one model chunk per stage) each stage's TP group re-plans
for itself: ``plugin.tp_group`` is the stage's own, so its ranks' numbers are gathered, its device
probe run and its moves made within it alone, over the decoder layers the stage holds (the plan in
units read from them, a unit's weight counted over them); a slow card in one stage re-plans that
stage and leaves the others as they are.  The pipeline's sends between stages carry activations of
the hidden size, which no plan changes.
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
from semimig.resharder.plans import held_layers, reshardable_plan

__all__ = ["RESHARD_SCHEDULES", "check_reshard", "make_resharder"]

logger = logging.getLogger(__name__)

RESHARD_SCHEDULES = ("OneForwardOneBackwardSchedule",)
"""The pipeline schedules whose stages re-plan: one model chunk per stage, stepped once per iteration
(interleaved and zero-bubble schedules run several chunks per stage)."""


def check_reshard(mode: str, model: Any, plugin: Any, reshard: Any, optimizer: Any) -> Optional[Any]:
    """The model's plan in units when this mode re-shards, or :class:`ConfigError` naming what stops it.

    ``None`` when the mode does not re-shard, with ``tp_size == 1``, and for ``semi`` on a model that
    takes no plan in units (its documented meaning there: resizing and migration, one INFO line).  A
    model that takes a plan re-shards under ``semi`` as under ``reshard``: what stops the re-plan (the
    plugin, no ``optimizer=``) is refused in both modes, never served by a quieter ``semi``."""
    if reshard is not None and not isinstance(reshard, ReshardConfig):
        raise ConfigError(f"reshard must be a semimig.controller.reshard.ReshardConfig or None, got {reshard!r}")
    if mode not in ("reshard", "semi") or plugin.tp_size == 1:
        return None
    try:
        plan = reshardable_plan(model, plugin, block_size=getattr(reshard, "block_size", None))
    except ConfigError as err:
        if mode == "reshard":
            raise ConfigError(f"mode='reshard': {err}") from None
        logger.info("semimig: mode=semi resizes and migrates without re-sharding: the model takes no plan in units "
                    "(%s)", err)
        return None
    hint = "" if mode == "reshard" else (" (semi re-shards a model that takes a plan in units; mode='zero-pri' "
                                         "resizes and mode='mig' migrates without re-sharding)")
    pp, dp = int(plugin.pp_size), int(getattr(plugin, "dp_size", 1))
    schedule = type(getattr(plugin, "scheduler", None)).__name__
    blockers = [(pp > 1 and schedule not in RESHARD_SCHEDULES,
                 f"pipeline schedule {schedule} (pp_style={getattr(plugin, 'pp_style', '?')!r}; each stage re-plans "
                 "under pp_style='1f1b', one model chunk per stage)"),
                (pp > 1 and dp > 1, f"pp_size={pp} with dp_size={dp} (a stage's replicas would plan over the whole "
                                    "world, which holds the other stages; a pipeline re-plans at dp_size=1)"),
                (dp > 1 and plugin.tp_size * dp != dist.get_world_size(),
                 f"tp_size={plugin.tp_size} x dp_size={dp} != world size "
                 f"{dist.get_world_size()} (the replicas agree on one plan over the whole world)"),
                (getattr(plugin, "zero_stage", 0) > 0 and getattr(plugin, "zero_config", {}).get("overlap_allgather"),
                 "zero_stage>0 with overlap_allgather=True (pending all-gather handles on the parameters)"),
                (getattr(plugin, "zero_stage", 0) > 0 and getattr(plugin, "cpu_offload", False),
                 "zero_stage>0 with cpu_offload=True (its masters live on the host)")]
    for blocked, why in blockers:
        if blocked:
            raise ConfigError(f"mode='{mode}' cannot re-plan with {why}{hint}")
    try:
        import semimig.shardformer.replan  # noqa: F401  (the mechanics that move weights and optimizer state)
    except ImportError:
        raise ConfigError(f"mode='{mode}' needs semimig.shardformer.replan (apply_plan), which this install "
                          f"lacks{hint}") from None
    if optimizer is None:
        raise ConfigError(f"mode='{mode}' moves the optimizer state with the weights: pass optimizer= (the "
                          f"boosted optimizer){hint}")
    return plan


def make_resharder(model: Any, optimizer: Any, plugin: Any, plan: Any, mode: str, balance_config: Any,
                   reshard: Any, iterations_per_epoch: Optional[int], *, batch: Any = None, clock: Any = None):
    """The :class:`~semimig.resharder.Resharder` and the function that sets the controller's phase
    for a plan and rebinds it to the new shapes after a move (its binding caches every layer's
    shape): the controller and its configuration stay the ones in use.  ``batch`` (a
    :class:`~semimig.hybrid.split.BatchSplit`, plain DP with several replicas): the re-sharder also owns
    the split, every replica's plan and it chosen by one planner (:mod:`semimig.resharder.joint`).
    ``clock`` (the controller's :class:`~semimig.straggler.clock.StepClock`): a torch DDP over several
    replicas reduces through semimig's hook, its wait for a slower replica timed there as communication
    (:mod:`semimig.straggler.ddp_wait`), so every rank's compute is its own work."""
    from semimig.nn.balanced import BalancedLinearMixin

    group = plugin.tp_group
    config = getattr(model, "unwrap", lambda: model)().config

    def move(new_plan: Any) -> tuple[int, float]:
        from semimig.shardformer.replan import apply_plan

        report = apply_plan(model, optimizer, new_plan, group=group)
        return int(report.bytes_sent), float(report.seconds)

    def rebind(controller: Any, new_plan: Any, *, settled: bool) -> Optional[list]:
        """Set ``controller``'s phase for ``new_plan`` and, after a move (not ``settled``), bind it to the
        new shapes; the bound layers, or ``None`` when nothing changed.  Mode semi on uneven shards:
        only measuring until the policy has a full window under the new plan (``settled``), then
        resizing only, each rank's busy time compared with its own measured under the new plan (its
        baseline: :class:`~semimig.controller.shedding.ShedPolicy`); on even shards semi again (migration
        assumes equal K per rank)."""
        even = len(set(new_plan.mlp_units)) == 1 and len(set(new_plan.kv_units)) == 1
        semi = mode == "semi"
        phase = dict(hold=semi and not even and not settled, even=even,
                     baseline=resharder.busy_baseline() if semi and settled and not even else None)
        if settled:
            if not controller.set_phase(**phase):
                return None
        else:
            controller.rebind(**phase)
        if semi and controller.rank == 0:
            logger.info("semimig: shards %s: %s", new_plan, "even, migration on (semi)" if even else
                        "uneven, resizing only (as %s) for what varies from step to step, against the busy "
                        "times measured under the new plan (migration assumes equal K per rank)" % controller.acting
                        if settled else "uneven: resizing paused until a window of steps is measured under the "
                        "new plan")
        return [m for m in model.modules() if isinstance(m, BalancedLinearMixin)]

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
    # a pipeline stage holds some of the decoder layers: a unit weighs (and moves) what it has in them
    layers = held_layers(model, config) if plugin.pp_size > 1 else None
    resharder = Resharder(plan, config, group=group, move=move, config=reshard, replicas=replicas,
                          world_group=None, dp_rank=P.group_rank(plugin.dp_group) if replicas > 1 else 0,
                          dp_group=plugin.dp_group if replicas > 1 else None,
                          move_replicas=move_replicas if replicas > 1 and zero_stage == 0 else None, joint=joint,
                          layers=layers)
    if clock is not None:
        from semimig.straggler import ddp_wait

        resharder.ddp_waits = tuple(ddp_wait.install(model, clock))
    return resharder, rebind
