"""Turn straggler tolerance on in your own training script: one call after ``booster.boost``.

    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, custom_policy=SemiMigPolicy())
    model, optimizer, *_ = Booster(plugin=plugin).boost(model, optimizer)
    balancer = semimig.enable(model, plugin, optimizer=optimizer, mode="semi")
    for batch in loader:                       # the loop is unchanged
        loss = model(**batch).loss
        booster.backward(loss, optimizer)
        optimizer.step()                       # ...and the balancer re-plans right after it
        optimizer.zero_grad()
    print(balancer.report)                     # the latest StepReport

What it does: it builds a :class:`~semimig.controller.BalanceController` over the model's semimig
layers on the plugin's tensor-parallel group (``plugin.tp_group``) and calls its ``step()`` once
per optimizer step.  Modes are the controller's (``semi``, ``mig``, ``zero-rd``, ``zero-pri``,
``zero-pridiff-e``, ``zero-pridiff-r``, ``baseline``) plus ``off``, a synonym of ``baseline``: the
layers are timed (and slowed, if a test straggler is injected) but never resized or migrated; and
``reshard`` (below).
``straggler="fixed:1:4"`` (any :meth:`~semimig.straggler.injection.StragglerConfig.from_cli`
spec) injects a test straggler: TP-group rank 1's GEMMs take 4x as long, in every TP group.

Why the optimizer is hooked.  The controller's ``step()`` is collective over the TP group and must
run once per iteration, after the optimizer step, on every rank of the group.  ``optimizer.step()``
is the one call of a training loop that every rank makes exactly once per iteration whatever the
loop looks like (gradient accumulation, ``booster.execute_pipeline``, an fp16 step skipped for
overflow all still call it once), so hooking it keeps the controller in lock-step with the
user's loop with no line added.  The hook wraps the boosted optimizer's own ``step`` (the
instance attribute; :meth:`Balancer.close` removes it) rather than torch's
``register_step_post_hook`` on the inner optimizer, because Colossal-AI's wrappers skip the
inner step on fp16 overflow and ZeRO steps the inner optimizer on its own copies.  Pass no
``optimizer`` to call :meth:`Balancer.step` yourself instead.

What it logs (logger ``semimig.balancer``, on the first rank of each TP group, whose plan every rank
shares): at INFO the layers it binds, the first plan, every change of plan, every straggler
flagged or unflagged, and every ``log_every`` steps a line with the ranks' busy times and shed
shares; at WARNING, once, the first time a straggler is balanced — Python prints WARNING records
even when logging is not configured, so a run always shows that the balancer acted.

Re-sharding (DESIGN §8).  ``mode="reshard"`` is exact and never prunes: the layers are only timed
(and slowed by a test straggler), and after every step :class:`~semimig.resharder.Resharder` feeds
the pure :class:`~semimig.controller.reshard.ReshardPolicy` every rank's split of the step; when
a straggler has stayed (its speed ratio stable over a window) and the predicted gain over a
horizon pays for the move, every changed unit's weights and optimizer state move once
(:func:`semimig.shardformer.replan.apply_plan`) and the controller is rebound to the new shapes
(the same controller and configuration; its phase changes, :meth:`~semimig.controller.BalanceController.set_phase`).
``mode="semi"`` on a model that can re-plan does the same for the straggler that stays and keeps
resizing and migration as the instant reaction; once the shards are uneven it resizes only
(migration assumes equal K per rank; the log says so) and migrates again if a re-plan returns to
even.  Re-planning needs the model built with a plan in units
(``SemiMigPolicy(shard_plan=semimig.resharder.even_reshardable_plan(config, tp))``), the optimizer
hooked and ``pp_size == 1`` (ZeRO-1/2 re-plan in process too: their master shards are gathered,
moved and cut again); both modes refuse anything else by name.  ``mode="semi"`` on a model that
takes no plan in units (a model type other than Llama, Qwen2, Mistral, GPT-2 and ViT, or layers
that hold none) resizes and migrates only, and says so in one INFO line.  With ``dp_size > 1``
the numbers are gathered over the world; under plain DP (``zero_stage=0``) each replica's TP group
plans for itself (one policy per replica, a move of any replica moving every replica at the same
step: :func:`semimig.shardformer.replicas.apply_replica_plans`); under ZeRO every replica holds one
plan, solved for the slowest rank at each TP position (:func:`semimig.resharder.slowest_per_position`;
its flat buffers need equal shapes across the DP group).  With ``batch=`` under plain DP, one joint planner
(:mod:`semimig.resharder.joint`, :func:`semimig.sharding.joint.plan_job`) chooses every replica's plan and the
batch split together whenever a replica's policy decides, within every rank's memory
(``BatchSplit.memory_bytes``; one INFO line when memory, not speed, bounds the plan), and the batch split
only carries its samples out (no re-plan trigger of its own: one owner); under ZeRO Poplar's split absorbs the rest.
Before the first step ``enable`` runs a short device probe on the TP group (the same fixed GEMMs on
every rank, ~0.1 s) and moves at once for a rank that is clearly and consistently slow
(:meth:`~semimig.resharder.Resharder.probe`; ``ReshardConfig(probe=0)`` turns it off; with
``dp_size > 1`` read per replica, or at the slowest rank of each TP position under ZeRO, as the steps are).  One INFO line per
re-plan (plan, predicted step, bytes and seconds moved) and one with the measured step once a full
window ran under it; :attr:`Balancer.reshard_summary` has them all.

Data-parallel groups (``batch=``).  ``enable(..., batch=semimig.BatchSplit(global_batch_size=G))``
also splits each global batch between the plugin's DP groups (Poplar, DESIGN §6): every TP group
is one device, timed by its slowest member's busy time after balancing; the hook then steps a
:class:`~semimig.hybrid.HybridBalancer` (the controller's step, the group times, the plan's
agreement and re-plan) instead of the controller alone, and training takes its rows through
:meth:`Balancer.micro_batches` (:mod:`semimig.hybrid.split` has the loop).  ``tp_size=1`` and
``pp_size > 1`` are refused with it.

Refused (:class:`~semimig.errors.ConfigError`, naming the input): a plugin that is not
``HybridParallelPlugin``, a model with no semimig layers (boost it with
``custom_policy=SemiMigPolicy()``), an unknown mode, a straggler spec that does not parse, an
optimizer without ``step``, a pipeline schedule other than 1F1B (interleaved and zero-bubble
schedules run several model chunks per stage, whose forwards and backwards interleave across
iterations of the plan).  ``tp_size=1`` has nothing to balance: one warning, and the handle does
nothing.  A model already balanced (a second ``enable`` before ``close()``) is refused, and so is
``Balancer.step()`` when the optimizer is hooked (it would step the controller twice).  With ``pp_size > 1`` (1F1B) each stage's TP group balances its own layers.

Nothing of the balancer is saved in a checkpoint, by design: semimig layers hold no extra
parameters or buffers, so ``booster.save_model``/``load_model`` and the optimizer state are
exactly Colossal-AI's.  Priorities, lineage and timing history describe the machine (which rank
is slow now), not the model, so after a resume ``enable`` is called again and rebuilds them from
the first iterations (the first plan comes after the controller's ``patience`` decisions, the
PriDiff priorities after one period).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Union

import torch
import torch.nn as nn

from semimig._validate import check_int
from semimig.errors import ConfigError
from semimig.balancer.checks import _agree_on_call, _check_batch, _check_optimizer, _check_plugin, _config
from semimig.modes import ENABLE_MODES, Mode

__all__ = ["Balancer", "PlanView", "enable", "ENABLE_MODES"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PlanView:
    """A TP group's balancing decision as one report shows it (identical on every rank of the group).

    Two views are equal when the same ranks are flagged and shed the same shares; how a semi/mig
    plan splits a share between migration and resizing (``split``) is shown, not compared, since
    the controller applies a decision one or two iterations after it is made.
    """

    flagged: tuple[int, ...]
    """Ranks the controller treats as stragglers, slowest first."""
    shed: tuple[float, ...]
    """Share of each rank's K columns it is to shed (pruned + migrated), rounded to 0.001."""
    split: str = field(default="", compare=False)
    """The plan in force, e.g. ``"rank 1: prune 44.8%, migrate 30.7% to [0]"`` (semi/mig only)."""

    @classmethod
    def from_report(cls, report: Any, group_size: int) -> "PlanView":
        decision, plan = report.decision, report.plan
        shed = decision.shed if decision is not None else (0.0,) * group_size
        split = "" if plan is None else "; ".join(
            f"rank {a.rank}: prune {a.gamma:.1%}, migrate {a.migrate_share:.1%} to {list(a.receivers)}"
            for a in plan.actions if a.gamma > 0 or a.migrate_share > 0)
        return cls(flagged=tuple(report.flagged), shed=tuple(round(float(s), 3) for s in shed), split=split)

    @property
    def balancing(self) -> bool:
        """Some rank sheds work."""
        return any(s > 0 for s in self.shed)

    def describe(self) -> str:
        if not self.balancing:
            return "every rank dense" + (f" (flagged {list(self.flagged)}, not shedding)" if self.flagged else "")
        text = ", ".join(f"rank {r} sheds {s:.1%}" for r, s in enumerate(self.shed) if s > 0)
        return text + (f" ({self.split})" if self.split else "")


class Balancer:
    """The handle :func:`enable` returns: the controller, the latest report, and the hook."""

    def __init__(self, controller: Any, layers: list, *, optimizer: Any = None, log_every: int = 0,
                 active: bool = True, resharder: Any = None, rebind: Any = None, hybrid: Any = None) -> None:
        self.controller = controller
        self._layers = layers
        self.hybrid = hybrid
        """With ``enable(..., batch=BatchSplit(...))``: the :class:`~semimig.hybrid.HybridBalancer` that
        splits each global batch between the DP groups and steps the controller; ``None`` otherwise."""
        self.batch_report = None
        """The latest :class:`~semimig.hybrid.HybridStepReport` (with ``batch=``; ``None`` before the first step)."""
        self.resharder = resharder
        """Mode ``reshard`` (and ``semi`` on a model that can re-plan): the
        :class:`~semimig.resharder.Resharder` fed after every step; ``None`` otherwise."""
        self._rebind = rebind
        """With a resharder: ``rebind(controller, plan, settled=...)`` sets the controller's phase for the
        plan in force and rebinds it to the new shapes after a move (the bound layers; ``None``: unchanged)."""
        if resharder is not None:
            controller.meter.marks_spans = True  # the policy reads the pair spans (semimig.straggler.busy)
        self.active = active
        self.log_every = log_every
        self.report = None
        """The latest :class:`~semimig.controller.StepReport` (``None`` before the first step)."""
        self.steps = 0
        self._view: Optional[PlanView] = None
        self._rebound = False  # the controller was rebound to new shards: its next plan is not the run's first
        self._warned = False
        self._optimizer = None
        self._speaks = controller is None or controller.rank == 0
        self.timed_model = None
        """The model whose vocabulary collectives are timed (:mod:`semimig.shardformer.vocab_clock`)."""
        self.skip_model = None
        """The model whose idle ranks skip their steps (:mod:`semimig.shardformer.skip`); ``None``: none may."""
        if optimizer is not None:
            self._hook(optimizer)

    # ------------------------------------------------------------------ the loop
    def step(self):
        """Close the iteration (after ``optimizer.step()``): the controller's ``step()``, then the logs.

        Only without a hooked optimizer: the hook already calls it, and a second call per
        iteration would desynchronise the plan from the loop (refused).
        """
        if self._optimizer is not None:
            raise ConfigError("balancer.step() is called by the hooked optimizer.step(); do not call it as well "
                              "(or enable(..., optimizer=None) to call it yourself)")
        return self._step()

    def _step(self):
        if not self.active:
            return None
        if self.hybrid is not None:  # the hybrid steps the controller, then the DP groups' batch plan
            self.batch_report = self.hybrid.step()
            report = self.batch_report.balance
        else:
            report = self.controller.step()
        self.report = report
        self.steps += 1
        self._log(report)
        if self.resharder is not None:
            plan = self.resharder.observe(report)  # collective; equal on every rank
            samples = self.resharder.samples  # the joint planner's split (DP with a batch split): the next step's
            if samples is not None and self.hybrid is not None and samples != self.hybrid.plan.samples:
                self.hybrid.adopt(samples)
            if plan is not None or self.resharder.settled_now:
                layers = self._rebind(self.controller, self.resharder.plan, settled=plan is None)
                if layers is not None:
                    self._layers = layers
                    self._view, self._rebound = None, True
        return report

    def micro_batches(self, batch: Any) -> list:
        """This rank's DP group's micro-batches of one global ``batch`` (``enable(..., batch=...)`` only).

        ``batch`` is a tensor or a structure of tensors with ``global_batch_size`` rows, the same on
        every rank; the group takes its rows of the batch plan in force, cut into its micro-steps
        (:class:`~semimig.allocation.data.MicroBatch`: ``.data``, ``.scale_loss(loss)``, ``.is_last``).
        """
        if self.hybrid is None:
            raise ConfigError("balancer.micro_batches() splits batches between data-parallel groups: call "
                              "semimig.enable(..., batch=semimig.BatchSplit(global_batch_size=...)) to use it")
        return self.hybrid.micro_batches(batch)

    def evaluation_share(self, count: int) -> range:
        """This rank's DP group's rows of an evaluation batch of ``count`` rows (the same batches on every
        rank): its share of the batch plan in force (:func:`~semimig.allocation.evaluation_share`), so a
        slow group evaluates less, as it trains less, and no group waits at the next step for another's
        evaluation.  Run one forward per batch on these rows (a group with none: a one-row stand-in,
        weighted 0), sum each loss times its rows, then sum that and the rows over the DP group."""
        if self.hybrid is None:
            raise ConfigError("balancer.evaluation_share() splits evaluation between data-parallel groups by the "
                              "batch split: call semimig.enable(..., batch=semimig.BatchSplit(global_batch_size=...))")
        from semimig.allocation.data import evaluation_share

        return evaluation_share(count, self.hybrid.plan.samples, self.hybrid.layout.dp_rank)

    @property
    def batch_plan(self) -> Any:
        """The DP groups' batch plan in force (:class:`~semimig.allocation.plan.AllocationPlan`), or ``None``."""
        return None if self.hybrid is None else self.hybrid.plan

    @property
    def reshard_summary(self) -> Optional[dict]:
        """Re-plans so far (count, plans, bytes moved, seconds), or ``None`` without re-sharding."""
        return None if self.resharder is None else self.resharder.summary()

    def set_epoch(self, epoch: int) -> None:
        """Tell the controller which epoch runs (round-robin test stragglers follow it)."""
        if self.active:
            self.controller.set_epoch(epoch)

    @contextlib.contextmanager
    def dense(self) -> Iterator[None]:
        """Evaluation: inside the block every layer runs densely, unslowed and untimed."""
        with (self.controller.dense() if self.active else contextlib.nullcontext()):
            yield

    def close(self) -> None:
        """Remove the optimizer hook; the layers return to dense."""
        if self._optimizer is not None and getattr(self._optimizer, "step", None) is self._hooked_step:
            del self._optimizer.step  # the class's own step again
        self._optimizer = None
        if self.skip_model is not None:  # every rank computes again, the vocabulary even
            from semimig.shardformer import skip
            from semimig.shardformer.replan import current_plan

            model, self.skip_model = self.skip_model, None
            skip.release(model, current_plan(model).resolve(model.unwrap().config, self.controller.size))
        if self.active:
            for layer in self._layers:
                layer.directive = None
            self.controller.close()
            if self.resharder is not None:
                self.resharder.close()
            self.active = False
        if self.timed_model is not None:
            from semimig.shardformer import vocab_clock

            vocab_clock.uninstall(self.timed_model)
            self.timed_model = None

    # ------------------------------------------------------------------ internals
    def _hook(self, optimizer: Any) -> None:
        original = _check_optimizer(optimizer)

        def step(*args: Any, **kwargs: Any) -> Any:
            with self.controller.step_clock.region("update"):  # work per step, whatever the batch (.resharder.joint)
                result = original(*args, **kwargs)
            if self.skip_model is not None:  # idle ranks take the replicated parameters' new values
                from semimig.shardformer.skip import after_step

                after_step(self.skip_model)
            self._step()
            return result

        self._hooked_step = step
        self._optimizer = optimizer
        optimizer.step = step

    def _log(self, report: Any) -> None:
        view = PlanView.from_report(report, self.controller.size)
        previous, self._view = self._view, view
        if not self._speaks:
            return
        step = report.iteration
        if previous is None:
            what = "plan on the new shards" if self._rebound else "first plan"
            logger.info("semimig step %d: %s: %s", step, what, view.describe())
        else:
            for rank in view.flagged:
                if rank not in previous.flagged:
                    logger.info("semimig step %d: TP rank %d flagged as a straggler", step, rank)
            for rank in previous.flagged:
                if rank not in view.flagged:
                    logger.info("semimig step %d: TP rank %d no longer straggles", step, rank)
            if view.shed != previous.shed:
                logger.info("semimig step %d: plan changed: %s", step, view.describe())
        if view.balancing and not self._warned:
            self._warned = True
            logger.warning("semimig is balancing straggler(s) %s of its tensor-parallel group from step %d: %s",
                           list(view.flagged), step, view.describe())
        if self.log_every and (step + 1) % self.log_every == 0:
            decision = report.decision
            times = "n/a" if decision is None else ", ".join(f"{t * 1e3:.1f}" for t in decision.unpruned_s)
            logger.info("semimig step %d: busy %.1f ms on TP rank 0, unpruned times [%s] ms, %s",
                        step, report.busy.busy_s * 1e3, times, view.describe())


def _param_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's first floating-point parameter (the probe's GEMMs run in it)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def enable(model: nn.Module, plugin: Any, *, optimizer: Any = None, mode: Optional[str] = None,
           straggler: Union[str, Any, None] = None, log_every: int = 0, config: Any = None,
           iterations_per_epoch: Optional[int] = None, reshard: Any = None, batch: Any = None) -> Balancer:
    """Balance ``model``'s tensor-parallel layers against stragglers (module docstring).

    Args:
        model: the boosted model (``booster.boost`` with ``custom_policy=SemiMigPolicy()``).
        plugin: its ``HybridParallelPlugin``.
        optimizer: the boosted optimizer; its ``step`` is hooked.  ``None``: call
            :meth:`Balancer.step` after every ``optimizer.step()`` yourself.
        mode: one of :data:`ENABLE_MODES` (default ``config.mode``, else ``"semi"``).
        straggler: a test straggler: a spec like ``"fixed:1:4"`` or a ``StragglerConfig``.
        log_every: an INFO line every this many steps (0: only plan changes and flags).
        config: a :class:`~semimig.controller.BalanceConfig` for every other setting.
        iterations_per_epoch: the PriDiff period when ``config.resizing.period`` is unset.
        reshard: a :class:`~semimig.controller.reshard.ReshardConfig` for modes ``reshard`` and
            ``semi`` (default settings when ``None``).
        batch: a :class:`~semimig.hybrid.split.BatchSplit` to also split each global batch between
            the plugin's data-parallel groups (Poplar: faster TP groups take more samples; the
            group's time is its slowest member's after balancing); then feed training through
            :meth:`Balancer.micro_batches`.  ``None``: every DP rank keeps its own batch.

    Returns:
        The :class:`Balancer`; ``.report`` is the latest ``StepReport``, ``.reshard_summary`` the re-plans.

    Collective over the world: every rank of the job calls it, with the same settings (checked; a rank's
    own test ``straggler`` may differ).
    """
    # before any other collective; collective over the world
    _agree_on_call(plugin, mode, straggler, config, reshard, batch, iterations_per_epoch, optimizer)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model must be the boosted torch.nn.Module, got {type(model).__name__}")
    _check_plugin(plugin)  # every argument is checked before a layer is touched: a refusal leaves no state
    if optimizer is not None:
        _check_optimizer(optimizer)
    log_every = check_int("log_every", log_every, minimum=0)
    mode, balance_config = _config(mode, straggler, config)
    _check_batch(batch, plugin)
    from semimig.resharder import check_reshard, make_resharder
    from semimig.nn.balanced import BalancedLinearMixin

    layers = [m for m in model.modules() if isinstance(m, BalancedLinearMixin)]
    from colossalai.interface import ModelWrapper

    if plugin.tp_size == 1 and (layers or isinstance(model, ModelWrapper)):  # tp 1: the policy swaps no layer
        check_reshard(mode, model, plugin, reshard, optimizer)  # still refuses a reshard= that is no ReshardConfig
        logger.warning("semimig: tp_size=1, so there is no tensor-parallel group to balance; balancing is off")
        return Balancer(None, layers, active=False)
    if not layers:
        raise ConfigError(f"model {type(model).__name__} has no semimig layers: boost it with "
                          "HybridParallelPlugin(..., custom_policy=semimig.shardformer.SemiMigPolicy())")
    if any(m.directive is not None for m in layers):
        raise ConfigError(f"model {type(model).__name__} is already balanced (its layers hold directives): "
                          "close() the previous balancer or controller first")
    uneven = any(getattr(m, "shard_plans", None) for m in layers)
    if balance_config.mode == "mig" and uneven:
        raise ConfigError(f"mode='mig' migrates columns between equal shards, but {type(model).__name__} has uneven "
                          "tensor-parallel shards (SemiMigPolicy(shard_plan=...)): use 'semi', 'reshard', a zero-* "
                          "mode or 'off'")
    plan = check_reshard(mode, model, plugin, reshard, optimizer)
    skip_state = _install_skip(model, optimizer, plugin) if optimizer is not None else None
    from semimig.controller import BalanceController

    controller = BalanceController(model, balance_config, process_group=plugin.tp_group,
                                   iterations_per_epoch=iterations_per_epoch)
    from semimig.shardformer import vocab_clock

    vocab_clock.install(model)  # the vocabulary's collectives are the step's communication too
    if uneven:
        controller.set_phase(even=False)  # before any step: nothing decided yet to restart
        if mode is Mode.SEMI and controller.rank == 0:
            logger.info("semimig: mode=semi on uneven shards: resizing only (as %s), migration off (it assumes "
                        "equal K per rank)", controller.acting)
    resharder = rebind = None
    if plan is not None:
        joint = batch is not None and mode == "reshard"  # every replica's plan and the split: one planner
        resharder, rebind = make_resharder(model, optimizer, plugin, plan, mode, balance_config, reshard,
                                           iterations_per_epoch, batch=batch if joint else None,
                                           clock=controller.step_clock)
        if skip_state is not None and skip_state.blocked is None:  # priced and read as idle from the probe on
            skip_state.probe = resharder.allow_idle(True, clock=controller.clock)
            if not resharder.reads_idle:  # decided before the probe's move may leave a rank idle
                _block_skip(skip_state, resharder)
        if resharder.samples is not None:  # the split has one owner: the batch balancer only carries it out
            batch = dataclasses.replace(batch, allocation="even", replan=None)
        if resharder.probe(controller.clock, dtype=_param_dtype(model)) is not None:  # a device slow from the start
            layers = rebind(controller, resharder.plan, settled=False)
        else:
            controller.restart_step()  # the probe's time is no step's work
    if controller.rank == 0:
        logger.info("semimig: %d semimig layers in a tensor-parallel group of %d, mode=%s, straggler=%s "
                    "(output heads named %s stay dense)%s", len(layers), controller.size,
                    mode if mode == "reshard" else controller.acting, balance_config.straggler.to_cli(),
                    "/".join(balance_config.dense_layers),
                    f"; re-sharding from {plan}" if plan is not None else "")
    try:
        hybrid = None if batch is None else batch.hybrid_balancer(plugin, controller=controller)
        if hybrid is not None and resharder is not None and resharder.samples is not None:
            hybrid.adopt(resharder.samples)
            if torch.distributed.get_rank() == 0:
                logger.info("semimig: mode=reshard with a batch split over %d data-parallel replicas: one joint "
                            "planner chooses every replica's plan and the split (samples %s); the batch split "
                            "does not re-plan on its own", len(resharder.samples), list(resharder.samples))
        balancer = Balancer(controller, layers, optimizer=optimizer, log_every=log_every, resharder=resharder,
                            rebind=rebind, hybrid=hybrid)
        balancer.timed_model = model
        if skip_state is not None:
            balancer.skip_model = _start_skip(model, skip_state, resharder)
        return balancer
    except BaseException:
        for layer in layers:  # undo the controller's binding: a corrected call must not find it "balanced"
            layer.directive = None
        controller.close()
        vocab_clock.uninstall(model)
        if skip_state is not None and not skip_state.idle:  # the forward unwrapped (nothing skips yet)
            from semimig.shardformer import skip

            skip.uninstall(model)
        raise


def _install_skip(model: nn.Module, optimizer: Any, plugin: Any) -> Any:
    """The skip state (:mod:`semimig.shardformer.skip`), installed before any move so that a move to a plan
    that leaves a rank idle lets it skip; its reason logged once when idle ranks cannot skip."""
    from semimig.shardformer import skip

    state = skip.install(model, optimizer, plugin)
    if state.blocked is not None and state.rank == 0:
        logger.info("semimig: a rank a plan leaves idle will run its steps (it cannot skip them: %s)", state.blocked)
    return state


def _block_skip(state: Any, resharder: Any) -> None:
    state.blocked = "the re-shard policy reads an idle rank's speed by the device probe, which is off"
    resharder.allow_idle(False)
    if state.rank == 0:
        logger.info("semimig: a rank a plan leaves idle will run its steps (%s)", state.blocked)


def _start_skip(model: nn.Module, state: Any, resharder: Any) -> Optional[nn.Module]:
    """Idle ranks skip from now on under the plan in force (a collective over the TP group); ``model``, or
    ``None`` when they cannot (the re-shard policy reads an idle rank's speed by the device probe)."""
    from semimig.shardformer import skip
    from semimig.shardformer.replan import current_plan

    if state.blocked is None and resharder is not None and resharder.idle is None:
        _block_skip(state, resharder)
    if state.blocked is not None:  # every rank runs its steps: nothing of skipping stays on the model
        skip.uninstall(model)
        return None
    skip.configure(model, current_plan(model).resolve(model.unwrap().config, state.tp))
    return model
