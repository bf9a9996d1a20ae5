"""Priority pruning (paper III-B, Algorithm 1; DESIGN.md section 1).

Per-column weight variation of a weight shard ``W  # [N, K]`` over one statistics period::

    snapshot : delta_c = (1/N) * sum_n |W_end[n, c] - W_start[n, c]|
    per_step : delta_c = sum_t (1/N) * sum_n |W_t[n, c] - W_{t-1}[n, c]|

Incremental update: a column pruned during the last period keeps its previous ``delta`` (a
zero-imputed column barely moves, and a full update would prune it again forever).  Columns never
measured have ``delta = +inf`` (never preferred for pruning).

Selection of ``|P|`` pruned columns: ``rd`` uniformly at random; ``pri`` (and both PriDiff
variants) by Algorithm 1's priority list (:class:`PriorityList`): built once per statistics
period, smallest ``delta`` first, ties broken by how often each column was pruned in *earlier*
periods (fewer first), then by index; an iteration prunes the first ``|P|`` columns of the list
that the rank computes itself.  Within a period the pruned set is therefore stable (the paper's
list), and across periods a column pruned before yields its place among equals, so columns that
were never measured (``delta = inf``) get measured within a bounded number of periods.

Revisiting pruned columns (``revisit=True``, the default; ``ResizingConfig.revisit_pruned``):
the list puts the columns pruned in the period that just ended after every column that was
computed in it, i.e. the key is ``(pruned last period, delta, earlier counts, index)``.  The
incremental update keeps a pruned column's old ``delta`` so that its own zero change cannot trap
it, but an old ``delta`` still ranks it against fresh ones measured at another point of the
schedule (a warm-up's small steps), so under a steady straggler some columns are pruned period
after period and others never, and the ones left behind cost the dense model accuracy; revisiting,
each column a rank prunes is computed again in about every other period.  A rank that must prune more than the columns it computed last period still
prunes some of them again (fewest earlier prunes first).  ``delta`` itself keeps the paper's
incremental values, so PriDiff's thresholds and candidate shares are unchanged.

PriDiff's per-layer ratios live in :mod:`semimig.resizing.pridiff`.
"""
from __future__ import annotations

import logging
import math
from typing import Literal, Optional

import torch

from semimig._validate import check_bool, check_int
from semimig.errors import ConfigError
from semimig.resizing.config import VARIANTS

__all__ = ["block_keys", "column_variation", "ColumnVariationTracker", "PriorityList", "priority_order", "select_pruned",
           "select_pruned_blocks"]

logger = logging.getLogger(__name__)



def _check_block(block: int, size: int, what: str) -> None:
    """A block size ``g``: a positive int dividing ``size`` (``what`` names it in the error)."""
    check_int("block", block, minimum=1)
    if size % block:
        raise ConfigError(f"block must be a positive int dividing {what} = {size}, got {block!r}")

def column_variation(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """``[K]`` float32 on ``new``'s device: mean over rows of ``|new - old|`` for ``[N, K]`` weights."""
    if new.dim() != 2 or new.shape != old.shape:
        raise ValueError(f"expected two [N, K] weights of the same shape, got {tuple(new.shape)} and {tuple(old.shape)}")
    diff = new.to(torch.float32) - old.to(device=new.device, dtype=torch.float32)
    return diff.abs_().mean(dim=0)


class ColumnVariationTracker:
    """Per-column variation ``delta`` of one ``[N, K]`` weight across statistics periods.

    Everything lives where the weight lives: one copy of the weight in its own dtype on its own
    device (the period-start snapshot, or the previous step for ``per_step``) and ``[K]`` float32
    accumulators beside it.  Nothing is copied to the host, so a rank's host memory does not grow
    with the model and no period waits for a device-to-host transfer of a weight.

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
        self.device = weight.device
        self.num_columns = weight.shape[1]
        self.delta = torch.full((self.num_columns,), math.inf, dtype=torch.float32, device=self.device)
        """``[K]`` float32 on the weight's device: the variation of the last completed period (inf: never measured)."""
        self.steps = 0
        self.periods = 0
        self._ref = self._snapshot(weight)
        self._accum = torch.zeros(self.num_columns, dtype=torch.float32, device=self.device)

    def storage(self) -> tuple[torch.Tensor, ...]:
        """Every tensor the tracker holds (the reference copy, the accumulators, ``delta``)."""
        return (self._ref, self._accum, self.delta)

    def _snapshot(self, weight: torch.Tensor) -> torch.Tensor:
        if tuple(weight.shape) != self.shape:
            raise ValueError(f"weight shape changed from {self.shape} to {tuple(weight.shape)}")
        if weight.device != self.device:
            raise ValueError(f"weight moved from {self.device} to {weight.device}")
        return weight.detach().clone()

    def observe_step(self, weight: torch.Tensor) -> None:
        """After an optimizer step; ``per_step`` accumulates ``mean_n |W_t - W_{t-1}|``."""
        self.steps += 1
        if self.method == "per_step":
            current = self._snapshot(weight)
            self._accum += column_variation(current, self._ref)
            self._ref = current

    def end_period(self, weight: torch.Tensor, pruned: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Close the period: new ``delta`` for the columns not in ``pruned``, the old one for the rest.

        ``pruned``: ``[K]`` bool mask (or count tensor, nonzero = pruned) of the columns pruned at
        any iteration of the period, e.g. ``LineageTable.prune_counts(...) > 0``; None = none.
        Returns a copy of the updated ``delta`` and starts the next period from ``weight``.
        """
        current = self._snapshot(weight)
        measured = self._accum.clone() if self.method == "per_step" else column_variation(current, self._ref)
        if pruned is None:
            self.delta = measured
        else:
            if pruned.shape != (self.num_columns,):
                raise ValueError(f"pruned must be a [{self.num_columns}] mask, got shape {tuple(pruned.shape)}")
            self.delta = torch.where(pruned.to(self.device) != 0, self.delta, measured)
        self._ref = current
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
    check_int("n_prune", n_prune, minimum=0, maximum=num_columns)
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if variant == "rd":
        perm = torch.randperm(num_columns, generator=generator)
        return perm[:n_prune].sort().values.to(delta.device)
    if torch.isnan(delta).any():
        raise ValueError("delta contains NaN")
    if tie_break is not None and tie_break.shape != delta.shape:
        raise ValueError(f"tie_break must have shape {tuple(delta.shape)}, got {tuple(tie_break.shape)}")
    # Lexicographic (delta, tie_break, index) via stable sorts, least significant key first.
    return _lexicographic(delta, tie_break)[:n_prune].sort().values


def block_keys(delta: torch.Tensor, block: int, tie_break: Optional[torch.Tensor] = None,
               recent: Optional[torch.Tensor] = None) -> tuple:
    """Per aligned block ``[b·g, b·g + g)`` of ``[K]`` column keys: ``(mean delta, sum tie_break, max recent)``.

    A block's weight change is the mean of its columns' (an unmeasured column, ``inf``, makes
    its block unmeasured); its earlier prune count is the sum of its columns'; it was pruned
    recently when any of its columns was.  ``g`` must divide ``K``.
    """
    k = delta.numel()
    _check_block(block, k, "K")
    mean = delta.view(-1, block).mean(dim=1)
    ties = None if tie_break is None else tie_break.reshape(-1, block).sum(dim=1)
    last = None if recent is None else recent.reshape(-1, block).amax(dim=1)
    return mean, ties, last


def _blocks_to_columns(blocks: torch.Tensor, block: int) -> torch.Tensor:
    """Sorted column indices of the given block numbers."""
    blocks = blocks.sort().values
    return (blocks[:, None] * block + torch.arange(block, device=blocks.device)).flatten()


def select_pruned_blocks(delta: torch.Tensor, n_prune: int, block: int, *,
                         tie_break: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``pri`` at block granularity: sorted column indices of the ``round(n_prune / g)`` blocks of smallest mean ``delta``.

    Ties: smaller summed ``tie_break``, then block index.  ``block = 1`` is :func:`select_pruned`'s ``pri``.
    The pruned columns are whole aligned blocks, so the keep set is too (what
    :func:`semimig.kernels.layout.layout_keep` with ``block=g`` and the grouped kernels take).
    """
    if delta.dim() != 1:
        raise ValueError(f"delta must be 1-D [K], got shape {tuple(delta.shape)}")
    check_int("n_prune", n_prune, minimum=0, maximum=delta.numel())
    if torch.isnan(delta).any():
        raise ValueError("delta contains NaN")
    if tie_break is not None and tie_break.shape != delta.shape:
        raise ValueError(f"tie_break must have shape {tuple(delta.shape)}, got {tuple(tie_break.shape)}")
    mean, ties, _ = block_keys(delta, block, tie_break)
    n_blocks = min(mean.numel(), int(n_prune / block + 0.5))
    return _blocks_to_columns(_lexicographic(mean, ties)[:n_blocks], block)


def priority_order(delta: torch.Tensor, earlier_counts: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[K]`` int64 permutation: smallest ``delta`` first, then fewest ``earlier_counts``, then index."""
    if delta.dim() != 1 or (earlier_counts is not None and earlier_counts.shape != delta.shape):
        raise ValueError(f"delta must be [K] and earlier_counts [K] or None, got {tuple(delta.shape)}")
    return _lexicographic(delta, earlier_counts)


def _lexicographic(delta: torch.Tensor, tie_break: Optional[torch.Tensor],
                   first: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Indices sorted by ``(first, delta, tie_break, index)`` (stable sorts, least significant first)."""
    order = torch.arange(delta.numel(), device=delta.device)
    if tie_break is not None:
        order = torch.sort(tie_break.to(delta.device), stable=True).indices
    order = order.index_select(0, torch.sort(delta.index_select(0, order), stable=True).indices)
    if first is not None:
        first = first.to(delta.device).index_select(0, order)
        order = order.index_select(0, torch.sort(first, stable=True).indices)
    return order


class PriorityList:
    """Algorithm 1 for one ``[N, K]`` weight: the period's priority list and its statistics.

    ``delta`` (``[K]`` float32, inf = never measured), ``earlier_counts`` (``[K]`` int64: in how
    many iterations of all *completed* periods each column was pruned) and ``order`` (this
    period's list) live on the weight's device and are rebuilt by :meth:`end_period`.
    ``revisit``: order the columns pruned in the last period after the others (module
    docstring); False is the paper's list.

    :meth:`select` answers with host indices (the lineage and the keep-set caches read them on the
    host): the list restricted to ``own`` columns (or its blocks) is read back once per period and
    ``(own, block)``, a ``[K]`` int64 permutation, never a weight; later selections slice it.
    """

    def __init__(self, weight: torch.Tensor, *, revisit: bool = True) -> None:
        self.revisit = check_bool("revisit", revisit)
        self.tracker = ColumnVariationTracker(weight)
        k, device = self.tracker.num_columns, self.tracker.device
        self.delta = self.tracker.delta.clone()
        self.earlier_counts = torch.zeros(k, dtype=torch.int64, device=device)
        self.order = torch.arange(k, device=device)
        self.measured = False
        """True once a period has ended (``delta`` holds measurements)."""
        self.recent: Optional[torch.Tensor] = None
        """``[K]`` int8: 1 for the columns pruned in the last period (``revisit``), else None."""
        self._lists: dict[tuple[int, int], torch.Tensor] = {}
        """Per ``(own, block)``: this period's list on the host (columns, or block numbers for ``block > 1``)."""

    def storage(self) -> tuple[torch.Tensor, ...]:
        """Every statistics tensor held for the weight (the tracker's, ``delta``, the counts, the list)."""
        mine = (self.delta, self.earlier_counts, self.order) + (() if self.recent is None else (self.recent,))
        return self.tracker.storage() + mine

    def end_period(self, weight: torch.Tensor, period_counts: Optional[torch.Tensor]) -> torch.Tensor:
        """Close the period with the ``[K]`` counts of iterations each column was pruned in it.

        Columns pruned at any iteration keep their old ``delta`` (incremental update); the new
        list orders by the new ``delta`` and the counts of every completed period.
        """
        device = self.tracker.device
        counts = None if period_counts is None else period_counts.to(device, torch.int64)
        self.delta = self.tracker.end_period(weight, None if counts is None else counts > 0)
        if counts is not None:
            self.earlier_counts += counts
        recent = (counts > 0).to(torch.int8) if self.revisit and counts is not None else None
        self.recent = recent
        self.order = _lexicographic(self.delta, self.earlier_counts, recent)
        self._lists.clear()
        self.measured = True
        return self.delta

    def select(self, own: int, n_prune: int, *, block: int = 1) -> torch.Tensor:
        """Sorted int64 on the host: the first ``n_prune`` columns of the list within ``[0, own)``.

        ``block = g > 1``: whole aligned blocks of ``g`` columns instead, ``round(n_prune / g)``
        of them, ordered by the block keys of :func:`block_keys` (recently pruned last, then
        smallest mean ``delta``, fewest summed earlier prunes, block index); ``g`` must divide ``own``.
        """
        if not 0 <= n_prune <= own <= self.order.numel():
            raise ValueError(f"need 0 <= n_prune={n_prune} <= own={own} <= K={self.order.numel()}")
        if block != 1:
            _check_block(block, own, "own")
            blocks = self._list(own, block)
            return _blocks_to_columns(blocks[:min(blocks.numel(), int(n_prune / block + 0.5))], block)
        return self._list(own, 1)[:n_prune].sort().values

    def _list(self, own: int, block: int) -> torch.Tensor:
        """This period's list of ``[0, own)`` on the host: columns (``block = 1``) or aligned blocks."""
        key = (own, block)
        if key not in self._lists:
            if block == 1:
                mine = self.order if own == self.order.numel() else self.order[self.order < own]
            else:
                recent = None if self.recent is None else self.recent[:own]
                mean, ties, last = block_keys(self.delta[:own], block, self.earlier_counts[:own], recent)
                mine = _lexicographic(mean, ties, last)
            self._lists[key] = mine.cpu()  # [K] int64 indices: the one read per period and (own, block)
        return self._lists[key]
