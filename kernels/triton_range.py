"""Triton kernel for the column-range GEMM that migration accumulates into a partial output.

    _range_accumulate_kernel: out[M, N] += x[:, a:a+n] @ w[:, b:b+n]^T

A receiving rank computes the contribution of a contiguous range of a straggler's K columns
(``w`` may be the received weight slice, ``b`` an offset inside it) and adds it to an output
buffer it already holds (its own partial ``Y`` before the all-reduce).  The column ranges are
passed as strided views, so nothing is copied; the tile of ``out`` is read once, the fp32 sum
added and the result rounded once to ``out``'s dtype.
"""
from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from .triton_common import device_guard, gemm_configs, input_precision, kept_bucket, prune_configs, tile_ids

__all__ = ["range_linear_accumulate_"]


@triton.autotune(
    configs=gemm_configs("BLOCK_M", "BLOCK_N", "BLOCK_K"),
    key=["M", "N", "K_KEPT_BUCKET"],
    prune_configs_by={"early_config_prune": prune_configs("BLOCK_M", "M")},
    restore_value=["out_ptr"],  # autotuning runs the kernel several times; it must add once
)
@triton.jit
def _range_accumulate_kernel(
    # pointers
    out_ptr, x_ptr, w_ptr,
    # sizes (K_KEPT = width of the column range)
    M, N, K_KEPT, K_KEPT_BUCKET,
    # strides
    stride_om, stride_on, stride_xm, stride_xk, stride_wn, stride_wk,
    # meta-parameters
    INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_ROWS: tl.constexpr,
):
    # -- output tile [BLOCK_M, BLOCK_N]
    pid_m, pid_n = tile_ids(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_ROWS)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    m_mask = rm < M
    n_mask = rn < N
    x_rows = x_ptr + rm[:, None] * stride_xm
    w_rows = w_ptr + rn[None, :] * stride_wn

    # -- reduction over the contiguous column range
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K_KEPT, BLOCK_K):
        rk = (k0 + tl.arange(0, BLOCK_K)).to(tl.int64)
        k_mask = rk < K_KEPT
        a = tl.load(x_rows + rk[None, :] * stride_xk, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(w_rows + rk[:, None] * stride_wk, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

    # -- read-add-write of the output tile
    out_ptrs = out_ptr + rm[:, None] * stride_om + rn[None, :] * stride_on
    mask = m_mask[:, None] & n_mask[None, :]
    acc += tl.load(out_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def range_linear_accumulate_(
    out: Tensor, x: Tensor, weight: Tensor, x_start: int, w_start: int, width: int
) -> Tensor:
    """``out += x[:, x_start:x_start+width] @ weight[:, w_start:w_start+width]^T`` in place.

    out [M, N] (operand dtype or fp32), x [M, Kx], weight [N, Kw]; the ranges are in bounds.
    """
    xs = x[:, x_start : x_start + width]  # [M, width] view
    ws = weight[:, w_start : w_start + width]  # [N, width] view
    m, n = out.shape

    def grid(meta: dict) -> tuple[int]:
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    with device_guard(out):
        _range_accumulate_kernel[grid](
            out, xs, ws,
            m, n, width, kept_bucket(width),
            out.stride(0), out.stride(1), xs.stride(0), xs.stride(1), ws.stride(0), ws.stride(1),
            INPUT_PRECISION=input_precision(x.dtype),
        )  # fmt: skip
    return out
