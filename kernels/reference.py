"""Pure-torch twins of the kernels: the test oracle and the CPU path.

Each function has the signature of its Triton launcher (operands already checked, keep set as
a :class:`~semimig.kernels.keep.KeepPlan`) and computes, with ``S = plan.keep``:

    gather_linear_fwd  : y        = x[:, S] @ w[:, S]^T (+ bias)          y  [M, N]
    gather_linear_dgrad: dx[:, S] = dy @ w[:, S],      dx[:, P] = 0        dx [M, K]
    gather_linear_wgrad: dw[:, S] = dy^T @ x[:, S],    dw[:, P] = 0        dw [N, K]

and the two halves of a paired MLP (the column layer computes only the output rows ``S`` its row
layer keeps; the row layer receives those units compact, ``x_S [M, |S|]``):

    rows_linear_fwd    : y_S      = x @ w[S, :]^T (+ bias[S])             y_S [M, |S|]
    rows_linear_wgrad  : dw[S, :] = dy_S^T @ x,        other rows 0        dw [N, K]
    compact_linear_fwd : y        = x_S @ w[:, S]^T                        y  [M, N]
    compact_linear_wgrad: dw[:, S] = dy^T @ x_S,       dw[:, P] = 0        dw [N, K]

How, cheapest first (the fixed cost ``F`` of a pruned GEMM on a CPU is what these choices set):

- nothing pruned: exactly the products that ``F.linear`` and its autograd compute
  (``F.linear``, ``dy @ w`` or for a column-major input ``(w^T @ dy^T)^T``, and ``dy^T @ x``),
  so a fully kept layer is bit-for-bit the dense layer on this path;
- ``S`` one contiguous run ``[a, b)`` (a prefix when a straggler migrates its tail, a suffix
  when the first columns are pruned): slices, no copy at all; the products are written straight
  into ``dx[:, a:b]`` / ``dw[:, a:b]`` and only the rest is zeroed;
- otherwise ``x[:, S]`` / ``w[:, S]`` are gathered with ``index_select`` and the products are
  scattered into a zero-filled result with ``scatter_(1, S.expand(rows, |S|), products)``;
- a keep set of aligned blocks of ``g`` columns (``plan.group > 1``: priority pruning at block
  granularity) is gathered block by block, ``t.view(M, K/g, g).index_select(1, keep_groups)``,
  which copies runs of ``g`` contiguous values instead of single ones, and scattered by the block
  gather of ``[products | one zero block]`` (each value read and written once, no fill).

The scatters were chosen by measurement (one rank, one thread, ``[1024, 4096]`` and ``[512, 4096]``
results, 40 interleaved repetitions, medians).  Single columns at γ 0.5 /
0.75 / 0.9: ``scatter_`` 1.36 / 1.03 / 0.51 ms against 1.94 / 1.67 / 1.28 for the element gather of
``[products | zero column]`` and 2.57 / 1.49 / 0.75 for ``index_copy_`` into
zeros.  Blocks of 32: the block gather 0.97 / 0.58 / 0.36 ms against 1.69 / 0.87 / 0.45 for a fill
plus a block ``index_copy_``.  Blocks of 8, mixed: on
``[1024, 4096]`` (the paired row layer's weight gradient at the LLM shape) the block gather first
or within 5 % (1.34 / 1.15–1.22 / 1.02 ms; ``scatter_`` 1.37–1.40 / 2.07–2.31 / 1.07–1.32), on
``[512, 4096]`` ``scatter_`` first (0.44–0.64 / 0.27–0.55 / 0.18–0.35 against 0.59–0.65 / 0.51–0.55
/ 0.48–0.49), two runs each; the block gather serves every ``g > 1`` until a rule by shape is
measured (a fill's cost on a large result swings with the allocator's state).  The gathers copy
the same values; a product written into a buffer of another row stride may round differently in
the last bit (BLAS picks its kernel by the output's leading dimension).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .keep import KeepPlan

__all__ = ["compact_linear_fwd", "compact_linear_wgrad", "gather_linear_dgrad", "gather_linear_fwd",
           "gather_linear_wgrad", "rows_linear_fwd", "rows_linear_wgrad"]


def gather_linear_fwd(x: Tensor, weight: Tensor, bias: Tensor | None, plan: KeepPlan) -> Tensor:
    """``y = x[:, S] @ w[:, S]^T (+ bias)``; x [M, K], weight [N, K] -> y [M, N]."""
    if plan.dense:
        return F.linear(x, weight, bias)
    if plan.n_kept == 0:
        y = x.new_zeros(x.shape[0], weight.shape[0])
        return y.add_(bias) if bias is not None else y
    if plan.span is not None:
        a, b = plan.span
        return F.linear(x[:, a:b], weight[:, a:b], bias)
    return F.linear(_kept_columns(x, plan), _kept_columns(weight, plan), bias)


def _scattered(plan: KeepPlan, rows: int, like: Tensor, product) -> Tensor:
    """``out [rows, K]`` with ``out[:, S] = product(S columns)`` and exact zeros on ``P``.

    ``product(out_view)`` writes the ``[rows, |S|]`` product of the kept columns into
    ``out_view`` (a strided view: no temporary for the GEMM's result).
    """
    if plan.span is not None:
        a, b = plan.span
        out = like.new_empty(rows, plan.k)
        product(out[:, a:b])
        out[:, :a].zero_()
        out[:, b:].zero_()
        return out
    g = plan.group
    if g > 1:  # [products of S | one zero block], gathered block by block
        blocks = plan.n_kept // g
        buf = like.new_empty(rows, (blocks + 1) * g)
        product(buf[:, : plan.n_kept])
        buf[:, plan.n_kept:].zero_()
        return buf.view(rows, blocks + 1, g).index_select(1, plan.block_scatter_source).view(rows, plan.k)
    products = like.new_empty(rows, plan.n_kept)  # single columns: scattered into zeros, row by row
    if plan.n_kept:
        product(products)
    return like.new_zeros(rows, plan.k).scatter_(1, plan.keep64.expand(rows, plan.n_kept), products)


def _mm_into(out: Tensor, a: Tensor, b: Tensor) -> None:
    """``out = a @ b`` written in place; through autograd (a copy) when an operand needs a gradient."""
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        out.copy_(a.mm(b))
    else:
        torch.mm(a, b, out=out)


def _kept_columns(t: Tensor, plan: KeepPlan) -> Tensor:
    """``t[:, S]``: a view for a contiguous run, else a gathered copy (block by block for a grouped
    keep set of a contiguous ``t``)."""
    if plan.span is not None:
        a, b = plan.span
        return t[:, a:b]
    g = plan.group
    if g > 1 and t.is_contiguous():
        rows = t.shape[0]
        return t.view(rows, plan.k // g, g).index_select(1, plan.keep_groups).view(rows, plan.n_kept)
    return t.index_select(1, plan.keep)


def gather_linear_dgrad(dy: Tensor, weight: Tensor, plan: KeepPlan, *, column_major: bool = False) -> Tensor:
    """``dx[:, S] = dy @ w[:, S]``, zeros on ``P``; dy [M, N], weight [N, K] -> dx [M, K].

    ``column_major`` (dense only): return ``dx`` column-major, computed as ``(w^T @ dy^T)^T``.
    That is what ``F.linear``'s autograd does when its input is column-major (strides
    ``(1, M)``), so the dense path stays bit-for-bit equal to it for transposed inputs.
    """
    if plan.dense:
        return weight.t().mm(dy.t()).t() if column_major else dy.mm(weight)
    return _scattered(plan, dy.shape[0], dy, lambda out: _mm_into(out, dy, _kept_columns(weight, plan)))


def gather_linear_wgrad(dy: Tensor, x: Tensor, plan: KeepPlan) -> Tensor:
    """``dw[:, S] = dy^T @ x[:, S]``, zeros on ``P``; dy [M, N], x [M, K] -> dw [N, K]."""
    if plan.dense:
        return dy.t().mm(x)
    return _scattered(plan, dy.shape[1], dy, lambda out: _mm_into(out, dy.t(), _kept_columns(x, plan)))


def rows_linear_fwd(x: Tensor, weight: Tensor, bias: Tensor | None, rows: Tensor) -> tuple[Tensor, Tensor]:
    """``y_S = x @ w[S, :]^T (+ bias[S])``: only the output rows ``S`` (int64); x [M, K], weight [N, K]
    -> ``(w[S, :] [|S|, K], y_S [M, |S|])`` (the gathered rows are the backward's ``dx = dy_S @ w[S, :]``)."""
    w_rows = weight.index_select(0, rows)
    return w_rows, F.linear(x, w_rows, None if bias is None else bias.index_select(0, rows))


def rows_linear_wgrad(dy_rows: Tensor, x: Tensor, rows: Tensor, n: int) -> Tensor:
    """``dw[S, :] = dy_S^T @ x``, exact zeros on the other rows; dy_S [M, |S|], x [M, K] -> dw [n, K]."""
    return dy_rows.new_zeros(n, x.shape[1]).index_copy_(0, rows, dy_rows.t().matmul(x))


def compact_linear_fwd(x_kept: Tensor, weight: Tensor, plan: KeepPlan) -> tuple[Tensor, Tensor]:
    """``y = x_S @ w[:, S]^T`` on a compact input x_S [M, |S|], weight [N, K] -> ``(w[:, S], y [M, N])``
    (``w[:, S]`` a view for a contiguous run; the backward's ``dx_S = dy @ w[:, S]``)."""
    w_kept = _kept_columns(weight, plan)
    return w_kept, F.linear(x_kept, w_kept)


def compact_linear_wgrad(dy: Tensor, x_kept: Tensor, plan: KeepPlan) -> Tensor:
    """``dw[:, S] = dy^T @ x_kept``, zeros on ``P``; dy [M, N], x_kept [M, K'] (the kept columns,
    already compact: a paired row layer's input) -> dw [N, K].

    The product is written straight into the scattered result's buffer (no gather of ``x``);
    plain torch on every backend (the scatter is one gather, the GEMM cuBLAS's on a GPU).
    """
    if plan.dense:
        return dy.t().mm(x_kept)
    return _scattered(plan, dy.shape[1], dy, lambda out: _mm_into(out, dy.t(), x_kept))
