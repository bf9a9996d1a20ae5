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
(build it with ``from_native_module``), sizes that are not ``tp`` ints ``≥ 1`` summing to the
split dimension.  ``seq_parallel_mode="split_gather"`` gathers and splits along the sequence,
not the split dimension, and is left as it is.
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
from semimig.sharding.split import shard_functions

__all__ = ["uneven_plan", "presharded"]

_MARK = "dist_layout"  # what Colossal-AI's constructors test (is_distributed_tensor) before sharding


def uneven_plan(cls_name: str, shard_sizes: Any, split_name: str, size: int, tp_size: int) -> Optional[ShardPlan]:
    """The plan of ``shard_sizes`` (columns per rank) along ``split_name``; ``None`` when absent or even."""
    if shard_sizes is None:
        return None
    if isinstance(shard_sizes, ShardPlan):
        shard_sizes = shard_sizes.sizes
    if isinstance(shard_sizes, (str, bytes)) or not isinstance(shard_sizes, (list, tuple)):
        raise ConfigError(f"semimig {cls_name}: shard_sizes must be a tuple of ints (one per rank), got {shard_sizes!r}")
    try:
        plan = ShardPlan(units=tuple(shard_sizes))
    except ConfigError as err:
        raise ConfigError(f"semimig {cls_name}: shard_sizes={tuple(shard_sizes)!r}: {err}") from None
    if plan.tp != tp_size:
        raise ConfigError(f"semimig {cls_name}: shard_sizes={plan.units} has {plan.tp} entries, the tensor-parallel "
                          f"group has {tp_size} ranks")
    if plan.dimension != size:
        raise ConfigError(f"semimig {cls_name}: shard_sizes={plan.units} sum to {plan.dimension}, not "
                          f"{split_name}={size}")
    return None if plan.is_even else plan


def _refuse_options(cls_name: str, matrix_kind: str, options: dict, plan: ShardPlan) -> None:
    reasons = []
    if matrix_kind == "column" and options.get("gather_output", False):
        reasons.append("gather_output=True (Colossal-AI's output gather assumes even shards)")
    if matrix_kind == "row" and not options.get("parallel_input", True):
        reasons.append("parallel_input=False (Colossal-AI's input split assumes even shards)")
    if options.get("weight") is None:
        reasons.append("no weight given (build uneven layers with from_native_module from the full module)")
    if reasons:
        raise ConfigError(f"semimig {cls_name} with uneven shard_sizes={plan.units}: refused " + "; ".join(reasons))


@contextmanager
def presharded(cls_name: str, matrix_kind: str, options: dict, plan: Optional[ShardPlan], group) -> Iterator[None]:
    """Around Colossal-AI's constructor: cut ``options["weight"]`` (and a column layer's ``bias_``) to this
    rank's slice of ``plan`` as customised distributed tensors, hidden from the constructor's even sharding.

    Does nothing when ``plan`` is ``None`` (no or even ``shard_sizes``).
    """
    if plan is None:
        yield
        return
    _refuse_options(cls_name, matrix_kind, options, plan)
    rank = P.group_rank(group)
    params: List[Tuple[torch.nn.Parameter, int]] = [(options["weight"], 0 if matrix_kind == "column" else 1)]
    if matrix_kind == "column" and options.get("bias_") is not None:
        params.append((options["bias_"], 0))
    for param, dim in params:
        shard_fn, gather_fn = shard_functions(plan, rank, dim=dim, group=group)
        piece = distribute_tensor_with_customization(param.data, shard_fn, gather_fn)
        customized_distributed_tensor_to_existing_param(piece, param)
        setattr(param, _MARK, None)
    try:
        yield
    finally:
        for param, _ in params:
            if _MARK in param.__dict__:
                delattr(param, _MARK)

