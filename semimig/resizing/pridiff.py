"""PriDiff: differentiated per-layer pruning ratios (paper III-B; DESIGN.md section 1).

A column ``c`` of layer ``k`` is a pruning *candidate* when its weight barely changed over the
last statistics period: ``delta_kc < theta_k``.  The paper's threshold is absolute,
``theta = N_iter * theta_iter``; but how far a weight moves per step depends on the optimizer and
its schedule (SGD moves it by ``lr * grad``, Adam by about ``lr`` whatever the gradient), so one
absolute number means "every column" under Adam at a small or annealed lr and "no column" under
SGD with large gradients.  The paper's intent is "prune what barely changed", i.e.
barely *compared with the layer's other columns*, so the default threshold is relative:

    relative : theta_k = theta_rel * median_c(delta_kc)        (finite deltas only; default 0.5)
    absolute : theta_k = N_iter * theta_iter                   (the paper's; ``theta_mode="absolute"``)

The relative threshold is invariant to rescaling every change of a layer (optimizer, lr,
schedule) and selects the columns whose change is small against the layer's typical change.

Per-layer ratios, for a straggler whose rank-level shed share is ``gamma > 0``::

    share_k   = |{c : delta_kc < theta_k}| / K_k
    gamma_k   = min( max(share_k, alpha * g), gamma_max )                       (paper)
    pridiff-e : g = empirical gamma (1/2)
    pridiff-r : g >= gamma the smallest value with  sum_k gamma_k F_k / sum_k F_k >= gamma

so PriDiff-R's savings follow Eq. 1 above the paper's ``alpha * gamma`` floor: layers with many
candidates prune more, the others less (at least ``alpha * g``), and the total is what the rank
must shed.  ``F_k`` are the layers' GEMM FLOPs.
"""
from __future__ import annotations

import logging
import math
from typing import Sequence

import torch

from semimig._validate import check_number
from semimig.resizing.config import ResizingConfig

__all__ = ["layer_thresholds", "candidate_shares", "pridiff_ratios", "pridiff_ratios_for_savings",
           "achieved_savings"]

logger = logging.getLogger(__name__)
_BISECTION_STEPS = 50


def layer_thresholds(deltas: Sequence[torch.Tensor], config: ResizingConfig, period: int) -> list[float]:
    """``theta_k`` per layer (see the module docstring); 0 for a layer with no measured column."""
    if config.theta_mode == "absolute":
        return [config.theta(period)] * len(deltas)
    thetas = []
    for delta in deltas:
        finite = delta[torch.isfinite(delta)]
        thetas.append(config.theta_rel * float(finite.median()) if finite.numel() else 0.0)
    return thetas


def candidate_shares(deltas: Sequence[torch.Tensor], thetas: Sequence[float]) -> list[float]:
    """``share_k``: the fraction of layer ``k``'s columns with ``delta < theta_k`` (inf never is)."""
    if len(deltas) != len(thetas):
        raise ValueError(f"got {len(deltas)} layers and {len(thetas)} thresholds")
    shares = []
    for k, (delta, theta) in enumerate(zip(deltas, thetas)):
        if delta.dim() != 1 or delta.numel() == 0:
            raise ValueError(f"delta of layer {k} must be a non-empty 1-D tensor, got shape {tuple(delta.shape)}")
        shares.append(float((delta < theta).sum()) / delta.numel())
    return shares


def _check_ratio_args(gamma: float, alpha: float, gamma_max: float) -> None:
    check_number("gamma", gamma, minimum=0.0, maximum=1.0)
    check_number("alpha", alpha, minimum=0.0, maximum=1.0, low_open=True)
    check_number("gamma_max", gamma_max, minimum=0.0, maximum=1.0, high_open=True)


def pridiff_ratios(shares: Sequence[float], *, gamma: float, alpha: float, gamma_max: float) -> list[float]:
    """The paper's ``gamma_k = min(max(share_k, alpha * gamma), gamma_max)``; all 0 when ``gamma == 0``."""
    _check_ratio_args(gamma, alpha, gamma_max)
    for k, share in enumerate(shares):
        check_number(f"share of layer {k}", share, minimum=0.0, maximum=1.0)
    if gamma == 0:
        return [0.0] * len(shares)
    return [min(max(share, alpha * gamma), gamma_max) for share in shares]


def pridiff_ratios_for_savings(shares: Sequence[float], layer_flops: Sequence[float], *, gamma: float,
                               alpha: float, gamma_max: float) -> list[float]:
    """PriDiff-R: the paper's ratios with ``g >= gamma`` raised until the savings reach ``gamma``.

    The floor ``alpha * g`` is found by bisection on ``[alpha * gamma, gamma_max]`` (savings are
    non-decreasing in it); when every layer at ``gamma_max`` still saves less, that is returned.
    """
    ratios = pridiff_ratios(shares, gamma=gamma, alpha=alpha, gamma_max=gamma_max)
    if gamma == 0 or achieved_savings(ratios, layer_flops) >= gamma:
        return ratios

    def at(floor: float) -> list[float]:
        return [min(max(share, floor), gamma_max) for share in shares]

    lo, hi = alpha * gamma, gamma_max  # invariant: savings(lo) < gamma <= savings(hi), unless hi is short
    if achieved_savings(at(hi), layer_flops) < gamma:
        return at(hi)
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if achieved_savings(at(mid), layer_flops) >= gamma:
            hi = mid
        else:
            lo = mid
    return at(hi)


def achieved_savings(gammas: Sequence[float], layer_flops: Sequence[float]) -> float:
    """FLOP-weighted pruned share ``sum_k gamma_k F_k / sum_k F_k`` (0 when there is no work)."""
    if len(gammas) != len(layer_flops):
        raise ValueError(f"got {len(gammas)} ratios for {len(layer_flops)} layers")
    for g in gammas:
        check_number("every gamma", g, minimum=0.0, maximum=1.0)
    for f in layer_flops:
        check_number("every layer_flops", f, minimum=0.0)
    total = math.fsum(layer_flops)
    if total == 0:
        return 0.0
    return math.fsum(g * f for g, f in zip(gammas, layer_flops)) / total
