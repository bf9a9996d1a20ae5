"""Pure-torch twins of the kernels: the test oracle and the CPU path.

Each function has the signature of its Triton launcher (operands already checked, keep set as
a :class:`~semimig.kernels.keep.KeepPlan`) and computes, with ``S = plan.keep``:

    gather_linear_fwd  : y        = x[:, S] @ w[:, S]^T (+ bias)          y  [M, N]
    gather_linear_dgrad: dx[:, S] = dy @ w[:, S],      dx[:, P] = 0        dx [M, K]
    gather_linear_wgrad: dw[:, S] = dy^T @ x[:, S],    dw[:, P] = 0        dw [N, K]
    range_linear_accumulate_: out += x[:, a:a+n] @ w[:, b:b+n]^T           out [M, N]

Unlike the kernels, these materialise ``x[:, S]`` / ``w[:, S]`` with ``index_select`` and
scatter with ``index_copy_``.  With nothing pruned they are exactly the products that
``F.linear`` and its autograd compute (``F.linear``, ``dy @ w`` or for a column-major input
``(w^T @ dy^T)^T``, and ``dy^T @ x``), so a fully kept layer is bit-for-bit the dense layer on
this path.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .keep import KeepPlan

__all__ = ["gather_linear_dgrad", "gather_linear_fwd", "gather_linear_wgrad", "range_linear_accumulate_"]


def gather_linear_fwd(x: Tensor, weight: Tensor, bias: Tensor | None, plan: KeepPlan) -> Tensor:
    """``y = x[:, S] @ w[:, S]^T (+ bias)``; x [M, K], weight [N, K] -> y [M, N]."""
    if plan.dense:
        return F.linear(x, weight, bias)
    if plan.n_kept == 0:
        y = x.new_zeros(x.shape[0], weight.shape[0])
        return y.add_(bias) if bias is not None else y
    keep = plan.keep
    return F.linear(x.index_select(1, keep), weight.index_select(1, keep), bias)


def gather_linear_dgrad(dy: Tensor, weight: Tensor, plan: KeepPlan, *, column_major: bool = False) -> Tensor:
    """``dx[:, S] = dy @ w[:, S]``, zeros on ``P``; dy [M, N], weight [N, K] -> dx [M, K].

    ``column_major`` (dense only): return ``dx`` column-major, computed as ``(w^T @ dy^T)^T``.
    That is what ``F.linear``'s autograd does when its input is column-major (strides
    ``(1, M)``), so the dense path stays bit-for-bit equal to it for transposed inputs.
    """
    if plan.dense:
        return weight.t().mm(dy.t()).t() if column_major else dy.mm(weight)
    dx = dy.new_zeros(dy.shape[0], plan.k)
    if plan.n_kept:
        dx.index_copy_(1, plan.keep.long(), dy.mm(weight.index_select(1, plan.keep)))
    return dx


def gather_linear_wgrad(dy: Tensor, x: Tensor, plan: KeepPlan) -> Tensor:
    """``dw[:, S] = dy^T @ x[:, S]``, zeros on ``P``; dy [M, N], x [M, K] -> dw [N, K]."""
    if plan.dense:
        return dy.t().mm(x)
    dw = dy.new_zeros(dy.shape[1], plan.k)
    if plan.n_kept:
        dw.index_copy_(1, plan.keep.long(), dy.t().mm(x.index_select(1, plan.keep)))
    return dw


def range_linear_accumulate_(
    out: Tensor, x: Tensor, weight: Tensor, x_start: int, w_start: int, width: int
) -> Tensor:
    """``out += x[:, x_start:x_start+width] @ weight[:, w_start:w_start+width]^T`` in place.

    The product is accumulated in fp32 (or in the operands' dtype when that is wider) and
    rounded once when added to ``out``.
    """
    if width == 0:
        return out
    xs = x[:, x_start : x_start + width]
    ws = weight[:, w_start : w_start + width]
    if out.dtype == x.dtype:
        return out.addmm_(xs, ws.t())
    # out is wider than the operands (fp32 buffer for fp16/bf16 inputs): widen exactly first.
    return out.addmm_(xs.to(out.dtype), ws.to(out.dtype).t())
