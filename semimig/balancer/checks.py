"""What :func:`semimig.enable` checks before it binds anything: the optimizer, the plugin, the batch split,
the mode and configuration as resolved, and that every rank of the job was called with the same settings
(a refusal on one rank alone would leave the others waiting in a collective).  Every refusal is a
:class:`~semimig.errors.ConfigError` naming the input."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from semimig.errors import ConfigError
from semimig.modes import Mode, parse_mode

BALANCED_SCHEDULES = ("OneForwardOneBackwardSchedule",)
"""The pipeline schedules whose stages balance: one model chunk per stage (1F1B)."""


def _check_optimizer(optimizer: Any) -> Any:
    """The optimizer's ``step`` (checked before anything is bound, so a refusal leaves no state)."""
    original = getattr(optimizer, "step", None)
    if not callable(original):
        raise ConfigError(f"optimizer must be the boosted optimizer (with a step method) or None, got {optimizer!r}")
    return original


def _check_plugin(plugin: Any) -> None:
    from colossalai.booster.plugin import HybridParallelPlugin

    if not isinstance(plugin, HybridParallelPlugin):
        raise ConfigError(f"plugin must be a colossalai HybridParallelPlugin (semimig balances its tensor-parallel "
                          f"group), got {type(plugin).__name__}")
    schedule = type(getattr(plugin, "scheduler", None)).__name__
    if plugin.pp_size > 1 and schedule not in BALANCED_SCHEDULES:
        raise ConfigError(f"plugin pipeline schedule {schedule} (pp_style={getattr(plugin, 'pp_style', '?')!r}) "
                          f"cannot be balanced: semimig balances pp_style='1f1b' with one model chunk per stage")


def _check_batch(batch: Any, plugin: Any) -> None:
    """``batch=`` is a :class:`~semimig.hybrid.split.BatchSplit` on a plugin with TP groups to time."""
    if batch is None:
        return
    from semimig.hybrid.split import BatchSplit

    if not isinstance(batch, BatchSplit):
        raise ConfigError(f"batch must be a semimig.BatchSplit or None, got {batch!r}")
    if plugin.tp_size == 1:
        raise ConfigError("batch=BatchSplit(...) times each data-parallel group by its semimig layers, and "
                          "tp_size=1 has none: plan the batch with semimig.allocation (profile, poplar_plan) instead")
    if plugin.pp_size > 1:
        raise ConfigError(f"batch=BatchSplit(...) needs pp_size=1 (got {plugin.pp_size}): a pipeline's "
                          "micro-batches are the schedule's, not the batch plan's")


def _config(mode: Optional[str], straggler: Any, config: Any) -> tuple[Mode, Any]:
    from semimig.controller import BalanceConfig

    if config is not None and not isinstance(config, BalanceConfig):
        raise ConfigError(f"config must be a BalanceConfig or None, got {config!r}")
    base = config or BalanceConfig()
    mode = base.mode if mode is None else parse_mode(mode)
    changes = {"mode": mode.controller_mode}
    if straggler is not None:
        changes["straggler"] = straggler  # a spec string is parsed (and checked) by BalanceConfig
    if all(getattr(base, name) == value for name, value in changes.items()):
        return mode, base  # the caller's configuration itself
    return mode, dataclasses.replace(base, **changes)


def _stable_repr(value: Any) -> str:
    """``repr`` without object addresses (``<... at 0x7f...>`` differs between processes)."""
    import re

    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def _agree_on_call(plugin: Any, mode: Any, straggler: Any, config: Any, reshard: Any, batch: Any,
                   iterations_per_epoch: Any, optimizer: Any) -> None:
    """Every rank of the job must call :func:`enable` with the same settings: the balancer's collectives
    (the controller's exchange, the re-sharding gathers, the batch split's) follow them, so ranks that
    differ — another mode, ``ReshardConfig``, ``BatchSplit`` or controller setting — wait on different
    collectives and hang.  One ``all_gather_object`` over the world (collective: every rank of the job
    calls :func:`enable`) compares the settings as resolved (``mode=None`` with ``config.mode="semi"``
    equals ``mode="semi"``) and carries each rank's refusal of its own test straggler (a bad spec or
    rank refused on one rank alone would leave the others waiting); every rank then raises the same
    ``ConfigError``.  Not compared: the test straggler itself (a rank may inject one in its own replica
    alone), ``config.curves`` (fitted per tensor-parallel group; the controller checks them within its
    group) and ``log_every``."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return
    problem, resolved_mode, resolved = None, mode, config
    try:
        resolved_mode, resolved = _config(mode, straggler, config)
        tp = getattr(plugin, "tp_size", None)
        bad = [r for r in resolved.straggler.ranks if isinstance(tp, int) and 1 < tp <= r]  # tp 1: warned, off
        if bad:
            problem = f"straggler ranks {bad} do not exist in a tensor-parallel group of size {tp}"
    except ConfigError as err:
        problem = str(err)
    is_config = dataclasses.is_dataclass(resolved) and not isinstance(resolved, type)
    fields = ({f.name: _stable_repr(getattr(resolved, f.name)) for f in dataclasses.fields(resolved)
               if f.name not in ("straggler", "curves")} if is_config else {"": _stable_repr(resolved)})
    mine = {"mode": _stable_repr(resolved_mode), **{f"config.{k}".rstrip("."): v for k, v in fields.items()},
            "reshard": _stable_repr(reshard), "batch": _stable_repr(batch),
            "iterations_per_epoch": _stable_repr(iterations_per_epoch),
            "optimizer": "given" if optimizer is not None else "None (Balancer.step() by hand)"}
    from semimig.controller.agreement import difference_report, gather_verdicts

    every, refusal = gather_verdicts(mine, problem, None, "rank")
    if refusal is not None:
        raise ConfigError(refusal)
    if any(theirs != mine for theirs in every):
        raise ConfigError("semimig.enable: the ranks were called with different settings (every rank must pass "
                          "the same ones; their collectives would not match):\n" + difference_report(every))
