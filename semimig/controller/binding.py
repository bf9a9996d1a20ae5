"""The layer side of the runtime: a model's semimig layers, their priorities, and their directives.

:class:`LayerBinding` holds, per semimig layer of a model, what outlives one iteration (the
per-layer :class:`LayerState`, Algorithm 1's :class:`PriorityList`, the token count), turns a
rank-level shed share into per-layer ratios (uniform, or PriDiff), and hands each layer the
:class:`LayerDirective` of the next iteration: which of its own K columns it keeps, which it
migrates, and the lineage hooks that record the pruned set in forward and check it in backward.

Everything here is local to the rank: per-layer ratios depend on the rank's own weight statistics,
but the rank-level shares, migration layouts and receivers come from the group's plan, which every
rank holds identically (:mod:`semimig.controller.agreement` checks it).
"""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import torch
import torch.nn as nn

from semimig.errors import ConfigError
from semimig.migration.layout import MigrationLayout
from semimig.nn.balanced import BalancedLinearMixin
from semimig.controller.reflex import StepReflex
from semimig.nn.directive import LayerDirective, LayerState
from semimig.resizing.config import ResizingConfig
from semimig.resizing.lineage import LineageTable
from semimig.resizing.pridiff import candidate_shares, layer_thresholds, pridiff_ratios, pridiff_ratios_for_savings
from semimig.resizing.priority import PriorityList, select_pruned
from semimig.resizing.ratio import columns_to_prune

__all__ = ["BoundLayer", "BoundPair", "LayerBinding", "PAIRED_MLPS", "gemm_weight"]

logger = logging.getLogger(__name__)

_PAIRING_SAID: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()
"""The pairing last logged per model: a re-plan rebuilds the binding, which says it again only if it changed."""

PAIRED_MLPS: tuple[str, ...] = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "GPT2MLP")
"""MLP classes whose column layers feed their row layer through elementwise functions only (the
activation, a gate's product): paired pruning (``ResizingConfig.paired``) may compact them."""


def gemm_weight(layer: BalancedLinearMixin) -> torch.Tensor:
    """The layer's weight as its GEMMs see it, ``[N, K]`` (GPT-2's Conv1D layers store ``[K, N]``)."""
    weight = getattr(layer, "gemm_weight", None)
    return (weight if weight is not None else layer.weight).detach()


@dataclass
class BoundLayer:
    name: str
    layer: BalancedLinearMixin
    dense: bool = False
    """Never resized or migrated (``BalanceConfig.dense_layers``); its GEMMs are still timed."""
    state: LayerState = field(default_factory=LayerState)
    priority: Optional[PriorityList] = None
    tokens: int = 0
    """``M`` of the layer's GEMMs in the last training forward (the pretest's shapes)."""
    timed_only: Optional[LayerDirective] = None
    """The reusable directive of a dense iteration (timed, nothing pruned or migrated)."""
    keep_cache: Optional[tuple] = None
    """``(key, keep, pruned)`` of the last keep set (see :meth:`LayerBinding._keep_set`)."""
    reflex: Optional["LayerReflex"] = None
    """This layer's hook of the step reflex (None: no reflex)."""

    @property
    def shape(self) -> tuple[int, int]:
        """``(N, K)`` of this rank's shard (read without detaching: a distributed tensor's detach
        deep-copies its sharding spec)."""
        weight = getattr(self.layer, "gemm_weight", None)
        n, k = (weight if weight is not None else self.layer.weight).shape
        return int(n), int(k)


@dataclass(frozen=True)
class BoundPair:
    """An MLP's column layers and the row layer they feed (``ResizingConfig.paired``)."""

    name: str
    columns: tuple[BoundLayer, ...]
    row: BoundLayer


def _unpairable(columns: list[BoundLayer], rows: list[BoundLayer]) -> Optional[str]:
    """Why an MLP's semimig layers cannot be pruned as a pair, or ``None``."""
    if len(rows) != 1 or not columns:
        return f"{len(columns)} column and {len(rows)} row layers (a pair needs column layers and one row layer)"
    row = rows[0]
    for b in (*columns, row):
        if b.dense:
            return f"{b.name} is a dense layer"
    for b in columns:
        layer = b.layer
        if getattr(layer, "gather_output", False) or getattr(layer, "skip_bias_add", False):
            return f"{b.name} gathers its output or skips its bias add"
        if len(getattr(layer, "split_sizes", None) or ()) > 1:
            return f"{b.name} is packed (its rows are parts of several outputs)"
        if b.shape[0] != row.shape[1]:
            return f"{b.name} has {b.shape[0]} output rows, {row.name} {row.shape[1]} input columns"
    if not getattr(row.layer, "parallel_input", True):
        return f"{row.name} splits its input itself (parallel_input=False)"
    return None


class LayerReflex:
    """One layer's side of the step reflex (:mod:`semimig.controller.reflex`).

    At the opening of each dense call of the layer (in training) it marks the rank's busy time so
    far; once the reflex has fired it hands out the layer's keep set at the fired ``γ`` (the same
    priority lists as a planned prune; never for a dense layer) and records it in the lineage table.
    """

    __slots__ = ("binding", "bound", "reflex", "meter", "handed")

    def __init__(self, binding: "LayerBinding", bound: BoundLayer, reflex: StepReflex, meter) -> None:
        self.binding, self.bound, self.reflex, self.meter = binding, bound, reflex, meter
        self.handed: Optional[tuple[int, torch.Tensor]] = None
        """``(iteration, pruned)`` of the last keep set handed out (the lineage check accepts it)."""

    def mark_call(self) -> None:
        """Mark a call whose keep set is fixed for the step (a paired layer's): the reflex's marks
        then follow every call of the step, as its references (clean dense steps) do."""
        if self.bound.layer.training:
            self.reflex.mark(self.meter.busy_s)

    def keep(self, planned_kept: Optional[int], forward: bool) -> Optional[torch.Tensor]:
        """Mark the call; once fired, the keep set at ``γ`` if it keeps fewer than ``planned_kept``
        (``None``: the call is dense), recorded as the layer's lineage of this iteration; never for
        a forward when the reflex prunes backward calls only (``ReflexConfig.forward``)."""
        b = self.bound
        if not b.layer.training:
            return None
        gamma = self.reflex.mark(self.meter.busy_s)
        if gamma == 0.0 or b.dense or (forward and not self.reflex.config.forward):
            return None
        k = b.shape[1]
        n_prune = columns_to_prune(k, gamma)
        if n_prune == 0 or (planned_kept is not None and k - n_prune >= planned_kept):
            return None
        keep, pruned = self.binding._keep_set(b, k, n_prune)
        self.binding.lineage.record(b.name, "weight", pruned, self.binding.iteration, num_columns=k)
        self.handed = (self.binding.iteration, pruned)
        return keep


class LayerBinding:
    """Every semimig layer of ``model`` and how a rank-level plan becomes per-layer directives."""

    def __init__(self, model: nn.Module, resizing: ResizingConfig, dense_layers: Sequence[str], *,
                 prioritized: bool, rank: int) -> None:
        self.resizing = resizing
        self.layers = [BoundLayer(name, m, dense=any(name == n or name.endswith("." + n) for n in dense_layers))
                       for name, m in model.named_modules() if isinstance(m, BalancedLinearMixin)]
        if not self.layers:
            raise ConfigError(f"{type(model).__name__} has no semimig layers: shard it with SemiMigPolicy "
                             "or build it from semimig.nn.Linear1D_Col/Row")
        self.lineage = LineageTable()
        self._theta_warned = False
        self._flops: Optional[list[float]] = None
        self._tuned = False
        """The fused kernels were tuned for the layers' shapes (:meth:`_tune_kernels`)."""
        self._shares: Optional[tuple[int, list[float], list[float]]] = None
        """PriDiff's ``(period, thresholds, candidate shares)`` of the resizable layers, read from the
        device once per statistics period (the layers' ``delta`` live beside their weights)."""
        self.generator = torch.Generator().manual_seed(resizing.seed * 1009 + rank)
        self.iteration = 0
        """The iteration of the directives in force (the reflex's lineage records carry it)."""
        self._hooks: list = []
        """The forward pre-hooks this binding put on its layers (:meth:`detach` removes them)."""
        self.pairs: tuple[BoundPair, ...] = self._find_pairs(model) if resizing.paired else ()
        modules = dict(model.named_modules())
        for pair in self.pairs:
            self._hooks.append(modules[pair.name].register_forward_pre_hook(self._reflex_pairs(pair)))
        for b in self.layers:
            b.layer.layer_name = b.name
            if prioritized:
                b.priority = PriorityList(gemm_weight(b.layer), revisit=resizing.revisit_pruned)
            self._hooks.append(b.layer.register_forward_pre_hook(self._note_tokens(b)))

    def _find_pairs(self, model: nn.Module) -> tuple[BoundPair, ...]:
        """The MLPs of a class in :data:`PAIRED_MLPS` whose semimig layers can prune as a pair; what it
        found is logged once per model (a re-plan's new binding repeats it only if it changed)."""
        by_layer = {id(b.layer): b for b in self.layers}
        pairs, said = [], []
        for name, module in model.named_modules():
            if type(module).__name__ not in PAIRED_MLPS:
                continue
            children = [by_layer[id(c)] for c in module.children() if id(c) in by_layer]
            columns = [b for b in children if b.layer.matrix_kind == "column"]
            rows = [b for b in children if b.layer.matrix_kind == "row"]
            why = _unpairable(columns, rows)
            if why is not None:
                said.append((logging.INFO, "paired pruning: %s prunes each layer's own K: %s", name, why))
                continue
            pairs.append(BoundPair(name, tuple(columns), rows[0]))
        if pairs:
            said.append((logging.INFO, "paired pruning: %d MLPs prune as pairs (%s, ...)", len(pairs), pairs[0].name))
        else:
            # INFO: pairing is the default, and a model without such an MLP (a ViT) is served as before
            said.append((logging.INFO, "paired pruning: %s has no MLP of %s whose semimig layers pair; every "
                         "layer prunes its own K", type(model).__name__, ", ".join(PAIRED_MLPS)))
        if _PAIRING_SAID.get(model) != tuple(said):
            _PAIRING_SAID[model] = tuple(said)
            for level, message, *args in said:
                logger.log(level, message, *args)
        return tuple(pairs)

    def pretest_shapes(self) -> list[tuple[int, int, int, str]]:
        """``(M, N, K, path)`` of every layer for the SEMI pretest (:data:`semimig.controller.pretest.PATHS`):
        a pair's column layers prune their output rows (``rows``), its row layer a compact input
        (``compact``), every other layer its own K (``gather``)."""
        paths = {b.name: "rows" for pair in self.pairs for b in pair.columns}
        paths.update({pair.row.name: "compact" for pair in self.pairs})
        return [(b.tokens, *b.shape, paths.get(b.name, "gather")) for b in self.layers]

    def detach(self) -> None:
        """Remove this binding's hooks from the layers (idempotent).  Each hook holds its layer's
        priority list (a copy of the weight on its device), so a controller that is closed or refused,
        or one a re-plan replaces, would otherwise leave a hook and a weight copy per layer behind."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()

    # ------------------------------------------------------------------ statistics (Alg. 1)
    def end_period(self, period: int) -> None:
        """Close a statistics period: new δ and priority lists (on the weights' devices), log PriDiff's
        candidate shares."""
        for b in self.layers:
            if b.priority is not None:
                b.priority.end_period(gemm_weight(b.layer), self._prune_counts(b))
        self.lineage.reset_period()
        self._shares = None
        if self.resizing.differentiated and self.layers[0].priority is not None:
            self._log_candidates(period)

    def _log_candidates(self, period: int) -> None:
        """Per layer, the share of columns below PriDiff's threshold this period (INFO); once, a
        WARNING when an absolute threshold covers every column of every layer (then a straggler
        prunes gamma_max everywhere, whatever it needs: the absolute theta is too large for this
        optimizer's steps)."""
        res = self.resizing
        resizable = [b for b in self.layers if not b.dense]
        thetas, shares = self._candidate_shares(period)
        logger.info("PriDiff (theta %s): share of columns below theta per layer: %s", res.theta_mode,
                    ", ".join(f"{b.name}={s:.2f}" for b, s in zip(resizable, shares)))
        if res.theta_mode == "absolute" and shares and min(shares) == 1.0 and not self._theta_warned:
            self._theta_warned = True
            deltas = [b.priority.delta for b in resizable]
            largest = max(float(d[d.isfinite()].max()) for d in deltas if d.isfinite().any())
            logger.warning("PriDiff: every column's weight variation is below theta=%g (theta_iter=%g x %d "
                           "iterations; largest delta %.3g), so a straggler prunes gamma_max=%g in every layer "
                           "whatever it needs; use theta_mode='relative' or theta_iter below %.3g",
                           thetas[0], res.theta_iter, period, largest, res.gamma_max, largest / period)

    def _candidate_shares(self, period: int) -> tuple[list[float], list[float]]:
        """PriDiff's thresholds and candidate shares of the resizable layers, computed once per
        statistics period (each reads a layer's ``delta`` back from its device)."""
        if self._shares is None or self._shares[0] != period:
            deltas = [b.priority.delta for b in self.layers if not b.dense]
            thetas = layer_thresholds(deltas, self.resizing, period)
            self._shares = (period, thetas, candidate_shares(deltas, thetas))
        return self._shares[1], self._shares[2]

    # ------------------------------------------------------------------ ratios
    def layer_flops(self) -> list[float]:
        """``N·K`` of every layer (GEMM FLOPs per token, up to a constant); shapes never change."""
        if self._flops is None:
            self._flops = [float(n * k) for n, k in (b.shape for b in self.layers)]
        return self._flops

    def layer_gammas(self, shed: float, period: int) -> tuple[float, ...]:
        """Per-layer pruning ratios for a rank-level shed share (dense layers: 0).

        Uniform for rd/pri; PriDiff (:mod:`semimig.resizing.pridiff`) once the first period has
        measured the columns: E takes ``shed`` as its uniform γ, R raises the floor until the
        FLOP-weighted savings of the resizable layers reach ``shed``.
        """
        res = self.resizing
        resizable = [b for b in self.layers if not b.dense]
        if shed <= 0 or not resizable:
            return (0.0,) * len(self.layers)
        if not res.differentiated or not all(b.priority is not None and b.priority.measured for b in resizable):
            return tuple(0.0 if b.dense else shed for b in self.layers)
        _, shares = self._candidate_shares(period)
        if res.variant == "pridiff-r":
            flops = [f for f, b in zip(self.layer_flops(), self.layers) if not b.dense]
            ratios = pridiff_ratios_for_savings(shares, flops, gamma=shed, alpha=res.alpha, gamma_max=res.gamma_max)
        else:
            ratios = pridiff_ratios(shares, gamma=shed, alpha=res.alpha, gamma_max=res.gamma_max)
        it = iter(ratios)
        return tuple(0.0 if b.dense else next(it) for b in self.layers)

    # ------------------------------------------------------------------ directives
    @property
    def migrating(self) -> bool:
        """Some layer migrates or receives columns on this rank (its directive has a layout)."""
        return any(b.layer.directive is not None and b.layer.directive.layout is not None for b in self.layers)

    def attach_reflex(self, reflex: Optional[StepReflex], meter) -> None:
        """Give every layer's dense directive a hook of ``reflex`` (None: detach it)."""
        for b in self.layers:
            b.reflex = None if reflex is None else LayerReflex(self, b, reflex, meter)
            b.timed_only = None  # rebuilt with (or without) the hook at the next apply

    def signature(self) -> tuple:
        """The layers' shard shapes: what the reflex's references are valid for (a re-shard changes it)."""
        return tuple(b.shape for b in self.layers)

    def apply(self, *, iteration: int, gammas: Sequence[float], migrate: Mapping[int, float],
              receivers: Optional[tuple[int, ...]], group_size: int, rank: int, exchange, meter) -> bool:
        """Hand every layer its directive for ``iteration`` (see the module docstring); True when
        every layer runs dense on this rank (nothing pruned, migrated or received).  The step
        reflex's hook rides on every directive that does not migrate."""
        self.iteration = iteration
        if not self._tuned and any(gammas) and all(b.tokens for b in self.layers):
            self._tune_kernels()
        dense = True
        paired = self._paired_keep_sets(gammas, migrate)
        for b, gamma in zip(self.layers, gammas):
            if id(b) in paired:
                self._apply_paired(b, *paired[id(b)], iteration, meter)
                dense = False
                continue
            n, k = b.shape
            counts = self._migrated_counts(b, migrate)
            layout = MigrationLayout.build(group_size, k, counts, receivers) if any(counts.values()) else None
            if layout is None:
                b.state.clear()
            own = k - counts.get(rank, 0)
            n_prune = min(columns_to_prune(k, gamma), own)
            if n_prune == 0 and layout is None:
                # Dense and timed: one directive per layer, reused while nothing changes (no
                # per-iteration allocation, no lineage record of an empty set).
                if b.timed_only is None or b.timed_only.timer is not meter:
                    b.timed_only = LayerDirective(iteration=0, impute=self.resizing.impute, timer=meter, state=b.state,
                                                  reflex=b.reflex)
                b.layer.directive = b.timed_only
                continue
            dense = False
            keep, pruned = None, torch.empty(0, dtype=torch.long)
            if n_prune > 0:
                keep, pruned = self._keep_set(b, own, n_prune)
            b.layer.directive = LayerDirective(
                iteration=iteration, keep=keep, layout=layout, exchange=exchange,
                impute=self.resizing.impute, timer=meter, state=b.state,
                on_forward=self._recorder(b.name, pruned, k, iteration), on_backward=self._reader(b, pruned, iteration),
                reflex=b.reflex if layout is None else None)
        return dense

    def _reflex_pairs(self, pair: BoundPair):
        """The MLP's forward pre-hook: once the step reflex has fired earlier in the step (and prunes
        forwards), a pair whose layers all run their dense directive runs the rest of the step paired
        at the fired ``γ`` instead of pruning each layer's own K (an MLP it fires inside keeps the
        per-layer reaction: its first layers already ran).  The next :meth:`apply` restores them."""
        def hook(module, args) -> None:
            members = (*pair.columns, pair.row)
            hooked = pair.row.reflex
            if not module.training or hooked is None or not hooked.reflex.config.forward:
                return
            gamma = hooked.reflex.gamma
            if gamma == 0.0 or any(m.layer.directive is None or m.layer.directive is not m.timed_only for m in members):
                return  # not fired, or a planned prune, migration or evaluation holds the pair
            keep_pruned = self._pair_keep_set(pair, gamma)
            if keep_pruned is not None:
                meter = pair.row.layer.directive.timer
                for m in members:
                    self._apply_paired(m, *keep_pruned, self.iteration, meter)
        return hook

    def _migrated_counts(self, b: BoundLayer, migrate: Mapping[int, float]) -> dict[int, int]:
        """Columns of ``b`` each rank migrates this iteration (none for a dense layer)."""
        k = b.shape[1]
        return {} if b.dense else {r: min(k, round(k * share)) for r, share in migrate.items()}

    def _pair_keep_set(self, pair: BoundPair, gamma: float) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """``(keep, pruned)`` of the pair's units at ``gamma`` (the row layer's priority list), or None."""
        k = pair.row.shape[1]
        n_prune = min(columns_to_prune(k, gamma), k)
        return self._keep_set(pair.row, k, n_prune) if n_prune else None

    def _paired_keep_sets(self, gammas: Sequence[float], migrate: Mapping[int, float]) -> dict:
        """``{id(bound layer): (keep, pruned)}`` for every layer of a pair that prunes this iteration:
        the row layer's kept units at its ratio, shared by its column layers.  A pair none of whose
        layers migrates or receives; the others prune their own K (:meth:`apply`)."""
        out: dict = {}
        ratio = {id(b): g for b, g in zip(self.layers, gammas)}
        for pair in self.pairs:
            members = (*pair.columns, pair.row)
            if any(any(self._migrated_counts(m, migrate).values()) for m in members):
                continue
            keep_pruned = self._pair_keep_set(pair, ratio[id(pair.row)])
            if keep_pruned is not None:
                out.update((id(m), keep_pruned) for m in members)
        return out

    def _apply_paired(self, b: BoundLayer, keep: torch.Tensor, pruned: torch.Tensor, iteration: int, meter) -> None:
        """A pair member's directive: the row layer keeps ``keep`` and takes it compact; a column
        layer computes those rows only (its lineage records the rows it dropped)."""
        b.state.clear()
        n, k = b.shape
        row = b.layer.matrix_kind == "row"
        matrix, size = ("weight", k) if row else ("weight.rows", n)
        b.layer.directive = LayerDirective(
            iteration=iteration, keep=keep if row else None, compact_input=row, rows=None if row else keep,
            impute=self.resizing.impute, timer=meter, state=b.state, reflex=b.reflex,  # the reflex only marks
            on_forward=self._recorder(b.name, pruned, size, iteration, matrix),
            on_backward=self._reader(b, pruned, iteration, matrix))

    def _tune_kernels(self) -> None:
        """Before the first pruned iteration, between steps: compile and tune the fused kernels for
        the layers' shapes (:func:`semimig.kernels.tune.tune_kernels`; nothing without CUDA and Triton),
        so no timed GEMM carries Triton's first-call compile and tuning."""
        from semimig.kernels.tune import tune_kernels

        self._tuned = True
        pairs = {b.name for pair in self.pairs for b in (*pair.columns, pair.row)}
        shapes = sorted({(b.tokens, *b.shape) for b in self.layers if not b.dense and b.name not in pairs})
        weight = gemm_weight(self.layers[0].layer)
        tune_kernels(shapes, dtype=weight.dtype, device=weight.device)

    def _keep_set(self, b: BoundLayer, own: int, n_prune: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keep, pruned)`` index tensors; the same objects while the period's list and the
        sizes stay (the kernels' plan cache and the lineage checks then skip their work)."""
        key = None if self.resizing.variant == "rd" or b.priority is None else (own, n_prune, b.priority.tracker.periods)
        if key is not None and b.keep_cache is not None and b.keep_cache[0] == key:
            return b.keep_cache[1], b.keep_cache[2]
        pruned = self._select(b, own, n_prune)
        mask = torch.ones(own, dtype=torch.bool)
        mask[pruned] = False
        keep = torch.arange(own)[mask].to(b.layer.weight.device)
        if key is not None:
            b.keep_cache = (key, keep, pruned)
        return keep, pruned

    def _select(self, b: BoundLayer, own: int, n_prune: int) -> torch.Tensor:
        """The ``n_prune`` columns of ``[0, own)`` to drop: random (rd) or the period's priority list."""
        if self.resizing.variant == "rd" or b.priority is None:
            return select_pruned(torch.zeros(own), n_prune, "rd", self.generator)
        block = self.resizing.block  # whole aligned blocks (round(n_prune / block) of them) where block divides own
        return b.priority.select(own, n_prune, block=block if own % block == 0 else 1)

    def _prune_counts(self, b: BoundLayer) -> Optional[torch.Tensor]:
        try:
            return self.lineage.prune_counts(b.name, "weight")
        except KeyError:  # never pruned yet
            return None

    def _recorder(self, name: str, pruned: torch.Tensor, k: int, iteration: int, matrix: str = "weight"):
        def record() -> None:
            self.lineage.record(name, matrix, pruned, iteration, num_columns=k)
        return record

    def _reader(self, b: BoundLayer, pruned: torch.Tensor, iteration: int, matrix: str = "weight"):
        """Backward's check that the layer's lineage is what its forward pruned: the plan's set, or
        the step reflex's larger one handed out at this forward (``matrix``: ``"weight.rows"`` for a
        paired column layer's dropped rows)."""
        def read() -> None:
            recorded = self.lineage.lookup(b.name, matrix)
            handed = None if b.reflex is None else b.reflex.handed
            handed = handed[1] if handed is not None and handed[0] == iteration else None
            if recorded is pruned or recorded is handed:  # the very tensor recorded: equal, and no device sync
                return
            recorded = recorded.cpu()  # another tensor: its values decide (one sync on an accelerator)
            if torch.equal(recorded, pruned.cpu()) or (handed is not None and torch.equal(recorded, handed.cpu())):
                return
            raise RuntimeError(f"lineage of {b.name} changed between forward and backward")
        return read

    @staticmethod
    def _note_tokens(b: BoundLayer):
        def hook(module, args) -> None:
            if module.training:
                b.tokens = args[0].numel() // max(1, args[0].shape[-1])
        return hook

    def clear_directives(self) -> list:
        """Detach every directive (dense evaluation); returns them for :meth:`restore`."""
        saved = [b.layer.directive for b in self.layers]
        for b in self.layers:
            b.layer.directive = None
        return saved

    def restore(self, saved: list) -> None:
        for b, directive in zip(self.layers, saved):
            b.layer.directive = directive
