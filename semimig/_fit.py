"""The one straight-line fit of the project: least squares ``y ≈ a + b·x``.

Three places fit a line to measured times: the controller's fixed fraction of a pruned rank's
GEMM time (``T = a + b·w`` over the work fractions it ran at, :mod:`semimig.controller.timing`),
the migration benchmark's link model (``t(B) = α + β·B`` over message sizes) and the kernel
benchmark's fixed cost (``t = F + V·(1 − γ)``).  All use this function, so they agree on the
arithmetic: means and sums by :func:`math.fsum` (exactly rounded, so the fit does not depend on
the order of the points), ``b = Σ(x − x̄)(y − ȳ) / Σ(x − x̄)²``, ``a = ȳ − b·x̄``.
"""
from __future__ import annotations

import math
from typing import Sequence

__all__ = ["line_fit"]


def line_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """``(a, b)``: the least-squares intercept and slope of ``y ≈ a + b·x``.

    Raises:
        ValueError: ``xs`` and ``ys`` of different lengths, a NaN or infinite point, or ``x`` whose
            spread is zero (fewer than two distinct values, or so close that ``Σ(x − x̄)²``
            underflows: the slope is undefined), naming what was given.
    """
    xs, ys = [float(x) for x in xs], [float(y) for y in ys]
    if len(xs) != len(ys):
        raise ValueError(f"line_fit needs one y per x, got {len(xs)} x and {len(ys)} y")
    bad = [(x, y) for x, y in zip(xs, ys) if not (math.isfinite(x) and math.isfinite(y))]
    if bad:
        raise ValueError(f"line_fit needs finite points, got {bad}")
    if len(set(xs)) < 2:
        raise ValueError(f"line_fit needs two or more distinct x, got {sorted(set(xs))}")
    n = len(xs)
    mean_x, mean_y = math.fsum(xs) / n, math.fsum(ys) / n
    sxx = math.fsum((x - mean_x) ** 2 for x in xs)
    if sxx <= 0.0:
        raise ValueError(f"line_fit needs x with a spread, got {sorted(set(xs))} (Σ(x − x̄)² underflows to 0)")
    sxy = math.fsum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
    slope = sxy / sxx
    return mean_y - slope * mean_x, slope
