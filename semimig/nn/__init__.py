"""semimig's 1D tensor-parallel linear layers (drop-ins for Colossal-AI's) and their functional core.

Exported under Colossal-AI's class names, so ``from colossalai.shardformer.layer import X`` (or
``from colossalai.legacy.nn import X``) can become ``from semimig.nn import X``.
"""
from semimig import _compat

_compat.check_colossalai_version()
_compat.apply_cpu_shim()  # patches only what Colossal-AI's CPU accelerator lacks; no-op with CUDA

from semimig.nn.directive import LayerDirective, LayerState  # noqa: E402
from semimig.nn.fused import (  # noqa: E402
    FusedLinear1D_Col,
    FusedLinear1D_Row,
    GPT2FusedLinearConv1D_Col,
    GPT2FusedLinearConv1D_Row,
)
from semimig.nn.layers import Linear1D_Col, Linear1D_Row  # noqa: E402
from semimig.nn.legacy import Linear1D  # noqa: E402

__all__ = [
    "Linear1D", "Linear1D_Col", "Linear1D_Row",
    "GPT2FusedLinearConv1D_Col", "GPT2FusedLinearConv1D_Row", "FusedLinear1D_Col", "FusedLinear1D_Row",
    "LayerDirective", "LayerState",
]
