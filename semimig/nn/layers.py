"""Drop-in replacements for ``colossalai.shardformer.layer.Linear1D_Col`` / ``Linear1D_Row``.

The classes subclass Colossal-AI's (same constructor, ``from_native_module``, sharded state
dict, ``gather_output``, ``skip_bias_add``, lazy initialisation), and route their GEMMs through
:mod:`semimig.nn.functional`, where a :class:`~semimig.nn.directive.LayerDirective` set by the
balancing runtime (``layer.directive``) adds ZERO-resizing and migration.  Without a directive
they compute exactly what Colossal-AI computes.  The packed and GPT-2 layers are in
:mod:`semimig.nn.fused`; the conversion steps all share :mod:`semimig.nn.conversion`.

Called with no ``process_group`` inside a program set up by ``colossalai.legacy.launch`` with
the 1D tensor mode, the constructors build the legacy flavour (:mod:`semimig.nn.legacy`)
instead, so ``from colossalai.legacy.nn import Linear1D_Col`` can be swapped for
``from semimig.nn import Linear1D_Col``.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from colossalai.shardformer.layer import Linear1D_Col as _CaiLinear1D_Col
from colossalai.shardformer.layer import Linear1D_Row as _CaiLinear1D_Row

from semimig._compat import gather_forward_split_backward, split_forward_gather_backward
from semimig.nn import legacy
from semimig.nn.balanced import BalancedShardFormerLinear, Output
from semimig.nn.conversion import Group, from_native


class Linear1D_Col(BalancedShardFormerLinear, _CaiLinear1D_Col):
    """Column-parallel linear: weight ``[out/e, in]``, ``x`` replicated, ``dx`` all-reduced in backward."""

    matrix_kind = "column"

    def __new__(cls, *args, **kwargs):
        if legacy.wants_legacy(kwargs):
            return legacy.Linear1D_Col(*args, **kwargs)
        return super().__new__(cls)

    @staticmethod
    def from_native_module(module: nn.Linear, process_group: Group, **kwargs) -> nn.Module:
        """Shard a ``torch.nn.Linear`` along its output features (returned as-is if ``out < e``)."""
        return from_native(Linear1D_Col, module, process_group, layout="linear", split="out", **kwargs)

    def forward(self, input_: torch.Tensor) -> Output:
        return self._column_forward(
            input_, lambda y: gather_forward_split_backward(y, dim=-1, process_group=self.process_group))


class Linear1D_Row(BalancedShardFormerLinear, _CaiLinear1D_Row):
    """Row-parallel linear: weight ``[out, in/e]``, ``x`` split along K, ``y`` all-reduced in forward."""

    matrix_kind = "row"

    def __new__(cls, *args, **kwargs):
        if legacy.wants_legacy(kwargs):
            return legacy.Linear1D_Row(*args, **kwargs)
        return super().__new__(cls)

    @staticmethod
    def from_native_module(module: nn.Linear, process_group: Group, **kwargs) -> nn.Module:
        """Shard a ``torch.nn.Linear`` along its input features (returned as-is if ``in < e``)."""
        return from_native(Linear1D_Row, module, process_group, layout="linear", split="in", **kwargs)

    def reset_parameters(self, weight_initializer, bias_initializer) -> None:
        self._init_row_parameters(weight_initializer, bias_initializer)

    def forward(self, input_: torch.Tensor) -> Output:
        return self._row_forward(
            input_, lambda x: split_forward_gather_backward(x, dim=-1, process_group=self.process_group))
