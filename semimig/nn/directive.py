"""What one semimig layer does in the current iteration on this rank.

A :class:`LayerDirective` is handed to a layer by the balancing runtime before its forward
(``layer.directive = ...``) and read by the functional module in forward *and* backward.  With
no directive (``None``) a layer computes exactly what Colossal-AI's layer computes.

Column sets of a rank's ``K`` (shard-local reduction columns), for a directive:

    own   = [0, K - L)            columns this rank is responsible for (L = columns it migrates)
    keep  ⊆ own, sorted           columns it actually computes (``None``: all of ``own``)
    pruned = own \\ keep          dropped by ZERO-resizing; gradients imputed (default 0)
    [K - L, K)                    computed by receivers (exact), results returned

Paired pruning (an MLP's column → elementwise → row pair, ``ResizingConfig.paired``): the row
layer keeps ``S`` of its K (the intermediate units) and receives them compact (``compact_input``);
the column layers feeding it compute only the output ``rows = S`` and keep their whole K.

The directive is immutable; per-layer mutable state (the weight block broadcast once per
iteration, the previous gradient for the ``same`` imputation, the validated keep plan) lives in
:class:`LayerState`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

import torch

from semimig.errors import ConfigError
from semimig.kernels import KeepPlan, plan_keep
from semimig.migration.exchange import Exchange
from semimig.migration.layout import MigrationLayout

IMPUTE_POLICIES = ("zero", "same", "average")


class CallReflex(Protocol):
    """The step reflex's hook in one layer (:mod:`semimig.controller.reflex`): called at the opening
    of each of the layer's dense calls (forward and backward) and of its pruned forwards, with the
    columns the call keeps as planned (``None``: all) and whether it is a forward; a keep set of
    fewer columns the call computes instead (the hook records it in the lineage table), or
    ``None`` (as planned)."""

    def keep(self, planned_kept: Optional[int], forward: bool) -> Optional[torch.Tensor]: ...

    def mark_call(self) -> None:
        """The opening of a call whose keep set cannot change (a paired layer's): marked, never pruned more."""


class GemmTimer(Protocol):
    """Runs one GEMM closure and accounts its time as this rank's own busy time.

    A timer may also have ``open_gap(phase)`` / ``close_gap(phase)`` / ``drop_gap()`` and a true
    ``marks_spans`` (as a :class:`~semimig.straggler.busy.BusyMeter` built for re-sharding has): the
    layers then mark the span between a column/row pair's two layers with them; any other timer
    is not told."""

    def timed(self, fn: Callable[[], Any], *, flops: int, full_flops: int) -> Any: ...


@dataclass
class LayerState:
    """Mutable per-layer state that outlives one forward/backward.

    ``weight_blocks``: ``{(iteration, straggler, count, version): (block, offset)}`` — migrated weight columns,
    broadcast once per iteration and reused by every forward and backward of that iteration.
    ``previous_wgrad``: last iteration's weight gradient, kept only for the ``same`` imputation.
    The keep plan of the rank's own columns is cached too (see :meth:`own_plan`).
    """

    weight_blocks: dict = field(default_factory=dict)
    previous_wgrad: Optional[torch.Tensor] = None
    _plan_key: Optional[tuple] = field(default=None, repr=False)
    _plan_keep: Optional[tuple] = field(default=None, repr=False)
    _plan: Optional[KeepPlan] = field(default=None, repr=False)

    def weight_block(self, key: tuple, make: Callable[[], tuple]) -> tuple:
        """The cached block for ``key = (iteration, straggler, count, weight version)``.

        The weight's version counter changes at every in-place update (the optimizer step), so
        a forward after ``optimizer.step()`` never sees pre-update columns; entries of other
        iterations are dropped.
        """
        if key not in self.weight_blocks:
            for stale in [k for k in self.weight_blocks if k[0] != key[0]]:
                del self.weight_blocks[stale]
            self.weight_blocks[key] = make()
        return self.weight_blocks[key]

    def own_plan(self, keep: Optional[torch.Tensor], k_total: int, k_own: int, device: torch.device,
                 group: Optional[int]) -> KeepPlan:
        """The validated :class:`~semimig.kernels.KeepPlan` of the columns this rank computes.

        ``keep`` (within ``[0, k_own)``), or the prefix ``[0, k_own)`` when ``keep`` is None, as a
        plan over all ``k_total`` columns.  Built by ``plan_keep`` (validation, complement) only
        when the keep set changes — same values as last time, same plan — so an unchanged plan
        costs one comparison per forward instead of a validation per GEMM.
        """
        key = (k_total, k_own, device, group, keep is None)
        if self._plan is not None and key == self._plan_key and (keep is None or self._same_keep(keep)):
            return self._plan
        columns = torch.arange(k_own, device=device) if keep is None else keep
        self._plan = plan_keep(columns, k_total, device, group=group)
        self._plan_key = key
        self._plan_keep = None if keep is None else (keep, keep._version, keep.clone())
        return self._plan

    def _same_keep(self, keep: torch.Tensor) -> bool:
        """The cached plan's keep set: the same unchanged tensor (no look at the values, no device
        sync), or equal values."""
        source, version, values = self._plan_keep
        if keep is source and keep._version == version:
            return True
        return keep.shape == values.shape and bool(torch.equal(keep, values))

    def clear(self) -> None:
        """Drop cached blocks (no migration this iteration)."""
        self.weight_blocks.clear()


@dataclass(frozen=True, kw_only=True)
class LayerDirective:
    """One layer's balancing action for one iteration on this rank (see module docstring)."""

    iteration: int
    keep: Optional[torch.Tensor] = None  # [K'] int64, sorted, within own columns
    layout: Optional[MigrationLayout] = None
    exchange: Optional[Exchange] = None
    impute: str = "zero"
    timer: Optional[GemmTimer] = None
    state: LayerState = field(default_factory=LayerState)
    on_forward: Optional[Callable[[], None]] = None  # the runtime writes the lineage table here
    on_backward: Optional[Callable[[], None]] = None  # ... and reads it back here
    reflex: Optional[CallReflex] = None  # no migration: the rank may prune (more) within the step
    rows: Optional[torch.Tensor] = None
    """Paired pruning, column layer: the output rows it computes (sorted), its output compact
    ``[..., |rows|]``; its own K stays whole (``keep`` None).  The rows are the kept columns of the
    row layer it feeds through an elementwise function (an MLP's intermediate units): the other
    rows feed only that layer's pruned columns (unread outputs, exactly-zero gradients)."""
    compact_input: bool = False
    """Paired pruning, row layer: its input arrives compact, the ``keep`` columns only (the column
    layers that feed it computed only those rows); its input gradient is compact too.  A paired
    directive's ``reflex`` only marks its calls (:meth:`CallReflex.mark_call`): the pair's units
    are fixed for the step."""

    def __post_init__(self) -> None:
        if self.impute not in IMPUTE_POLICIES:
            raise ConfigError(f"impute must be one of {IMPUTE_POLICIES}, got {self.impute!r}")
        if self.rows is not None or self.compact_input:
            what = "rows" if self.rows is not None else "compact_input"
            if self.layout is not None:
                raise ConfigError(f"a paired directive ({what}) cannot migrate: the pair's layers must compute "
                                  "the same units in forward and backward")
            if self.rows is not None and (self.keep is not None or self.compact_input):
                raise ConfigError("a column layer's paired directive (rows) keeps its whole K: no keep, no compact_input")
            if self.compact_input and self.keep is None:
                raise ConfigError("compact_input needs the keep set the compact input holds")
            if self.rows is not None and (not isinstance(self.rows, torch.Tensor)
                                          or self.rows.dtype not in (torch.int32, torch.int64) or self.rows.dim() != 1):
                raise ConfigError(f"rows must be a 1-D int32/int64 tensor, got {getattr(self.rows, 'dtype', type(self.rows).__name__)}")
        if self.reflex is not None and self.layout is not None:
            raise ConfigError("a directive with a reflex cannot migrate (its migration layout fixes the columns "
                              "every rank computes)")
        if self.layout is not None and self.layout.active and self.exchange is None:
            raise ConfigError("a directive with migration needs an exchange")
        if self.keep is not None and (not isinstance(self.keep, torch.Tensor)
                                      or self.keep.dtype not in (torch.int32, torch.int64)):
            raise ConfigError(f"keep must be an int32/int64 tensor, got {getattr(self.keep, 'dtype', type(self.keep).__name__)}")

    def own_columns(self, rank: int, k_total: int) -> int:
        """``K - L_rank``: the leading columns this rank is responsible for."""
        if self.layout is None:
            return k_total
        if self.layout.k_total != k_total:
            raise ConfigError(f"migration layout is for K={self.layout.k_total}, the layer has K={k_total}")
        return self.layout.own_columns(rank)

    @property
    def migrating(self) -> bool:
        return self.layout is not None and self.layout.active
