"""The balancing runtime: binds a model's semimig layers and re-plans them every iteration.

    controller = BalanceController(model, BalanceConfig(mode="semi"), process_group=plugin.tp_group)
    for epoch in range(epochs):
        controller.set_epoch(epoch)
        for batch in loader:
            loss = model(**batch).loss
            booster.backward(loss, optimizer); optimizer.step(); optimizer.zero_grad()
            controller.step()            # once per iteration, after the optimizer step

``step()`` closes the iteration.  Every rank of the tensor-parallel group must call it, the same
number of times: it performs one small all-gather (every rank's work fraction and busy time, and
the digest of the plan it applied, :mod:`semimig.controller.agreement`), raises
:class:`~semimig.errors.PlanDisagreement` on every rank if the plans differed, updates the timing
model of every rank (:mod:`semimig.controller.timing`), decides who sheds how much
(:mod:`semimig.controller.shedding`, DESIGN §3a: only on sustained, significant evidence, and only
while pruning pays) and, in modes ``semi``/``mig``, how the shed columns split between migration
and resizing (:func:`~semimig.controller.plan.decide_plan`, Eqs. 2-3), and hands every layer its
:class:`~semimig.nn.directive.LayerDirective` for the next iteration.  All ranks decide from the
same gathered numbers, so no plan is ever broadcast.

Modes: ``baseline`` (dense, only measured and slowed), ``zero-rd`` / ``zero-pri`` /
``zero-pridiff-e`` / ``zero-pridiff-r`` (stragglers prune), ``mig`` (stragglers migrate),
``semi`` (Eq. 2 / Eq. 3 split; SEMI's cost curves come from a pretest started the first time a
straggler is flagged and advanced one small task per step while one is, so a run without
stragglers, or the free phases of one that comes and goes, never pay for it).  In mode ``semi`` migration
must also pay in wall time: after a few iterations of it the same stragglers try resizing only,
and the faster split is kept (:mod:`semimig.controller.trial`; the iteration's wall time travels
in the same all-gather).

``force(prune=..., migrate=...)`` pins a plan (per-rank shares) for experiments and tests; it is
collective and checks at once that every rank forced the same plan.  Layers named by
``BalanceConfig.dense_layers`` (the output head) always run dense.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import time
import weakref
from typing import Mapping, Optional

import torch.nn as nn

from semimig._validate import check_int
from semimig.comm import primitives as P
from semimig.controller.actions import GroupActions, StepReport, check_forced
from semimig.controller.agreement import (
    ObservationExchange,
    check_agreement,
    describe,
    exchange_observations,
    plan_digest,
)
from semimig.controller.balance_config import MODES, BalanceConfig
from semimig.controller.binding import LayerBinding
from semimig.controller.deciding import Decisions
from semimig.controller.phase import Phase
from semimig.controller.plan import GroupPlan
from semimig.controller.pretest import PretestRun
from semimig.controller.reflex import StepReflex
from semimig.controller.shedding import ShedDecision, ShedPolicy
from semimig.controller.timing import RankTiming, observation_problem
from semimig.controller.trial import MigrationTrial
from semimig.errors import ConfigError
from semimig.migration.exchange import make_exchange
from semimig.modes import Mode
from semimig.nn.balanced import BalancedLinearMixin
from semimig.resizing.pridiff import achieved_savings
from semimig.straggler.busy import BusyMeter, BusyStats
from semimig.straggler.clock import make_clock
from semimig.straggler.device import DeviceClock, DeviceTime
from semimig.straggler.injection import StragglerInjector
from semimig.straggler.nvml import HealthWatch

__all__ = ["BalanceConfig", "BalanceController", "GroupActions", "MODES", "StepReport"]

logger = logging.getLogger(__name__)

DEFAULT_PERIOD = 50


class BalanceController(Decisions, Phase):
    """Per tensor-parallel group: measures, decides and applies balancing for one model.

    A plan decided at ``step()`` ``j`` is *pending*: its digest travels in the background
    all-gather posted at that step, collected at step ``j + 1``, and the plan reaches the layers
    from iteration ``j + 2`` only once every rank is known to hold the same one — so a plan that
    differs between ranks never reaches a layer.  Decisions use the observations collected at
    the same step (those of the iteration before), so a measurement acts three iterations later.

    Except for resizing only: a plan in which nobody migrates, replacing one in which nobody
    migrated, reaches the layers from the next iteration (a measurement acts two iterations
    later), because a straggler that comes and goes must be met within a few iterations and
    pruning changes no collective — a rank that pruned differently computes the same collectives
    with different numbers for one iteration, and its digest still raises
    :class:`~semimig.errors.PlanDisagreement` on every rank at the next step.  A plan that starts
    or changes migration changes the collectives' layouts and still waits for its digest.
    """

    def __init__(self, model: nn.Module, config: BalanceConfig = BalanceConfig(), *,
                 process_group=None, iterations_per_epoch: Optional[int] = None) -> None:
        if not isinstance(model, nn.Module):
            raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(config, BalanceConfig):
            raise ConfigError(f"config must be a BalanceConfig, got {config!r}")
        check_int("iterations_per_epoch", iterations_per_epoch, minimum=1, allow_none=True)
        self.config = config
        """The configuration in force, as given: never rewritten (the phase below is runtime state)."""
        self._model = model
        layers = [m for m in model.modules() if isinstance(m, BalancedLinearMixin)]
        groups = {id(m.process_group) for m in layers}
        if process_group is None:
            if len(groups) > 1:
                raise ConfigError(f"the model's semimig layers use {len(groups)} process groups; pass process_group")
            process_group = layers[0].process_group if layers else None
        self.group = process_group
        self.rank, self.size = P.group_rank(process_group), P.group_size(process_group)
        self.injector = StragglerInjector(config.straggler, self.rank, self.size)  # refuses a bad rank before any hook
        self.binding = self._bind()
        try:
            self._build(config, process_group, iterations_per_epoch)
        except BaseException:
            self.binding.clear_directives()  # a refused controller leaves the model as it found it
            self.binding.detach()
            clock = getattr(self, "clock", None)
            if clock is not None:
                clock.detach()
            if hasattr(self, "_untime"):
                self._untime()
            raise

    def _build(self, config: BalanceConfig, process_group, iterations_per_epoch: Optional[int]) -> None:
        """The rest of ``__init__``, after the layers are bound."""
        res = config.resizing
        device = self.binding.layers[0].layer.weight.device
        self._collective_device = P.collective_device(process_group)
        self.step_clock = make_clock(device, lag=0 if device.type != "cuda" else 1)
        """The step's device times (DESIGN §3b): semimig's GEMMs and collectives as regions; a host
        step is read at its own end, a CUDA step one step late (its events never waited for)."""
        injecting = config.straggler.pattern != "none"
        self.meter = BusyMeter(self.injector if injecting else None, device=device, clock=self.step_clock)
        """The injector reaches the meter only when a test straggler is configured: an injecting meter
        waits for the device around every GEMM to time it, which a real run must never do."""
        self._untime = P.time_collectives(self.meter.comm)  # semimig's collectives are the step's communication
        self.health = HealthWatch(device, rank=self.rank)  # NVML's clocks and throttle reasons, logged (CUDA only)
        straggler = config.straggler
        self.clock: Optional[DeviceClock] = None
        """The whole-device test straggler (``scope=device``, a pattern configured) and only it: wraps
        the collectives of :mod:`torch.distributed` to sleep its slowdown before each and splits the
        step by them.  ``None`` otherwise: nothing in :mod:`torch.distributed` is patched."""
        if straggler.pattern != "none" and straggler.scope == "device":
            self.clock = DeviceClock(self.injector, device=device).attach()
            weakref.finalize(self, self.clock.detach)
        self.exchange = make_exchange(config.exchange, process_group)
        self.period = res.period or iterations_per_epoch or DEFAULT_PERIOD
        self.curves = config.curves
        self.iteration, self.epoch = 0, 0
        self.reports: collections.deque = collections.deque(maxlen=4096)
        self._nonfinite_warned = False
        self.holding, self.even = False, True
        self.baseline: Optional[tuple[float, ...]] = None
        """Each rank's busy seconds measured under the uneven plan in force (:meth:`set_phase`), or ``None``."""
        self._start_decisions()

    def _bind(self) -> LayerBinding:
        """Bind the model's layers as they are shaped now (the binding caches every layer's shape)."""
        res = self.config.resizing_in_force()  # a zero-* mode's variant
        return LayerBinding(self._model, res, self.config.dense_layers, prioritized=res.prioritized and
                            self.config.mode.resizes, rank=self.rank)

    def _start_decisions(self) -> None:
        """A fresh decision state for the layers as bound and the phase in force: the acting mode's
        step reflex, evidence policy and migration trial, every layer dense; timing models that
        continue the previous ones' history (:meth:`RankTiming.carry_history`)."""
        config, acting = self.config, self.acting
        ctl = config.controller_in_force()  # resizing's gamma_max
        on_host = self.step_clock.backend == "host"  # the reflex reads the step's busy time as it runs
        self.reflex = StepReflex(ctl.reflex, gamma_max=config.gamma_max) \
            if acting.resizes and ctl.reflex and on_host else None
        """Mode zero-*/semi on a host clock: the rank's own pruning within a step (None: off; off on CUDA,
        where the open step's events are not read before the step ends)."""
        self.binding.attach_reflex(self.reflex, self.meter)
        before = getattr(self, "timings", ())
        self.timings = [RankTiming(ctl.window, react_steps=ctl.react_steps, change_ratio=ctl.change_ratio,
                                   change_sigmas=ctl.change_sigmas) for _ in range(self.size)]
        for timing, old in zip(self.timings, before):
            timing.carry_history(old)  # warm: a slowdown after a move is seen within a few steps
        pridiff_e = config.variant == "pridiff-e" and acting.variant is not None
        fixed = config.resizing.empirical_gamma if pridiff_e else None
        self.policy = ShedPolicy(self.size, ctl, fixed_shed=fixed, mode=acting.plan_mode, baseline=self.baseline)
        self.resize_only: set[int] = set()
        """Mode semi: ranks whose shedding with migration did not pay; they only resize from then on."""
        wants_trial = ctl.migration_trial and acting is Mode.SEMI and ctl.migrators is None
        self.trial = MigrationTrial(ctl.migration_trial) if wants_trial else None
        """Mode semi: the wall-time check that migration pays (:mod:`semimig.controller.trial`);
        off when ``ControllerConfig.migrators`` fixes who migrates (the λ sweep)."""
        self._replan = False
        self._pretest_run: Optional[PretestRun] = None
        """Mode semi: the pretest in progress (one task per step), ``None`` before and after."""
        self._flagged_before: tuple[int, ...] = ()
        """The ranks flagged at the previous ``step()`` (no pretest task in the step that flags one)."""
        self._trial_events: list[str] = []
        self._step_clock: Optional[float] = None
        self.forced: Optional[tuple[dict, dict]] = None
        self._current = self._pending = GroupActions(prune=(0.0,) * self.size)
        self._exchange = ObservationExchange(self.group, self._collective_device)
        self._posted: tuple = ({}, {}, self._pending, None)
        """What the posted all-gather checks: the applied plan's description, the pending one's, the
        pending actions themselves (applied once the check passes), and the actions applied in the
        posted iteration (what SEMI's migration trial classifies its wall time by)."""
        self._gammas: tuple[float, ...] = (0.0,) * len(self.binding.layers)
        self._setup = describe(exchange=config.exchange, dense=tuple(b.dense for b in self.binding.layers))
        """What every plan's digest also covers: the ranks must share the migration exchange and which
        layers stay dense, or the same plan runs different collectives (a hang).  (Not the shard shapes:
        an uneven plan gives each rank its own.)"""
        self._apply()

    # ------------------------------------------------------------------ public
    @property
    def lineage(self):
        """The lineage table (what was pruned where and when)."""
        return self.binding.lineage

    @property
    def plan(self) -> Optional[GroupPlan]:
        """The SEMI/MIG plan in force (``None`` in the zero modes, while balanced, or while forced)."""
        return None if self.forced else self._current.plan

    @property
    def decision(self) -> Optional[ShedDecision]:
        """The latest evidence and shares of the group (flags, unpruned times, reference)."""
        return self._pending.decision

    def set_epoch(self, epoch: int) -> None:
        """Tell the injector (round-robin stragglers) which epoch runs."""
        self.epoch = check_int("epoch", epoch, minimum=0)
        self.injector.set_position(epoch, self.iteration)

    def force(self, *, prune: Optional[Mapping[int, float]] = None,
              migrate: Optional[Mapping[int, float]] = None) -> None:
        """Pin the plan from the next iteration on: ``prune={rank: γ}``, ``migrate={rank: share}``.

        Shares are of each layer's K columns.  ``force()`` with no argument returns to the mode's
        own decisions.  Collective (with or without arguments): every rank must call it with the same
        arguments; a mismatch — a bad argument on one rank only included — raises
        :class:`~semimig.errors.PlanDisagreement` on every rank, before any layer uses it (a rank that
        refused alone would leave the others waiting in their next collective).
        """
        unforce, problem = prune is None and migrate is None, None
        try:
            prune, migrate = check_forced("prune", prune, self.size), check_forced("migrate", migrate, self.size)
            for rank in prune.keys() & migrate.keys():
                if prune[rank] + migrate[rank] > 1.0:
                    raise ConfigError(f"force: rank {rank} sheds {prune[rank] + migrate[rank]} > 1 of its columns")
        except ConfigError as err:
            problem = str(err)
        forced = None if unforce or problem else (prune, migrate)
        wanted = {**describe(forced=forced, problem=problem), **self._setup}  # the report names the refusal
        digest = plan_digest({**describe(forced=forced, refused=problem is not None), **self._setup})
        digests = [row[2] for row in exchange_observations(1.0, 1.0, (digest, 0), False, self.group,
                                                           self._collective_device)]
        check_agreement(digests, wanted, self.group, what="forced plan (force() arguments)")
        if problem is not None:  # every rank holds the same refusal
            raise ConfigError(problem)
        if unforce:
            self.forced = None
            self._apply()
            return
        previous = self.forced
        self.forced = (prune, migrate)
        try:
            self._apply()  # builds the layouts: an impossible plan raises here
        except ValueError:
            self.forced = previous
            self._apply()
            raise

    def close(self) -> None:
        """Stop the whole-device straggler's clock if any (the collectives are unwrapped once no clock
        is attached) and remove the layers' hooks; idempotent."""
        if self.clock is not None:
            self.clock.detach()
        self._untime()
        self.binding.detach()

    def step(self) -> StepReport:
        """Close the iteration: measure, check agreement, decide (collectively), set the next directives.

        The iteration's observation and the digests of the plan it applied and of the plan
        decided for later are posted in a background all-gather, collected at the next
        ``step()``; there every rank checks the digests (a pending plan reaches the layers only
        once they agree), feeds every rank's observation to its timing model and decides.
        """
        stats, device_time, wall = self._close_step()
        self.health.poll()  # at most once per HealthWatch.every_s; nothing without NVML
        reflex_gamma = self.reflex.end_step(stats.busy_s) if self.reflex is not None else 0.0
        observed = (stats.work_fraction, stats.busy_s)
        if reflex_gamma > 0.0:
            logger.info("iteration %d: rank %d ran %.1fx its recent steps' pace from layer call %d on and pruned "
                        "gamma=%.2f of its columns for the rest of the step (reflex)", self.iteration, self.rank,
                        self.reflex.slowdown, self.reflex.fired_at, reflex_gamma)
            observed = (1.0, self.reflex.dense_s)  # the dense step it would have been (StepReflex.dense_s)
        problem = observation_problem(stats.work_fraction, stats.busy_s)
        valid = stats.gemm_count > 0 and problem is None
        if not math.isfinite(wall):
            problem, wall = f"non-finite wall time {wall!r} s", 0.0  # 0: unknown to the migration trial
        if problem is not None and problem.startswith("non-finite") and not self._nonfinite_warned:
            self._nonfinite_warned = True  # once: a NaN run would repeat it every iteration
            logger.warning("semimig: iteration %d on rank %d: %s; not an observation: skipped (this warning is "
                           "given once)", self.iteration, self.rank, problem)
        applied_now = None if self.forced else self._current
        with self.meter.comm():
            rows = self._exchange.collect()
        if rows is not None:
            applied, pending, verified, applied_actions = self._posted
            check_agreement([row[2] for row in rows], applied, self.group,
                            what=f"plan applied in iteration {self.iteration - 1}")
            check_agreement([row[3] for row in rows], pending, self.group,
                            what=f"plan decided at step {self.iteration}")
            for timing, scale, (work, busy, _, _, ok, _, sudden, other) in zip(self.timings, self.policy.scale, rows):
                if ok:  # other: the step's compute minus busy time (ShedPolicy's other_s)
                    timing.observe(work, busy / scale, sudden=sudden, other_s=other / scale)
            self._current = verified  # equal on every rank: now it may reach the layers
            walls = [row[5] for row in rows]
            if all(math.isfinite(w) for w in walls):  # every rank posts a finite wall (0 = unknown)
                self._run_trial(min(walls), max(walls), applied_actions)
        digest = self._digest
        self.iteration += 1
        self.injector.set_position(self.epoch, self.iteration)
        if self.iteration % self.period == 0:
            self.binding.end_period(self.period)
        if not self.forced and (self.iteration - 1) % self.config.interval == 0 and rows is not None:
            self._pending = self._decide(self._pending)
            if not self._current.migrate and not self._pending.migrate:
                self._current = self._pending  # resizing only: at once (see the class docstring)
        decision = self._pending.decision
        flagged = () if decision is None else tuple(decision.flagged)
        if self._pretest_run is not None and flagged and flagged == self._flagged_before:
            # only while a straggler is flagged: the curves serve it, and a group without one (the
            # free phases of a straggler that comes and goes) pays nothing (identical on every rank).
            # Not in the step whose decision flagged it: that step ran at the straggler's own pace
            # (its plan not yet in force, at most the reflex's relief), and a task's GEMMs on the
            # slowed rank would add to the slowest step of the straggler's onset
            self._advance_pretest()  # its own time is not the next iteration's work or traffic
        self._flagged_before = flagged
        pending = {**self._pending.describe(self.acting.value), **self._setup}
        self._posted = (self._description, pending, self._pending, applied_now)
        # the rest of this rank's own work (ShedPolicy: "The rest of a rank's own work"); unknown (NaN) when the
        # clock saw no compute, or the step's GEMMs were not all timed (a reflex step: its dense time is estimated)
        compute = 0.0 if device_time is None else device_time.compute_s
        other = max(compute - stats.busy_s, 0.0) if compute > 0.0 and reflex_gamma == 0.0 else math.nan
        with self.meter.comm():
            self._exchange.post(*observed, (digest, plan_digest(pending)), valid, wall, sudden=reflex_gamma > 0.0,
                                other_s=other)
        self._apply()
        report = StepReport(self.iteration - 1, stats, self._shed_target(), self._gammas,
                            achieved_savings(self._gammas, self.binding.layer_flops()),
                            dict(self._migrate()), self.plan, self._pending.decision, digest, device_time,
                            reflex_gamma)
        self.reports.append(report)
        return report

    def restart_step(self) -> None:
        """The open iteration starts now: what ran since the last ``step()`` (the pretest, the device
        probe, a move) is no iteration's work or traffic."""
        self.meter.reset()
        if self.clock is not None:
            self.clock.take()

    def _close_step(self) -> tuple[BusyStats, Optional[DeviceTime], float]:
        """The step clock's boundary: the busy numbers and the device split of the iteration it
        resolves (on the host the one just ended; on CUDA the one before, after one event wait at
        most), and the iteration's wall time (0 when unknown)."""
        resolved = self.meter.end_step(wait=True)
        if resolved is None:  # CUDA: its events are not complete (another stream) or none yet (the first step)
            stats, times = BusyStats(busy_s=0.0, work_fraction=1.0, gemm_count=0, collective_wait_s=0.0), None
        else:
            stats, times = resolved
        if times is not None and times.dropped:  # the clock's pool ran dry: its sums are short
            stats = dataclasses.replace(stats, gemm_count=0)
        if self.clock is not None:  # the whole-device straggler's split (its sleeps are compute)
            device_time = self.clock.take()
        elif times is None:
            device_time = None
        else:
            device_time = DeviceTime(wall_s=times.wall_s, comm_s=times.comm_s, sleep_s=0.0, collectives=0,
                                     dp_s=times.dp_s, update_s=times.update_s)
        if self.step_clock.backend != "host":
            return stats, device_time, 0.0 if times is None else times.wall_s
        now = time.perf_counter()
        wall = 0.0 if self._step_clock is None else now - self._step_clock
        self._step_clock = now
        return stats, device_time, wall

    def _shed_target(self) -> float:
        """This rank's shed share (pruned + migrated) in force for the next iteration."""
        if self.forced:
            prune, migrate = self.forced
            return prune.get(self.rank, 0.0) + migrate.get(self.rank, 0.0)
        return self._current.prune[self.rank] + self._current.migrate.get(self.rank, 0.0)

    def _migrate(self) -> Mapping[int, float]:
        if self.forced:
            return {r: s for r, s in self.forced[1].items() if s > 0}
        return self._current.migrate

    # ------------------------------------------------------------------ directives
    def _apply(self) -> None:
        """Hand the layers the actions in force (forced, or the verified current plan)."""
        if self.forced:
            gamma = self.forced[0].get(self.rank, 0.0)
            self._gammas = tuple(0.0 if b.dense else gamma for b in self.binding.layers)
            receivers = None
            self._description = {**describe(mode=self.acting.value, forced=self.forced), **self._setup}
        else:
            self._gammas = self.binding.layer_gammas(self._current.prune[self.rank], self.period)
            receivers = self._current.receivers
            self._description = {**self._current.describe(self.acting.value), **self._setup}
        self._digest = plan_digest(self._description)
        dense = self.binding.apply(iteration=self.iteration, gammas=self._gammas, migrate=self._migrate(),
                                   receivers=receivers, group_size=self.size, rank=self.rank, exchange=self.exchange,
                                   meter=self.meter)
        if self.reflex is not None:
            timing, state = self.timings[self.rank], self.policy.states[self.rank]
            # f from planned pruning where fitted, capped where the controller would back off
            fixed = min(timing.fixed_fraction, self.config.controller.max_fixed_fraction) if timing.informed else 0.0
            armed = not self.binding.migrating and not self.forced and self.iteration >= state.backoff_until
            self.reflex.begin_step(armed=armed, dense=dense, fixed_fraction=fixed,
                                   signature=self.binding.signature())

    @contextlib.contextmanager
    def dense(self):
        """Inside the block every layer runs densely (evaluation): no pruning, migration or delay; and its
        time is no step's work: the step clock, the whole-device straggler's clock and the host's wall time
        of the step leave it out, so an evaluation between steps reads as no slowdown."""
        saved = self.binding.clear_directives()
        start = time.perf_counter()
        try:
            with self.step_clock.region("off"), (self.clock.off() if self.clock is not None
                                                 else contextlib.nullcontext()):
                yield
        finally:
            self.binding.restore(saved)
            if self._step_clock is not None:
                self._step_clock += time.perf_counter() - start

    # ------------------------------------------------------------------ inspection
    def lineage_entries(self):
        """The current lineage table entries (see :class:`semimig.resizing.lineage.LineageTable`)."""
        return self.lineage.entries()
