"""A shard plan: how many units of a paired dimension each tensor-parallel rank holds (DESIGN §8).

A *paired dimension* is the one a column layer splits its outputs along and the next row layer
its inputs along, so that the pair needs no collective beyond the row layer's all-reduce of
``y`` and the column layer's all-reduce of ``dx``: the MLP intermediate dimension ``I`` (rows of
``gate/up/c_fc``, the same columns of ``down/c_proj``) and the attention heads (rows of
``q, k, v``, the same columns of ``o``).  It is split in whole *units* of ``unit_size`` columns:

- MLP: blocks of ``b`` columns of ``I`` (``unit_size = b``, ``I = b · total_units``);
- attention: KV groups, each one KV head and its ``n_q/n_kv`` query heads, i.e.
  ``unit_size = (n_q/n_kv)·head_dim`` columns of ``q`` / ``o`` and ``head_dim`` rows of ``k``, ``v``
  (:meth:`ShardPlan.with_unit_size` gives the ``k, v`` view of the same plan).

Rank ``r`` holds ``units[r] ≥ 0`` consecutive units, in rank order (at least one unit in all):
its columns are ``[offsets()[r], offsets()[r] + sizes[r])`` with ``sizes[r] = units[r]·unit_size``.
Its share is ``p_r = units[r]/total_units``.  A rank holding zero units has an empty shard: its
column layers produce ``[M, 0]`` outputs and a zero ``dx``, its row layer a zero partial ``y``,
and it still takes part in every collective (the layers of :mod:`semimig.nn` and the attention of
:mod:`semimig.shardformer.uneven` serve it), so a rank too slow for even one unit can be relieved
of a kind entirely.  :meth:`ShardPlan.even` is today's (Colossal-AI's) layout:
``torch.chunk`` of the dimension into ``tp`` equal parts; like Colossal-AI it refuses a
``total_units`` that ``tp`` does not divide.  An uneven split exists only as an explicit plan.

Finer attention units (not built).  The attention unit is a whole KV group, so with ``n_kv`` groups
a rank's attention share moves in steps of ``1/n_kv`` (GQA at tp 8 with 8 KV heads: one group per
rank, nothing to move but a whole rank's attention).  A finer unit would be one query head, a
group's query heads split across ranks, with the group's small ``k, v`` rows held by every rank
that holds one of its query heads.  It is exact (``dk`` is a sum over the group's query heads, so
each holder's ``dk_r·W_k`` summed by the column layer's ``dx`` all-reduce is the dense ``dx``), but it
needs, none of which exists yet:

- a covering plan: the query rows stay a :class:`ShardPlan` in units of ``head_dim``, but the ``k, v``
  rows of rank ``r`` are every group its head range touches, so neighbours overlap by up to one
  group — intervals this class (disjoint, consecutive) cannot state;
- the shared ``k, v`` weights' gradients summed over the ranks sharing the group before the step
  (each holds only its heads' part of ``dW_k``), their optimizer state kept identical on each holder,
  and the grad norm, ZeRO's DP shards and checkpoints counting and writing each group once;
- the attention forward: Hugging Face's ``repeat_kv`` maps query head ``i`` to KV head
  ``i // (n_q/n_kv)`` from the config, which holds only when a rank's heads are whole groups; a
  partial group needs a per-rank head-to-KV index (an attention forward per model family);
- :func:`~semimig.sharding.move.move_schedule` with one source and several destinations for a
  shared group, and the solver's unit sizes (query heads for the GEMMs, a duplicated group's
  ``k, v`` as replicated work on each holder).

Until then a rank too slow for one KV group holds none (``units[r] = 0``, above), which already
relieves it of all attention; the finer unit matters only when the best share lies strictly
between 0 and one group.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from semimig._validate import check_int, is_int
from semimig.errors import ConfigError

__all__ = ["ShardPlan", "units_of", "kv_group_unit"]


def units_of(name: str, dimension: int, unit_size: int) -> int:
    """``dimension // unit_size``; :class:`ConfigError` naming ``name`` unless ``unit_size`` divides it."""
    check_int(name, dimension, minimum=1)
    check_int("unit_size", unit_size, minimum=1)
    if dimension % unit_size != 0:
        raise ConfigError(f"{name}={dimension} is not divisible by the unit size {unit_size}")
    return dimension // unit_size


def kv_group_unit(*, num_heads: int, num_kv_heads: int, head_dim: int) -> Tuple[int, int]:
    """``(q_columns, kv_columns)`` of one KV group: ``(n_q/n_kv · head_dim, head_dim)``.

    :class:`ConfigError` unless ``num_kv_heads`` divides ``num_heads`` (GQA/MQA/MHA all do).
    """
    check_int("num_heads", num_heads, minimum=1)
    check_int("num_kv_heads", num_kv_heads, minimum=1)
    check_int("head_dim", head_dim, minimum=1)
    if num_heads % num_kv_heads != 0:
        raise ConfigError(f"num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads}")
    return num_heads // num_kv_heads * head_dim, head_dim


@dataclass(frozen=True, kw_only=True)
class ShardPlan:
    """Per tensor-parallel rank, its number of units of one paired dimension.

    ``units``     per rank (group-rank order), ints ``≥ 0`` summing to ``≥ 1``; ``tp = len(units)``.
    ``unit_size`` columns of the dimension per unit (block size, or a KV group's columns).
    """

    units: Tuple[int, ...]
    unit_size: int = 1

    def __post_init__(self) -> None:
        units, size = self.units, self.unit_size
        if (type(units) is tuple and units and type(size) is int and size >= 1  # plain ints: nothing to convert
                and all(type(n) is int and n >= 0 for n in units) and sum(units) >= 1):
            return
        if isinstance(self.units, (str, bytes)) or not isinstance(self.units, (tuple, list)) or not self.units:
            raise ConfigError(f"units must be a non-empty tuple of ints (one per tensor-parallel rank), "
                              f"got {self.units!r}")
        for r, n in enumerate(self.units):
            if not is_int(n) or n < 0:
                raise ConfigError(f"units[{r}] must be an int >= 0, got {n!r} in units={tuple(self.units)!r}")
        if sum(self.units) < 1:
            raise ConfigError(f"units={tuple(self.units)!r} hold no unit at all: at least one rank needs one")
        object.__setattr__(self, "units", tuple(int(n) for n in self.units))
        object.__setattr__(self, "unit_size", check_int("unit_size", self.unit_size, minimum=1))

    def __hash__(self) -> int:
        """The fields' hash, computed once (the plan is frozen; plans key the policy's per-step memos)."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.units, self.unit_size))
            object.__setattr__(self, "_hash", cached)
        return cached

    # --- construction -------------------------------------------------------------------
    @classmethod
    def even(cls, total_units: int, tp: int, *, unit_size: int = 1) -> "ShardPlan":
        """``tp`` equal parts: Colossal-AI's layout.  Refuses ``total_units`` not divisible by ``tp``."""
        check_int("total_units", total_units, minimum=1)
        check_int("tp", tp, minimum=1)
        if total_units % tp != 0:
            raise ConfigError(f"total_units={total_units} is not divisible by the tensor-parallel size tp={tp}: "
                              "the even plan needs equal shards (give an explicit uneven ShardPlan instead)")
        return cls(units=(total_units // tp,) * tp, unit_size=unit_size)

    @classmethod
    def for_dimension(cls, units, *, dimension: int, unit_size: int = 1) -> "ShardPlan":
        """A plan of ``units`` checked against a dimension of ``dimension`` columns."""
        plan = cls(units=units, unit_size=unit_size)
        plan.check_dimension("dimension", dimension)
        return plan

    def with_unit_size(self, unit_size: int) -> "ShardPlan":
        """The same units measured in another unit (e.g. a KV group's ``k, v`` rows instead of its ``q`` rows)."""
        return ShardPlan(units=self.units, unit_size=unit_size)

    # --- reading ------------------------------------------------------------------------
    @property
    def tp(self) -> int:
        return len(self.units)

    @property
    def total_units(self) -> int:
        return sum(self.units)

    @property
    def dimension(self) -> int:
        """Columns of the whole dimension: ``total_units · unit_size``."""
        return self.total_units * self.unit_size

    @property
    def sizes(self) -> Tuple[int, ...]:
        """Columns per rank: ``units[r] · unit_size``."""
        return tuple(n * self.unit_size for n in self.units)

    @property
    def is_even(self) -> bool:
        return len(set(self.units)) == 1

    def shares(self) -> Tuple[float, ...]:
        """``p_r = units[r] / total_units`` (sums to 1); computed once (the plan is frozen)."""
        cached = self.__dict__.get("_shares")
        if cached is None:
            total = self.total_units
            cached = tuple(n / total for n in self.units)
            object.__setattr__(self, "_shares", cached)
        return cached

    def offsets(self) -> Tuple[int, ...]:
        """First column of each rank: ``offsets()[r] = Σ_{q<r} sizes[q]`` (length ``tp``)."""
        out, start = [], 0
        for size in self.sizes:
            out.append(start)
            start += size
        return tuple(out)

    def column_range(self, rank: int) -> Tuple[int, int]:
        """``(start, stop)``: the columns ``[start, stop)`` of the dimension rank ``rank`` holds."""
        check_int("rank", rank, minimum=0, maximum=self.tp - 1)
        start = self.offsets()[rank]
        return start, start + self.sizes[rank]

    def check_dimension(self, name: str, dimension: int) -> None:
        """:class:`ConfigError` naming ``name`` unless the plan covers exactly ``dimension`` columns."""
        total = units_of(name, dimension, self.unit_size)
        if total != self.total_units:
            raise ConfigError(f"{name}={dimension} is {total} units of {self.unit_size}, but the plan's units "
                              f"{self.units} sum to {self.total_units}")

    def check_tp(self, tp: int) -> None:
        """:class:`ConfigError` unless the plan has one entry per rank of a group of ``tp``."""
        if self.tp != tp:
            raise ConfigError(f"the plan has {self.tp} ranks (units={self.units}) but the tensor-parallel group "
                              f"has tp={tp}")

    def __str__(self) -> str:
        return f"ShardPlan(units={list(self.units)} x {self.unit_size})"
