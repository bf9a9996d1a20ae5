"""Shared pieces of the Triton kernels: autotune configurations and two ``@triton.jit`` helpers.

Tile names follow the problem dimensions in every kernel (``BLOCK_M`` tokens, ``BLOCK_N``
output features, ``BLOCK_K`` reduction columns of the layer); ``BLOCK_K`` is always the
gathered dimension, so it is at least 32 and a multiple of every group size.

Autotuning.  :func:`gemm_configs` gives candidate tiles for Hopper (H100/H200: 228 KB shared
memory, 4-5 stages of cp.async pipelining; gathered operands cannot use TMA).  Kernels tune on
``(M_BUCKET, N, K_KEPT_BUCKET, GROUP)`` plus the operand dtypes: :func:`kept_bucket` rounds ``|S|`` up
to a multiple of 512 (a power of two below 512) so that a pruning ratio that moves each iteration
does not re-tune each iteration, and :func:`token_bucket` rounds the token count ``M`` up to a
power of two (a multiple of 4096 above 4096) so that a new sequence length or last batch does not
re-tune either.  Configs are pruned on the buckets too, so every ``M`` of a bucket sees the same
candidates and shares one tuned config.  Under ``TRITON_INTERPRET=1`` a single tiny configuration is
used so the interpreted tests stay fast and no benchmarking happens.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import triton
import triton.language as tl

from .backend import triton_interpreting

__all__ = ["device_guard", "gemm_configs", "input_precision", "kept_bucket", "prune_configs", "token_bucket"]

# (output rows, output cols, reduction, num_warps, num_stages); the roles of M/N/K per kernel
# are given to gemm_configs.  Large tiles for the big LLM/ViT GEMMs, smaller ones for small M.
_HOPPER_TILES: tuple[tuple[int, int, int, int, int], ...] = (
    (128, 256, 64, 8, 3),
    (256, 128, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 32, 4, 4),
    (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (64, 64, 64, 4, 5),
    (32, 64, 64, 4, 5),
    (16, 64, 128, 4, 4),
)
_INTERPRETER_TILE = (16, 16, 16, 4, 1)  # BLOCK_K raised to 32 below


def gemm_configs(rows: str, cols: str, red: str) -> list[triton.Config]:
    """Candidate configs; ``rows``/``cols`` name the output tile blocks, ``red`` the reduction block.

    Whichever of the three is ``"BLOCK_K"`` is the gathered dimension; it gets the output
    column or reduction size of the tile, always >= 32.
    """
    tiles = (_INTERPRETER_TILE,) if triton_interpreting() else _HOPPER_TILES
    configs = []
    for r, c, k, warps, stages in tiles:
        meta = {rows: r, cols: c, red: k, "GROUP_ROWS": 8}
        if meta["BLOCK_K"] < 32:
            if not triton_interpreting():
                continue
            meta["BLOCK_K"] = 32
        configs.append(triton.Config(meta, num_warps=warps, num_stages=stages))
    return configs


def prune_configs(rows: str, n_rows: str) -> object:
    """An ``early_config_prune`` hook dropping tiles far larger than the problem.

    Keeps configs whose row block is <= max(16, next_pow2(n_rows)) and whose ``BLOCK_K`` is
    <= max(32, next_pow2(K_KEPT)); always keeps at least the smallest config.
    """

    def prune(configs: list[triton.Config], named_args: dict, **kwargs: object) -> list[triton.Config]:
        row_cap = max(16, triton.next_power_of_2(int(named_args[n_rows])))
        k_cap = max(32, triton.next_power_of_2(int(named_args["K_KEPT"])))
        kept = [c for c in configs if c.kwargs[rows] <= row_cap and c.kwargs["BLOCK_K"] <= k_cap]
        smallest = min(configs, key=lambda c: c.kwargs[rows] * c.kwargs["BLOCK_K"])
        return kept or [smallest]

    return prune


def kept_bucket(n_kept: int) -> int:
    """Autotune key for ``|S|``: next power of two below 512, else next multiple of 512."""
    if n_kept <= 512:
        return triton.next_power_of_2(max(n_kept, 1))
    return -(-n_kept // 512) * 512


def token_bucket(m: int) -> int:
    """Autotune key for a token count ``M``: next power of two up to 4096, else next multiple of 4096."""
    if m <= 4096:
        return triton.next_power_of_2(max(m, 1))
    return -(-m // 4096) * 4096


def input_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` precision for fp32 operands: TF32 only where torch would use it for matmul."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


@contextlib.contextmanager
def device_guard(t: torch.Tensor) -> Iterator[None]:
    """Launch on ``t``'s CUDA device (Triton launches on the current device)."""
    if t.device.type == "cuda":
        with torch.cuda.device(t.device):
            yield
    else:
        yield


@triton.jit
def tile_ids(pid, n_row_tiles, n_col_tiles, GROUP_ROWS: tl.constexpr):
    """Grouped tile ordering (Triton tutorial 03): ``GROUP_ROWS`` row tiles share column tiles in L2."""
    width = GROUP_ROWS * n_col_tiles
    first_row = (pid // width) * GROUP_ROWS
    rows_in_group = tl.minimum(n_row_tiles - first_row, GROUP_ROWS)
    pid_row = first_row + (pid % width) % rows_in_group
    pid_col = (pid % width) // rows_in_group
    return pid_row, pid_col


@triton.jit
def gather_columns(idx_ptr, offs, n, GROUP: tl.constexpr):
    """Column numbers at positions ``offs`` of an index set of ``n`` columns, and the valid mask.

    ``GROUP == 1``: ``idx_ptr`` holds the columns.  ``GROUP == g``: it holds ``n / g`` block
    indices ``b`` and position ``p`` maps to column ``b[p // g]·g + p % g``; the hints tell the
    compiler the columns come in g-aligned contiguous runs (``offs`` starts at a multiple of
    ``BLOCK_K``, itself a multiple of g), which enables vectorised loads and stores.
    """
    if GROUP == 1:
        mask = offs < n
        cols = tl.load(idx_ptr + offs, mask=mask, other=0).to(tl.int64)
    else:
        block = offs // GROUP
        mask = block < n // GROUP
        cols = tl.load(idx_ptr + block, mask=mask, other=0).to(tl.int64) * GROUP + offs % GROUP
        cols = tl.max_contiguous(tl.multiple_of(cols, GROUP), GROUP)
    return cols, mask
