"""Where a rank sits in the tensor-parallel x data-parallel grid of a ``HybridParallelPlugin``.

``world = tp · dp`` ranks (``pp_size = 1``, no sequence parallelism folded into the DP group).  A
*group* is one tensor-parallel group: it holds one replica of the model, all its ranks take the
same samples, and it is Poplar's device.  Group ``g`` is the one whose ranks have rank ``g`` in
their data-parallel group (``plugin.dp_group``), so group order is data-parallel rank order, the
order of the batch plan's devices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from semimig.comm import primitives as P
from semimig.errors import ConfigError

__all__ = ["GridLayout", "group_maxima"]


@dataclass(frozen=True, kw_only=True)
class GridLayout:
    """This rank's place in the grid and every rank's group (identical on every rank)."""

    rank: int
    """Global rank."""
    tp_rank: int
    tp_size: int
    dp_rank: int
    """This rank's group index ``g``."""
    dp_size: int
    """Number of groups (Poplar's devices)."""
    group_of_rank: tuple[int, ...]
    """``group_of_rank[r]``: the group of global rank ``r``."""
    tp_group: Optional[dist.ProcessGroup] = None
    dp_group: Optional[dist.ProcessGroup] = None

    @property
    def world_size(self) -> int:
        return len(self.group_of_rank)

    def members(self, group: int) -> tuple[int, ...]:
        """Global ranks of group ``group``."""
        return tuple(r for r, g in enumerate(self.group_of_rank) if g == group)

    @classmethod
    def from_plugin(cls, plugin: Any) -> "GridLayout":
        """Read the grid from a ``HybridParallelPlugin`` (collective: one all-gather over all ranks)."""
        from colossalai.booster.plugin import HybridParallelPlugin

        if not isinstance(plugin, HybridParallelPlugin):
            raise ConfigError(f"the 2-D composition needs a HybridParallelPlugin, got {type(plugin).__name__}")
        if plugin.pp_size != 1 or plugin.mixed_dp_group is not plugin.dp_group:
            raise ConfigError(f"the 2-D composition supports pp_size=1 without sequence parallelism in the DP group, "
                              f"got pp_size={plugin.pp_size}, sp_size={plugin.sp_size}")
        tp_rank, tp_size = P.group_rank(plugin.tp_group), P.group_size(plugin.tp_group)
        dp_rank, dp_size = P.group_rank(plugin.dp_group), P.group_size(plugin.dp_group)
        world = P.group_size(None)
        if tp_size * dp_size != world:
            raise ConfigError(f"tp_size={tp_size} x dp_size={dp_size} != world size {world}")
        mine = torch.tensor([dp_rank], dtype=torch.int64, device=P.collective_device(None))
        gathered = [torch.empty_like(mine) for _ in range(world)]
        if world > 1:
            dist.all_gather(gathered, mine)
        else:
            gathered = [mine]
        return cls(rank=P.group_rank(None), tp_rank=tp_rank, tp_size=tp_size, dp_rank=dp_rank, dp_size=dp_size,
                   group_of_rank=tuple(int(t.item()) for t in gathered), tp_group=plugin.tp_group,
                   dp_group=plugin.dp_group)


def group_maxima(values_by_rank: Sequence[float], group_of_rank: Sequence[int], num_groups: int) -> list[float]:
    """Per group, the largest value of its members: a TP group runs at its slowest member's speed."""
    if len(values_by_rank) != len(group_of_rank):
        raise ConfigError(f"{len(values_by_rank)} values for {len(group_of_rank)} ranks")
    out = [float("-inf")] * num_groups
    for value, group in zip(values_by_rank, group_of_rank):
        out[group] = max(out[group], float(value))
    return out
