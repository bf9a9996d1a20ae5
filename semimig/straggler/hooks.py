"""Straggler injection for layers semimig does not own (Colossal-AI's own, for the baseline).

Forward and full-backward hooks on ``colossalai.shardformer.layer.Linear1D_Col/Row`` charge the
delay of the layer's GEMMs to a :class:`BusyMeter`: one GEMM (``2·M·N·K`` FLOPs) after forward,
two after backward.  The hooks cannot time the GEMMs apart from the collectives inside those
layers, so only the deterministic ``flops`` and ``emulated`` modes are accepted.  Hooks do
nothing while the module is in eval mode.
"""
from __future__ import annotations

from typing import List

import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from semimig.straggler.busy import BusyMeter


def _is_colossalai_linear(module: nn.Module) -> bool:
    from colossalai.shardformer.layer import Linear1D_Col, Linear1D_Row

    return type(module) in (Linear1D_Col, Linear1D_Row)


def attach_to_colossalai_layers(model: nn.Module, meter: BusyMeter) -> List[RemovableHandle]:
    """Hook every Colossal-AI 1D linear layer of ``model``; returns the handles (``.remove()``)."""
    injector = meter.injector
    if injector is None or injector.config.mode == "measured":
        raise ValueError("hook injection needs a BusyMeter whose injector uses mode 'flops' or 'emulated', "
                         f"got {None if injector is None else injector.config.mode!r}")
    handles = []
    for module in model.modules():
        if not _is_colossalai_linear(module):
            continue

        def forward_hook(mod, args, output):
            if mod.training:
                n, k = mod.weight.shape
                mod._semimig_flops = 2 * (args[0].numel() // args[0].shape[-1]) * n * k
                meter.timed(lambda: None, flops=mod._semimig_flops, full_flops=mod._semimig_flops)

        def backward_hook(mod, grad_input, grad_output):
            if mod.training:
                flops = 2 * getattr(mod, "_semimig_flops", 0)
                meter.timed(lambda: None, flops=flops, full_flops=flops)

        handles.append(module.register_forward_hook(forward_hook))
        handles.append(module.register_full_backward_hook(backward_hook))
    if not handles:
        raise ValueError(f"{type(model).__name__} has no Colossal-AI Linear1D_Col/Row layers to slow down")
    return handles
