"""The ``auto`` backend on a GPU: per launch shape, the faster of the fused kernel and the gather path.

Two exact implementations compute each pruned pass: the fused Triton kernel, which reads the kept
columns in place, and the torch path, which copies them into a compact operand and runs cuBLAS at
``K'``.  Neither wins everywhere.  A fused kernel reads a keep set of single columns scattered
along every row of the operand (no coalesced load), where the gather pays one copy and then runs
the best GEMM there is; a keep set of whole blocks the fused kernel reads in runs.  So the choice
is measured, not assumed: the first launch with a new key runs both paths (the fused kernel's
first call, which compiles and tunes it, is not timed), times ``TRIALS`` more launches of each,
interleaved, with CUDA events on the current stream, waits for them once, and keeps the faster
(median) for every later launch with that key.  The key is the fused kernel's own tuning key
(its token, output and kept-column buckets, and the keep set's block size) with the pass, the
dtype and the device: the shapes a kernel would tune for alike.

Every launch after the first with a key runs one path and waits for nothing.  The first waits
once; :func:`~semimig.kernels.tune.tune_kernels` makes those first launches before the first timed
step.  :func:`choices` lists what was decided; :func:`forget` drops it (tests, a changed device).
"""
from __future__ import annotations

import logging
import statistics
import time
from typing import Callable

import torch
from torch import Tensor

__all__ = ["TRIALS", "choices", "fastest", "forget"]

logger = logging.getLogger(__name__)

TRIALS = 3
"""Timed launches of each path at a new key (after one untimed launch of each)."""

_CHOSEN: dict[tuple, str] = {}


def choices() -> dict[tuple, str]:
    """Every key decided so far and the path it runs (``"triton"`` or ``"torch"``)."""
    return dict(_CHOSEN)


def forget() -> None:
    """Drop every decision: the next launch with each key measures again."""
    _CHOSEN.clear()


def _clock(device: torch.device):
    """``(mark, seconds, wait)``: a mark recorded now, the seconds between two marks, and a wait for a
    mark to complete: CUDA events on the current stream on CUDA, the host clock elsewhere (the host's
    work is finished when its call returns)."""
    if device.type == "cuda":
        def mark():
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return mark, lambda start, end: start.elapsed_time(end) / 1000.0, lambda last: last.synchronize()
    return time.perf_counter, lambda start, end: end - start, lambda last: None


def fastest(key: tuple, device: torch.device, paths: dict[str, Callable[[], Tensor]]) -> Tensor:
    """``paths[name]()`` for the path chosen for ``key``; at a new key, every path measured first
    (module docstring) and the result of the chosen path's last timed launch returned."""
    chosen = _CHOSEN.get(key)
    if chosen is not None:
        return paths[chosen]()
    if not paths:
        raise ValueError("fastest: no path to choose from")
    mark, seconds, wait = _clock(device)
    outs = {name: fn() for name, fn in paths.items()}  # untimed: compiles and tunes a fused kernel
    timed: dict[str, list] = {name: [] for name in paths}
    for _ in range(TRIALS):
        for name, fn in paths.items():
            start = mark()
            outs[name] = fn()
            end = mark()
            timed[name].append((start, end))
    wait(end)  # the last mark recorded: every earlier one is complete with it
    medians = {name: statistics.median(seconds(*m) for m in marks) for name, marks in timed.items()}
    chosen = min(medians, key=medians.get)
    _CHOSEN[key] = chosen
    logger.info("pruned GEMM %s: %s (%s)", key, chosen,
                ", ".join(f"{name} {s * 1e3:.3f} ms" for name, s in medians.items()))
    return outs[chosen]
