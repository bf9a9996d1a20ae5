"""Lineage table: which columns were pruned where, and when (paper III-A, DESIGN.md section 1).

One record per ``(layer_name, matrix_name)`` and iteration::

    (layer, matrix, P, iteration)      P  # [|P|] int64, sorted pruned column indices of K

written in forward, read in backward and by the priority statistics.  Memory is bounded: only the
current iteration's index tensors are held (recording a newer iteration drops all older entries),
plus one ``[K]`` counter per matrix of how many iterations of the current statistics period
pruned each column.  Re-recording the same matrix in the same iteration (activation recompute)
replaces the entry and its contribution to the counts.  Index values (range, sorted, unique) are
checked for CPU tensors; accelerator tensors are trusted, since reading them would sync the device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from semimig._validate import check_int
__all__ = ["LineageEntry", "LineageTable"]

Key = tuple[str, str]


@dataclass(frozen=True, kw_only=True)
class LineageEntry:
    """One record of the table."""

    layer: str
    matrix: str
    pruned: torch.Tensor
    """``[|P|]`` int64, sorted, unique pruned column indices."""
    iteration: int
    num_columns: int
    """``K``: the matrix's column count."""


class LineageTable:
    """Current iteration's pruned index sets plus per-period prune counts."""

    def __init__(self) -> None:
        self._iteration: Optional[int] = None
        self._entries: dict[Key, LineageEntry] = {}
        self._counts: dict[Key, torch.Tensor] = {}
        self._period_iterations: dict[Key, int] = {}
        self._counted: set[Key] = set()  # keys whose current entry is inside the counts
        self._validated: dict[Key, torch.Tensor] = {}  # the last index tensor checked per key (same object: skip)

    @property
    def iteration(self) -> Optional[int]:
        """The iteration whose entries are held (None before the first record)."""
        return self._iteration

    def record(self, layer: str, matrix: str, pruned: torch.Tensor, iteration: int, *, num_columns: int) -> LineageEntry:
        """Record that ``matrix`` of ``layer`` pruned columns ``pruned`` (of ``num_columns``) at ``iteration``."""
        if not isinstance(layer, str) or not layer or not isinstance(matrix, str) or not matrix:
            raise ValueError(f"layer and matrix must be non-empty strings, got {layer!r}, {matrix!r}")
        check_int("iteration", iteration, minimum=0)
        check_int("num_columns", num_columns, minimum=0)
        key = (layer, matrix)
        if self._validated.get(key) is not pruned:  # a keep set reused across iterations is checked once
            checked = self._check_indices(layer, matrix, pruned, num_columns)
            if checked is pruned:
                self._validated[key] = pruned
            pruned = checked
        if self._iteration is not None and iteration < self._iteration:
            raise ValueError(
                f"iteration {iteration} for {layer}.{matrix} is older than the table's iteration {self._iteration}"
            )
        if self._iteration is None or iteration > self._iteration:
            self._entries.clear()  # bounded memory: a new iteration drops the older index tensors
            self._counted.clear()
            self._iteration = iteration

        counts = self._counts.get(key)
        if counts is not None and counts.numel() != num_columns:
            raise ValueError(f"{layer}.{matrix} was recorded with {counts.numel()} columns, now {num_columns}")
        if counts is None:
            counts = torch.zeros(num_columns, dtype=torch.int64, device=pruned.device)
            self._counts[key] = counts
        if key in self._counted:  # same iteration again: replace, do not double count
            old = self._entries[key].pruned.to(counts.device)
            counts.index_add_(0, old, torch.full_like(old, -1))
        else:
            self._period_iterations[key] = self._period_iterations.get(key, 0) + 1
            self._counted.add(key)
        new = pruned.to(counts.device)
        counts.index_add_(0, new, torch.ones_like(new))
        entry = LineageEntry(layer=layer, matrix=matrix, pruned=pruned, iteration=iteration, num_columns=num_columns)
        self._entries[key] = entry
        return entry

    @staticmethod
    def _check_indices(layer: str, matrix: str, pruned: torch.Tensor, num_columns: int) -> torch.Tensor:
        if not isinstance(pruned, torch.Tensor) or pruned.dim() != 1:
            raise ValueError(f"pruned indices of {layer}.{matrix} must be a 1-D tensor, got {pruned!r}")
        if pruned.dtype.is_floating_point or pruned.dtype.is_complex or pruned.dtype == torch.bool:
            raise ValueError(f"pruned indices of {layer}.{matrix} must be integers, got dtype {pruned.dtype}")
        pruned = pruned.to(torch.int64)
        # Value checks read the tensor; on an accelerator that would be a device sync per record.
        if pruned.numel() and pruned.device.type == "cpu":
            lo, hi = int(pruned.min()), int(pruned.max())
            if lo < 0 or hi >= num_columns:
                raise ValueError(
                    f"pruned indices of {layer}.{matrix} must lie in [0, {num_columns}), got range [{lo}, {hi}]"
                )
            if pruned.numel() > 1 and not bool((pruned[1:] > pruned[:-1]).all()):
                raise ValueError(f"pruned indices of {layer}.{matrix} must be sorted and unique")
        return pruned

    def lookup(self, layer: str, matrix: str) -> torch.Tensor:
        """The current iteration's pruned indices of ``matrix`` in ``layer`` (for backward)."""
        entry = self._entries.get((layer, matrix))
        if entry is None:
            raise KeyError(f"no lineage entry for {layer}.{matrix} at iteration {self._iteration}")
        return entry.pruned

    def entries(self) -> list[LineageEntry]:
        """The current iteration's entries, in recording order (for logs and tests)."""
        return list(self._entries.values())

    def prune_counts(self, layer: str, matrix: str) -> torch.Tensor:
        """``[K]`` int64: in how many iterations of the current period each column was pruned."""
        counts = self._counts.get((layer, matrix))
        if counts is None:
            raise KeyError(f"{layer}.{matrix} has never been recorded")
        return counts.clone()

    def period_iterations(self, layer: str, matrix: str) -> int:
        """How many iterations of the current period recorded ``matrix`` of ``layer``."""
        return self._period_iterations.get((layer, matrix), 0)

    def reset_period(self) -> None:
        """Start a new statistics period: counts to zero (the current entries stay)."""
        for counts in self._counts.values():
            counts.zero_()
        for key in self._period_iterations:
            self._period_iterations[key] = 0
        self._counted.clear()  # a re-record of the current iteration now counts in the new period
