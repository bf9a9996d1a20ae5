"""The balancing runtime: binds a model's semimig layers and re-plans them every iteration.

    controller = BalanceController(model, BalanceConfig(mode="semi"))
    for epoch in range(epochs):
        controller.set_epoch(epoch)
        for batch in loader:
            loss = model(**batch).loss
            booster.backward(loss, optimizer); optimizer.step(); optimizer.zero_grad()
            controller.step()            # once per iteration, after the optimizer step

``step()`` closes the iteration: it reads this rank's busy time (its own GEMMs and injected
delays, never time blocked in collectives), decides the next iteration's actions and hands every
layer a :class:`~semimig.nn.directive.LayerDirective`.  Every rank of the tensor-parallel group
must call it, the same number of times: the decision uses collectives (a one-scalar all-reduce
for ZERO's reference time, an all-gather of busy times for MIG/SEMI) and is computed
identically everywhere, so no plan is ever broadcast.

Modes: ``baseline`` (dense, only measured and slowed), ``zero-rd`` / ``zero-pri`` /
``zero-pridiff-e`` / ``zero-pridiff-r`` (stragglers prune, Eq. 1 against the group mean of the
current busy times, which converges to the fastest rank as the straggler catches up), ``mig``
(stragglers migrate only), ``semi`` (Eq. 2 / Eq. 3 split between migration and resizing, with
cost curves from a pretest after the first iteration).

``force(prune=..., migrate=...)`` pins a plan (per-rank shares) for experiments and tests.
Layers named by ``BalanceConfig.dense_layers`` (the output head) always run dense.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import statistics
from dataclasses import dataclass, field
from typing import Mapping, Optional

import torch
import torch.nn as nn

from semimig.comm import primitives as P
from semimig.controller.config import ControllerConfig
from semimig.controller.curves import CostCurves
from semimig.controller.plan import GroupPlan, decide_plan
from semimig.controller.pretest import REFERENCE_COLUMNS, run_pretest
from semimig.migration.exchange import EXCHANGE_POLICIES, make_exchange
from semimig.migration.layout import MigrationLayout
from semimig.nn.balanced import BalancedLinearMixin
from semimig.nn.directive import LayerDirective, LayerState
from semimig.resizing.config import ResizingConfig
from semimig.resizing.lineage import LineageTable
from semimig.resizing.priority import ColumnVariationTracker, achieved_savings, pridiff_ratios, select_pruned
from semimig.resizing.ratio import ReferenceTime, columns_to_prune, pruning_ratio, refresh_reference
from semimig.straggler.busy import BusyMeter, BusyStats
from semimig.straggler.injection import StragglerConfig, StragglerInjector

logger = logging.getLogger(__name__)

MODES = ("baseline", "zero-rd", "zero-pri", "zero-pridiff-e", "zero-pridiff-r", "mig", "semi")
DEFAULT_PERIOD = 50


@dataclass(frozen=True, kw_only=True)
class BalanceConfig:
    """Everything the runtime needs; validated on construction."""

    mode: str = "semi"
    """One of :data:`MODES`."""
    resizing: ResizingConfig = field(default_factory=ResizingConfig)
    """Pruning settings; for ``zero-*`` modes the variant is taken from the mode name."""
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    """SEMI/MIG decision settings; its ``mode`` is derived from :attr:`mode`."""
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    """Injected slowdown (benchmarks and tests); ``pattern="none"`` in production."""
    exchange: str = "broadcast-reduce"
    """How migrated operands travel: one of ``EXCHANGE_POLICIES``."""
    interval: int = 1
    """Re-plan every ``interval`` iterations (the plan is kept in between)."""
    curves: Optional[CostCurves] = None
    """SEMI cost curves; ``None`` runs the pretest after the first iteration."""
    smoothing: int = 3
    """Busy times entering a decision are the median of the last ``smoothing`` iterations, so
    one descheduled GEMM does not turn a rank into a straggler."""
    dense_layers: tuple[str, ...] = ("classifier", "lm_head", "score", "qa_outputs")
    """Module-name suffixes of layers that never resize or migrate (still timed and slowed): the
    model's output head.  The paper balances the transformer layers (attention and MLP); pruning
    a sharded head would train the straggler's logits from a fraction of the features."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.exchange not in EXCHANGE_POLICIES:
            raise ValueError(f"exchange must be one of {EXCHANGE_POLICIES}, got {self.exchange!r}")
        if isinstance(self.interval, bool) or not isinstance(self.interval, int) or self.interval < 1:
            raise ValueError(f"interval must be an int >= 1, got {self.interval!r}")
        if isinstance(self.smoothing, bool) or not isinstance(self.smoothing, int) or self.smoothing < 1:
            raise ValueError(f"smoothing must be an int >= 1, got {self.smoothing!r}")
        if isinstance(self.dense_layers, str) or not all(isinstance(n, str) and n for n in self.dense_layers):
            raise ValueError(f"dense_layers must be a tuple of non-empty module-name suffixes, got {self.dense_layers!r}")
        if self.mode.startswith("zero-"):
            object.__setattr__(self, "resizing", dataclasses.replace(self.resizing, variant=self.mode[5:]))
        plan_mode = {"baseline": "baseline", "mig": "mig", "semi": "semi"}.get(self.mode, "zero")
        gamma_max = self.resizing.gamma_max
        default = ControllerConfig.__dataclass_fields__["gamma_max"].default
        if self.controller.gamma_max not in (default, gamma_max):
            raise ValueError(f"controller.gamma_max={self.controller.gamma_max!r} disagrees with "
                             f"resizing.gamma_max={gamma_max!r}: set it once, on resizing")
        if self.controller.migrators is not None and self.mode != "semi":
            raise ValueError(f"controller.migrators (λ={self.controller.migrators}) needs mode 'semi', got {self.mode!r}")
        object.__setattr__(self, "controller", dataclasses.replace(
            self.controller, mode=plan_mode, gamma_max=gamma_max))


@dataclass(frozen=True)
class StepReport:
    """What ``step()`` measured for the iteration that just ended and decided for the next."""

    iteration: int
    busy: BusyStats
    gamma_target: float
    gamma_per_layer: tuple[float, ...]
    achieved_savings: float
    migrate: Mapping[int, float]
    plan: Optional[GroupPlan]


@dataclass
class _Bound:
    name: str
    layer: BalancedLinearMixin
    dense: bool = False
    """Never resized or migrated (``BalanceConfig.dense_layers``); its GEMMs are still timed."""
    state: LayerState = field(default_factory=LayerState)
    tracker: Optional[ColumnVariationTracker] = None
    delta: Optional[torch.Tensor] = None
    tokens: int = 0


class BalanceController:
    """Per tensor-parallel group: measures, decides and applies balancing for one model."""

    def __init__(self, model: nn.Module, config: BalanceConfig = BalanceConfig(), *,
                 process_group=None, iterations_per_epoch: Optional[int] = None) -> None:
        self.config = config
        self.bound = [_Bound(name, m, dense=any(name == n or name.endswith("." + n) for n in config.dense_layers))
                      for name, m in model.named_modules() if isinstance(m, BalancedLinearMixin)]
        if not self.bound:
            raise ValueError(f"{type(model).__name__} has no semimig layers: shard it with SemiMigPolicy "
                             "or build it from semimig.nn.Linear1D_Col/Row")
        groups = {id(b.layer.process_group) for b in self.bound}
        if process_group is None:
            if len(groups) != 1:
                raise ValueError(f"the model's semimig layers use {len(groups)} process groups; pass process_group")
            process_group = self.bound[0].layer.process_group
        self.group = process_group
        self.rank, self.size = P.group_rank(process_group), P.group_size(process_group)
        device = self.bound[0].layer.weight.device
        self.injector = StragglerInjector(config.straggler, self.rank, self.size)
        self.meter = BusyMeter(self.injector, device=device)
        self.lineage = LineageTable()
        self.exchange = make_exchange(config.exchange, process_group)
        self.reference = ReferenceTime(threshold=config.resizing.refresh_threshold, reduce=config.resizing.t_ref)
        if iterations_per_epoch is not None and (isinstance(iterations_per_epoch, bool)
                                                 or not isinstance(iterations_per_epoch, int) or iterations_per_epoch < 1):
            raise ValueError(f"iterations_per_epoch must be an int >= 1 or None, got {iterations_per_epoch!r}")
        self.period = config.resizing.period or iterations_per_epoch or DEFAULT_PERIOD
        self.curves = config.curves
        self.generator = torch.Generator().manual_seed(config.resizing.seed * 1009 + self.rank)
        self.iteration, self.epoch = 0, 0
        self.plan: Optional[GroupPlan] = None
        self.forced: Optional[tuple[dict, dict]] = None
        self.reports: list[StepReport] = []
        self._recent: collections.deque = collections.deque(maxlen=config.smoothing)
        self._gammas: tuple[float, ...] = (0.0,) * len(self.bound)
        self._migrate: dict[int, float] = {}
        self._receivers: Optional[tuple[int, ...]] = None  # the plan's receivers (None: every non-migrating rank)
        self._theta_warned = False
        for b in self.bound:
            b.layer.layer_name = b.name
            if config.resizing.prioritized and config.mode.startswith(("zero", "semi")):
                b.tracker = ColumnVariationTracker(b.layer.weight.detach())
            b.layer.register_forward_pre_hook(self._note_tokens(b))
        self._apply()

    # ------------------------------------------------------------------ public
    def set_epoch(self, epoch: int) -> None:
        """Tell the injector (round-robin stragglers) which epoch runs."""
        self.epoch = epoch
        self.injector.set_position(epoch, self.iteration)

    def force(self, *, prune: Optional[Mapping[int, float]] = None,
              migrate: Optional[Mapping[int, float]] = None) -> None:
        """Pin the plan from the next iteration on: ``prune={rank: γ}``, ``migrate={rank: share}``.

        Shares are of each layer's K columns.  ``force()`` with no argument returns to the mode's
        own decisions.  Must be called identically on every rank.
        """
        if prune is None and migrate is None:
            self.forced = None
        else:
            prune, migrate = dict(prune or {}), dict(migrate or {})
            for what, table in (("prune", prune), ("migrate", migrate)):
                for rank, share in table.items():
                    if not 0 <= rank < self.size:
                        raise ValueError(f"force({what}=...): rank {rank} is outside the group of size {self.size}")
                    if not 0.0 <= share <= 1.0:
                        raise ValueError(f"force({what}=...): share for rank {rank} must be in [0, 1], got {share}")
            for rank in prune.keys() & migrate.keys():
                if prune[rank] + migrate[rank] > 1.0:
                    raise ValueError(f"force: rank {rank} sheds {prune[rank] + migrate[rank]} > 1 of its columns")
            previous = (self.forced, self._gammas, self._migrate)
            self.forced = (prune, migrate)
            self._gammas, self._migrate = self._forced_actions()
            try:
                self._apply()  # builds the layouts: an impossible plan raises here
            except ValueError:
                self.forced, self._gammas, self._migrate = previous
                self._apply()
                raise
            return
        self._apply()

    def step(self) -> StepReport:
        """Close the iteration: measure, decide (collectively), and set the next directives."""
        stats = self.meter.snapshot()
        self.meter.reset()
        self.iteration += 1
        self.injector.set_position(self.epoch, self.iteration)
        self._update_priorities()
        target = 0.0
        if self.forced:
            self._gammas, self._migrate = self._forced_actions()
        elif (self.iteration - 1) % self.config.interval == 0:
            target = self._decide(stats)
        flops = [b.layer.weight.shape[0] * b.layer.k_columns for b in self.bound]
        report = StepReport(self.iteration - 1, stats, target, self._gammas,
                            achieved_savings(self._gammas, flops), dict(self._migrate), self.plan)
        self.reports.append(report)
        self._apply()
        return report

    # ------------------------------------------------------------------ decisions
    def _decide(self, stats: BusyStats) -> float:
        mode = self.config.mode
        if mode == "baseline":
            return 0.0
        self._recent.append((stats.busy_s, stats.full_work_busy_s))
        busy = statistics.median(b for b, _ in self._recent)
        full = statistics.median(f for _, f in self._recent)
        if mode.startswith("zero"):
            # Eq. 1 with T_ref the group mean of the *current* busy times: as the straggler sheds
            # work its current time falls, the refreshed mean follows, and the fixed point is
            # the fast ranks' time.  Ranks within the noise tolerance of T_ref never prune.
            t_ref = refresh_reference(self.reference, busy, self.group)
            straggles = full > t_ref * (1.0 + self.config.controller.tol)
            gamma = pruning_ratio(full, t_ref, full, self.config.resizing.gamma_max) if straggles else 0.0
            if mode == "zero-pridiff-e" and gamma > 0:
                gamma = self.config.resizing.empirical_gamma
            self._gammas = self._layer_gammas(gamma)
            self._migrate = {}
            return gamma
        times = P.all_gather_floats(full, self.group)
        if self.curves is None:
            if not all(b.tokens for b in self.bound):
                raise RuntimeError("the SEMI pretest needs the token count of every layer: call step() after "
                                   "a training forward/backward, not before")
            weight = self.bound[0].layer.weight
            self.curves = run_pretest([(b.tokens, b.layer.weight.shape[0], b.layer.k_columns) for b in self.bound],
                                      self.group, gemm_timer=self.meter, device=weight.device, dtype=weight.dtype)
            self.meter.reset()  # the pretest's GEMMs are not the next iteration's work
        self.plan = decide_plan(times, REFERENCE_COLUMNS, self.curves, self.config.controller, previous=self.plan)
        mine = self.plan.actions[self.rank]
        self._gammas = self._layer_gammas(mine.gamma)
        self._migrate = {a.rank: a.migrate_share for a in self.plan.actions if a.migrate_share > 0}
        self._receivers = tuple(sorted({r for a in self.plan.actions for r in a.receivers})) or None
        return mine.shed_share

    def _layer_gammas(self, gamma: float) -> tuple[float, ...]:
        res = self.config.resizing
        if res.differentiated and gamma > 0 and all(b.delta is not None for b in self.bound):
            gammas = pridiff_ratios([b.delta for b in self.bound], gamma=gamma, alpha=res.alpha,
                                    theta=res.theta(self.period), gamma_max=res.gamma_max)
        else:
            gammas = (gamma,) * len(self.bound)
        return tuple(0.0 if b.dense else g for b, g in zip(self.bound, gammas))

    def _warn_if_theta_covers_all(self) -> None:
        """Log once when every resizable column is below PriDiff's threshold: a straggler then
        prunes ``gamma_max`` in each layer whatever it needs (``theta_iter`` is an absolute weight
        change per iteration, so an optimizer whose steps are smaller, e.g. Adam at lr <= theta_iter,
        puts every column under it).  Runs where δ changes, once per period."""
        res = self.config.resizing
        deltas = [b.delta for b in self.bound if not b.dense and b.delta is not None]
        if self._theta_warned or not res.differentiated or not deltas:
            return
        theta = res.theta(self.period)
        if not all(bool((d < theta).all()) for d in deltas):
            return
        self._theta_warned = True
        largest = max(float(d.max()) for d in deltas)
        logger.warning("PriDiff: every column's weight variation is below theta=%g (theta_iter=%g x %d "
                       "iterations; largest delta %.3g), so a straggler prunes gamma_max=%g in every layer "
                       "whatever it needs; set ResizingConfig.theta_iter below %.3g for per-layer ratios",
                       theta, res.theta_iter, self.period, largest, res.gamma_max, largest / self.period)

    def _forced_actions(self) -> tuple[tuple[float, ...], dict[int, float]]:
        prune, migrate = self.forced
        gamma = prune.get(self.rank, 0.0)
        return tuple(0.0 if b.dense else gamma for b in self.bound), {r: s for r, s in migrate.items() if s > 0}

    def _update_priorities(self) -> None:
        if self.iteration % self.period:
            return
        for b in self.bound:
            if b.tracker is not None:
                counts = self._prune_counts(b)
                b.delta = b.tracker.end_period(b.layer.weight.detach(), None if counts is None else counts > 0)
        self.lineage.reset_period()
        self._warn_if_theta_covers_all()

    # ------------------------------------------------------------------ directives
    def _apply(self) -> None:
        migrate = self._migrate
        for b, gamma in zip(self.bound, self._gammas):
            k = b.layer.k_columns
            counts = {} if b.dense else {r: min(k, round(k * share)) for r, share in migrate.items()}
            receivers = None if self.forced else self._receivers
            layout = MigrationLayout.build(self.size, k, counts, receivers) if any(counts.values()) else None
            if layout is None:
                b.state.clear()
            own = k - counts.get(self.rank, 0)
            n_prune = min(columns_to_prune(k, gamma), own)
            keep, pruned = None, torch.empty(0, dtype=torch.long)
            if n_prune > 0:
                pruned = self._select(b, own, n_prune)
                mask = torch.ones(own, dtype=torch.bool)
                mask[pruned] = False
                keep = torch.arange(own)[mask].to(b.layer.weight.device)
            elif own < k:
                keep = None  # prefix [0, own): the functional core handles it without a gather
            b.layer.directive = LayerDirective(
                iteration=self.iteration, keep=keep, layout=layout, exchange=self.exchange,
                impute=self.config.resizing.impute, timer=self.meter, state=b.state,
                on_forward=self._recorder(b.name, pruned, k), on_backward=self._reader(b.name, pruned))

    def _select(self, b: _Bound, own: int, n_prune: int) -> torch.Tensor:
        """The ``n_prune`` columns of ``[0, own)`` to drop: random (rd) or smallest δ first.

        Columns with distinct δ are pruned smallest first.  Ties (above all the columns never
        measured, δ = inf, e.g. those pruned in the first period) are broken by how often each
        column was pruned so far in *this* period, so tied columns take turns iteration by
        iteration.  Known consequence: a column pruned at any iteration keeps its old δ, so tied
        never-measured columns that take turns stay unmeasured (PriDiff's share below theta is
        frozen; see README).  Paper Alg. 1 keeps one list per period instead.
        """
        if self.config.resizing.variant == "rd":
            return select_pruned(torch.zeros(own), n_prune, "rd", self.generator)
        if b.delta is None:  # first period, no statistics yet: one stable set, like a priority list
            return torch.arange(n_prune)
        counts = self._prune_counts(b)
        return select_pruned(b.delta[:own], n_prune, "pri", tie_break=None if counts is None else counts[:own])

    def _prune_counts(self, b: _Bound) -> Optional[torch.Tensor]:
        try:
            return self.lineage.prune_counts(b.name, "weight")
        except KeyError:  # never pruned yet
            return None

    def _recorder(self, name: str, pruned: torch.Tensor, k: int):
        iteration = self.iteration

        def record() -> None:
            self.lineage.record(name, "weight", pruned, iteration, num_columns=k)
        return record

    def _reader(self, name: str, pruned: torch.Tensor):
        def read() -> None:
            recorded = self.lineage.lookup(name, "weight")
            if not torch.equal(recorded.cpu(), pruned.cpu()):
                raise RuntimeError(f"lineage of {name} changed between forward and backward")
        return read

    def _note_tokens(self, b: _Bound):
        def hook(module, args) -> None:
            if module.training:
                b.tokens = args[0].numel() // max(1, args[0].shape[-1])
        return hook

    @contextlib.contextmanager
    def dense(self):
        """Inside the block every layer runs densely (evaluation): no pruning, migration or delay."""
        saved = [b.layer.directive for b in self.bound]
        for b in self.bound:
            b.layer.directive = None
        try:
            yield
        finally:
            for b, directive in zip(self.bound, saved):
                b.layer.directive = directive

    # ------------------------------------------------------------------ inspection
    def lineage_entries(self):
        """The current lineage table entries (see :class:`semimig.resizing.lineage.LineageTable`)."""
        return self.lineage.entries()
