"""Keep sets: validation and the launch plan every kernel reads.

A keep set ``S ⊂ [0, K)`` is a sorted, duplicate-free integer tensor of the kept reduction
columns (``keep  # [K'] int, sorted``); ``P = [0, K) \\ S`` are the pruned columns.

Granularity.  ``S`` is *g-grouped* (g in ``GROUP_SIZES``) when it is a union of aligned blocks
``[b·g, b·g + g)`` and ``K % g == 0`` (so ``P`` is a union of aligned blocks too).  The kernels
then read one group index ``b`` per g columns and know that the gathered columns come in
contiguous, g-aligned runs, which restores vectorised loads and stores along the contiguous
dimension.  Otherwise (g = 1) they gather single columns, as in the paper.

:func:`plan_keep` validates a keep set once and packs everything the launchers need into a
:class:`KeepPlan`; the autograd function builds one plan in forward and reuses it in backward.

Only :func:`plan_keep` builds plans.  Constructing :class:`KeepPlan` directly (or through
``dataclasses.replace``) raises :class:`~semimig.errors.ConfigError`, so every plan that reaches a
kernel holds values that were checked: no out-of-bounds gather from a hand-made index.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from semimig.errors import ConfigError

__all__ = ["GROUP_SIZES", "KeepPlan", "plan_keep", "validate_keep"]

GROUP_SIZES: tuple[int, ...] = (32, 16, 8)
"""Aligned group sizes the grouped kernels support, largest first (auto-detection order)."""

_INDEX_DTYPES = (torch.int32, torch.int64)


_building = threading.local()  # set while plan_keep constructs a plan (see KeepPlan.__post_init__)


@dataclass(frozen=True, kw_only=True)
class KeepPlan:
    """A validated keep set ``S`` of ``[0, k)`` and its complement ``P``; built by :func:`plan_keep` only.

    Attributes:
        k: the full reduction size ``K``.
        keep: ``[K'] int32``, sorted kept columns ``S``.
        pruned: ``[K - K'] int32``, sorted pruned columns ``P``.
        group: granularity ``g``; 1 means single columns.
        first, last: ``min S`` and ``max S`` as host ints (-1 when ``S`` is empty).
        keep_groups: ``[K'/g] int32`` block indices ``S[::g] // g`` when ``g > 1``, else None.
        pruned_groups: ``[(K-K')/g] int32`` block indices of ``P`` when ``g > 1``, else None.
    """

    k: int
    keep: Tensor
    pruned: Tensor
    group: int
    first: int
    last: int
    keep_groups: Tensor | None = None
    pruned_groups: Tensor | None = None

    def __post_init__(self) -> None:
        if not getattr(_building, "active", False):
            raise ConfigError("KeepPlan is built by plan_keep(keep, k, device), which validates the keep set; "
                              "a plan made any other way could send a kernel out of bounds")
        if self.k < 0:
            raise ConfigError(f"KeepPlan.k must be >= 0, got {self.k}")
        if self.group not in (1, *GROUP_SIZES):
            raise ConfigError(f"KeepPlan.group must be 1 or one of {GROUP_SIZES}, got {self.group}")
        for name in ("keep", "pruned"):
            t = getattr(self, name)
            if t.dtype != torch.int32 or t.dim() != 1:
                raise ConfigError(f"KeepPlan.{name} must be a 1-D int32 tensor, got {t.dtype} {tuple(t.shape)}")
        if self.keep.numel() + self.pruned.numel() != self.k:
            raise ConfigError(
                f"KeepPlan: |keep| + |pruned| = {self.keep.numel()} + {self.pruned.numel()} != k = {self.k}"
            )
        grouped = self.group > 1
        if grouped != (self.keep_groups is not None) or grouped != (self.pruned_groups is not None):
            raise ConfigError(f"KeepPlan: group indices must be given exactly when group > 1 (group={self.group})")

    @cached_property
    def n_kept(self) -> int:
        """``|S| = K'``."""
        return self.keep.numel()

    @cached_property
    def n_pruned(self) -> int:
        """``|P| = K - K'``."""
        return self.pruned.numel()

    @cached_property
    def dense(self) -> bool:
        """True when nothing is pruned (``S = [0, K)``)."""
        return self.n_kept == self.k

    @cached_property
    def span(self) -> tuple[int, int] | None:
        """``(a, b)`` when ``S = [a, b)`` is one contiguous run (then slices replace gathers), else None."""
        if self.n_kept and self.last - self.first + 1 == self.n_kept:
            return self.first, self.last + 1
        return None

    @property
    def device(self) -> torch.device:
        return self.keep.device

    @cached_property
    def keep64(self) -> Tensor:
        """``[K'] int64``: :attr:`keep` as the index dtype ``Tensor.scatter_`` takes.

        The torch path scatters single kept columns with ``zeros.scatter_(1, keep64.expand(rows,
        K'), products)`` (built on first use; the Triton kernels scatter by themselves).
        """
        return self.keep.long()

    @cached_property
    def block_scatter_source(self) -> Tensor | None:
        """``[K/g] int64`` (``g = group > 1``; ``None`` for single columns): for block ``b``, its block
        in ``[computed S blocks | one zero block]`` (the zero block for a pruned one), so that
        ``buf.view(rows, K'/g + 1, g).index_select(1, block_scatter_source)`` is the scattered result
        with exact zeros on ``P``: a block gather, one read and one write of each value."""
        if self.group == 1:
            return None
        return _gather_source(self.keep_groups, self.k // self.group)


def _gather_source(kept: Tensor, size: int) -> Tensor:
    """``[size] int64``: for slot ``j`` of ``[0, size)``, its index in ``[kept slots in order | one zero
    slot]`` (the zero slot for a slot not in ``kept``)."""
    source = torch.full((size,), kept.numel(), dtype=torch.int64, device=kept.device)
    source[kept.long()] = torch.arange(kept.numel(), device=kept.device)
    return source


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Device equality where ``cuda`` and ``cuda:<current>`` are the same device."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.index is None or b.index is None:
        current = torch.cuda.current_device() if a.type == "cuda" and torch.cuda.is_available() else 0
        return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)
    return a.index == b.index


def _check_structure(keep: object, k: int, device: torch.device) -> Tensor:
    """Checks that need no look at the values (no device synchronisation)."""
    _check_k(k)
    if not isinstance(keep, Tensor):
        raise ConfigError(f"keep must be a torch.Tensor of column indices or None, got {type(keep).__name__}")
    if keep.dtype not in _INDEX_DTYPES:
        raise ConfigError(f"keep must be an int32 or int64 tensor, got dtype {keep.dtype}")
    if keep.dim() != 1:
        raise ConfigError(f"keep must be 1-D, got shape {tuple(keep.shape)}")
    if not _same_device(keep.device, device):
        raise ConfigError(f"keep is on {keep.device} but the operands are on {device}")
    if keep.numel() > k:
        raise ConfigError(f"keep has {keep.numel()} entries but K = {k}: it cannot keep more columns than exist")
    return keep


def _check_k(k: object) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ConfigError(f"K must be a non-negative int, got {k!r}")


def _check_values(keep: Tensor, k: int) -> tuple[int, int]:
    """Range, sortedness and uniqueness; returns ``(min, max)`` (-1, -1 when empty); one host sync."""
    if keep.numel() == 0:
        return -1, -1
    step = keep[1:] - keep[:-1]
    min_step = step.min() if step.numel() else torch.ones((), dtype=keep.dtype, device=keep.device)
    lo, hi, min_step = torch.stack([keep.min(), keep.max(), min_step]).tolist()
    if lo < 0 or hi >= k:
        bad = lo if lo < 0 else hi
        position = int(torch.argmax((keep == bad).to(torch.int8)))
        raise ConfigError(f"keep index {bad} is out of range [0, {k}) (at position {position})")
    if min_step <= 0:
        i = int(torch.argmax((step <= 0).to(torch.int8)))
        a, b = int(keep[i]), int(keep[i + 1])
        what = "duplicate index" if a == b else "unsorted indices"
        raise ConfigError(f"keep must be sorted and unique: {what} {a}, {b} at positions {i}, {i + 1}")
    return int(lo), int(hi)


def validate_keep(keep: Tensor | None, k: int, device: torch.device | str) -> Tensor:
    """Validate a keep set for reduction size ``k`` on ``device``; return it as contiguous int32.

    ``None`` means dense and returns ``arange(k)``.  Raises :class:`~semimig.errors.ConfigError`
    (a ValueError and a TypeError) for a non-tensor, a non-integer dtype, a wrong shape or device,
    more entries than ``k``, an index outside ``[0, k)``, duplicates or unsorted indices; every
    message names the bad value.  Looking at the values costs one device synchronisation on an
    accelerator.
    """
    device = torch.device(device)
    if keep is None:
        _check_k(k)
        return torch.arange(k, dtype=torch.int32, device=device)
    keep = _check_structure(keep, k, device)
    _check_values(keep, k)
    return keep.to(torch.int32).contiguous()


def _aligned(keep: Tensor, g: int) -> Tensor:
    """0-d bool tensor: ``keep`` (validated, ``|keep| % g == 0``) is a union of aligned g-blocks."""
    blocks = keep.view(-1, g)  # [K'/g, g]
    runs = (blocks == blocks[:, :1] + torch.arange(g, dtype=keep.dtype, device=keep.device)).all()
    return (blocks[:, 0] % g == 0).all() & runs


def _detect_group(keep: Tensor, k: int) -> int:
    """Largest g in ``GROUP_SIZES`` with ``g | K`` and ``keep`` g-aligned, else 1 (one host sync)."""
    candidates = [g for g in GROUP_SIZES if k % g == 0 and keep.numel() % g == 0]
    if not candidates:
        return 1
    if keep.numel() in (0, k):  # empty or dense: trivially aligned, no look at the values
        return candidates[0]
    flags = torch.stack([_aligned(keep, g) for g in candidates]).tolist()
    return next((g for g, ok in zip(candidates, flags) if ok), 1)


def _is_grouped(keep: Tensor, k: int, g: int) -> bool:
    """True when ``keep`` (validated) is a union of aligned g-blocks and ``g`` divides ``k``."""
    if k % g or keep.numel() % g:
        return False
    return keep.numel() in (0, k) or bool(_aligned(keep, g))


def _complement(keep: Tensor, k: int) -> Tensor:
    """Sorted ``[0, k) \\ keep`` without a data-dependent size (no host synchronisation)."""
    is_pruned = torch.ones(k, dtype=torch.int8, device=keep.device)
    is_pruned[keep.long()] = 0
    # A stable sort puts the kept columns (0) first, each side in ascending column order.
    order = torch.sort(is_pruned, stable=True).indices
    return order[keep.numel():].to(torch.int32)


def plan_keep(
    keep: Tensor | KeepPlan | None,
    k: int,
    device: torch.device | str,
    *,
    group: int | None = None,
) -> KeepPlan:
    """Build the :class:`KeepPlan` of ``keep`` for reduction size ``k``: the only way to make one.

    Args:
        keep: kept column indices (sorted, unique, int32/int64), ``None`` for dense, or an
            existing plan (returned as is after checking ``k`` and the device: its values were
            checked when it was built).
        k: reduction size ``K``.
        device: device of the operands.
        group: granularity. ``None`` detects the largest aligned ``g`` in ``GROUP_SIZES``
            (falling back to 1); an explicit ``g`` must match ``keep``; ``1`` skips detection.

    The values are always validated (one host synchronisation on an accelerator, two with
    group detection); the plan owns copies of its index tensors, so later writes to ``keep``
    cannot change it.  Raises :class:`~semimig.errors.ConfigError` naming the bad value.
    """
    device = torch.device(device)
    if isinstance(keep, KeepPlan):
        if keep.k != k:
            raise ConfigError(f"the keep plan was built for K = {keep.k} but the operands have K = {k}")
        if not _same_device(keep.device, device):
            raise ConfigError(f"the keep plan is on {keep.device} but the operands are on {device}")
        return keep
    if group is not None and group not in (1, *GROUP_SIZES):
        raise ConfigError(f"group must be None, 1 or one of {GROUP_SIZES}, got {group!r}")
    if keep is None:
        keep32 = validate_keep(None, k, device)
        first, last = (0, k - 1) if k else (-1, -1)
    else:
        keep = _check_structure(keep, k, device)
        first, last = _check_values(keep, k)
        keep32 = keep.to(torch.int32, copy=True).contiguous()
    if group is None:
        group = _detect_group(keep32, k)
    elif group > 1 and not _is_grouped(keep32, k, group):
        raise ConfigError(f"keep is not a union of aligned groups of {group} columns with K = {k} divisible by {group}")
    pruned = _complement(keep32, k)
    groups = {}
    if group > 1:
        groups = dict(keep_groups=(keep32[::group] // group).contiguous(),
                      pruned_groups=(pruned[::group] // group).contiguous())
    _building.active = True
    try:
        return KeepPlan(k=k, keep=keep32, pruned=pruned, group=group, first=first, last=last, **groups)
    finally:
        _building.active = False
