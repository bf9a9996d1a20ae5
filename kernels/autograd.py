"""``pruned_linear``: the autograd-enabled pruned linear layer (DESIGN.md §1).

Only the full ``x``, ``w`` and the keep plan are saved for backward (as a plain linear would
save ``x`` and ``w``); the kernels gather on the fly.

Imputation ``"same"``: the previous gradient is kept by this module, one detached copy per
weight tensor, in a weak dictionary keyed by the weight (released with the weight, or by
:func:`clear_imputation_state`).  "Previous" means the previous backward through
``pruned_linear`` with that weight and ``impute="same"``; with gradient accumulation that is the
previous micro-batch.  The first backward imputes zeros.  Cost: one gradient-sized copy per
weight, as the paper states.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils.weak import WeakTensorKeyDictionary

from semimig.errors import ConfigError

from . import ops
from .backend import resolve_backend
from .impute import ImputePolicy, check_policy, impute_
from .keep import KeepPlan, plan_keep

__all__ = ["clear_imputation_state", "pruned_linear"]

_previous_grad: WeakTensorKeyDictionary = WeakTensorKeyDictionary()  # weight -> dw [N, K]


def clear_imputation_state(weight: Tensor | None = None) -> None:
    """Forget the previous gradient kept for ``"same"`` imputation (of ``weight``, or of all)."""
    if weight is None:
        _previous_grad.clear()
    else:
        _previous_grad.pop(weight, None)


class _PrunedLinearFunction(torch.autograd.Function):
    """Pruned linear on 2-D operands, ``S`` = kept and ``P`` = pruned columns of K.

        forward : y        = x[:, S] @ w[:, S]^T (+ b)
        backward: dx[:, S] = dy @ w[:, S]          dx[:, P] = 0
                  dw[:, S] = dy^T @ x[:, S]        dw[:, P] = impute (zero / same / average)
                  db       = sum_m dy[m, :]
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: Tensor,  # [M, K]
        weight: Tensor,  # [N, K]
        bias: Tensor | None,  # [N]
        plan: KeepPlan,
        impute: str,
        backend: str,
    ) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.plan, ctx.impute, ctx.backend = plan, impute, backend
        ctx.weight_key = weight if impute == "same" else None
        return ops.fwd(backend, x, weight, bias, plan)

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        plan: KeepPlan = ctx.plan
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            # torch's own test for a column-major mat1 in addmm's backward (bit-for-bit dense path)
            column_major = x.stride(0) == 1 and x.stride(1) == x.shape[0]
            dx = ops.dgrad(ctx.backend, dy, weight, plan, column_major=column_major)
        if ctx.needs_input_grad[1]:
            dw = ops.wgrad(ctx.backend, dy, x, plan)
            if ctx.impute == "same":
                impute_(dw, plan, "same", _previous_grad.get(ctx.weight_key))
                _previous_grad[ctx.weight_key] = dw.detach().clone()
            else:
                impute_(dw, plan, ctx.impute)
        if ctx.needs_input_grad[2]:
            db = dy.sum(0)
        return dx, dw, db, None, None, None


def pruned_linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    keep: Tensor | KeepPlan | None,
    *,
    impute: ImputePolicy = "zero",
    group: int | None = None,
) -> Tensor:
    """``y = x[..., S] @ w[:, S]^T (+ bias)`` with the pruned backward of DESIGN.md §1.

    Args:
        x: ``[..., K]`` input; leading dimensions are flattened to ``M`` and restored.
        weight: ``[N, K]``.
        bias: ``[N]`` or None; its gradient is the full ``sum(dy)``.
        keep: sorted unique kept column indices (int32/int64), a KeepPlan, or None (dense).
        impute: fill of the pruned weight-gradient columns, ``"zero"``, ``"same"`` or ``"average"``.
        group: keep-set granularity, None to detect (see :mod:`semimig.kernels.keep`).

    Returns ``[..., N]``.  The backend is resolved once here and reused in backward.
    """
    check_policy(impute)
    if not isinstance(x, Tensor) or x.dim() < 1:
        raise ConfigError(f"x must be a tensor with at least one dimension, got {getattr(x, 'shape', x)}")
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        raise ConfigError(f"weight must be a 2-D tensor [N, K], got {getattr(weight, 'shape', weight)}")
    k = weight.shape[1]
    if x.shape[-1] != k:
        raise ConfigError(f"mismatched K: x has {x.shape[-1]} features but weight has {k} columns")
    x2d = x.reshape(-1, k)  # [M, K]
    ops.check_linear_operands(x2d, weight, bias)
    plan = plan_keep(keep, k, weight.device, group=group)
    backend = resolve_backend(x.device, x.dtype)
    y = _PrunedLinearFunction.apply(x2d, weight, bias, plan, impute, backend)
    return y.reshape(*x.shape[:-1], weight.shape[0])
