"""Drop-in replacements for ``colossalai.shardformer.layer.Linear1D_Col`` / ``Linear1D_Row``.

The classes subclass Colossal-AI's (same constructor, ``from_native_module``, sharded state
dict, ``gather_output``, ``skip_bias_add``), and route their GEMMs through
:mod:`semimig.nn.functional`, where a :class:`~semimig.nn.directive.LayerDirective` set by the
balancing runtime (``layer.directive``) adds ZERO-resizing and migration.  Without a directive
they compute exactly what Colossal-AI computes.

Called with no ``process_group`` inside a program set up by ``colossalai.legacy.launch`` with
the 1D tensor mode, the constructors build the legacy flavour (:mod:`semimig.nn.legacy`)
instead, so ``from colossalai.legacy.nn import Linear1D_Col`` can be swapped for
``from semimig.nn import Linear1D_Col``.
"""
from __future__ import annotations

import logging
from typing import List, Optional, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn as nn
from colossalai.shardformer.layer import Linear1D_Col as _CaiLinear1D_Col
from colossalai.shardformer.layer import Linear1D_Row as _CaiLinear1D_Row
from colossalai.shardformer.layer._operation import gather_forward_split_backward, split_forward_gather_backward
from torch.distributed import ProcessGroup

from semimig.nn import legacy
from semimig.nn.functional import column_parallel_linear, row_parallel_linear
from semimig.nn.balanced import BalancedLinearMixin

logger = logging.getLogger(__name__)

_UNSUPPORTED = {
    "seq_parallel_mode": None,
    "fp8_communication": False,
    "use_zbv": False,
}


def _reject_unsupported(cls_name: str, kwargs: dict) -> None:
    for name, supported in _UNSUPPORTED.items():
        if name in kwargs and kwargs[name] != supported:
            raise ValueError(f"semimig {cls_name} supports {name}={supported!r} only, got {kwargs[name]!r}")


def _single_group(process_group: Union[ProcessGroup, List[ProcessGroup], None]) -> Optional[ProcessGroup]:
    if isinstance(process_group, (list, tuple)):
        if len(process_group) != 1:
            raise ValueError(f"expected exactly one process group, got {len(process_group)}")
        return process_group[0]
    return process_group


def _check_native_linear(module: nn.Module, cls_name: str) -> None:
    if not isinstance(module, nn.Linear):
        raise TypeError(f"{cls_name}.from_native_module expects a torch.nn.Linear, got {type(module).__name__}")


def _check_divisible(name: str, size: int, tp_size: int) -> None:
    if size % tp_size != 0:
        raise ValueError(f"{name}={size} is not divisible by the tensor-parallel size {tp_size}")


def _from_native(cls, module: nn.Module, process_group, split: str, **kwargs) -> nn.Module:
    """Shard ``module`` (a ``torch.nn.Linear``) as ``cls`` along ``split`` ("in"/"out" features).

    As in Colossal-AI, a layer narrower than the group along ``split`` is returned unchanged.
    """
    _check_native_linear(module, cls.__name__)
    group = _single_group(process_group)
    tp_size = dist.get_world_size(group)
    size = getattr(module, f"{split}_features")
    if size < tp_size:
        return module
    _check_divisible(f"{split}_features", size, tp_size)
    return cls(module.in_features, module.out_features, bias=module.bias is not None, device=module.weight.device,
               process_group=group, weight=module.weight, bias_=module.bias, **kwargs)


class Linear1D_Col(BalancedLinearMixin, _CaiLinear1D_Col):
    """Column-parallel linear: weight ``[out/e, in]``, ``x`` replicated, ``dx`` all-reduced in backward."""

    matrix_kind = "column"

    def __new__(cls, *args, **kwargs):
        if legacy.wants_legacy(kwargs):
            return legacy.Linear1D_Col(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: torch.dtype = None,
                 device: torch.device = None, process_group: ProcessGroup = None, **kwargs) -> None:
        _reject_unsupported(type(self).__name__, kwargs)
        tp_size = dist.get_world_size(process_group) if dist.is_initialized() else 1
        _check_divisible("out_features", out_features, tp_size)
        super().__init__(in_features, out_features, bias=bias, dtype=dtype, device=device,
                         process_group=process_group, **kwargs)
        self._init_balancing()

    @staticmethod
    def from_native_module(module: nn.Linear, process_group: Union[ProcessGroup, List[ProcessGroup]],
                           **kwargs) -> nn.Module:
        """Shard a ``torch.nn.Linear`` along its output features (returned as-is if ``out < e``)."""
        return _from_native(Linear1D_Col, module, process_group, "out", **kwargs)

    def forward(self, input_: torch.Tensor) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        self._check_width(input_, self.weight.shape[-1])
        bias = None if self.skip_bias_add else self.bias
        output = column_parallel_linear(input_, self.weight, bias, self.process_group, self._active_directive())
        if self.gather_output:
            output = gather_forward_split_backward(output, dim=-1, process_group=self.process_group)
        return (output, self.bias) if self.skip_bias_add else output


class Linear1D_Row(BalancedLinearMixin, _CaiLinear1D_Row):
    """Row-parallel linear: weight ``[out, in/e]``, ``x`` split along K, ``y`` all-reduced in forward."""

    matrix_kind = "row"

    def __new__(cls, *args, **kwargs):
        if legacy.wants_legacy(kwargs):
            return legacy.Linear1D_Row(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: torch.dtype = None,
                 device: torch.device = None, process_group: ProcessGroup = None, **kwargs) -> None:
        _reject_unsupported(type(self).__name__, kwargs)
        if kwargs.get("stream_chunk_num", 1) != 1:
            raise ValueError(f"semimig Linear1D_Row supports stream_chunk_num=1 only, got {kwargs['stream_chunk_num']}")
        tp_size = dist.get_world_size(process_group) if dist.is_initialized() else 1
        _check_divisible("in_features", in_features, tp_size)
        super().__init__(in_features, out_features, bias=bias, dtype=dtype, device=device,
                         process_group=process_group, **kwargs)
        self._init_balancing()

    @staticmethod
    def from_native_module(module: nn.Linear, process_group: Union[ProcessGroup, List[ProcessGroup]],
                           **kwargs) -> nn.Module:
        """Shard a ``torch.nn.Linear`` along its input features (returned as-is if ``in < e``)."""
        return _from_native(Linear1D_Row, module, process_group, "in", **kwargs)

    @torch.no_grad()
    def reset_parameters(self, weight_initializer, bias_initializer) -> None:
        """Colossal-AI's initialisation, with the bias broadcast on the bias's own device (CPU too)."""
        weight_initializer(self.weight, fan_in=self.in_features, fan_out=self.out_features)
        if self.bias is not None:
            bias_initializer(self.bias, fan_in=self.in_features)
            if dist.is_initialized() and dist.get_world_size(self.process_group) > 1:
                src = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
                dist.broadcast(self.bias.data, src=src, group=self.process_group)

    def forward(self, input_: torch.Tensor) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        if self.parallel_input:
            self._check_width(input_, self.weight.shape[-1])
        else:
            self._check_width(input_, self.weight.shape[-1] * self.num_partitions)
            input_ = split_forward_gather_backward(input_, dim=-1, process_group=self.process_group)
        output = row_parallel_linear(input_, self.weight, self.process_group, self._active_directive())
        if self.skip_bias_add:
            return output, self.bias
        return output + self.bias if self.bias is not None else output
