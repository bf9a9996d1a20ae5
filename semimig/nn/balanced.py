"""What every semimig linear layer adds to Colossal-AI's: a balancing directive and clear errors."""
from __future__ import annotations

from typing import Optional

import torch

from semimig.nn.directive import LayerDirective


class BalancedLinearMixin:
    """Mixed into each semimig linear layer (both flavours).

    ``directive``  the :class:`LayerDirective` of the current iteration, or ``None`` (dense).
    ``layer_name`` the module's qualified name, set by the runtime when it binds the model.
    ``matrix_kind`` ``"column"`` or ``"row"``: which 1D tensor-parallel GEMM the layer runs.
    """

    matrix_kind: str = ""
    directive: Optional[LayerDirective]
    layer_name: Optional[str]

    def _init_balancing(self) -> None:
        self.directive = None
        self.layer_name = None

    @property
    def k_columns(self) -> int:
        """``K`` of this rank's GEMMs: the width of its weight shard ``[N, K]``."""
        return self.weight.shape[-1]

    def _active_directive(self) -> Optional[LayerDirective]:
        """The directive while training; evaluation always runs densely and untimed."""
        return self.directive if self.training else None

    def _check_width(self, input_: torch.Tensor, expected: int) -> None:
        if input_.shape[-1] != expected:
            raise ValueError(
                f"{type(self).__name__} expects inputs of width {expected} (last dimension), "
                f"got shape {tuple(input_.shape)}"
            )

    def extra_repr(self) -> str:
        n, k = self.weight.shape
        active = "dense" if self.directive is None else f"balanced(iter={self.directive.iteration})"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, shard=[{n}, {k}], {active}"
        )
