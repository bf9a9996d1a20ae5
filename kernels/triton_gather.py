"""Triton kernels for the three GEMMs of a pruned linear layer, gathering K on the fly.

With ``S`` the kept and ``P`` the pruned reduction columns (a :class:`KeepPlan`):

    _gather_fwd_kernel    : y        = x[:, S] @ w[:, S]^T (+ bias)   tiles [M, N], loop over S
    _scatter_grad_kernel  : out[:, S] = a @ b[:, S]                   tiles [R, S], loop over RED
                            out[:, P] = 0                             tiles [R, P], no loop
        dgrad: out = dx [M, K], a = dy [M, N],     b = w [N, K]   (R = M, RED = N)
        wgrad: out = dw [N, K], a = dy^T [N, M],   b = x [M, K]   (R = N, RED = M)

dgrad and wgrad are one kernel: the same product with the operands' strides swapped (``dy^T``
is ``dy`` read with its strides exchanged, no copy).  Autotuning keys on which gradient it is
(``PASS``), since the best tile differs with the access pattern even for equal sizes.

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
from .triton_common import prune_configs, tile_ids, token_bucket

__all__ = ["FWD_KEY", "GRAD_KEY", "gather_linear_dgrad", "gather_linear_fwd", "gather_linear_wgrad", "tune_key"]

FWD_KEY = ["M_BUCKET", "N", "K_KEPT_BUCKET", "GROUP"]
"""The forward kernel's autotune key: the token count and ``|S|`` bucketed (:mod:`.triton_common`)."""
GRAD_KEY = ["R_BUCKET", "RED_BUCKET", "K_KEPT_BUCKET", "GROUP", "PASS"]
"""The gradient kernel's: its rows (``M`` for dgrad) and reduction (``M`` for wgrad) bucketed."""


@triton.autotune(
    configs=gemm_configs("BLOCK_M", "BLOCK_N", "BLOCK_K"),
    key=FWD_KEY,
    prune_configs_by={"early_config_prune": prune_configs("BLOCK_M", "M_BUCKET")},
)
@triton.jit
def _gather_fwd_kernel(
    # pointers
    x_ptr, w_ptr, bias_ptr, y_ptr, keep_ptr,
    # sizes
    M, N, K_KEPT, K_KEPT_BUCKET, M_BUCKET,
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
    configs=gemm_configs("BLOCK_R", "BLOCK_K", "BLOCK_RED"),
    key=GRAD_KEY,
    prune_configs_by={"early_config_prune": prune_configs("BLOCK_R", "R_BUCKET")},
)
@triton.jit
def _scatter_grad_kernel(
    # pointers
    a_ptr, b_ptr, out_ptr, keep_ptr, pruned_ptr,
    # sizes (R output rows, RED reduction length, PASS 0 = dgrad / 1 = wgrad: autotune key only)
    R, RED, K_KEPT, K_PRUNED, K_KEPT_BUCKET, R_BUCKET, RED_BUCKET, PASS,
    # strides
    stride_ar, stride_ared, stride_bred, stride_bk, stride_outr, stride_outk,
    # meta-parameters
    GROUP: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_RED: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_ROWS: tl.constexpr,
):
    pid = tl.program_id(0)
    n_r_tiles = tl.cdiv(R, BLOCK_R)
    n_gemm_tiles = n_r_tiles * tl.cdiv(K_KEPT, BLOCK_K)
    if pid < n_gemm_tiles:
        # -- GEMM tile [BLOCK_R, BLOCK_K] of out[:, S]: reduction over RED
        pid_r, pid_k = tile_ids(pid, n_r_tiles, tl.cdiv(K_KEPT, BLOCK_K), GROUP_ROWS)
        rr = (pid_r * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
        cols, k_mask = gather_columns(keep_ptr, pid_k * BLOCK_K + tl.arange(0, BLOCK_K), K_KEPT, GROUP)
        r_mask = rr < R
        a_rows = a_ptr + rr[:, None] * stride_ar  # [BLOCK_R, 1]
        b_cols = b_ptr + cols[None, :] * stride_bk  # [1, BLOCK_K]
        acc = tl.zeros((BLOCK_R, BLOCK_K), dtype=tl.float32)
        for red0 in range(0, RED, BLOCK_RED):
            rred = (red0 + tl.arange(0, BLOCK_RED)).to(tl.int64)
            red_mask = rred < RED
            a = tl.load(a_rows + rred[None, :] * stride_ared, mask=r_mask[:, None] & red_mask[None, :], other=0.0)
            b = tl.load(b_cols + rred[:, None] * stride_bred, mask=red_mask[:, None] & k_mask[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        tile = acc.to(out_ptr.dtype.element_ty)
    else:
        # -- zero-fill tile [BLOCK_R, BLOCK_K] of out[:, P]
        q = pid - n_gemm_tiles
        rr = ((q % n_r_tiles) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
        cols, k_mask = gather_columns(pruned_ptr, (q // n_r_tiles) * BLOCK_K + tl.arange(0, BLOCK_K), K_PRUNED, GROUP)
        r_mask = rr < R
        tile = tl.zeros((BLOCK_R, BLOCK_K), dtype=out_ptr.dtype.element_ty)
    # -- scattered store into the columns of out
    out_ptrs = out_ptr + rr[:, None] * stride_outr + cols[None, :] * stride_outk
    tl.store(out_ptrs, tile, mask=r_mask[:, None] & k_mask[None, :])


def tune_key(kernel: str, m: int, n: int, k: int, n_kept: int, group: int = 1) -> tuple:
    """The autotune key (without dtypes) of ``kernel`` (``"fwd"``, ``"dgrad"`` or ``"wgrad"``) for
    ``x [M, K]``, ``w [N, K]`` and ``n_kept`` kept columns: what selects a tuned config."""
    bucket = kept_bucket(n_kept)
    if kernel == "fwd":
        return token_bucket(m), n, bucket, group
    if kernel == "dgrad":
        return token_bucket(m), token_bucket(n), bucket, group, 0
    if kernel == "wgrad":
        return token_bucket(n), token_bucket(m), bucket, group, 1
    raise ValueError(f"kernel must be 'fwd', 'dgrad' or 'wgrad', got {kernel!r}")


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
            m, n, plan.n_kept, kept_bucket(plan.n_kept), token_bucket(m),
            x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), y.stride(0), y.stride(1),
            HAS_BIAS=bias is not None, GROUP=plan.group, INPUT_PRECISION=input_precision(x.dtype),
        )  # fmt: skip
    return y


def _scatter_grad(a: Tensor, b: Tensor, plan: KeepPlan, pass_id: int) -> Tensor:
    """``out [R, K]``: ``out[:, S] = a @ b[:, S]``, zeros on P; a [R, RED], b [RED, K] (any strides)."""
    r, red = a.shape
    out = torch.empty(r, plan.k, dtype=a.dtype, device=a.device)
    keep, pruned = _indices(plan)

    def grid(meta: dict) -> tuple[int]:
        tiles_k = triton.cdiv(plan.n_kept, meta["BLOCK_K"]) + triton.cdiv(plan.n_pruned, meta["BLOCK_K"])
        return (triton.cdiv(r, meta["BLOCK_R"]) * tiles_k,)

    with device_guard(a):
        _scatter_grad_kernel[grid](
            a, b, out, keep, pruned,
            r, red, plan.n_kept, plan.n_pruned, kept_bucket(plan.n_kept), token_bucket(r), token_bucket(red), pass_id,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
            GROUP=plan.group, INPUT_PRECISION=input_precision(a.dtype),
        )  # fmt: skip
    return out


def gather_linear_dgrad(dy: Tensor, weight: Tensor, plan: KeepPlan) -> Tensor:
    """``dx[:, S] = dy @ w[:, S]``, zeros on P; dy [M, N], weight [N, K] -> dx [M, K]."""
    return _scatter_grad(dy, weight, plan, 0)


def gather_linear_wgrad(dy: Tensor, x: Tensor, plan: KeepPlan) -> Tensor:
    """``dw[:, S] = dy^T @ x[:, S]``, zeros on P; dy [M, N], x [M, K] -> dw [N, K]."""
    return _scatter_grad(dy.t(), x, plan, 1)
