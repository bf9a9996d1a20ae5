"""The 2-D composition's runtime: Poplar's batch plan across the DP groups, SEMI inside each TP group.

    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, zero_stage=1, custom_policy=SemiMigPolicy())
    model, optimizer, *_ = booster.boost(model, optimizer)
    semi = BalanceController(model, BalanceConfig(mode="semi"), process_group=plugin.tp_group)
    layout = GridLayout.from_plugin(plugin)
    curves = profile_group_curves(layout, probe, batch_sizes=(16, 32), max_batch_size=64)
    balancer = HybridBalancer(plugin, layout=layout, curves=curves, global_batch_size=64, controller=semi)
    for batch in global_batches:                      # the same global batch on every rank
        micro = balancer.micro_batches(batch)         # this group's share, cut into micro-steps
        run_iteration(booster, model, optimizer, iter(micro), loss_fn, zero_stage=balancer.zero_stage)
        optimizer.step(); optimizer.zero_grad()
        balancer.step()                               # SEMI step, group times, re-plan check

Per iteration ``step()`` closes the SEMI controller's iteration (or reads a busy source when the
TP layers are not semimig's, e.g. the baseline's straggler hooks); when the plan may change (Poplar
with a re-plan trigger) it then gathers ``(busy time, batch plan digest, batch fingerprint)`` over
the TP group (whose ranks run in lockstep anyway) and posts the group's summary — its slowest
member's busy time ``T_g`` and the range of its digests — to an asynchronous all-gather over the DP
group (:class:`~semimig.comm.lagged.LaggedRows`), read at the next step: no rank waits for another
node at the step it measured, and there is no per-step barrier across the world.  Every rank reads
the same rows, one step late: the digests prove every rank used the same batch plan
(:mod:`.agreement`; on a mismatch every rank joins one world gather that names the ranks), and
``T_g`` with the predictions of the plan it was measured under feed the re-plan trigger
(:mod:`.replan`), unless a re-plan came in between; when it fires, every rank rescales the curves,
allocates again, verifies the new plan (one int64 all-gather) and logs it.  A plan that cannot change (even split, or no trigger) is verified once,
when it is set, and costs no collective per iteration.  Gradients stay the global-batch mean: each micro-step's loss is scaled
by ``m·D/G`` (:mod:`semimig.allocation.data`), whatever the split, and the SEMI controller's
migration is exact.
"""
from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from torch.utils._pytree import tree_map

from semimig._validate import check_choice, check_int
from semimig.allocation.allocate import even_plan, poplar_plan
from semimig.allocation.data import MicroBatch
from semimig.allocation.plan import AllocationPlan, DevicePlan
from semimig.allocation.request import AllocationRequest
from semimig.allocation.speed import MIN_TIME_S, SpeedCurve
from semimig.comm import primitives as P
from semimig.comm.lagged import LaggedRows
from semimig.controller.agreement import check_agreement, ranks_by_value
from semimig.errors import ConfigError
from semimig.hybrid.agreement import batch_plan_digest, describe_batch_plan, verify_batch_plan
from semimig.hybrid.layout import GridLayout, group_maxima
from semimig.hybrid.replan import ReplanConfig, ReplanDecision, ReplanTrigger, scale_curve
from semimig.hybrid.split import ALLOCATIONS

logger = logging.getLogger(__name__)

__all__ = ["ALLOCATIONS", "HybridBalancer", "HybridStepReport", "profile_group_curves"]


@dataclass(frozen=True, kw_only=True)
class HybridStepReport:
    """What :meth:`HybridBalancer.step` measured and decided."""

    iteration: int
    group_busy_s: tuple[float, ...]
    """``T_g``: each group's slowest member's busy time in the iteration before the one that ended
    (the exchange is lagged a step; empty at the first step and without a re-plan trigger)."""
    samples: tuple[int, ...]
    """Samples per group in the plan for the next iteration."""
    replan: Optional[ReplanDecision] = None
    """The re-plan decided at this step, if any."""
    balance: Any = None
    """The SEMI controller's :class:`~semimig.controller.runtime.StepReport` (None without one)."""


class HybridBalancer:
    """Batch plan across the DP groups of a ``HybridParallelPlugin`` (module docstring).

    Args:
        plugin: the booster's ``HybridParallelPlugin`` (its ``zero_stage`` is the plan's stage).
        curves: one speed curve per group (group order), in the currency of the busy times.
        global_batch_size: samples per iteration over all groups.
        controller: the group's SEMI ``BalanceController`` (its ``step()`` is called here), or
        busy_source: when the layers are not semimig's, a callable returning this rank's busy
            seconds of the iteration that just ended and starting the next (e.g. reading and
            resetting a :class:`~semimig.straggler.hooks.BaselineInjection`); at most one of the
            two; with neither, no busy time is measured and no re-plan happens.
        allocation: ``"poplar"`` (Algorithm 2) or ``"even"`` (the homogeneous split, never re-planned).
        replan: the re-plan trigger's settings; ``None`` keeps the first plan.
        layout: the grid (read from ``plugin`` when omitted; a collective).
        calibrating: ``curves`` are a common guess, not a profile (:class:`~semimig.hybrid.split.BatchSplit`
            with ``curves=None``): the first re-plan sets every group's speed from measurement and
            is logged as that calibration.
    """

    def __init__(self, plugin: Any, *, curves: Sequence[SpeedCurve], global_batch_size: int,
                 controller: Any = None, busy_source: Optional[Callable[[], float]] = None,
                 allocation: str = "poplar",
                 replan: Optional[ReplanConfig] = ReplanConfig(), comm_time_s: float = 0.0,
                 max_accumulation_steps: Optional[int] = None, layout: Optional[GridLayout] = None,
                 calibrating: bool = False) -> None:
        check_choice("allocation", allocation, ALLOCATIONS)
        if controller is not None and busy_source is not None:
            raise ConfigError("pass a SEMI controller or a busy source, not both")
        if busy_source is not None and not callable(busy_source):
            raise ConfigError(f"busy_source must be a callable returning seconds, got {busy_source!r}")
        self.layout = layout if layout is not None else GridLayout.from_plugin(plugin)
        if len(curves) != self.layout.dp_size:
            raise ConfigError(f"curves must hold one speed curve per data-parallel group ({self.layout.dp_size}), "
                              f"got {len(curves)}")
        self.controller, self.busy_source, self.allocation = controller, busy_source, allocation
        self.zero_stage = int(plugin.zero_stage)
        self.request = AllocationRequest(curves=tuple(curves), global_batch_size=global_batch_size,
                                         zero_stage=self.zero_stage, comm_time_s=comm_time_s,
                                         max_accumulation_steps=max_accumulation_steps)
        measured = controller is not None or busy_source is not None
        self.calibrating = bool(calibrating) and bool(replan) and allocation == "poplar" and measured
        self.trigger = ReplanTrigger(self.layout.dp_size, replan, calibrate=self.calibrating) \
            if replan and allocation == "poplar" and measured else None
        self.iteration = 0
        self.replans: list[ReplanDecision] = []
        self._batch_fingerprint = 0
        """:func:`batch_fingerprint` of the global batch :meth:`micro_batches` cut this iteration (0: none)."""
        self._lagged = LaggedRows(self.layout.dp_group)
        """Each group's summary of a step, all-gathered over the DP group and read at the next step."""
        self._set_plan(self._allocate(self.request))

    # ------------------------------------------------------------------ plan
    @property
    def plan(self) -> AllocationPlan:
        """The batch plan in force (identical on every rank, verified)."""
        return self._plan

    def _allocate(self, request: AllocationRequest) -> AllocationPlan:
        return poplar_plan(request) if self.allocation == "poplar" else even_plan(request)

    def _set_plan(self, plan: AllocationPlan) -> None:
        verify_batch_plan(plan)
        self._plan = plan

    def adopt(self, samples: Sequence[int]) -> None:
        """Take ``samples[g]`` rows per group from the next iteration on, chosen by another owner (the joint
        planner of :class:`~semimig.resharder.Resharder`, identical on every rank): each group's rows in
        micro-steps of at most its curve's ``max_batch_size``, verified like any plan (collective: one
        int64 all-gather).  Only where this balancer does not re-plan on its own (no trigger)."""
        if self.trigger is not None:
            raise ConfigError("adopt(): this batch split re-plans on its own (a re-plan trigger); a plan chosen "
                              "elsewhere needs replan=None: one owner of the split")
        samples = tuple(check_int(f"samples[{g}]", b, minimum=0) for g, b in enumerate(samples))
        if len(samples) != self.layout.dp_size or sum(samples) != self.request.global_batch_size:
            raise ConfigError(f"adopt(): samples {list(samples)} must give the {self.layout.dp_size} groups the "
                              f"global batch {self.request.global_batch_size}")
        devices = []
        for b, curve in zip(samples, self.request.curves):
            micro = min(b, curve.max_batch_size)
            steps = -(-b // micro) if micro else 1
            devices.append(DevicePlan(name=curve.name, micro_batch_size=micro, accumulation_steps=steps,
                                      last_batch_size=b - (steps - 1) * micro))
        self._set_plan(AllocationPlan(zero_stage=self.zero_stage, global_batch_size=self.request.global_batch_size,
                                      devices=tuple(devices), comm_time_s=self.request.comm_time_s))

    def micro_batches(self, batch: Any) -> list[MicroBatch]:
        """This group's micro-batches of one global ``batch`` (tensors with ``gbs`` rows, same on every rank).

        Group ``g`` takes rows ``[offset_g, offset_g + samples_g)`` (:meth:`AllocationPlan.offset`),
        cut into its micro-steps; every TP rank of the group gets the same rows.  A micro-step with no
        samples (a group the plan gives nothing, or an empty last micro-step of ZeRO-2's lockstep plan)
        still has to run forward and backward to join the gradient collectives, and many models cannot
        run a batch of zero rows (Hugging Face attention reshapes to ``[0, heads, -1, d]``): it carries
        the global batch's first row as a stand-in, with ``size = 0``, whose
        :meth:`~semimig.allocation.data.MicroBatch.scale_loss` is ``0·loss`` — zero gradients, exactly.
        Under a re-planning split the next :meth:`step` also checks that every rank passed the same
        batch (:func:`batch_fingerprint`).
        """
        plan, g = self._plan, self.layout.dp_rank
        rows = {int(t.shape[0]) for t in _tensors(batch)}
        if rows != {plan.global_batch_size}:
            raise ConfigError(f"a global batch has {plan.global_batch_size} rows in every tensor, got {sorted(rows)}")
        self._batch_fingerprint = batch_fingerprint(batch)
        device = plan.device(g)
        start, out = plan.offset(g), []
        for step, size in enumerate(device.micro_batch_sizes):
            a, b = (start, start + size) if size else (0, 1)  # an empty micro-step: a one-row stand-in, loss x 0
            data = tree_map(lambda t, a=a, b=b: t[a:b] if isinstance(t, torch.Tensor) else t, batch)
            out.append(MicroBatch(data=data, size=size, step=step, is_last=step == device.accumulation_steps - 1,
                                  global_batch_size=plan.global_batch_size, dp_world_size=plan.num_devices))
            start += size
        return out

    # ------------------------------------------------------------------ per iteration
    def step(self) -> HybridStepReport:
        """Close the iteration (collective over all ranks): SEMI step, group times, agreement, re-plan."""
        balance = self.controller.step() if self.controller is not None else None
        busy = self._busy(balance)
        group_busy: list[float] = []
        decision = None
        if self.trigger is not None:  # without a trigger the plan never changes: verified once, no collective
            digest, fingerprint = float(batch_plan_digest(self._plan)), float(self._batch_fingerprint)  # as used
            tp = P.all_gather_rows([busy, digest, fingerprint], self.layout.tp_group)
            summary = [max(r[0] for r in tp)] + [f(r[i] for r in tp) for i in (1, 2) for f in (min, max)]
            tag = (self.iteration, digest, fingerprint, self._plan, self._predicted(), len(self.replans))
            lagged = self._lagged.exchange(summary, tag)
            self._batch_fingerprint = 0
            if lagged is not None:
                group_busy, decision = self._consume(*lagged)
        self.iteration += 1
        return HybridStepReport(iteration=self.iteration - 1, group_busy_s=tuple(group_busy),
                                samples=self._plan.samples, replan=decision, balance=balance)

    def _consume(self, rows: list[list[float]], tag: tuple) -> tuple[list[float], Optional[ReplanDecision]]:
        """A step's rows, one per group (DP-group order is group order): the plan and batch checks,
        then ``T_g`` against that step's predictions into the trigger (not across a re-plan)."""
        iteration, digest, fingerprint, plan, predicted, replans = tag
        digests = {v for r in rows for v in r[1:3]}
        fingerprints = {v for r in rows for v in r[3:5]}
        if len(digests) > 1 or len(fingerprints) > 1:  # every rank sees it: name the ranks (one world gather)
            world = P.all_gather_rows([digest, fingerprint], None)
            check_agreement([int(r[0]) for r in world], describe_batch_plan(plan), None,
                            what=f"Poplar batch plan used in iteration {iteration}")
            _check_same_batch([int(r[1]) for r in world], iteration)
        group_busy = [r[0] for r in rows]
        if replans != len(self.replans):  # measured under a plan the trigger has already replaced
            return group_busy, None
        decision = self.trigger.observe(group_busy, predicted)
        if decision is not None:
            self._replan(decision)
        return group_busy, decision

    def _predicted(self) -> list[float]:
        """``P_g`` per group: the plan's time, or — for a group given no sample, which runs a one-row
        stand-in per micro-step — its curve's time for one sample per micro-step."""
        return [d.predicted_time_s if d.samples else d.accumulation_steps * curve.time(1)
                for d, curve in zip(self._plan.devices, self.request.curves)]

    def _busy(self, balance: Any) -> float:
        if balance is not None:
            return float(balance.busy.busy_s)
        return float(self.busy_source()) if self.busy_source is not None else 0.0

    def _replan(self, decision: ReplanDecision) -> None:
        old = self._plan.samples
        curves = tuple(scale_curve(c, s) for c, s in zip(self.request.curves, decision.scales))
        self.request = AllocationRequest(curves=curves, global_batch_size=self.request.global_batch_size,
                                         zero_stage=self.zero_stage, comm_time_s=self.request.comm_time_s,
                                         max_accumulation_steps=self.request.max_accumulation_steps)
        self._set_plan(self._allocate(self.request))
        self.replans.append(decision)
        if self.calibrating:  # the first decision replaces the common guess by each group's measured speed
            self.calibrating = False
            seconds = [d.predicted_time_s for d in self._plan.devices]
            logger.info("calibrated the batch plan at iteration %d from the groups' measured times: predicted "
                        "%s s per iteration; samples %s -> %s", self.iteration, [round(t, 4) for t in seconds],
                        list(old), list(self._plan.samples))
            return
        logger.info("re-planned the batch at iteration %d: groups %s ran %s x their model; samples %s -> %s",
                    self.iteration, list(decision.changed_groups), [round(s, 3) for s in decision.scales], list(old),
                    list(self._plan.samples))


# ---------------------------------------------------------------------------------- profiling
def profile_group_curves(layout: GridLayout, probe: Callable[[int], float], *, batch_sizes: Sequence[int],
                         max_batch_size: int, repeats: int = 2) -> list[SpeedCurve]:
    """Poplar's time profile per TP group (collective over all ranks; identical result everywhere).

    ``probe(b)`` runs one forward/backward of ``b`` samples on this rank's group (no optimizer
    step) and returns this rank's busy seconds.  For each ``b`` of ``batch_sizes`` and each of
    ``repeats`` runs the busy times are all-gathered; group ``g``'s time at ``b`` is the median
    over runs of its slowest member's.  Memory is not searched (``max_batch_size`` is given):
    the curve's points are ``(b, time)`` and its interpolation :mod:`~semimig.allocation.speed`'s.
    """
    check_int("repeats", repeats, minimum=1)
    check_int("max_batch_size", max_batch_size, minimum=1)
    sizes = sorted({check_int("batch size", b, minimum=1, maximum=max_batch_size) for b in batch_sizes})
    if not sizes:
        raise ConfigError("batch_sizes must name at least one batch size to profile")
    points: list[list[tuple[int, float]]] = [[] for _ in range(layout.dp_size)]
    for b in sizes:
        runs = [group_maxima(P.all_gather_floats(probe(b), None), layout.group_of_rank, layout.dp_size)
                for _ in range(repeats)]
        for g in range(layout.dp_size):
            seconds = statistics.median(run[g] for run in runs)
            if not seconds >= MIN_TIME_S:
                raise ConfigError(f"group {g} measured no busy time at batch {b} ({seconds!r} s): the probe must "
                                  "run timed GEMMs (semimig layers or straggler hooks)")
            points[g].append((b, seconds))
    return [SpeedCurve.from_points(p, max_batch_size=max_batch_size, name=f"group{g}") for g, p in enumerate(points)]


_FINGERPRINT_SAMPLES = 1024


def batch_fingerprint(batch: Any) -> int:
    """A 48-bit digest (exact in a float64) of a batch's tensors: shapes, dtypes and
    :data:`_FINGERPRINT_SAMPLES` elements of each at positions drawn from a generator seeded by the
    tensor's size (the same positions on every rank) — cheap at any batch size, and different for the
    batches two ranks fed from their own samplers (``DistributedSampler``).  Drawn, not strided: a
    stride that is a multiple of a row's length would read one column only (token 0 of every row)."""
    import hashlib

    h = hashlib.blake2b(digest_size=6)
    for t in _tensors(batch):
        sample = t.detach().reshape(-1)
        if sample.numel() > _FINGERPRINT_SAMPLES:
            where = torch.randint(sample.numel(), (_FINGERPRINT_SAMPLES,),
                                  generator=torch.Generator().manual_seed(sample.numel()))
            sample = sample[where.to(sample.device)]
        h.update(repr((tuple(t.shape), str(t.dtype))).encode())
        h.update(sample.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return int.from_bytes(h.digest(), "big")


def _check_same_batch(fingerprints: list[int], iteration: int) -> None:
    """Every rank cut the same global batch (:meth:`HybridBalancer.micro_batches`), or a ``ConfigError`` on
    every rank.  Checked in the per-step gather of a re-planning split only (Poplar with a trigger): an
    ``even`` split or ``replan=None`` has no per-step collective, and none is added for this."""
    if len(set(fingerprints)) <= 1:
        return
    raise ConfigError(f"iteration {iteration}: the ranks passed micro_batches() different global batches ("
                      + ranks_by_value(fingerprints) + "): every rank must pass the same "
                      "global batch (the split gives each data-parallel group its rows) — not each rank's own "
                      "sampler's batch")


def _tensors(batch: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    tree_map(lambda t: found.append(t) if isinstance(t, torch.Tensor) else None, batch)
    return found
