"""Drop-ins for Colossal-AI's packed and GPT-2 tensor-parallel layers, balanced like ``Linear1D_Col/Row``.

================================  ====================  ==================================
class (Colossal-AI's name)        stored weight shard   GEMM view ``gemm_weight``
================================  ====================  ==================================
``GPT2FusedLinearConv1D_Col``     ``[K, N/e]`` (Conv1D)  ``weight.t()``  ``[N/e, K]``
``GPT2FusedLinearConv1D_Row``     ``[K/e, N]`` (Conv1D)  ``weight.t()``  ``[N, K/e]``
``FusedLinear1D_Col``             ``[N/e, K]``           ``weight``
``FusedLinear1D_Row``             ``[N, K/e]``           ``weight``
================================  ====================  ==================================

GPT-2's ``Conv1D`` computes ``y = x @ W + b`` with ``W`` stored ``[K, N]``; semimig runs the same
product as ``x @ (W^T)^T``, i.e. :func:`~semimig.nn.functional.column_parallel_linear` /
:func:`~semimig.nn.functional.row_parallel_linear` on the ``[N, K]`` view ``W.t()``, and autograd
returns ``dW = (dy^T @ x)^T``.  A :class:`~semimig.nn.directive.LayerDirective` therefore prunes and
migrates the same ``K`` columns of the view — rows of the stored ``Conv1D`` weight — exactly as for
``Linear1D_Col/Row``.

"Fused" (packed) layers shard each part of ``split_sizes`` (e.g. Q, K, V) separately, so rank ``r``
holds ``[Q_r, K_r, V_r]`` (Colossal-AI's ``split_fused_qkv_in_gpt2_style``): column layers pack
along ``N`` (every part must divide by ``e``), ``FusedLinear1D_Row`` along ``K``.  Sharding, state
dicts, initialisation and ``gather_output`` / ``parallel_input=False`` reorderings are
Colossal-AI's; only the GEMMs (and the row layers' CPU-safe bias broadcast) are semimig's.
"""
from __future__ import annotations

from typing import List

import torch
import torch.nn as nn
from colossalai.shardformer.layer import qkv_fused_linear as _cai

from semimig._compat import split_forward_gather_backward
from semimig.nn.balanced import BalancedPackedLinear, BalancedShardFormerLinear, Output
from semimig.nn.conversion import Group, from_native

__all__ = ["GPT2FusedLinearConv1D_Col", "GPT2FusedLinearConv1D_Row", "FusedLinear1D_Col", "FusedLinear1D_Row"]


class _Conv1DWeight:
    """GPT-2 ``Conv1D`` layers store ``[K, N]``; their GEMMs see the ``[N, K]`` view."""

    weight_transposed = True

    @property
    def gemm_weight(self) -> torch.Tensor:
        return self.weight.t()


class _PackedColumn(BalancedPackedLinear):
    """Column layers packed by ``split_sizes``: gathered output re-interleaved part by part."""

    matrix_kind = "column"

    def forward(self, input_: torch.Tensor) -> Output:
        return self._column_forward(
            input_, lambda y: _cai.gather_forward_split_backward_fused_qkv(y, self.split_sizes, self.process_group))


class GPT2FusedLinearConv1D_Col(_Conv1DWeight, _PackedColumn, _cai.GPT2FusedLinearConv1D_Col):
    """GPT-2 ``c_attn`` / ``c_fc``: column-parallel ``Conv1D``, weight ``[K, N/e]`` packed by ``split_sizes``."""

    @staticmethod
    def from_native_module(module: nn.Module, process_group: Group, split_sizes: List[int], **kwargs) -> nn.Module:
        """Shard a GPT-2 ``Conv1D`` along its output features, part by part (as-is if ``out < e``)."""
        return from_native(GPT2FusedLinearConv1D_Col, module, process_group, layout="conv1d", split="out",
                           split_sizes=split_sizes, **kwargs)


class GPT2FusedLinearConv1D_Row(_Conv1DWeight, BalancedShardFormerLinear, _cai.GPT2FusedLinearConv1D_Row):
    """GPT-2 attention/MLP ``c_proj``: row-parallel ``Conv1D``, weight ``[K/e, N]``, bias replicated."""

    matrix_kind = "row"

    @staticmethod
    def from_native_module(module: nn.Module, process_group: Group, **kwargs) -> nn.Module:
        """Shard a GPT-2 ``Conv1D`` along its input features (returned as-is if ``in < e``)."""
        return from_native(GPT2FusedLinearConv1D_Row, module, process_group, layout="conv1d", split="in", **kwargs)

    def reset_parameters(self, weight_initializer, bias_initializer) -> None:
        with self.randomizer.fork_rng(enable_cpu=True):
            self._init_row_parameters(weight_initializer, bias_initializer)

    def forward(self, input_: torch.Tensor) -> Output:
        return self._row_forward(
            input_, lambda x: split_forward_gather_backward(x, dim=-1, process_group=self.process_group))


class FusedLinear1D_Col(_PackedColumn, _cai.FusedLinear1D_Col):
    """Packed ``torch.nn.Linear`` (e.g. QKV), column-parallel: weight ``[N/e, K]`` packed by ``split_sizes``."""

    @staticmethod
    def from_native_module(module: nn.Linear, process_group: Group, split_sizes: List[int], **kwargs) -> nn.Module:
        """Shard a packed ``torch.nn.Linear`` along its output features, part by part."""
        return from_native(FusedLinear1D_Col, module, process_group, layout="linear", split="out",
                           split_sizes=split_sizes, **kwargs)


class FusedLinear1D_Row(BalancedPackedLinear, _cai.FusedLinear1D_Row):
    """Row-parallel ``torch.nn.Linear`` whose input is packed: weight ``[N, K/e]`` packed by ``split_sizes``."""

    matrix_kind = "row"

    @staticmethod
    def from_native_module(module: nn.Linear, process_group: Group, split_sizes: List[int], **kwargs) -> nn.Module:
        """Shard a ``torch.nn.Linear`` along its (packed) input features, part by part."""
        return from_native(FusedLinear1D_Row, module, process_group, layout="linear", split="in",
                           split_sizes=split_sizes, **kwargs)

    def reset_parameters(self, weight_initializer, bias_initializer) -> None:
        self._init_row_parameters(weight_initializer, bias_initializer)

    def forward(self, input_: torch.Tensor) -> Output:
        return self._row_forward(
            input_, lambda x: _cai.split_forward_gather_backward_fused_qkv(x, self.split_sizes, self.process_group))
