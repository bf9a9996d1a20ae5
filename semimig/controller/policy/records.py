"""What the re-shard policy reads and what it concludes (DESIGN §9): one step of the group, one decision,
and the units a move between two plans sends.  Plain records, identical on every rank."""
from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Optional, Tuple

from semimig._validate import check_number
from semimig.errors import ConfigError
from semimig.sharding.plan import ShardPlan

__all__ = ["ReshardSample", "ReshardDecision", "check_plans", "moved_units"]


def check_plans(name: str, plans: object) -> Tuple[ShardPlan, ...]:
    """``plans`` as a tuple: a non-empty list or tuple of :class:`ShardPlan`, one per paired dimension."""
    if not isinstance(plans, (list, tuple)) or not plans or not all(isinstance(p, ShardPlan) for p in plans):
        raise ConfigError(f"{name} must be a non-empty sequence of ShardPlan, got {plans!r}")
    return tuple(plans)


def _seconds(name: str, value: object) -> float:
    """``value`` as seconds (a number, or a numpy or torch scalar ``float()`` reads; never a string), finite
    and >= 0."""
    if not isinstance(value, (str, bytes)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            pass  # refused just below, by name
    return check_number(name, value, minimum=0.0)


@dataclass(frozen=True)
class ReshardSample:
    """One step of the group, every rank's numbers (all-gathered, so identical on every rank)."""

    compute_s: Tuple[float, ...]
    """``c_r``: the rank's own work in the step (wall minus collectives), seconds."""
    shardable_s: Tuple[float, ...]
    """``b_r``: the part of ``c_r`` in shardable work (the paired GEMMs and the spans between a pair's
    layers), seconds; 0 on a rank holding no unit."""
    comm_s: Tuple[float, ...]
    """``m_r``: seconds in collectives."""
    gemm_s: Optional[Tuple[float, ...]] = None
    """The part of ``b_r`` in the paired GEMMs alone (unpruned): what a resizing controller's busy
    time measures; ``None``: all of ``b_r``."""
    step_s: Optional[float] = None
    """The step as it ran when some rank shed work (resizing or migration); ``None``: nothing was shed."""
    dp_wait_s: Optional[Tuple[float, ...]] = None
    """The part of ``m_r`` spent waiting in the data-parallel gradient reduction (for other replicas);
    ``None``: not told apart."""
    update_s: Optional[Tuple[float, ...]] = None
    """The part of ``c_r`` in the optimizer's step (the parameters' update, work per step whatever the batch);
    ``None``: not timed."""

    def __post_init__(self) -> None:
        required = ("compute_s", "shardable_s", "comm_s")
        for name in required + ("gemm_s", "dp_wait_s", "update_s"):
            values = getattr(self, name)
            if hasattr(values, "tolist") and isinstance(listed := values.tolist(), list):  # a numpy array or a tensor
                object.__setattr__(self, name, values := listed)
            if not isinstance(values, (list, tuple)) and not (values is None and name not in required):
                raise ConfigError(f"ReshardSample.{name} must be a tuple of seconds, one per rank, got {values!r}")
        lengths = [len(self.compute_s), len(self.shardable_s), len(self.comm_s)]
        lengths += [] if self.gemm_s is None else [len(self.gemm_s)]
        lengths += [] if self.dp_wait_s is None else [len(self.dp_wait_s)]
        lengths += [] if self.update_s is None else [len(self.update_s)]
        if lengths[0] == 0 or any(n != lengths[0] for n in lengths):
            raise ConfigError(f"ReshardSample: compute_s, shardable_s, comm_s (and gemm_s, dp_wait_s, update_s) need "
                              f"one entry per rank, got {', '.join(map(str, lengths))}")
        optional = tuple(name for name in ("gemm_s", "dp_wait_s", "update_s") if getattr(self, name) is not None)
        for name in ("compute_s", "shardable_s", "comm_s") + optional:
            values = getattr(self, name)
            if type(values) is tuple and all(type(v) is float and 0.0 <= v < math.inf for v in values):
                continue  # plain floats in range: kept as they are
            values = tuple(_seconds(f"{name}[{r}]", v) for r, v in enumerate(getattr(self, name)))
            object.__setattr__(self, name, values)
        if self.step_s is not None:
            object.__setattr__(self, "step_s", _seconds("step_s", self.step_s))

    @property
    def gemm(self) -> Tuple[float, ...]:
        """``gemm_s``, or ``shardable_s`` when it was not given."""
        return self.shardable_s if self.gemm_s is None else self.gemm_s

    @property
    def valid(self) -> bool:
        """Every rank did some work, its shardable part within it."""
        return all(0.0 < c and b <= c for b, c in zip(self.shardable_s, self.compute_s))


@dataclass(frozen=True)
class ReshardDecision:
    """What :meth:`~semimig.controller.reshard.ReshardPolicy.observe` concluded at one step."""

    step: int
    plans: Optional[Tuple[ShardPlan, ...]] = None
    """The plans to move to now (one per dimension), or ``None``: keep the plan in force."""
    reason: str = ""
    predicted_s: float = 0.0
    """Predicted step (compute + communication) under ``plans`` (or under the plan in force)."""
    current_s: float = 0.0
    """The plan in force's step as measured (its window's medians); 0 while it is not measured."""
    speed_ratios: Tuple[float, ...] = ()
    move_bytes: int = 0
    move_cost_s: float = 0.0
    """The move's predicted cost and its way back's."""
    horizon: float = 0.0
    """Steps of the plan in force the gain was counted over (the state's expected remaining life)."""
    bet: int = 0
    """The slow steps in a row it was decided on before the next step told a change from outliers (0: none)."""

    @property
    def replan(self) -> bool:
        return self.plans is not None


def moved_units(old: ShardPlan, new: ShardPlan) -> int:
    """Units that change owner: with consecutive units in rank order, the unit at position ``i``
    moves when its owner differs between the two plans."""
    if old.total_units != new.total_units or old.tp != new.tp:
        raise ConfigError(f"plans {old} and {new} are not of the same dimension and group")

    def owners(plan: ShardPlan) -> list[int]:
        return [r for r, n in enumerate(plan.units) for _ in range(n)]

    return sum(a != b for a, b in zip(owners(old), owners(new)))
