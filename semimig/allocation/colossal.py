"""Running a plan under Colossal-AI: which DP rank am I, is the plan valid here, one iteration.

Supported plugins and what a "device" is:

- ``LowLevelZeroPlugin`` (stage 1 or 2): every rank is a device; DP group = the whole world.
- ``HybridParallelPlugin`` (``zero_stage`` 0, 1 or 2, ``pp_size == 1``, no sequence
  parallelism): a device is one TP group; every TP rank of a group takes the same micro-batches.
  The DP group is ``plugin.dp_group``; the device index is the rank in it.
- ``TorchDDPPlugin``: every rank is a device (ZeRO-0).
- ``TorchFSDPPlugin`` (torch FSDP): every rank of its process group is a device; the sharding
  strategy gives the stage: ``FULL_SHARD`` (the default) is ZeRO-3, ``SHARD_GRAD_OP`` ZeRO-2.  The plugin's ``configure`` places FSDP on ``torch.cuda.current_device()``,
  so it needs a GPU (tests/multirank/test_allocation_zero3.py runs it on CPU by answering that call with
  the CPU device while ``booster.boost`` runs).  (``GeminiPlugin``, Colossal-AI's other ZeRO-3,
  is not supported: it trains only in fp16/bf16 with its own optimizers, which need a GPU.)

Micro-steps (:func:`run_iteration`).  ZeRO-0/1: all micro-steps but the last run under
``booster.no_sync`` (gradients accumulate locally) and the last one reduces; devices may run
different numbers of micro-steps.  ZeRO-2: Colossal-AI cannot defer the reduce-scatter
(``no_sync`` is refused), so every micro-step reduces and every device must run the same number
of micro-steps: the plan must have one common ``accumulation_steps`` (ZeRO-2/3 plans do).
ZeRO-3 (FSDP) is the same, with the parameters also all-gathered in every forward; FSDP
accumulates the reduce-scattered gradient shards over the micro-steps.
Gradients accumulate in the optimizer's store in both cases; call ``optimizer.step()`` and
``optimizer.zero_grad()`` after the iteration as usual.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from semimig.allocation.data import MicroBatch, Reduction
from semimig.allocation.plan import AllocationPlan
from semimig.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DataParallelInfo:
    """This process's place in the data-parallel dimension."""

    rank: int
    """Device index: rank in the DP group."""
    size: int
    """Number of DP devices (the plan's ``num_devices``)."""
    group: Optional[dist.ProcessGroup]
    """The DP process group (None: the default group)."""
    zero_stage: int
    """The plugin's ZeRO stage (0 for DDP)."""


def data_parallel_info(plugin: Any) -> DataParallelInfo:
    """Read the DP rank, size, group and ZeRO stage from a Colossal-AI booster plugin."""
    from colossalai.booster.plugin import HybridParallelPlugin, LowLevelZeroPlugin, TorchDDPPlugin, TorchFSDPPlugin

    if isinstance(plugin, LowLevelZeroPlugin):
        return DataParallelInfo(rank=dist.get_rank(), size=dist.get_world_size(), group=None, zero_stage=plugin.stage)
    if isinstance(plugin, HybridParallelPlugin):
        if plugin.pp_size != 1:
            raise ConfigError(f"Poplar allocation supports HybridParallelPlugin with pp_size=1 only, got pp_size={plugin.pp_size}")
        if plugin.mixed_dp_group is not plugin.dp_group:
            raise ConfigError(
                "Poplar allocation does not support sequence parallelism folded into the DP group "
                f"(sp_size={plugin.sp_size}, sequence_parallelism_mode={plugin.shard_config.sequence_parallelism_mode!r})"
            )
        group = plugin.dp_group
        return DataParallelInfo(
            rank=dist.get_group_rank(group, dist.get_rank()), size=group.size(), group=group, zero_stage=plugin.zero_stage
        )
    if isinstance(plugin, TorchDDPPlugin):
        return DataParallelInfo(rank=dist.get_rank(), size=dist.get_world_size(), group=None, zero_stage=0)
    if isinstance(plugin, TorchFSDPPlugin):
        return _fsdp_info(plugin)
    raise ConfigError(
        f"unsupported plugin {type(plugin).__name__}; expected LowLevelZeroPlugin, HybridParallelPlugin, "
        "TorchDDPPlugin or TorchFSDPPlugin"
    )


def _fsdp_info(plugin: Any) -> DataParallelInfo:
    """DP place and ZeRO stage of a ``TorchFSDPPlugin`` (stage from its sharding strategy)."""
    from torch.distributed.fsdp import ShardingStrategy

    strategy = plugin.fsdp_kwargs.get("sharding_strategy") or ShardingStrategy.FULL_SHARD
    stages = {ShardingStrategy.FULL_SHARD: 3, ShardingStrategy.SHARD_GRAD_OP: 2}
    if strategy not in stages:  # NO_SHARD plans defer the reduction, and the plugin refuses no_sync
        raise ConfigError(f"Poplar allocation supports TorchFSDPPlugin with sharding_strategy in "
                          f"{[s.name for s in stages]}, got {strategy.name} (NO_SHARD: use TorchDDPPlugin; "
                          "hybrid strategies have no single flat DP group)")
    group = plugin.fsdp_kwargs.get("process_group")
    return DataParallelInfo(rank=dist.get_rank(group), size=dist.get_world_size(group), group=group,
                            zero_stage=stages[strategy])


def check_plan(plan: AllocationPlan, info: DataParallelInfo) -> None:
    """Raise ValueError unless ``plan`` can run on this DP setup (one device per DP rank, ZeRO-2 steps)."""
    if plan.num_devices != info.size:
        raise ConfigError(f"plan has {plan.num_devices} devices but the data-parallel group has {info.size} ranks")
    if info.zero_stage >= 2:
        steps = [d.accumulation_steps for d in plan.devices]
        if len(set(steps)) != 1:
            raise ConfigError(
                f"ZeRO-{info.zero_stage} reduce-scatters after every micro-step, so every device needs the same "
                f"accumulation_steps; the plan has {steps} (allocate with zero_stage={info.zero_stage})"
            )


def run_iteration(
    booster: Any,
    model: nn.Module,
    optimizer: Any,
    micro_batches: Iterator[MicroBatch],
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    *,
    zero_stage: int,
    reduction: Reduction = "mean",
) -> float:
    """Forward/backward of one iteration's micro-batches, taken from ``micro_batches`` up to ``is_last``.

    ``loss_fn(model, data)`` returns the micro-batch loss reduced by ``reduction``; it is scaled by
    :meth:`MicroBatch.scale_loss` before ``booster.backward``.  Does not step the optimizer.

    Returns:
        This rank's sum of scaled losses; the all-reduce sum over the DP group divided by its size
        is the global-batch mean loss.
    """
    total = 0.0
    for micro in micro_batches:
        defer = not micro.is_last and zero_stage < 2
        context = booster.no_sync(model, optimizer) if defer else contextlib.nullcontext()
        with context:
            scaled = micro.scale_loss(loss_fn(model, micro.data), reduction)
            booster.backward(scaled, optimizer)
        total += float(scaled.detach())
        if micro.is_last:
            return total
    raise ConfigError("micro_batches ended before the iteration's last micro-step")
