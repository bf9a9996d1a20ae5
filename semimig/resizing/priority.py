"""Priority pruning (paper III-B, Algorithm 1; DESIGN.md section 1).

Per-column weight variation of a weight shard ``W  # [N, K]`` over one statistics period::

    snapshot : delta_c = (1/N) * sum_n |W_end[n, c] - W_start[n, c]|
    per_step : delta_c = sum_t (1/N) * sum_n |W_t[n, c] - W_{t-1}[n, c]|

Incremental update: a column pruned during the last period keeps its previous ``delta`` (a
zero-imputed column barely moves, and a full update would prune it again forever).  Columns never
measured have ``delta = +inf`` (never preferred for pruning).

Selection of ``|P|`` pruned columns: ``rd`` uniformly at random; ``pri`` (and both PriDiff
variants) the smallest ``delta``, ties broken by an optional secondary key (e.g. how often each
column was pruned so far, which rotates equal columns round-robin), then by index.

PriDiff per-layer ratios (a straggler with uniform ratio ``gamma > 0``)::

    gamma_k = min( max( share_c(delta_kc < theta), alpha * gamma ), gamma_max ),  theta = N_iter * theta_iter

and the achieved GEMM savings ``sum_k gamma_k F_k / sum_k F_k`` to report next to ``gamma``.
"""
from __future__ import annotations

import logging
import math
from typing import Literal, Optional, Sequence

import torch

from semimig.resizing.config import VARIANTS

__all__ = [
    "column_variation",
    "ColumnVariationTracker",
    "select_pruned",
    "pridiff_ratios",
    "achieved_savings",
]

logger = logging.getLogger(__name__)


def column_variation(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """``[K]`` float64: mean over rows of ``|new - old|`` for ``[N, K]`` weights."""
    if new.dim() != 2 or new.shape != old.shape:
        raise ValueError(f"expected two [N, K] weights of the same shape, got {tuple(new.shape)} and {tuple(old.shape)}")
    diff = new.to(torch.float64) - old.to(device=new.device, dtype=torch.float64)
    return diff.abs().mean(dim=0)


class ColumnVariationTracker:
    """Per-column variation ``delta`` of one ``[N, K]`` weight across statistics periods.

    Bounded memory: one host (CPU) copy of the weight (the period-start snapshot, or the previous
    step for ``per_step``) plus ``[K]`` float64 accumulators; nothing extra on the accelerator.

    Call :meth:`observe_step` after every optimizer step (only ``per_step`` reads the weight) and
    :meth:`end_period` at each period boundary with the columns pruned during the period.
    """

    def __init__(self, weight: torch.Tensor, *, method: Literal["snapshot", "per_step"] = "snapshot") -> None:
        if weight.dim() != 2:
            raise ValueError(f"weight must be [N, K], got shape {tuple(weight.shape)}")
        if method not in ("snapshot", "per_step"):
            raise ValueError(f"method must be 'snapshot' or 'per_step', got {method!r}")
        self.method = method
        self.shape = tuple(weight.shape)
        self.num_columns = weight.shape[1]
        self.delta = torch.full((self.num_columns,), math.inf, dtype=torch.float64)
        """``[K]`` float64 on CPU: the variation of the last completed period (inf: never measured)."""
        self.steps = 0
        self.periods = 0
        self._host_ref = self._to_host(weight)
        self._accum = torch.zeros(self.num_columns, dtype=torch.float64)

    def _to_host(self, weight: torch.Tensor) -> torch.Tensor:
        if tuple(weight.shape) != self.shape:
            raise ValueError(f"weight shape changed from {self.shape} to {tuple(weight.shape)}")
        return weight.detach().to("cpu", copy=True)

    def observe_step(self, weight: torch.Tensor) -> None:
        """After an optimizer step; ``per_step`` accumulates ``mean_n |W_t - W_{t-1}|``."""
        self.steps += 1
        if self.method == "per_step":
            current = self._to_host(weight)
            self._accum += column_variation(current, self._host_ref)
            self._host_ref = current

    def end_period(self, weight: torch.Tensor, pruned: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Close the period: new ``delta`` for the columns not in ``pruned``, the old one for the rest.

        ``pruned``: ``[K]`` bool mask (or count tensor, nonzero = pruned) of the columns pruned at
        any iteration of the period, e.g. ``LineageTable.prune_counts(...) > 0``; None = none.
        Returns a copy of the updated ``delta`` and starts the next period from ``weight``.
        """
        current = self._to_host(weight)
        measured = self._accum.clone() if self.method == "per_step" else column_variation(current, self._host_ref)
        if pruned is None:
            keep_old = torch.zeros(self.num_columns, dtype=torch.bool)
        else:
            if pruned.shape != (self.num_columns,):
                raise ValueError(f"pruned must be a [{self.num_columns}] mask, got shape {tuple(pruned.shape)}")
            keep_old = pruned.to("cpu") != 0
        self.delta = torch.where(keep_old, self.delta, measured)
        self._host_ref = current
        self._accum.zero_()
        self.steps = 0
        self.periods += 1
        return self.delta.clone()


def select_pruned(
    delta: torch.Tensor,
    n_prune: int,
    variant: str,
    generator: Optional[torch.Generator] = None,
    *,
    tie_break: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Sorted ``[n_prune]`` int64 indices of the columns to prune, on ``delta``'s device.

    ``rd``: a uniform random subset (``generator``, a CPU generator, for reproducibility).
    ``pri`` / ``pridiff-e`` / ``pridiff-r``: the ``n_prune`` smallest ``delta``; equal ``delta``
    ordered by ``tie_break`` (smaller first, e.g. past prune counts), then by column index.
    """
    if delta.dim() != 1:
        raise ValueError(f"delta must be 1-D [K], got shape {tuple(delta.shape)}")
    num_columns = delta.numel()
    if isinstance(n_prune, bool) or not isinstance(n_prune, int) or not 0 <= n_prune <= num_columns:
        raise ValueError(f"n_prune must be an int in [0, {num_columns}], got {n_prune!r}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if variant == "rd":
        perm = torch.randperm(num_columns, generator=generator)
        return perm[:n_prune].sort().values.to(delta.device)
    if torch.isnan(delta).any():
        raise ValueError("delta contains NaN")
    # Lexicographic (delta, tie_break, index) via stable sorts, least significant key first.
    order = torch.arange(num_columns, device=delta.device)
    if tie_break is not None:
        if tie_break.shape != delta.shape:
            raise ValueError(f"tie_break must have shape {tuple(delta.shape)}, got {tuple(tie_break.shape)}")
        order = torch.sort(tie_break.to(delta.device), stable=True).indices
    order = order[torch.sort(delta[order], stable=True).indices]
    return order[:n_prune].sort().values


def pridiff_ratios(
    deltas_per_layer: Sequence[torch.Tensor],
    *,
    gamma: float,
    alpha: float,
    theta: float,
    gamma_max: float,
) -> list[float]:
    """Per-layer ``gamma_k = min(max(share(delta_k < theta), alpha * gamma), gamma_max)``.

    A rank that is not a straggler (``gamma == 0``) prunes nothing: all ratios are 0.
    """
    if not (isinstance(gamma, (int, float)) and 0 <= gamma <= 1):
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    if not (isinstance(alpha, (int, float)) and 0 < alpha <= 1):
        raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
    if not (isinstance(theta, (int, float)) and theta >= 0):
        raise ValueError(f"theta must be >= 0, got {theta!r}")
    if not (isinstance(gamma_max, (int, float)) and 0 <= gamma_max < 1):
        raise ValueError(f"gamma_max must be in [0, 1), got {gamma_max!r}")
    ratios = []
    for k, delta in enumerate(deltas_per_layer):
        if delta.dim() != 1 or delta.numel() == 0:
            raise ValueError(f"delta of layer {k} must be a non-empty 1-D tensor, got shape {tuple(delta.shape)}")
        if gamma == 0:
            ratios.append(0.0)
            continue
        share = float((delta < theta).sum()) / delta.numel()
        ratios.append(min(max(share, alpha * gamma), gamma_max))
    return ratios


def achieved_savings(gammas: Sequence[float], layer_flops: Sequence[float]) -> float:
    """FLOP-weighted pruned share ``sum_k gamma_k F_k / sum_k F_k`` (0 when there is no work)."""
    if len(gammas) != len(layer_flops):
        raise ValueError(f"got {len(gammas)} ratios for {len(layer_flops)} layers")
    for g in gammas:
        if not 0 <= g <= 1:
            raise ValueError(f"every gamma must be in [0, 1], got {g!r}")
    for f in layer_flops:
        if not (f >= 0 and math.isfinite(f)):
            raise ValueError(f"every layer_flops must be finite and >= 0, got {f!r}")
    total = math.fsum(layer_flops)
    if total == 0:
        return 0.0
    return math.fsum(g * f for g, f in zip(gammas, layer_flops)) / total
