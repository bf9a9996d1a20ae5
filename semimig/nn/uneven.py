"""Uneven shards for the plain column/row layers (DESIGN §8): ``shard_sizes`` along the split dimension.

``Linear1D_Col(..., shard_sizes=(n_0, …, n_{e-1}))`` keeps rows ``[o_r, o_r + n_r)`` of the full
weight ``[out, in]`` (and of the bias) on rank ``r``, ``o_r = Σ_{q<r} n_q``; ``Linear1D_Row`` keeps
those columns of ``[out, in]`` (bias replicated).  A column layer and the row layer after it with
the same sizes compute the same function as the dense pair: the column layer all-reduces its
full ``dx`` and the row layer its full ``y`` as before, only the order of the sums over the
split dimension changes.  Equal sizes take Colossal-AI's own path (bit for bit today's layout);
``shard_sizes=None`` is the default.

How it enters Colossal-AI's constructor.  Colossal-AI shards ``weight`` (and a column layer's
bias) with ``shard_rowwise``/``shard_colwise`` unless ``is_distributed_tensor`` (``hasattr(t,
"dist_layout")``) says it already is.  :func:`presharded` cuts each parameter to this rank's
slice *before* the constructor as a Colossal-AI customised distributed tensor (``shard_fn`` /
``gather_fn`` from :func:`semimig.sharding.split.shard_functions`, so ``state_dict`` gathers the
full tensor and ``load_state_dict`` cuts a full one, through ``ParallelModule``'s own code),
marks it with a ``dist_layout`` attribute for the constructor's check only, and removes the mark
after it.

Refused with uneven sizes (:class:`~semimig.errors.ConfigError`): ``gather_output=True`` and
``parallel_input=False`` (Colossal-AI's gather/split are even), a layer built without a weight
(build it with ``from_native_module``), sizes that are not ``tp`` ints ``≥ 0`` summing to the
split dimension.  A size 0 is an empty shard (weight ``[0, in]`` / ``[out, 0]``): the column layer
outputs ``[M, 0]`` and all-reduces a zero ``dx``, the row layer all-reduces a zero partial ``y`` and
adds its replicated bias once after the all-reduce, as Colossal-AI's row layer always does.  ``seq_parallel_mode="split_gather"`` gathers and splits along the sequence,
not the split dimension, and is left as it is.

Packed layers (``split_sizes``, e.g. GPT-2's ``c_attn`` = ``[Q, K, V]``) cut every part with the
same ``shard_sizes`` (each part must then have ``Σ shard_sizes`` columns), or part ``i`` with
``shard_sizes[i]`` when ``shard_sizes`` is a tuple of tuples (GQA's smaller K, V); rank ``r``
holds ``[Q_r, K_r, V_r]`` as with Colossal-AI.  GPT-2's ``Conv1D`` layers store the weight
transposed (``[in, out]``), so their split dimension is the other one.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import torch
from colossalai.tensor.d_tensor.api import customized_distributed_tensor_to_existing_param, \
    distribute_tensor_with_customization

from semimig.comm import primitives as P
from semimig.errors import ConfigError
from semimig.sharding.plan import ShardPlan
from semimig.sharding.split import packed_shard_functions

__all__ = ["uneven_plans", "presharded"]

_MARK = "dist_layout"  # what Colossal-AI's constructors test (is_distributed_tensor) before sharding
Plans = Tuple[ShardPlan, ...]


def _plan(cls_name: str, sizes: Any, what: str, size: int, tp_size: int) -> ShardPlan:
    if isinstance(sizes, ShardPlan):
        sizes = sizes.sizes
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, (list, tuple)):
        raise ConfigError(f"semimig {cls_name}: shard_sizes must be a tuple of ints (one per rank), got {sizes!r}")
    try:
        plan = ShardPlan(units=tuple(sizes))
    except ConfigError as err:
        raise ConfigError(f"semimig {cls_name}: shard_sizes={tuple(sizes)!r}: {err}") from None
    if plan.tp != tp_size:
        raise ConfigError(f"semimig {cls_name}: shard_sizes={plan.units} has {plan.tp} entries, the tensor-parallel "
                          f"group has {tp_size} ranks")
    if plan.dimension != size:
        raise ConfigError(f"semimig {cls_name}: shard_sizes={plan.units} sum to {plan.dimension}, not {what}={size}")
    return plan


def uneven_plans(cls_name: str, shard_sizes: Any, split_name: str, size: int, tp_size: int,
                 split_sizes: Optional[Sequence[int]] = None) -> Optional[Plans]:
    """One plan per packed part (one part, ``[size]``, for plain layers); ``None`` when absent or all even."""
    if shard_sizes is None:
        return None
    parts = [size] if split_sizes is None else list(split_sizes)
    nested = isinstance(shard_sizes, (list, tuple)) and len(shard_sizes) > 0 and \
        all(isinstance(s, (list, tuple, ShardPlan)) for s in shard_sizes)
    if nested and len(shard_sizes) != len(parts):
        raise ConfigError(f"semimig {cls_name}: shard_sizes has {len(shard_sizes)} per-part entries, "
                          f"split_sizes has {len(parts)} parts")
    names = [split_name] if split_sizes is None else [f"split_sizes[{i}]" for i in range(len(parts))]
    plans = tuple(_plan(cls_name, shard_sizes[i] if nested else shard_sizes, names[i], part, tp_size)
                  for i, part in enumerate(parts))
    return None if all(plan.is_even for plan in plans) else plans


def _refuse_options(cls_name: str, matrix_kind: str, options: dict, plans: Plans) -> None:
    reasons = []
    if matrix_kind == "column" and options.get("gather_output", False):
        reasons.append("gather_output=True (Colossal-AI's output gather assumes even shards)")
    if matrix_kind == "row" and not options.get("parallel_input", True):
        reasons.append("parallel_input=False (Colossal-AI's input split assumes even shards)")
    if options.get("weight") is None:
        reasons.append("no weight given (build uneven layers with from_native_module from the full module)")
    if reasons:
        sizes = [plan.units for plan in plans]
        raise ConfigError(f"semimig {cls_name} with uneven shard_sizes={sizes[0] if len(sizes) == 1 else sizes}: "
                          "refused " + "; ".join(reasons))


@contextmanager
def presharded(cls_name: str, matrix_kind: str, options: dict, plans: Optional[Plans], group, *,
               transposed: bool = False) -> Iterator[None]:
    """Around Colossal-AI's constructor: cut ``options["weight"]`` (and a column layer's ``bias_``) to this
    rank's slices of ``plans`` (one per packed part) as customised distributed tensors, hidden from the
    constructor's even sharding.  ``transposed``: the weight is stored ``[in, out]`` (GPT-2's ``Conv1D``).

    Does nothing when ``plans`` is ``None`` (no or even ``shard_sizes``).
    """
    if plans is None:
        yield
        return
    _refuse_options(cls_name, matrix_kind, options, plans)
    rank = P.group_rank(group)
    parts = [plan.dimension for plan in plans]
    weight_dim = (0 if matrix_kind == "column" else 1) ^ int(transposed)
    params: List[Tuple[torch.nn.Parameter, int]] = [(options["weight"], weight_dim)]
    if matrix_kind == "column" and options.get("bias_") is not None:
        params.append((options["bias_"], 0))
    for param, dim in params:
        shard_fn, gather_fn = packed_shard_functions(parts, plans, rank, dim=dim, group=group)
        piece = distribute_tensor_with_customization(param.data, shard_fn, gather_fn)
        customized_distributed_tensor_to_existing_param(piece, param)
        setattr(param, _MARK, None)
    try:
        yield
    finally:
        for param, _ in params:
            if _MARK in param.__dict__:
                delattr(param, _MARK)
