"""Which slices move where when a packed tensor's shard plans change (DESIGN §8): a pure schedule.

A tensor split along one dimension ``D`` holds ``k ≥ 1`` *parts* (one for a plain layer; ``Q, K, V``
for GPT-2's ``c_attn``), each cut by its own plan; rank ``r`` stores ``[P0_r, P1_r, …]`` (see
:mod:`semimig.sharding.split`).  Under the old plans rank ``s`` holds columns
``[a_s, a_s + m_s)`` of part ``i`` (``a = old.offsets()``, ``m = old.sizes``), under the new ones
rank ``d`` needs ``[b_d, b_d + n_d)``.  Because the layout is consecutive, what ``d`` needs from
``s`` is one interval, their overlap::

    [max(a_s, b_d), min(a_s + m_s, b_d + n_d))      (empty when max >= min)

at local offset ``max(a_s, b_d) − a_s + Σ_{j<i} m_j[s]`` of ``s``'s old tensor and
``max(a_s, b_d) − b_d + Σ_{j<i} n_j[d]`` of ``d``'s new one.  The pieces of every ``(s, d)`` tile
each new shard exactly once; a piece with ``s = d`` is a local copy, the others cross the link.
The schedule lists them in a fixed order (part, then source, then destination), so every rank
derives the same one from the plans alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple

from semimig.errors import ConfigError
from semimig.sharding.plan import ShardPlan

__all__ = ["Piece", "move_schedule", "local_offsets"]


@dataclass(frozen=True)
class Piece:
    """``length`` columns of part ``part`` from ``src``'s old shard (at ``src_offset``) to ``dst``'s new
    shard (at ``dst_offset``); ``start`` is the first column within the part (global)."""

    part: int
    src: int
    dst: int
    start: int
    length: int
    src_offset: int
    dst_offset: int

    @property
    def crosses(self) -> bool:
        """Whether the piece moves between two ranks (not a local copy)."""
        return self.src != self.dst


def local_offsets(plans: Sequence[ShardPlan], rank: int) -> Tuple[int, ...]:
    """Where each part starts in rank ``rank``'s packed shard: ``Σ_{j<i} plans[j].sizes[rank]``."""
    out, start = [], 0
    for plan in plans:
        out.append(start)
        start += plan.sizes[rank]
    return tuple(out)


def _check(old: Sequence[ShardPlan], new: Sequence[ShardPlan]) -> None:
    if len(old) != len(new) or not old:
        raise ConfigError(f"move_schedule: {len(old)} old and {len(new)} new part plans; one each per part is needed")
    for i, (a, b) in enumerate(zip(old, new)):
        if a.tp != b.tp or a.tp != old[0].tp:
            raise ConfigError(f"move_schedule: part {i}: old plan {a} and new plan {b} differ in tp")
        if a.dimension != b.dimension:
            raise ConfigError(f"move_schedule: part {i}: old plan {a} covers {a.dimension} columns, "
                              f"new plan {b} covers {b.dimension}")


def move_schedule(old: Sequence[ShardPlan], new: Sequence[ShardPlan]) -> Tuple[Piece, ...]:
    """Every piece (local copies included) that turns shards under ``old`` into shards under ``new``
    (one plan per part, each pair covering the same columns)."""
    _check(old, new)
    tp = old[0].tp
    src_base = [local_offsets(old, s) for s in range(tp)]
    dst_base = [local_offsets(new, d) for d in range(tp)]
    pieces = []
    for i, (a_plan, b_plan) in enumerate(zip(old, new)):
        a_off, b_off = a_plan.offsets(), b_plan.offsets()
        for s in range(tp):
            a0, a1 = a_off[s], a_off[s] + a_plan.sizes[s]
            for d in range(tp):
                b0, b1 = b_off[d], b_off[d] + b_plan.sizes[d]
                lo, hi = max(a0, b0), min(a1, b1)
                if lo < hi:
                    pieces.append(Piece(part=i, src=s, dst=d, start=lo, length=hi - lo,
                                        src_offset=src_base[s][i] + lo - a0, dst_offset=dst_base[d][i] + lo - b0))
    return tuple(pieces)
