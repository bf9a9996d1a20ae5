"""Triton kernels for the three GEMMs of a pruned linear layer, gathering K on the fly.

With ``S`` the kept and ``P`` the pruned reduction columns (a :class:`KeepPlan`):

    _gather_fwd_kernel  : y        = x[:, S] @ w[:, S]^T (+ bias)     tiles [M, N], loop over S
    _gather_dgrad_kernel: dx[:, S] = dy @ w[:, S]                     tiles [M, S], loop over N
                          dx[:, P] = 0                                tiles [M, P], no loop
    _gather_wgrad_kernel: dw[:, S] = dy^T @ x[:, S]                   tiles [N, S], loop over M
                          dw[:, P] = 0                                tiles [N, P], no loop

No ``x[:, S]`` / ``w[:, S]`` copy is made: each K step loads the next ``BLOCK_K`` column indices
and gathers the operand tiles through them.  dgrad and wgrad write every output element
exactly once: one launch runs the GEMM tiles over ``S`` (scattered stores) and, after them,
zero-fill tiles over ``P``.  Operands may have any strides; accumulation is fp32; edges are
masked.  With a g-grouped plan the index tensors hold block numbers (see
:func:`~semimig.kernels.triton_common.gather_columns`).

The launchers take checked operands (2-D, same dtype and device, no empty dimension) and a
plan; :mod:`semimig.kernels.ops` does the checking and the dispatch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .keep import KeepPlan
from .triton_common import device_guard, gather_columns, gemm_configs, input_precision, kept_bucket
from .triton_common import prune_configs, tile_ids

__all__ = ["gather_linear_dgrad", "gather_linear_fwd", "gather_linear_wgrad"]

_KEY = ["M", "N", "K_KEPT_BUCKET", "GROUP"]


@triton.autotune(
    configs=gemm_configs("BLOCK_M", "BLOCK_N", "BLOCK_K"),
    key=_KEY,
    prune_configs_by={"early_config_prune": prune_configs("BLOCK_M", "M")},
)
@triton.jit
def _gather_fwd_kernel(
    # pointers
    x_ptr, w_ptr, bias_ptr, y_ptr, keep_ptr,
    # sizes
    M, N, K_KEPT, K_KEPT_BUCKET,
    # strides
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    # meta-parameters
    HAS_BIAS: tl.constexpr, GROUP: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_ROWS: tl.constexpr,
):
    # -- output tile [BLOCK_M, BLOCK_N] of y
    pid_m, pid_n = tile_ids(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_ROWS)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    m_mask = rm < M
    n_mask = rn < N
    x_rows = x_ptr + rm[:, None] * stride_xm  # [BLOCK_M, 1]
    w_rows = w_ptr + rn[None, :] * stride_wn  # [1, BLOCK_N]

    # -- reduction over the kept columns, gathered through keep
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K_KEPT, BLOCK_K):
        cols, k_mask = gather_columns(keep_ptr, k0 + tl.arange(0, BLOCK_K), K_KEPT, GROUP)
        a = tl.load(x_rows + cols[None, :] * stride_xk, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(w_rows + cols[:, None] * stride_wk, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

    # -- bias and store
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.autotune(
    configs=gemm_configs("BLOCK_M", "BLOCK_K", "BLOCK_N"),
    key=_KEY,
    prune_configs_by={"early_config_prune": prune_configs("BLOCK_M", "M")},
)
@triton.jit
def _gather_dgrad_kernel(
    # pointers
    dy_ptr, w_ptr, dx_ptr, keep_ptr, pruned_ptr,
    # sizes
    M, N, K_KEPT, K_PRUNED, K_KEPT_BUCKET,
    # strides
    stride_dym, stride_dyn, stride_wn, stride_wk, stride_dxm, stride_dxk,
    # meta-parameters
    GROUP: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_ROWS: tl.constexpr,
):
    pid = tl.program_id(0)
    n_m_tiles = tl.cdiv(M, BLOCK_M)
    n_gemm_tiles = n_m_tiles * tl.cdiv(K_KEPT, BLOCK_K)
    if pid < n_gemm_tiles:
        # -- GEMM tile [BLOCK_M, BLOCK_K] of dx[:, S]: reduction over N
        pid_m, pid_k = tile_ids(pid, n_m_tiles, tl.cdiv(K_KEPT, BLOCK_K), GROUP_ROWS)
        rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        cols, k_mask = gather_columns(keep_ptr, pid_k * BLOCK_K + tl.arange(0, BLOCK_K), K_KEPT, GROUP)
        m_mask = rm < M
        dy_rows = dy_ptr + rm[:, None] * stride_dym  # [BLOCK_M, 1]
        w_cols = w_ptr + cols[None, :] * stride_wk  # [1, BLOCK_K]
        acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        for n0 in range(0, N, BLOCK_N):
            rn = (n0 + tl.arange(0, BLOCK_N)).to(tl.int64)
            n_mask = rn < N
            a = tl.load(dy_rows + rn[None, :] * stride_dyn, mask=m_mask[:, None] & n_mask[None, :], other=0.0)
            b = tl.load(w_cols + rn[:, None] * stride_wn, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        tile = acc.to(dx_ptr.dtype.element_ty)
    else:
        # -- zero-fill tile [BLOCK_M, BLOCK_K] of dx[:, P]
        q = pid - n_gemm_tiles
        rm = ((q % n_m_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        cols, k_mask = gather_columns(pruned_ptr, (q // n_m_tiles) * BLOCK_K + tl.arange(0, BLOCK_K), K_PRUNED, GROUP)
        m_mask = rm < M
        tile = tl.zeros((BLOCK_M, BLOCK_K), dtype=dx_ptr.dtype.element_ty)
    # -- scattered store into the columns of dx
    dx_ptrs = dx_ptr + rm[:, None] * stride_dxm + cols[None, :] * stride_dxk
    tl.store(dx_ptrs, tile, mask=m_mask[:, None] & k_mask[None, :])


@triton.autotune(
    configs=gemm_configs("BLOCK_N", "BLOCK_K", "BLOCK_M"),
    key=_KEY,
    prune_configs_by={"early_config_prune": prune_configs("BLOCK_N", "N")},
)
@triton.jit
def _gather_wgrad_kernel(
    # pointers
    dy_ptr, x_ptr, dw_ptr, keep_ptr, pruned_ptr,
    # sizes
    M, N, K_KEPT, K_PRUNED, K_KEPT_BUCKET,
    # strides
    stride_dym, stride_dyn, stride_xm, stride_xk, stride_dwn, stride_dwk,
    # meta-parameters
    GROUP: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_ROWS: tl.constexpr,
):
    pid = tl.program_id(0)
    n_n_tiles = tl.cdiv(N, BLOCK_N)
    n_gemm_tiles = n_n_tiles * tl.cdiv(K_KEPT, BLOCK_K)
    if pid < n_gemm_tiles:
        # -- GEMM tile [BLOCK_N, BLOCK_K] of dw[:, S]: reduction over M
        pid_n, pid_k = tile_ids(pid, n_n_tiles, tl.cdiv(K_KEPT, BLOCK_K), GROUP_ROWS)
        rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        cols, k_mask = gather_columns(keep_ptr, pid_k * BLOCK_K + tl.arange(0, BLOCK_K), K_KEPT, GROUP)
        n_mask = rn < N
        dy_cols = dy_ptr + rn[:, None] * stride_dyn  # [BLOCK_N, 1]: rows of dy^T
        x_cols = x_ptr + cols[None, :] * stride_xk  # [1, BLOCK_K]
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for m0 in range(0, M, BLOCK_M):
            rm = (m0 + tl.arange(0, BLOCK_M)).to(tl.int64)
            m_mask = rm < M
            a = tl.load(dy_cols + rm[None, :] * stride_dym, mask=n_mask[:, None] & m_mask[None, :], other=0.0)
            b = tl.load(x_cols + rm[:, None] * stride_xm, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        tile = acc.to(dw_ptr.dtype.element_ty)
    else:
        # -- zero-fill tile [BLOCK_N, BLOCK_K] of dw[:, P]
        q = pid - n_gemm_tiles
        rn = ((q % n_n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        cols, k_mask = gather_columns(pruned_ptr, (q // n_n_tiles) * BLOCK_K + tl.arange(0, BLOCK_K), K_PRUNED, GROUP)
        n_mask = rn < N
        tile = tl.zeros((BLOCK_N, BLOCK_K), dtype=dw_ptr.dtype.element_ty)
    # -- scattered store into the columns of dw
    dw_ptrs = dw_ptr + rn[:, None] * stride_dwn + cols[None, :] * stride_dwk
    tl.store(dw_ptrs, tile, mask=n_mask[:, None] & k_mask[None, :])


def _indices(plan: KeepPlan) -> tuple[Tensor, Tensor]:
    """The index tensors the kernels read: columns (g = 1) or g-block numbers."""
    if plan.group == 1:
        return plan.keep, plan.pruned
    assert plan.keep_groups is not None and plan.pruned_groups is not None
    return plan.keep_groups, plan.pruned_groups


def gather_linear_fwd(x: Tensor, weight: Tensor, bias: Tensor | None, plan: KeepPlan) -> Tensor:
    """``y = x[:, S] @ w[:, S]^T (+ bias)``; x [M, K], weight [N, K] -> y [M, N] (x's dtype)."""
    m, n = x.shape[0], weight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    keep, _ = _indices(plan)

    def grid(meta: dict) -> tuple[int]:
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    with device_guard(x):
        _gather_fwd_kernel[grid](
            x, weight, bias, y, keep,
            m, n, plan.n_kept, kept_bucket(plan.n_kept),
            x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), y.stride(0), y.stride(1),
            HAS_BIAS=bias is not None, GROUP=plan.group, INPUT_PRECISION=input_precision(x.dtype),
        )  # fmt: skip
    return y


def gather_linear_dgrad(dy: Tensor, weight: Tensor, plan: KeepPlan) -> Tensor:
    """``dx[:, S] = dy @ w[:, S]``, zeros on P; dy [M, N], weight [N, K] -> dx [M, K]."""
    m, n = dy.shape
    dx = torch.empty(m, plan.k, dtype=dy.dtype, device=dy.device)
    keep, pruned = _indices(plan)

    def grid(meta: dict) -> tuple[int]:
        tiles_k = triton.cdiv(plan.n_kept, meta["BLOCK_K"]) + triton.cdiv(plan.n_pruned, meta["BLOCK_K"])
        return (triton.cdiv(m, meta["BLOCK_M"]) * tiles_k,)

    with device_guard(dy):
        _gather_dgrad_kernel[grid](
            dy, weight, dx, keep, pruned,
            m, n, plan.n_kept, plan.n_pruned, kept_bucket(plan.n_kept),
            dy.stride(0), dy.stride(1), weight.stride(0), weight.stride(1), dx.stride(0), dx.stride(1),
            GROUP=plan.group, INPUT_PRECISION=input_precision(dy.dtype),
        )  # fmt: skip
    return dx


def gather_linear_wgrad(dy: Tensor, x: Tensor, plan: KeepPlan) -> Tensor:
    """``dw[:, S] = dy^T @ x[:, S]``, zeros on P; dy [M, N], x [M, K] -> dw [N, K]."""
    m, n = dy.shape
    dw = torch.empty(n, plan.k, dtype=dy.dtype, device=dy.device)
    keep, pruned = _indices(plan)

    def grid(meta: dict) -> tuple[int]:
        tiles_k = triton.cdiv(plan.n_kept, meta["BLOCK_K"]) + triton.cdiv(plan.n_pruned, meta["BLOCK_K"])
        return (triton.cdiv(n, meta["BLOCK_N"]) * tiles_k,)

    with device_guard(dy):
        _gather_wgrad_kernel[grid](
            dy, x, dw, keep, pruned,
            m, n, plan.n_kept, plan.n_pruned, kept_bucket(plan.n_kept),
            dy.stride(0), dy.stride(1), x.stride(0), x.stride(1), dw.stride(0), dw.stride(1),
            GROUP=plan.group, INPUT_PRECISION=input_precision(dy.dtype),
        )  # fmt: skip
    return dw
