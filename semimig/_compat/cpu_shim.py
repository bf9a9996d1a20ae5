"""A minimal CPU shim for Colossal-AI: :func:`apply_cpu_shim`.

Without CUDA, Colossal-AI runs on its ``CpuAccelerator``.  :func:`apply_cpu_shim` fills the
gaps on the paths semimig uses, each only if a probe shows it is broken, so a release that
fixes one keeps its own code.  On CPU the accelerator's generator *is* torch's default CPU
generator and CPU work is synchronous, which is all the replacements assume.

1. ``CpuAccelerator.get_rng_state`` calls ``torch.get_rng_state(device)``, which takes no
   argument (upstream issue hpcaitech/ColossalAI#5211), and ``CpuAccelerator.manual_seed``
   raises "not supported".  ShardFormer's ``Randomizer`` calls both when it builds
   ``DropoutForReplicatedInput``/``DropoutForParallelInput``, so ``HybridParallelPlugin``
   cannot shard any model with dropout: "Failed to replace dropout of type Dropout with
   DropoutForReplicatedInput with the exception: get_rng_state() takes 0 positional arguments
   but 1 was given".  Both are routed to torch's CPU generator.  (``set_rng_state`` already
   works; the other RNG methods stay unsupported because nothing in Colossal-AI calls them.)
2. ``LowLevelZeroOptimizer`` (``LowLevelZeroPlugin`` stage 1/2, and ``HybridParallelPlugin``
   with ``zero_stage>0``) asserts ``get_accelerator().name in ["cuda", "npu"]`` ("device is
   required") and uses ``Stream``, ``current_stream``, ``stream`` and ``synchronize``, which the
   CPU accelerator refuses.  The four become torch's own CPU stand-ins (``torch.cpu.Stream``
   ...) and the sanity check loses only its device gate.  ``overlap_communication=True``
   (both plugins' default) still cannot work on CPU: it calls ``Tensor.record_stream``, which
   has no CPU implementation, so the patched check refuses it with a message saying to pass
   ``overlap_communication=False``.
3. The legacy engine bypasses the accelerator and calls ``torch.cuda`` directly:
   ``legacy.context.random.seed_manager`` saves, seeds and restores the CUDA generator per
   parallel mode, ``legacy.context.random._helper.sync_states`` reads it, and
   ``legacy.context.parallel_context.ParallelContext.set_seed`` registers the per-mode seeds
   (DATA: ``seed``, TENSOR: ``seed + tp_rank``) only ``if torch.cuda.is_available()``; without
   them every legacy parallel layer dies in its constructor (``with seed(ParallelMode.TENSOR)``).
   The shim rebinds the global name ``torch`` in exactly those three modules to a view of torch
   whose ``cuda.get_rng_state/set_rng_state/manual_seed`` drive the CPU generator and whose
   ``cuda.is_available()`` is ``True``; every other attribute is the real ``torch`` /
   ``torch.cuda``, which is never modified (probe: ``torch.cuda.get_rng_state()`` raises).
   (In ``parallel_context``, ``is_available`` gates only the seed registration in ``set_seed``
   and the device binding in ``set_device``, which ``legacy.launch`` calls only under the real
   ``torch.cuda.is_available()``.)
4. ``HybridParallelPlugin(precision="fp16")`` builds a ``DynamicGradScaler``, whose constructor
   calls ``get_accelerator().device_count()``; the CPU accelerator raises "this method is not
   supported for cpu accelerator".  ``CpuAccelerator.device_count`` becomes
   ``torch.cpu.device_count()`` (1).  With it fp16 AMP trains on CPU exactly as Colossal-AI
   intends (loss scaling, overflow check).
5. Every pipeline send/receive (``pp_size > 1``) first asks
   ``colossalai.pipeline.p2p._check_for_nccl_hccl_backend``, which calls
   ``torch.distributed.is_hccl_available()``; torch 2.13 has no such function
   (``AttributeError``; ``Backend.HCCL`` is gone as well, but the check never reaches it on a
   gloo group).  ``p2p``'s ``torch`` becomes a view whose ``distributed.is_hccl_available()``
   says whether a backend named ``hccl`` is registered (``torch_npu`` registers it), so on
   this stack ``False``.  Probe: calling it on ``p2p``'s own ``torch`` raises.
6. ShardFormer's GPT-2, GPT-J, OPT and T5 forwards call ``torch.cuda.set_device(<the hidden
   states' device>)`` for every block (a leftover of naive model parallelism), and
   ``torch.cuda.set_device`` refuses a CPU device ("Expected a cuda device, but got: cpu"),
   so ``HybridParallelPlugin`` cannot run these models on CPU at all.  Their modules'
   ``torch`` becomes a view whose ``cuda.set_device`` returns at once for a CPU device (there
   is nothing to select) and calls the real one for anything else; ``cuda.is_available`` and
   every other name stay torch's.  Probe: ``set_device(torch.device("cpu"))`` on the
   module's own ``torch`` raises.

7. ``colossalai.shardformer.layer.qkv_fused_linear.gather_fused_qkv_in_gpt2_style`` (GPT-2's
   and the packed-QKV layers' state dict, and their ``gather_output=True``) moves its operand
   with ``qkv.cuda()`` before the all-gather and back after it, so a GPT-2 or packed-QKV model
   cannot save a checkpoint on CPU.  The module's function is wrapped: a CPU operand enters as
   a tensor whose ``.cuda()`` leaves it where it is (:class:`_StaysOnCpu`, the same storage),
   and the result comes back as a plain tensor; the rest is Colossal-AI's function unchanged.
   Probe: ``.cuda()`` on a CPU tensor raises (the function calls it unconditionally).

Not patched, because a shim would have to reimplement Colossal-AI rather than fill a gap:
``enable_flash_attention`` (and so ``enable_all_optimization``, which turns it on) has no CPU
kernel ("No usable kernel found for FlashAttentionForFloatAndCustomMaskLoader"; BERT's policy
does not use it and runs); ``enable_fused_normalization`` on RMSNorm models needs apex.  And
``colossalai.legacy.launch`` builds ``init_method=f"tcp://[{host}]:{port}"``, and
Python's URL parser rejects an IPv4 address in brackets ("An IPv4 address cannot be in
brackets"), so on one machine pass ``host="::1"``, not ``"127.0.0.1"``.

:func:`apply_cpu_shim` is not applied by ``import semimig``; ``semimig.nn`` applies it, or call it
yourself.
"""
from __future__ import annotations

import functools
import importlib
import logging
import types
from typing import Any, Callable, ContextManager

import torch

logger = logging.getLogger("semimig._compat")


# --------------------------------------------------------------------------------------------
# 1 + 2: CpuAccelerator methods
# --------------------------------------------------------------------------------------------
def _require_cpu(device: Any) -> None:
    if device is not None and torch.device(device).type != "cpu":
        raise ValueError(f"the CPU accelerator has only the CPU device; got device={device!r}")


def _get_rng_state(self, device: Any = None) -> torch.Tensor:
    """State of torch's CPU generator, the accelerator's only generator."""
    _require_cpu(device)
    return torch.get_rng_state()


def _manual_seed(self, seed: int) -> None:
    """Seed torch's CPU generator."""
    torch.manual_seed(seed)


def _stream(self, device: Any = None, priority: int = 0, **kwargs: Any) -> torch.cpu.Stream:
    """torch's CPU stand-in stream."""
    _require_cpu(device)
    return torch.cpu.Stream()


def _current_stream(self, device: Any = None) -> torch.cpu.Stream:
    """torch's CPU stand-in for the current stream."""
    _require_cpu(device)
    return torch.cpu.current_stream()


def _stream_context(self, stream_: torch.cpu.Stream) -> ContextManager:
    """``torch.cpu.stream(stream_)``, a context that selects the stand-in stream."""
    return torch.cpu.stream(stream_)


def _synchronize(self, device: Any = None) -> None:
    """``torch.cpu.synchronize()``: CPU work is already finished when it returns."""
    _require_cpu(device)
    torch.cpu.synchronize()


def _device_count(self) -> int:
    """``torch.cpu.device_count()``: one device, the CPU."""
    return torch.cpu.device_count()


def _probe_stream_context(acc: Any) -> None:
    with acc.stream(torch.cpu.current_stream()):
        pass


# method name -> (probe that raises while the method is broken, replacement)
_ACCELERATOR_FIXES: dict[str, tuple[Callable[[Any], Any], Callable[..., Any]]] = {
    "get_rng_state": (lambda acc: acc.get_rng_state(), _get_rng_state),
    "manual_seed": (lambda acc: acc.manual_seed(0), _manual_seed),
    "Stream": (lambda acc: acc.Stream(), _stream),
    "current_stream": (lambda acc: acc.current_stream(), _current_stream),
    "stream": (_probe_stream_context, _stream_context),
    "synchronize": (lambda acc: acc.synchronize(), _synchronize),
    "device_count": (lambda acc: acc.device_count(), _device_count),
}


def _raises(probe: Callable[[Any], Any], target: Any) -> bool:
    with torch.random.fork_rng(devices=[]):  # a probe must not move the caller's RNG stream
        try:
            probe(target)
        except (TypeError, RuntimeError, NotImplementedError, AssertionError, AttributeError, ValueError):
            return True
    return False


def _patch_cpu_accelerator() -> list[str]:
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator

    accelerator = CpuAccelerator()
    patched = []
    for name, (probe, replacement) in _ACCELERATOR_FIXES.items():
        if _raises(probe, accelerator):
            setattr(CpuAccelerator, name, replacement)
            patched.append(f"CpuAccelerator.{name}")
    return patched


def _zero_sanity_checks(self) -> None:
    """``LowLevelZeroOptimizer._sanity_checks`` without the "device is required" gate.

    Keeps Colossal-AI's parameter-dtype check; refuses ``overlap_communication=True``, whose
    ``Tensor.record_stream`` has no CPU implementation.  Installed only on machines without CUDA.
    """
    if self._overlap_communication:
        raise ValueError(
            "overlap_communication=True needs CUDA streams (Tensor.record_stream has no CPU "
            "implementation); on CPU pass overlap_communication=False to LowLevelZeroPlugin "
            "or HybridParallelPlugin"
        )
    for param_group in self.optim.param_groups:
        for param in param_group["params"]:
            if not getattr(param, "skip_zero_check", False) and param.dtype != self._dtype:
                raise AssertionError(
                    f"Parameters are expected to have the same dtype `{self._dtype}`, but got `{param.dtype}`"
                )


def _patch_zero() -> list[str]:
    from colossalai.zero.low_level.low_level_optim import LowLevelZeroOptimizer

    # the check of an optimizer without parameters fails only on its device gate
    empty = types.SimpleNamespace(
        optim=types.SimpleNamespace(param_groups=[]), _dtype=torch.float32, _overlap_communication=False
    )
    if _raises(LowLevelZeroOptimizer._sanity_checks, empty):
        LowLevelZeroOptimizer._sanity_checks = _zero_sanity_checks
        return ["LowLevelZeroOptimizer._sanity_checks"]
    return []


# --------------------------------------------------------------------------------------------
# 3, 5, 6: Colossal-AI modules that call torch directly see a view of torch
# --------------------------------------------------------------------------------------------
class _ModuleView(types.ModuleType):
    """A module as one Colossal-AI module sees it: ``overrides`` replace names, all else is ``real``'s.

    Bound as the global ``torch`` of chosen Colossal-AI modules, so the fix reaches only them;
    the real ``torch`` (and ``torch.cuda``, ``torch.distributed``) is never modified.
    """

    def __init__(self, real: types.ModuleType, purpose: str, **overrides: Any) -> None:
        super().__init__(real.__name__, purpose)
        self.__dict__["_real"] = real
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_real"], name)


def _cpu_get_rng_state(device: Any = "cuda") -> torch.Tensor:
    return torch.get_rng_state()


def _cpu_set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    torch.set_rng_state(new_state)


def _set_device_unless_cpu(device: Any) -> None:
    """``torch.cuda.set_device`` that leaves a CPU device alone (there is nothing to select)."""
    if isinstance(device, (str, torch.device)) and torch.device(device).type == "cpu":
        return
    torch.cuda.set_device(device)


def _is_hccl_available() -> bool:
    """Whether a backend named ``hccl`` is registered (by ``torch_npu``); torch 2.13 dropped the test."""
    import torch.distributed as dist

    return "hccl" in dist.Backend.backend_list


_TORCH_FOR_LEGACY = _ModuleView(torch, "torch as Colossal-AI's legacy seed modules see it on CPU", cuda=_ModuleView(
    torch.cuda, "the CPU generator plays the CUDA one", is_available=lambda: True,
    get_rng_state=_cpu_get_rng_state, set_rng_state=_cpu_set_rng_state, manual_seed=torch.manual_seed))
_TORCH_FOR_P2P = _ModuleView(torch, "torch as colossalai.pipeline.p2p sees it", distributed=_ModuleView(
    torch.distributed, "with is_hccl_available", is_hccl_available=_is_hccl_available))
_TORCH_FOR_MODELING = _ModuleView(torch, "torch as ShardFormer's forwards see it on CPU", cuda=_ModuleView(
    torch.cuda, "set_device accepts the CPU", set_device=_set_device_unless_cpu))

_LEGACY_RNG_MODULES = (
    "colossalai.legacy.context.random.seed_manager",
    "colossalai.legacy.context.random._helper",
    "colossalai.legacy.context.parallel_context",
)
_MODELING_SET_DEVICE_MODULES = tuple(f"colossalai.shardformer.modeling.{m}" for m in ("gpt2", "gptj", "opt", "t5"))

# (modules, what the view changes, probe that raises on the module's own torch while it is broken, view)
_TORCH_VIEWS: tuple[tuple[tuple[str, ...], str, Callable[[Any], Any], _ModuleView], ...] = (
    (_LEGACY_RNG_MODULES, "cuda", lambda t: t.cuda.get_rng_state(), _TORCH_FOR_LEGACY),
    (("colossalai.pipeline.p2p",), "distributed.is_hccl_available",
     lambda t: t.distributed.is_hccl_available(), _TORCH_FOR_P2P),
    (_MODELING_SET_DEVICE_MODULES, "cuda.set_device", lambda t: t.cuda.set_device(t.device("cpu")),
     _TORCH_FOR_MODELING),
)


class _StaysOnCpu(torch.Tensor):
    """A CPU tensor whose ``.cuda()`` returns itself (Colossal-AI's packed-QKV gather, item 7)."""

    def cuda(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self


def _gather_qkv_on_cpu(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @functools.wraps(original)
    def gather_fused_qkv_in_gpt2_style(qkv: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if qkv.device.type != "cpu":
            return original(qkv, *args, **kwargs)
        return original(qkv.as_subclass(_StaysOnCpu), *args, **kwargs).as_subclass(torch.Tensor)

    gather_fused_qkv_in_gpt2_style.semimig_cpu_shim = True
    return gather_fused_qkv_in_gpt2_style


def _patch_packed_qkv_gather() -> list[str]:
    module = importlib.import_module("colossalai.shardformer.layer.qkv_fused_linear")
    current = module.gather_fused_qkv_in_gpt2_style
    if getattr(current, "semimig_cpu_shim", False) or not _raises(lambda t: t.zeros(1).cuda(), torch):
        return []
    module.gather_fused_qkv_in_gpt2_style = _gather_qkv_on_cpu(current)
    return ["qkv_fused_linear.gather_fused_qkv_in_gpt2_style"]


def _patch_torch_views() -> list[str]:
    patched = []
    for module_names, what, probe, view in _TORCH_VIEWS:
        for module_name in module_names:
            module = importlib.import_module(module_name)
            if module.torch is not view and _raises(probe, module.torch):
                module.torch = view
                patched.append(f"{module_name}.torch.{what}")
    return patched


# --------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------
def apply_cpu_shim() -> list[str]:
    """Fill Colossal-AI's CPU gaps (module docstring, items 1-7) when CUDA is unavailable.

    Idempotent: a second call finds nothing broken and returns ``[]``.  Costs the import of
    ``colossalai.zero``, ``colossalai.legacy.context``, ``colossalai.pipeline.p2p`` and four
    ``colossalai.shardformer.modeling`` modules (well under a second once
    ``colossalai.shardformer`` is loaded).

    Returns:
        What this call patched, e.g. ``["CpuAccelerator.get_rng_state", ...]``; empty when CUDA
        is available or nothing is broken.
    """
    if torch.cuda.is_available():
        logger.debug("CUDA is available; Colossal-AI CPU shim not applied")
        return []
    patched = _patch_cpu_accelerator() + _patch_zero() + _patch_torch_views() + _patch_packed_qkv_gather()
    if patched:
        logger.info("Colossal-AI CPU shim patched: %s", ", ".join(patched))
    return patched
