"""The vocabulary's collectives on the step clock: Colossal-AI's embedding, head and loss, timed as communication.

Colossal-AI's vocabulary-parallel embedding, output head and cross-entropy communicate outside semimig's
layers: the embedding all-reduces its output, the head all-reduces its input gradient in backward, and the
loss all-reduces three times (the row maximum, the sum of exponentials, the target logits).  A rank that
reaches one of them before a slower one waits inside it, for the slower rank's final norm, head and loss.
Untimed, that wait reads as the faster rank's own compute (``compute = wall − comm``, :mod:`semimig.straggler.clock`),
so the step model reads a fast rank as slower than it is and the ranks as closer than they are.

:func:`install` puts those collectives in the comm region registered with
:func:`semimig.comm.primitives.time_collectives` (none registered: nothing is timed), on the device's own
time as every semimig collective, with nothing in :mod:`torch.distributed` wrapped:

- the embedding and the head get timed subclasses, their class set in place (as
  :mod:`torch.nn.utils.parametrize` does; :func:`uninstall` sets it back).  The embedding runs Colossal-AI's
  code with its all-reduce in the region.  The head's forward is Colossal-AI's matmul (no collective without
  ``gather_output``; with it, the all-gather is in the region); its backward is Colossal-AI's
  ``LinearWithAsyncCommunication`` — the input gradient's all-reduce started before the weight gradient's
  GEMM and waited for after it — with the wait in the region.  Same operations in the same order: outputs
  and gradients are bit-equal to Colossal-AI's;
- the loss has no module of its own: it runs inside the model's forward, after the head.  The span from the
  head's output to the model's return is the region: the loss's collectives and its own arithmetic (a few
  operations per logit, against the ``2·h`` of the head's GEMM per logit), which is counted with them.

A head whose options take another code path (fp8 communication, zero-bubble pipelines, sequence
parallelism that splits the sequence over the TP group) keeps Colossal-AI's class; :func:`install` says
so and its waits stay in the compute.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from semimig.comm import primitives as P

__all__ = ["install", "uninstall"]

logger = logging.getLogger(__name__)

_ATTR = "_semimig_vocab_clock"


def _cai():
    from colossalai.shardformer import layer as cai

    return cai


class _HeadLinear(torch.autograd.Function):
    """Colossal-AI's ``LinearWithAsyncCommunication`` (``async_grad_allreduce=True``, no fp8, no zero-bubble),
    the input gradient's all-reduce waited for in the comm region."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.save_for_backward(x, weight, bias)
        ctx.use_bias, ctx.group = bias is not None, group
        return F.linear(x, weight, bias) if bias is not None else F.linear(x, weight)

    @staticmethod
    def backward(ctx, dy):
        from semimig import _compat

        x, weight, bias = ctx.saved_tensors
        if ctx.use_bias:
            bias.view(bias.shape)  # as Colossal-AI: a view Gemini's __torch_function__ hooks into
        total = x.contiguous()
        dx = dy.matmul(weight)
        dy = dy.contiguous()
        if dy.dim() > 2:
            dy, total = dy.view(-1, dy.shape[-1]), total.view(-1, total.shape[-1])
        handle = P.all_reduce_start(dx, ctx.group)
        dw = None
        if _compat.private_operation("_grad_accum_fusion_available") and weight.grad is not None and \
                weight.grad.dtype in (torch.float32, torch.float16):  # Colossal-AI's fused accumulation (CUDA, apex)
            import fused_weight_gradient_mlp_cuda as fused

            kernel = fused.wgrad_gemm_accum_fp32 if weight.grad.dtype == torch.float32 else fused.wgrad_gemm_accum_fp16
            kernel(total, dy, weight.grad)
        else:
            dw = dy.t().matmul(total)
        db = dy.sum(dim=0) if ctx.use_bias else None
        P.wait(handle)
        return dx, dw, db, None


@functools.cache
def _head_class() -> type:
    cai = _cai()

    class TimedVocabParallelLMHead1D(cai.VocabParallelLMHead1D):
        """Colossal-AI's ``VocabParallelLMHead1D`` with its collectives in the comm region (module docstring)."""

        def forward(self, input_):
            from semimig._compat import gather_forward_split_backward

            if input_.shape[-1] != self.weight.shape[-1]:
                raise ValueError(f"the head's input has {input_.shape[-1]} features, its weight "
                                 f"{self.weight.shape[-1]} (input {tuple(input_.shape)}, weight {tuple(self.weight.shape)})")
            bias = self.bias if not self.skip_bias_add else None
            output = _HeadLinear.apply(input_, self.weight, bias, self.process_group)
            if self.gather_output:
                with P.comm_region():
                    output = gather_forward_split_backward(output, dim=-1, process_group=self.process_group)
                output = output[..., : self.old_num_embeddings]
            else:
                output = output[..., : self.num_valid_embeddings_local]
            _open_loss(self)
            return (output, self.bias) if self.skip_bias_add else output

    return TimedVocabParallelLMHead1D


@functools.cache
def _embedding_class() -> type:
    cai = _cai()

    class TimedVocabParallelEmbedding1D(cai.VocabParallelEmbedding1D):
        """Colossal-AI's ``VocabParallelEmbedding1D`` with its all-reduce in the comm region (module docstring)."""

        def forward(self, input_):
            from semimig._compat import reduce_forward

            mask = (input_ < self.vocab_start_index) | (input_ >= self.vocab_end_index)
            masked = input_.clone() - self.vocab_start_index
            masked[mask] = 0
            part = F.embedding(masked, self.weight, self.padding_idx, *self.embed_args, **self.embed_kwargs)
            out = part.clone()
            out[mask, :] = 0.0
            with P.comm_region():
                return reduce_forward(out, self.process_group, fp8_communication=self.fp8_communication)

    return TimedVocabParallelEmbedding1D


# ----------------------------------------------------------------------------- the loss's span
class _State:
    def __init__(self) -> None:
        self.loss: Optional[contextlib.ExitStack] = None
        self.swapped: List[tuple] = []
        self.handles: List[Any] = []

    def close_loss(self) -> None:
        if self.loss is not None:
            stack, self.loss = self.loss, None
            stack.close()


def _open_loss(head: nn.Module) -> None:
    """The head's output is out: the loss's span starts (closed when the model returns)."""
    state = getattr(head, _ATTR, None)
    if state is None:
        return
    state.close_loss()
    stack = contextlib.ExitStack()
    stack.enter_context(P.comm_region())
    state.loss = stack


def _why_untimed(head: nn.Module) -> Optional[str]:
    from colossalai.shardformer.layer.utils import is_share_sp_tp

    if getattr(head, "fp8_communication", False):
        return "fp8 communication"
    if getattr(head, "use_zbv", False):
        return "a zero-bubble pipeline"
    if is_share_sp_tp(getattr(head, "seq_parallel_mode", None)):
        return f"sequence parallelism {head.seq_parallel_mode!r}"
    return None


def install(model: nn.Module) -> None:
    """Time ``model``'s vocabulary collectives (module docstring); a model without them is left as it is."""
    if getattr(model, _ATTR, None) is not None:
        return
    cai = _cai()
    state = _State()
    for module in model.modules():
        if type(module) is cai.VocabParallelEmbedding1D:
            state.swapped.append((module, type(module)))
            module.__class__ = _embedding_class()
        elif type(module) is cai.VocabParallelLMHead1D:
            why = _why_untimed(module)
            if why is not None:
                logger.info("semimig: the head's collectives are not timed (%s): a wait in them reads as compute", why)
                continue
            state.swapped.append((module, type(module)))
            module.__class__ = _head_class()
            setattr(module, _ATTR, state)
    if not state.swapped:
        return
    state.handles.append(model.register_forward_pre_hook(lambda *_: state.close_loss()))
    state.handles.append(model.register_forward_hook(lambda *_: state.close_loss()))
    setattr(model, _ATTR, state)


def uninstall(model: nn.Module) -> None:
    """Colossal-AI's classes back, the hooks removed."""
    state = getattr(model, _ATTR, None)
    if state is None:
        return
    state.close_loss()
    for handle in state.handles:
        handle.remove()
    for module, cls in state.swapped:
        module.__class__ = cls
        if module.__dict__.get(_ATTR) is state:
            delattr(module, _ATTR)
    delattr(model, _ATTR)
