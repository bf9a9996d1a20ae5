"""Compile and tune the fused kernels for a model's shapes before any timed step.

Triton compiles a kernel and benchmarks its autotune candidates at the first call with a new
key (:data:`~semimig.kernels.triton_gather.FWD_KEY`, ``GRAD_KEY``).  Left to the training loop,
that first pruned GEMM would take seconds, and the controller would read the time as the rank's
own slowness.  :func:`tune_kernels` makes those first calls beforehand on the layers' shapes at
the given kept shares, on operands drawn on the device.  Where the layers would not run the
Triton kernels (no CUDA, no ``triton``, the torch backend chosen) it does nothing.
"""
from __future__ import annotations

import logging
import time
from typing import Iterable, Sequence

import torch

from .backend import resolve_backend
from .keep import plan_keep

__all__ = ["tune_kernels"]

logger = logging.getLogger(__name__)


def tune_kernels(shapes: Iterable[tuple[int, int, int]], *, dtype: torch.dtype, device: torch.device | str,
                 shares: Sequence[float] = (0.25, 0.5)) -> int:
    """Run the three fused kernels once per distinct tuning key of ``shapes`` (``(M, N, K)``: tokens,
    output features, reduction columns) at each pruned ``share`` of K; returns the launches made
    (0 where the layers use the torch path)."""
    device = torch.device(device)
    backend = resolve_backend(device, dtype)
    if backend not in ("triton", "measured"):
        return 0
    for share in shares:
        if not 0.0 <= share < 1.0:
            raise ValueError(f"tune_kernels: a pruned share must be in [0, 1), got {share!r}")
    from . import ops
    from .triton_gather import tune_key

    gen = torch.Generator(device=device).manual_seed(0)
    start, seen, launches = time.perf_counter(), set(), 0
    for m, n, k in shapes:
        for share in shares:
            n_kept = max(1, k - round(k * share))
            key = (tune_key("fwd", m, n, k, n_kept), tune_key("dgrad", m, n, k, n_kept), tune_key("wgrad", m, n, k, n_kept))
            if key in seen:
                continue
            seen.add(key)
            keep = torch.linspace(0, k - 1, n_kept, device=device).round().long().unique()  # spread over K
            plan = plan_keep(keep, k, device)
            x = torch.randn(m, k, generator=gen, device=device, dtype=dtype)
            w = torch.randn(n, k, generator=gen, device=device, dtype=dtype)
            dy = torch.randn(m, n, generator=gen, device=device, dtype=dtype)
            ops.fwd(backend, x, w, None, plan)  # "measured": also times both paths at this key
            ops.dgrad(backend, dy, w, plan)
            ops.wgrad(backend, dy, x, plan)
            launches += 3
    logger.info("tuned the fused kernels for %d keys in %.2f s", len(seen), time.perf_counter() - start)
    return launches
