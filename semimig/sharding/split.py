"""Cut full tensors at a plan's offsets and put them back together (DESIGN §8).

For a plan over units of a paired dimension ``D`` (:class:`~semimig.sharding.plan.ShardPlan`),
rank ``r`` holds the slice ``[o_r, o_r + n_r)`` of ``D`` with ``o_r = offsets()[r]`` and
``n_r = sizes[r]``.  An MLP pair with intermediate dimension ``I``::

    column weight  [I, H] -> rows    [o_r, o_r + n_r)  -> [n_r, H]
    column bias    [I]    -> entries [o_r, o_r + n_r)  -> [n_r]
    row weight     [H, I] -> columns [o_r, o_r + n_r)  -> [H, n_r]   (row bias replicated)

so ``Σ_r row_r(act(col_r(x))) = row(act(col(x)))`` exactly up to the order of the sum over ``I``
(the activation is elementwise).  Attention with KV groups: rows of ``q`` in units of
``(n_q/n_kv)·head_dim``, rows of ``k``, ``v`` in units of ``head_dim``, the columns of ``o`` as
``q``'s rows (:func:`split_attention`).  :func:`gather` is the single-process inverse;
:func:`all_gather_shards` the collective one (every rank gets the full tensor), which pads the
shards to the largest so that backends needing equal sizes (NCCL) can run it.

Packed tensors (GPT-2's ``c_attn`` ``[Q, K, V]``, any fused projection) hold several *parts*
along the split dimension; each part ``i`` is cut by its own plan and rank ``r`` holds the
concatenation ``[P0_r, P1_r, …]`` (Colossal-AI's ``split_fused_qkv_in_gpt2_style`` order, with
uneven pieces): :func:`shard_packed`, :func:`gather_packed`, :func:`all_gather_packed`.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from semimig.errors import ConfigError
from semimig.sharding.plan import ShardPlan

__all__ = ["PARTS", "SPLIT_DIM", "shard", "gather", "all_gather_shards", "shard_functions", "shard_packed", "gather_packed",
           "all_gather_packed", "packed_shard_functions", "MlpShard", "split_mlp", "AttentionShard", "split_attention"]


def _check_dim(tensor: torch.Tensor, plan: ShardPlan, dim: int, name: str) -> int:
    if not -tensor.dim() <= dim < tensor.dim():
        raise ConfigError(f"dim={dim} is out of range for {name} of shape {tuple(tensor.shape)}")
    dim %= tensor.dim()
    plan.check_dimension(f"{name}.shape[{dim}]", tensor.shape[dim])
    return dim


def shard(full: torch.Tensor, plan: ShardPlan, rank: int, *, dim: int, name: str = "tensor") -> torch.Tensor:
    """Rank ``rank``'s slice ``[o_r, o_r + n_r)`` of ``full`` along ``dim`` (a contiguous copy)."""
    dim = _check_dim(full, plan, dim, name)
    start, stop = plan.column_range(rank)
    return full.narrow(dim, start, stop - start).clone(memory_format=torch.contiguous_format)


def gather(shards: Sequence[torch.Tensor], plan: ShardPlan, *, dim: int) -> torch.Tensor:
    """The full tensor from every rank's shard (rank order); each must have the plan's size along ``dim``."""
    plan.check_tp(len(shards))
    for r, (piece, size) in enumerate(zip(shards, plan.sizes)):
        if piece.shape[dim] != size:
            raise ConfigError(f"shards[{r}] has {piece.shape[dim]} along dim {dim}, the plan gives rank {r} {size}")
    return torch.cat(list(shards), dim=dim)


def all_gather_shards(piece: torch.Tensor, plan: ShardPlan, *, dim: int, group=None) -> torch.Tensor:
    """Every rank's shard along ``dim``, concatenated in rank order, on every rank of ``group``.

    Pads each shard to the largest size, all-gathers, trims (one collective, any backend).
    """
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    plan.check_tp(world)
    dim %= piece.dim()
    rank = dist.get_rank(group) if dist.is_initialized() else 0
    if piece.shape[dim] != plan.sizes[rank]:
        raise ConfigError(f"rank {rank}'s shard has {piece.shape[dim]} along dim {dim}, the plan gives it "
                          f"{plan.sizes[rank]}")
    if world == 1:
        return piece.clone()
    widest = max(plan.sizes)
    pad_shape = list(piece.shape)
    pad_shape[dim] = widest
    padded = piece.new_zeros(pad_shape)
    padded.narrow(dim, 0, piece.shape[dim]).copy_(piece)
    out = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(out, padded.contiguous(), group=group)
    return torch.cat([t.narrow(dim, 0, size) for t, size in zip(out, plan.sizes)], dim=dim)


def shard_functions(plan: ShardPlan, rank: int, *, dim: int, group=None
                    ) -> Tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    """``(shard_fn, gather_fn)`` for Colossal-AI's customised distributed tensors
    (``distribute_tensor_with_customization``): full -> this rank's slice, slice -> full (collective).

    With them a parameter's ``state_dict`` holds the full tensor and ``load_state_dict`` takes one,
    through Colossal-AI's own ``ParallelModule`` code.
    """
    def shard_fn(full: torch.Tensor) -> torch.Tensor:
        return shard(full.detach() if isinstance(full, torch.nn.Parameter) else full, plan, rank, dim=dim)

    def gather_fn(piece: torch.Tensor) -> torch.Tensor:
        return all_gather_shards(piece.data, plan, dim=dim, group=group)

    return _labelled(shard_fn, gather_fn, (plan.dimension,), dim)


PARTS = "packed_parts"
"""Attribute of the functions :func:`shard_functions` / :func:`packed_shard_functions` return: the full
lengths of the packed parts along the split dimension (one entry for a plain tensor).  Read by the
checkpoint code, which cannot recover the parts from the gathered layout when a rank holds nothing."""

SPLIT_DIM = "split_dim"
"""Attribute of the same functions: the dimension they cut and gather along (as given, may be negative).
A rank holding every unit has a shard of the full shape, so the shapes alone cannot say it is one."""


def _labelled(shard_fn: Callable, gather_fn: Callable, parts: Tuple[int, ...], dim: int
              ) -> Tuple[Callable, Callable]:
    for fn in (shard_fn, gather_fn):
        setattr(fn, PARTS, tuple(int(n) for n in parts))
        setattr(fn, SPLIT_DIM, int(dim))
    return shard_fn, gather_fn


def _check_parts(full_size: int, parts: Sequence[int], plans: Sequence[ShardPlan], name: str) -> None:
    if len(parts) != len(plans) or not parts:
        raise ConfigError(f"{name}: one plan per part, got {len(plans)} plans for parts {list(parts)}")
    if sum(parts) != full_size:
        raise ConfigError(f"{name}: parts {list(parts)} sum to {sum(parts)}, the dimension has {full_size}")
    for i, (size, plan) in enumerate(zip(parts, plans)):
        plan.check_dimension(f"{name} part {i}", size)
        plan.check_tp(plans[0].tp)


def shard_packed(full: torch.Tensor, parts: Sequence[int], plans: Sequence[ShardPlan], rank: int, *,
                 dim: int, name: str = "tensor") -> torch.Tensor:
    """``[P0_r, P1_r, …]``: each part of ``full`` along ``dim`` cut at its plan's offsets, concatenated."""
    dim %= full.dim()
    _check_parts(full.shape[dim], parts, plans, name)
    pieces = torch.split(full, list(parts), dim=dim)
    return torch.cat([shard(p, plan, rank, dim=dim, name=f"{name} part {i}")
                      for i, (p, plan) in enumerate(zip(pieces, plans))], dim=dim)


def _unpack(per_rank: Sequence[torch.Tensor], plans: Sequence[ShardPlan], dim: int) -> torch.Tensor:
    """``[P0_0, P1_0, …], [P0_1, P1_1, …], …`` -> ``[P0_0, P0_1, …, P1_0, P1_1, …]``."""
    split = [torch.split(t, [plan.sizes[r] for plan in plans], dim=dim) for r, t in enumerate(per_rank)]
    return torch.cat([split[r][i] for i in range(len(plans)) for r in range(len(per_rank))], dim=dim)


def gather_packed(shards: Sequence[torch.Tensor], parts: Sequence[int], plans: Sequence[ShardPlan], *,
                  dim: int) -> torch.Tensor:
    """The full packed tensor from every rank's ``[P0_r, P1_r, …]`` (single process)."""
    _check_parts(sum(parts), parts, plans, "packed")
    plans[0].check_tp(len(shards))
    return _unpack(shards, plans, dim)


def _rank_totals(plans: Sequence[ShardPlan]) -> ShardPlan:
    """Each rank's packed width ``Σ_i sizes_i[r]``, as a plan of unit 1."""
    return ShardPlan(units=tuple(sum(plan.sizes[r] for plan in plans) for r in range(plans[0].tp)))


def all_gather_packed(piece: torch.Tensor, parts: Sequence[int], plans: Sequence[ShardPlan], *, dim: int,
                      group=None) -> torch.Tensor:
    """The full packed tensor on every rank of ``group`` from each rank's ``[P0_r, P1_r, …]`` (one all-gather)."""
    _check_parts(sum(parts), parts, plans, "packed")
    dim %= piece.dim()
    totals = _rank_totals(plans)
    gathered = all_gather_shards(piece, totals, dim=dim, group=group)
    return _unpack(torch.split(gathered, list(totals.units), dim=dim), plans, dim)


def packed_shard_functions(parts: Sequence[int], plans: Sequence[ShardPlan], rank: int, *, dim: int, group=None
                           ) -> Tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    """:func:`shard_functions` for a packed tensor (one part: the same as :func:`shard_functions`)."""
    def shard_fn(full: torch.Tensor) -> torch.Tensor:
        return shard_packed(full.detach() if isinstance(full, torch.nn.Parameter) else full, parts, plans, rank,
                            dim=dim)

    def gather_fn(piece: torch.Tensor) -> torch.Tensor:
        return all_gather_packed(piece.data, parts, plans, dim=dim, group=group)

    return _labelled(shard_fn, gather_fn, tuple(parts), dim)


class MlpShard(NamedTuple):
    """One rank's part of a Col→Row pair: column weight ``[n_r, H]``, bias ``[n_r]`` (or None),
    row weight ``[H, n_r]``."""

    column_weight: torch.Tensor
    column_bias: Optional[torch.Tensor]
    row_weight: torch.Tensor


def split_mlp(column_weight: torch.Tensor, column_bias: Optional[torch.Tensor], row_weight: torch.Tensor,
              plan: ShardPlan, rank: int) -> MlpShard:
    """Rank ``rank``'s shard of a pair with column weight ``[I, H]``, bias ``[I]``, row weight ``[H, I]``."""
    if row_weight.dim() != 2 or column_weight.dim() != 2 or row_weight.shape[1] != column_weight.shape[0]:
        raise ConfigError(f"row weight {tuple(row_weight.shape)} must be [H, I] for column weight "
                          f"{tuple(column_weight.shape)} [I, H]")
    bias = None if column_bias is None else shard(column_bias, plan, rank, dim=0, name="column_bias")
    return MlpShard(shard(column_weight, plan, rank, dim=0, name="column_weight"), bias,
                    shard(row_weight, plan, rank, dim=1, name="row_weight"))


class AttentionShard(NamedTuple):
    """One rank's attention: ``q [h_r·d, H]``, ``k, v [g_r·d, H]``, ``o [H, h_r·d]``;
    ``h_r`` query heads, ``g_r`` KV heads."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    num_heads: int
    num_kv_heads: int


def split_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, plan: ShardPlan, rank: int,
                    *, head_dim: int) -> AttentionShard:
    """Rank ``rank``'s KV groups of a (GQA) attention: ``plan`` counts KV groups, in units of the group's
    ``q`` rows (``plan.unit_size = (n_q/n_kv)·head_dim``, see :func:`~semimig.sharding.plan.kv_group_unit`)."""
    kv_plan = plan.with_unit_size(head_dim)
    if plan.unit_size % head_dim != 0:
        raise ConfigError(f"plan.unit_size={plan.unit_size} must be a whole number of heads of head_dim={head_dim}")
    q_per_kv = plan.unit_size // head_dim
    groups = plan.units[rank]
    return AttentionShard(shard(q, plan, rank, dim=0, name="q_proj.weight"),
                          shard(k, kv_plan, rank, dim=0, name="k_proj.weight"),
                          shard(v, kv_plan, rank, dim=0, name="v_proj.weight"),
                          shard(o, plan, rank, dim=1, name="o_proj.weight"),
                          num_heads=groups * q_per_kv, num_kv_heads=groups)
