"""Colossal-AI's private collectives that semimig's drop-in layers call, imported in this one place.

semimig's drop-in layers call two of Colossal-AI's private collectives exactly as its own 1D layers
do: ``gather_forward_split_backward`` and ``split_forward_gather_backward`` of
``colossalai.shardformer.layer._operation`` (unchanged from 0.4.7 to 0.5.0); the timed vocabulary
layers (:mod:`semimig.shardformer.vocab_clock`) call ``reduce_forward`` and read
``_grad_accum_fusion_available`` (whether apex's fused weight-gradient accumulation is in use) as
Colossal-AI's own embedding and head do.  They are imported only
here (``from semimig._compat import split_forward_gather_backward``): this module's ``__getattr__``
hands back Colossal-AI's own functions (the same objects, so the even layout stays bit-equal), loading
``_operation`` on first use.  A release that moves them breaks here, in one place.
"""
from __future__ import annotations

from typing import Any

PRIVATE_OPERATIONS = ("gather_forward_split_backward", "split_forward_gather_backward", "reduce_forward",
                      "_grad_accum_fusion_available")
"""The names of ``colossalai.shardformer.layer._operation`` semimig uses, importable from :mod:`semimig._compat`."""


def private_operation(name: str) -> Any:
    """Colossal-AI's own function ``name`` of :data:`PRIVATE_OPERATIONS` (the same object, loaded on first use)."""
    if name not in PRIVATE_OPERATIONS:
        raise AttributeError(f"module 'semimig._compat' has no attribute {name!r}")
    from colossalai.shardformer.layer import _operation

    return getattr(_operation, name)
