"""What every semimig ShardFormer layer does to become one: ``from_native_module`` and its checks.

Colossal-AI's contract is ``ParallelModule.from_native_module(module, process_group, **kwargs)``;
semimig's layers follow Colossal-AI's steps in Colossal-AI's order, so a policy, a test or a user
script cannot tell them apart at γ = 0:

1. ``LazyInitContext.materialize(module)``.  A module built under ``LazyInitContext`` holds
   ``LazyTensor`` parameters whose values are a recorded chain of deferred ops.  Materialising
   turns them into real ``Parameter`` objects in place; the layer then shards those very objects
   in place (``sharded_tensor_to_existing_param``), so ``module.weight is layer.weight`` and the
   parameter is a distributed tensor.  Sharding the ``LazyTensor`` instead records
   ``weight.data = shard(weight.data)`` into the tensor's own op chain: the layer keeps the full
   weight, and the sharder's later ``LazyInitContext.materialize(model)`` replays a chain that
   refers to itself (``RecursionError`` in ``lazy_init._rerun_ops``).
2. A list of one process group is that group.
3. A module narrower than the group along the split dimension is returned unchanged.
4. The split dimension (each fused part, for packed layers) must divide by the group size.

The module layouts: ``"linear"`` is ``torch.nn.Linear`` (weight ``[N, K]``), ``"conv1d"`` is a
Hugging Face ``Conv1D`` (GPT-2; weight ``[K, N]``, ``y = x @ W + b``, output width ``nf``): any
module with a 2-D ``weight`` and ``nf`` (Colossal-AI's own tests define their own ``Conv1D``).
A module of another class is refused by name: read in the wrong layout its weight would be
transposed silently.

:func:`unsupported_options` names the constructor options semimig's balanced GEMMs cannot serve;
the layers refuse them with :class:`~semimig.errors.ConfigError` and ``SemiMigPolicy`` leaves such
layers to Colossal-AI (with one warning) instead of swapping them.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

import torch.nn as nn
from colossalai.lazy import LazyInitContext
from torch.distributed import ProcessGroup

from semimig._validate import is_int
from semimig.comm import primitives as P
from semimig.errors import ConfigError

__all__ = ["Group", "SEQUENCE_MODES", "unsupported_options", "check_options", "check_constructor", "check_divisible", "check_split_sizes",
           "from_native"]

Group = Union[ProcessGroup, Sequence[ProcessGroup], None]
"""What ``from_native_module`` accepts as its process group (a list must hold exactly one)."""

SEQUENCE_MODES = (None, "split_gather", "all_to_all", "ring_attn")
"""``seq_parallel_mode`` values the layers serve.  ``all_to_all`` and ``ring_attn`` leave the linear
layers' GEMMs and collectives as without sequence parallelism (Colossal-AI's layers take the plain
path for them); ``split_gather`` is served exactly, see :class:`~semimig.nn.balanced.BalancedLinearMixin`."""


def unsupported_options(options: dict) -> List[str]:
    """Why a layer built with ``options`` (constructor kwargs) cannot be balanced; empty if it can."""
    reasons = []
    mode = options.get("seq_parallel_mode")
    if mode not in SEQUENCE_MODES:
        reasons.append(f"seq_parallel_mode must be one of {SEQUENCE_MODES}, got {mode!r} "
                       "('ring' overlaps its ring exchange with the GEMM chunks, which semimig does not split)")
    if options.get("fp8_communication", False):
        reasons.append(f"fp8_communication must be False, got {options['fp8_communication']!r}")
    if options.get("use_zbv", False):
        reasons.append(f"use_zbv must be False (zero-bubble weight-gradient deferral), got {options['use_zbv']!r}")
    if options.get("stream_chunk_num", 1) != 1:
        reasons.append(f"stream_chunk_num must be 1 (chunked inference only), got {options['stream_chunk_num']!r}")
    return reasons


def check_options(cls_name: str, options: dict) -> None:
    """Refuse options semimig cannot serve (:class:`ConfigError` naming the layer and every option)."""
    reasons = unsupported_options(options)
    if reasons:
        raise ConfigError(f"semimig {cls_name}: " + "; ".join(reasons))


def check_constructor(cls_name: str, *, in_features: Any, out_features: Any, bias: Any, dtype: Any, device: Any,
                      process_group: Any) -> None:
    """The constructor's own arguments, before Colossal-AI's code (or torch) meets them: sizes are
    ints >= 1, ``bias`` a bool, ``dtype`` a floating ``torch.dtype``, ``device`` one torch can name,
    ``process_group`` a ``ProcessGroup`` this rank belongs to (or ``None``).  :class:`ConfigError`
    names the layer, the argument and the value."""
    import torch
    import torch.distributed as dist

    prefix = f"semimig {cls_name}: "
    for name, value in (("in_features", in_features), ("out_features", out_features)):
        if not is_int(value) or value < 1:
            raise ConfigError(f"{prefix}{name} must be an int >= 1, got {value!r}")
    if not isinstance(bias, bool):
        raise ConfigError(f"{prefix}bias must be a bool, got {bias!r}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ConfigError(f"{prefix}dtype must be a floating-point torch.dtype or None, got {dtype!r}")
    if device is not None:
        try:
            torch.device(device)
        except (RuntimeError, TypeError, ValueError):
            raise ConfigError(f"{prefix}device must be a torch.device (or its name) or None, got {device!r}") from None
    if process_group is not None:
        if not isinstance(process_group, ProcessGroup):
            raise ConfigError(f"{prefix}process_group must be a torch.distributed ProcessGroup or None, "
                              f"got {type(process_group).__name__}")
        if dist.is_initialized() and dist.get_rank(process_group) < 0:
            raise ConfigError(f"{prefix}process_group does not hold this rank (global rank {dist.get_rank()})")


def check_divisible(cls_name: str, name: str, size: int, tp_size: int) -> None:
    if size % tp_size != 0:
        raise ConfigError(f"semimig {cls_name}: {name}={size} is not divisible by the tensor-parallel size {tp_size}")


def check_split_sizes(cls_name: str, split_sizes: Any, total_name: str, total: int, tp_size: int) -> None:
    """Packed layers: each fused part (e.g. Q, K, V) is sharded separately, so each must divide."""
    if not isinstance(split_sizes, (list, tuple)) or not split_sizes:
        raise ConfigError(f"semimig {cls_name}: split_sizes must be a non-empty list of ints, got {split_sizes!r}")
    if sum(split_sizes) != total:
        raise ConfigError(f"semimig {cls_name}: split_sizes={list(split_sizes)} must sum to {total_name}={total}")
    for i, size in enumerate(split_sizes):
        check_divisible(cls_name, f"split_sizes[{i}]", size, tp_size)


def single_group(process_group: Group) -> Optional[ProcessGroup]:
    if isinstance(process_group, (list, tuple)):
        if len(process_group) != 1:
            raise ConfigError(f"process_group: expected exactly one process group, got {len(process_group)}")
        return process_group[0]
    return process_group


def _check_layout(module: nn.Module, cls_name: str, layout: str) -> None:
    """Refuse a module whose class the layer cannot read (a Linear's weight read as Conv1D's would be transposed)."""
    got = type(module).__name__
    if layout == "linear":
        if not isinstance(module, nn.Linear):
            raise ConfigError(f"{cls_name}.from_native_module expects a torch.nn.Linear, got {got}")
        return
    weight = getattr(module, "weight", None)
    if not hasattr(module, "nf") or not isinstance(weight, nn.Parameter) or weight.dim() != 2:
        raise ConfigError(f"{cls_name}.from_native_module expects a GPT-2 Conv1D (weight [in, out], "
                          f"output width nf), got {got}")


def _features(module: nn.Module, layout: str) -> tuple[int, int]:
    """``(in_features, out_features)`` of a native module in either layout."""
    if layout == "linear":
        return module.in_features, module.out_features
    in_features, out_features = module.weight.shape
    nf = module.nf
    if nf != out_features:
        raise ConfigError(f"{type(module).__name__}: weight {tuple(module.weight.shape)} does not end in nf={nf}")
    return in_features, out_features


def build(cls: type, **kwargs: Any) -> nn.Module:
    """``cls(**kwargs)`` as the ShardFormer flavour, even inside a legacy 1D program.

    (Called directly, ``semimig.nn.Linear1D_Col(...)`` with no group builds the legacy flavour
    there; a conversion always builds the ShardFormer layer, as Colossal-AI's does.)
    """
    layer = object.__new__(cls)
    layer.__init__(**kwargs)
    return layer


def from_native(cls: type, module: nn.Module, process_group: Group, *, layout: str, split: str, **kwargs: Any) -> nn.Module:
    """Shard ``module`` as ``cls`` along ``split`` (``"in"`` or ``"out"`` features), Colossal-AI's steps 1-4.

    ``split_sizes`` in ``kwargs`` (packed layers) is checked part by part.
    """
    _check_layout(module, cls.__name__, layout)
    check_options(cls.__name__, kwargs)
    LazyInitContext.materialize(module)
    in_features, out_features = _features(module, layout)
    group = single_group(process_group)
    tp_size = P.group_size(group)
    size = in_features if split == "in" else out_features
    if size < tp_size:
        return module
    if kwargs.get("shard_sizes") is not None:
        pass  # uneven shards (semimig.nn.uneven): the layer's constructor checks them against the dimension
    elif kwargs.get("split_sizes") is not None:
        check_split_sizes(cls.__name__, kwargs["split_sizes"], f"{split}_features", size, tp_size)
    else:
        check_divisible(cls.__name__, f"{split}_features", size, tp_size)
    bias = getattr(module, "bias", None)
    return build(cls, in_features=in_features, out_features=out_features, bias=bias is not None,
                 device=module.weight.device, process_group=group, weight=module.weight, bias_=bias, **kwargs)
