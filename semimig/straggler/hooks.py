"""Straggler injection for layers semimig does not own (Colossal-AI's own: the baseline).

Hooks on Colossal-AI's tensor-parallel linear layers (``Linear1D_Col/Row``, the fused
``FusedLinear1D_Col/Row`` and GPT-2's ``GPT2FusedLinearConv1D_Col/Row``: every class semimig's
policy swaps) slow their GEMMs the way semimig's own layers are slowed, in every injection mode.  A layer of ``N x K`` weight on ``M`` tokens does one
GEMM of ``f = 2·M·N·K`` FLOPs forward and two (dgrad, wgrad) backward.  Each GEMM is charged

    delay = injector.delay_for(t, f)       flops   : (chi - 1) · f / rate   (t unused)
                                           emulated: chi · f / rate        (t unused)
                                           measured: (chi - 1) · t

where ``t`` is the GEMM's own time.  Hooks cannot time a GEMM apart from the collectives inside a
layer (the row forward all-reduces its output; the column backward all-reduces ``dX`` while it
computes ``dW``), except in one place: the column forward with ``gather_output=False`` and no
sequence parallelism is a bare ``F.linear``.  In measured mode that forward is timed (forward
pre-hook to forward hook, the device synchronised on CUDA), which gives this rank's GEMM rate

    rate = Σ f / Σ t   over the timed column forwards of the iteration so far
                       (the previous iteration's rate until the first one of a new iteration)

and every other GEMM's time is estimated as ``t = f / rate``.  The straggler is thus slowed by
``(chi - 1)`` times its own measured compute, as semimig's layers are, without timing any
collective; the estimate assumes backward GEMMs run at the forward GEMMs' rate.

Nothing happens while a module is in eval mode.  :meth:`BaselineInjection.snapshot` gives the
iteration's busy time (GEMM time, measured or estimated, plus delays) for the bench's records.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from semimig.errors import ConfigError
from semimig.straggler.busy import BusyMeter
from semimig.straggler.injection import StragglerInjector

__all__ = ["BaselineInjection", "GemmCharge", "attach_to_colossalai_layers"]


@dataclass(frozen=True)
class GemmCharge:
    """One hooked GEMM: which layer, which pass, its FLOPs, its time and the delay injected."""

    layer: str
    kind: str  # "col-forward", "row-forward", "col-backward", "row-backward"
    flops: float
    seconds: float
    """Measured (column forward in measured mode), else ``flops / rate`` (``0`` outside measured mode)."""
    delay_s: float


def _linear_kinds() -> dict[type, str]:
    """Colossal-AI's tensor-parallel linear classes (the ones :data:`semimig.shardformer.policy.SWAPS`
    replaces) and whether each is a column (``col``) or row (``row``) layer."""
    from colossalai.shardformer import layer as cai

    return {cai.Linear1D_Col: "col", cai.GPT2FusedLinearConv1D_Col: "col", cai.FusedLinear1D_Col: "col",
            cai.Linear1D_Row: "row", cai.GPT2FusedLinearConv1D_Row: "row", cai.FusedLinear1D_Row: "row"}


def _forward_is_bare_gemm(module: nn.Module) -> bool:
    """A column layer whose forward runs no collective (no output gather, no shared SP/TP)."""
    from colossalai.shardformer.layer.utils import is_share_sp_tp

    mode = getattr(module, "seq_parallel_mode", None)
    return not getattr(module, "gather_output", False) and not (mode is not None and is_share_sp_tp(mode))


class BaselineInjection:
    """Slows every Colossal-AI tensor-parallel linear layer of ``model`` by ``injector``'s straggler
    (module docstring)."""

    def __init__(self, model: nn.Module, injector: StragglerInjector, *, device: torch.device | str = "cpu",
                 keep_charges: bool = False) -> None:
        if not isinstance(injector, StragglerInjector):
            raise ConfigError(f"injector must be a StragglerInjector, got {injector!r}")
        self.injector = injector
        self.device = torch.device(device)
        self.keep_charges = keep_charges
        self.charges: List[GemmCharge] = []
        self._rate: Optional[float] = None  # FLOP/s of the timed forwards, carried across iterations
        self._timed_flops = self._timed_s = 0.0
        self.reset()
        kinds = _linear_kinds()
        layers = [(name, m, kinds[type(m)]) for name, m in model.named_modules() if type(m) in kinds]
        if not layers:
            raise ConfigError(f"{type(model).__name__} has no Colossal-AI tensor-parallel linear layers to slow down "
                              f"(looked for {sorted(c.__name__ for c in kinds)})")
        self.measured = injector.config.mode == "measured"
        timed = {name for name, m, kind in layers if kind == "col" and _forward_is_bare_gemm(m)}
        if self.measured and not timed:
            raise ConfigError("measured injection times the column layers' forward GEMMs, but every column layer "
                              "of this model gathers its output or shares sequence parallelism (a collective "
                              "inside the forward); use injection mode 'flops' or 'emulated'")
        self.handles: List[RemovableHandle] = []
        for name, module, kind in layers:
            self._hook(name, module, kind, timed=self.measured and name in timed)

    # ------------------------------------------------------------------ accounting
    def reset(self) -> None:
        """Start a new iteration (the measured rate carries over until a new forward is timed)."""
        self._rate = self.rate()
        self._timed_flops = self._timed_s = 0.0
        self._busy_s = self._delay_s = self._flops = 0.0
        self.charges = []

    def rate(self) -> Optional[float]:
        """This rank's measured GEMM rate (FLOP/s): this iteration's timed forwards, else the last one's."""
        return self._timed_flops / self._timed_s if self._timed_s > 0 else self._rate

    def snapshot(self) -> dict:
        """This iteration so far: ``busy_s`` (GEMM time + delays), ``delay_s``, ``flops``, ``rate``."""
        return {"busy_s": self._busy_s, "delay_s": self._delay_s, "flops": self._flops, "rate": self.rate()}

    def _charge(self, layer: str, kind: str, flops: float, seconds: Optional[float]) -> None:
        if seconds is None:
            rate = self.rate()
            seconds = flops / rate if (self.measured and rate) else 0.0
        delay = self.injector.delay_for(seconds, flops)
        self.injector.inject(delay, self.device)
        self._busy_s += self.injector.charged_s(seconds, delay)
        self._delay_s += delay
        self._flops += flops
        if self.keep_charges:
            self.charges.append(GemmCharge(layer, kind, flops, seconds, delay))

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------ hooks
    def _hook(self, name: str, module: nn.Module, kind: str, *, timed: bool) -> None:
        state = {}

        def pre_forward(mod, args):
            if mod.training and timed:
                self._sync()
                state["start"] = time.perf_counter()

        def forward(mod, args, output):
            if not mod.training:
                return
            tokens = args[0].numel() // args[0].shape[-1]
            state["flops"] = flops = 2.0 * tokens * mod.weight.numel()  # [N, K], or [K, N] for GPT-2's Conv1D
            seconds = None
            if timed:
                self._sync()
                seconds = time.perf_counter() - state.pop("start")
                self._timed_flops += flops
                self._timed_s += seconds
            self._charge(name, f"{kind}-forward", flops, seconds)

        def backward(mod, grad_input, grad_output):
            if mod.training and "flops" in state:
                self._charge(name, f"{kind}-backward", 2.0 * state["flops"], None)

        if timed:
            self.handles.append(module.register_forward_pre_hook(pre_forward))
        self.handles.append(module.register_forward_hook(forward))
        self.handles.append(module.register_full_backward_hook(backward))

    def remove(self) -> None:
        """Detach every hook."""
        for handle in self.handles:
            handle.remove()
        self.handles = []


def attach_to_colossalai_layers(model: nn.Module, meter: BusyMeter) -> List[RemovableHandle]:
    """Hook every Colossal-AI 1D linear layer of ``model`` with ``meter``'s injector and device (any
    mode); returns the handles (``.remove()``).  Kept for callers of the older interface; the bench
    uses :class:`BaselineInjection`, which also reports the iteration's busy time."""
    if meter.injector is None:
        raise ConfigError("hook injection needs a BusyMeter with an injector, got one without")
    return BaselineInjection(model, meter.injector, device=meter.device).handles
