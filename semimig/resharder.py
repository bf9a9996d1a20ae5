"""Re-sharding during training: the thin distributed layer over :mod:`semimig.controller.reshard`.

:class:`Resharder` serves ``semimig.enable(..., mode="reshard")`` and the re-sharding half of
``mode="semi"`` (:mod:`semimig.balancer`).  Once per optimizer step, after the balance
controller's ``step()``, it

1. all-gathers over the tensor-parallel group every rank's split of the step (one float64
   all-gather of seven numbers): its own work ``compute_s`` (the controller's
   :class:`~semimig.straggler.device.DeviceClock`: wall minus time in collectives), its GEMM
   seconds in semimig's paired layers (``busy_s``) and the seconds between a pair's two layers
   (``paired_gap_s``: the attention core, the activation — :mod:`semimig.straggler.busy`), which
   together are the shardable work it measures, its seconds in collectives, the injected
   whole-device sleep, the wall time and the work fraction it ran at;
2. feeds the numbers, identical on every rank, to the pure :class:`ReshardPolicy`; while a
   straggler prunes or migrates (mode ``semi``) its GEMM seconds are scaled up to full work from
   *this step's* measurement (:func:`unshed`: ``b / (f + (1 − f)·w)``, ``w`` the work fraction the
   step ran at, ``f`` the controller's fitted fixed fraction), and the extra scaled by the rank's
   measured slow-down of everything else (``compute/(compute − sleep)``, 1 on a real slow device),
   so the policy sees the rank's speed, not its shrunk work.  (The controller's own estimate
   ``ShedDecision.unpruned_s`` is a window median: measured, it still showed the throttled speed
   three steps after a 20 s throttle had lifted, and SEMI re-planned for a straggler already gone.)
Before the first step, :meth:`Resharder.probe` (called by :func:`semimig.enable`) times the same
fixed work on every rank (:func:`probe_times`) and moves at once for a large, consistent slowdown
(:meth:`~semimig.controller.reshard.ReshardPolicy.profile`: a device slow from the start is not run
at its full slowdown for the launch steps).  Then, per step:

3. when the policy decides, calls :func:`semimig.shardformer.replan.apply_plan` (collective: moves
   every changed unit's weights and optimizer state once), tells the policy the measured cost, and
   hands the caller the new plan so that it rebuilds the controller on the new shapes.

With data-parallel replicas under plain DP (``zero_stage=0``) each replica's TP group plans for
itself: every rank keeps one policy per replica and feeds each its own replica's rows (gathered a
step late over the DP group, so every rank takes every replica's decision alike), and a decision of
any replica moves every replica to its plan at once
(:func:`semimig.shardformer.replicas.apply_replica_plans`, whose gradient reduction stays exact
across the differing layouts).  Under ZeRO the replicas share one plan, planned for the slowest
rank at each TP position: its flat gradient buckets and master shards need equal shapes across the
data-parallel group.

:func:`check_reshard` (what a mode needs, refused by name) and :func:`make_resharder` (the
resharder and the controller rebuild after a move) are :func:`semimig.enable`'s side of it.

One INFO line per re-plan (plan, predicted step, move cost), and one when the next full window
under the new plan has been measured (measured step beside the predicted one); at DEBUG, one line
per step with every rank's numbers and the policy's reason (how the launch plan of the README's
results was diagnosed).  Every rank takes
the same decision at the same step because it decides from the same gathered numbers.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from semimig._validate import check_int
from semimig.comm import primitives as P
from semimig.comm.lagged import LaggedRows
from semimig.controller.reshard import (PROBE_REPEATS, ReshardConfig, ReshardDecision, ReshardPolicy,
                                        ReshardSample)
from semimig.controller.timing import dense_equivalent
from semimig.errors import ConfigError
from semimig.sharding.plan import ShardPlan, units_of

__all__ = ["Resharder", "ReplanEvent", "probe_times", "unshed", "slowest_per_position", "reshardable_plan", "even_reshardable_plan", "check_reshard",
           "make_resharder", "resizing_mode", "gemm_scale"]

logger = logging.getLogger(__name__)

PROBE_TARGET_S = 0.02
"""Seconds one repeat of the device probe takes on the fastest rank (:func:`probe_times`)."""
PROBE_MAX_SIZE = 4096
"""Largest side of the probe's matrices (the model's hidden size below it): 3 x 64 MB in fp32."""


@dataclass
class ReplanEvent:
    """One re-plan as the run reports it (JSON-friendly through :meth:`as_dict`)."""

    step: int
    plan: str
    mlp_units: tuple
    kv_units: tuple
    predicted_s: float
    before_s: float
    bytes_moved: int
    move_s: float
    reason: str
    measured_s: Optional[float] = None
    """Measured step (max compute + min communication, window median) once a full window ran under it."""
    extra: dict = field(default_factory=dict)
    replica: Optional[int] = None
    """The data-parallel replica that moved (a plan per replica); ``None``: every replica, one plan."""

    def as_dict(self) -> dict:
        out = {"step": self.step, "plan": self.plan, "mlp_units": list(self.mlp_units),
               "kv_units": list(self.kv_units), "predicted_s": self.predicted_s, "before_s": self.before_s,
               "measured_s": self.measured_s, "bytes_moved": self.bytes_moved, "move_s": self.move_s,
               "reason": self.reason}
        if self.replica is not None:
            out["replica"] = self.replica
        return out


def even_reshardable_plan(config: Any, tp: int, *, block_size: int = 128):
    """The even plan written out in units (MLP blocks of ``block_size``, KV groups), which the
    policy can re-plan: build the model with ``SemiMigPolicy(shard_plan=even_reshardable_plan(...))``."""
    from semimig.shardformer.uneven import UnevenPlan, model_dims

    dims = model_dims(config)
    blocks = units_of(f"the MLP intermediate size (block_size={block_size})", dims.intermediate, block_size)
    for name, total in (("MLP blocks", blocks), ("KV groups", dims.num_kv_heads)):
        if total % tp:
            raise ConfigError(f"an even re-shardable plan needs tp={tp} to divide the model's {total} {name}")
    return UnevenPlan(mlp_units=(blocks // tp,) * tp, kv_units=(dims.num_kv_heads // tp,) * tp,
                      block_size=block_size)


def reshardable_plan(model: Any, plugin: Any, *, block_size: Optional[int] = None):
    """The plan the model was built with, as an :class:`~semimig.shardformer.UnevenPlan` with units
    in both dimensions, or :class:`ConfigError` saying how to build a model that can re-plan."""
    try:
        from semimig.shardformer.replan import current_plan  # the mechanics (branch replan)
    except ImportError:
        current_plan = None
    built = getattr(getattr(plugin, "custom_policy", None), "shard_plan", None)  # the plan the model was built with
    plan = None
    if current_plan is not None:
        try:  # what the layers hold now, in the built plan's block size when there is one
            plan = current_plan(model, block_size=getattr(built, "block_size", None) or block_size)
        except ConfigError:
            plan = None
    if plan is None:
        plan = built
    if plan is None or plan.mlp_units is None or plan.kv_units is None:
        raise ConfigError("re-sharding needs the model built with a plan in units: "
                          "HybridParallelPlugin(custom_policy=SemiMigPolicy(shard_plan="
                          "semimig.resharder.even_reshardable_plan(model.config, tp))), got shard_plan="
                          f"{plan}")
    return plan


def _params_per_unit(config: Any, dims: Any, block_size: int) -> tuple[float, float]:
    """Parameters of one MLP block and one KV group, summed over the decoder layers."""
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd")
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer")
    group_q = dims.num_heads // dims.num_kv_heads * dims.head_dim
    if dims.family == "llama":  # gate, up, down; q, o (group_q each) and k, v (head_dim each)
        mlp, kv = 3 * hidden * block_size, 2 * hidden * group_q + 2 * hidden * dims.head_dim
    else:  # GPT-2: c_fc, c_proj; c_attn (3 parts) and attn.c_proj (ViT: the same as separate layers)
        mlp, kv = 2 * hidden * block_size, 4 * hidden * group_q
    return float(mlp * layers), float(kv * layers)


def unshed(compute_s: float, shardable_s: float, *, sleep_s: float, work: float, fixed: float) -> tuple[float, float]:
    """A rank's ``(compute, shardable)`` seconds at full work, from a step it ran at work fraction
    ``work`` (pruned or migrated columns; 1: nothing shed, returned as measured).

    The GEMM time model of :mod:`semimig.controller.timing`: ``b = S·(f + (1 − f)·w)``, so the full
    work's GEMM seconds are ``S = b / (f + (1 − f)·w)`` (its :func:`~semimig.controller.timing.dense_equivalent`;
    ``f`` the fitted fixed fraction, 0 where it is
    not a number in ``[0, 1)``); the extra ``S − b`` is added to both, scaled by ``c / (c − sleep)``
    (an emulated whole-device straggler's sleep slows the extra work alike; 1 on a real device).
    """
    if not 0.0 < work < 1.0 or shardable_s <= 0.0:
        return compute_s, shardable_s
    f = fixed if 0.0 <= fixed < 1.0 else 0.0  # NaN (no estimate yet) fails the test too
    extra = dense_equivalent(shardable_s, work, f) - shardable_s
    scale = compute_s / (compute_s - sleep_s) if compute_s > sleep_s > 0.0 else 1.0
    return compute_s + extra * scale, shardable_s + extra * scale


def slowest_per_position(rows: list[list[float]], *, tp: int) -> list[list[float]]:
    """One row per TP position from every rank's row of a tp x dp grid (DESIGN §8: every DP replica
    holds the same plan, so it is planned for the slowest rank at each TP position).

    ``rows[i] = [tp_rank, dp_rank, compute, shardable, comm, gemm, ...]`` (any order, one per rank;
    seconds at full work; a row may stop after ``compute``, as the device probe's do).  Replica ``d``'s fastest compute is ``c_d``; position ``r`` takes the row
    of the replica where ``compute / c_d`` is largest (the rank slowest *relative to its own replica*,
    so a replica that Poplar gives more samples is not mistaken for a slow one; ties: the lowest
    ``dp_rank``), its compute, shardable and GEMM seconds put on one time base (scaled by
    ``mean_d c_d / c_d``; the seconds in collectives and the other columns as they are).  One
    replica: its rows, unchanged."""
    by_replica: dict[int, dict[int, list[float]]] = {}
    for row in rows:
        by_replica.setdefault(int(row[1]), {})[int(row[0])] = row
    replicas = sorted(by_replica)
    if any(sorted(by_replica[d]) != list(range(tp)) for d in replicas):
        raise ConfigError(f"slowest_per_position: every replica needs one row per TP rank 0..{tp - 1}, got "
                          f"{ {d: sorted(by_replica[d]) for d in replicas} }")
    if len(replicas) == 1:
        return [by_replica[replicas[0]][r] for r in range(tp)]
    fastest = {d: min(by_replica[d][r][2] for r in range(tp)) for d in replicas}
    base = sum(fastest.values()) / len(replicas)
    out = []
    for r in range(tp):
        d = max(replicas, key=lambda d: (by_replica[d][r][2] / fastest[d] if fastest[d] > 0 else 0.0, -d))
        scale = base / fastest[d] if fastest[d] > 0 else 1.0
        row = list(by_replica[d][r])
        for i in (2, 3, 5):
            if i < len(row):
                row[i] *= scale
        out.append(row)
    return out


class Resharder:
    """Feeds the policy, moves on its decision (module docstring).  ``move`` is called as
    ``move(new_plan) -> (bytes this rank sent, seconds)`` (collective over the TP group).

    ``replicas`` (data-parallel size ``D``, with ``world_group`` holding all ``tp·D`` ranks and
    ``dp_group`` this rank's ``D`` peers at its TP position): each step's rows, gathered over the TP
    group, are all-gathered over the DP group asynchronously and read at the next step
    (:class:`~semimig.comm.lagged.LaggedRows`: no per-step barrier across the world), so every rank
    holds every replica's rows of the same step.  Then, with ``move_replicas`` (called as
    ``move_replicas(plans_by_replica) -> (bytes this rank sent, seconds)``, collective over the world:
    :func:`~semimig.shardformer.replicas.apply_replica_plans`), each replica plans for itself: every
    rank keeps one policy per replica (:attr:`policies`, :attr:`policy` its own replica's), feeds
    replica ``d``'s policy replica ``d``'s rows, and so takes every replica's decision as every other
    rank does; when any replica's policy decides, every rank moves the world to the tuple of the
    replicas' plans at that step, and each policy that decided is told its own replica's cost.
    Without it (ZeRO, whose flat buffers need equal shapes across the DP group) the replicas share
    one plan: the one policy is fed the slowest rank at each TP position (:func:`slowest_per_position`)
    and every replica moves within its own TP group, at the same step, to the same plan.  The rows in
    flight at a move were measured under the old plans and are dropped.  The resizing scale
    (:meth:`busy_scale`) stays each replica's own GEMM split."""

    def __init__(self, plan: Any, model_config: Any, *, group: Any, move: Callable[[Any], tuple[int, float]],
                 config: ReshardConfig = ReshardConfig(), state_bytes_per_param: int = 12,
                 replicas: int = 1, world_group: Any = None, dp_rank: int = 0, dp_group: Any = None,
                 move_replicas: Optional[Callable[[tuple], tuple[int, float]]] = None) -> None:
        from semimig.shardformer.uneven import model_dims

        self.group = group
        self.rank, self.size = P.group_rank(group), P.group_size(group)
        self.replicas, self.dp_rank, self.world_group = replicas, dp_rank, world_group
        self.per_replica = replicas > 1 and move_replicas is not None
        """Each replica plans for itself (``move_replicas`` given, several replicas)."""
        self._local: collections.deque = collections.deque(maxlen=config.window)  # this replica's samples
        self._pending_local: Optional[ReshardSample] = None  # this replica's part of the step being fed
        self._lagged = LaggedRows(dp_group) if replicas > 1 else None  # every replica's rows, a step late
        self._device = P.collective_device(group)
        self._move = move
        self._move_replicas = move_replicas
        self.model_config = model_config
        self.plan = plan
        self.plans = (plan,) * (replicas if self.per_replica else 1)
        """Every replica's plan in DP rank order (a plan per replica), or the one shared plan."""
        resolved = plan.resolve(model_config, self.size)
        dims = model_dims(model_config)
        mlp_params, kv_params = _params_per_unit(model_config, dims, plan.block_size)
        mlp_plan, kv_plan = resolved.mlp, ShardPlan(units=resolved.q.units)

        def new_policy() -> ReshardPolicy:  # a dimension's weight: its share of the paired parameters (all its units)
            return ReshardPolicy(
                (mlp_plan, kv_plan), weights=(mlp_params * mlp_plan.total_units, kv_params * kv_plan.total_units),
                bytes_per_unit=(int(mlp_params * state_bytes_per_param), int(kv_params * state_bytes_per_param)),
                config=config)

        self.policies: tuple = tuple(new_policy() for _ in self.plans)
        """One policy per replica (a plan per replica), every rank holding all of them; else the one policy."""
        self.policy = self.policies[dp_rank if self.per_replica else 0]
        """This replica's policy (the one shared policy when the replicas share a plan)."""
        self.events: list[ReplanEvent] = []
        self.last: Optional[ReshardDecision] = None
        self.settled_now = False
        """True for the one step at which a full window under this replica's new plan has been measured."""
        self._speaks = self.rank == 0

    # ------------------------------------------------------------------ per step
    def gather(self, report: Any) -> Optional[Any]:
        """Every rank's split of the step just closed (collective over the TP group).  With several
        replicas: the previous step's (also an asynchronous all-gather over the DP group), or ``None``
        when no step is in flight — a tuple of every replica's sample (a plan per replica), or one
        sample of the slowest rank per TP position (one shared plan)."""
        device = report.device
        busy = float(report.busy.busy_s)
        compute = float(device.compute_s) if device is not None else 0.0
        sleep = float(device.sleep_s) if device is not None else 0.0
        comm = float(device.comm_s) if device is not None else 0.0
        wall = float(device.wall_s) if device is not None else 0.0
        work = float(report.busy.work_fraction)
        gap = float(report.busy.paired_gap_s)
        if self.replicas > 1:
            return self._gather_replicas(report, [compute, busy, comm, sleep, wall, work, gap])
        rows = P.all_gather_rows([compute, busy, comm, sleep, wall, work, gap], self.group)
        decision = getattr(report, "decision", None)
        fixed = getattr(decision, "fixed_fraction", None) or (math.nan,) * self.size
        shed = any(0.0 < row[5] < 1.0 for row in rows)  # the step as it ran, when a rank shed work
        return _sample([unshed(c, b, sleep_s=s, work=w, fixed=f) for (c, b, _, s, _, w, _), f in zip(rows, fixed)],
                       rows, step_s=max(row[0] for row in rows) + min(row[2] for row in rows) if shed else None)

    def _gather_replicas(self, report: Any, mine: list[float]) -> Optional[Any]:
        """This replica's rows (each rank's own numbers, unshed with its own fixed fraction; a TP
        gather), posted to the DP group's lagged all-gather; from the previous step's rows of every
        replica, every replica's own sample (a plan per replica), or that replica's own sample kept for
        :meth:`busy_scale` and the slowest rank per TP position for the one policy (``None`` at a step
        with nothing in flight)."""
        decision = getattr(report, "decision", None)
        fixed = getattr(decision, "fixed_fraction", None)
        own_fixed = float(fixed[self.rank]) if fixed else math.nan
        compute, busy, comm, sleep, wall, work, gap = mine
        c, b = unshed(compute, busy, sleep_s=sleep, work=work, fixed=own_fixed)
        local = P.all_gather_rows([self.rank, self.dp_rank, c, b + gap, comm, b, sleep, wall, work, gap], self.group)
        mine_sample = None if self.per_replica else _row_sample(local)
        lagged = self._lagged.exchange([v for row in local for v in row], mine_sample)
        if lagged is None:
            return None
        flat, self._pending_local = lagged
        width = len(local[0])
        rows = [replica[i:i + width] for replica in flat for i in range(0, len(replica), width)]
        if self.per_replica:
            by_replica: dict[int, dict[int, list[float]]] = {}
            for row in rows:
                by_replica.setdefault(int(row[1]), {})[int(row[0])] = row
            return tuple(_row_sample([by_replica[d][r] for r in range(self.size)]) for d in range(self.replicas))
        return _row_sample(slowest_per_position(rows, tp=self.size))

    def observe(self, report: Any) -> Optional[Any]:
        """Feed the step; if this replica's plan changes, move (every replica's, with a plan per
        replica) and return this replica's new :class:`UnevenPlan`."""
        sample = self.gather(report)
        if sample is None:  # several replicas: this step's rows are read at the next step
            self.settled_now = False
            return None
        if self.per_replica:
            return self._observe_replicas(sample, report)
        decision = self.policy.observe(sample)
        if self.replicas > 1 and self.policy.samples and self.policy.samples[-1] is sample:
            self._local.append(self._pending_local)  # this replica's step, in the window the policy keeps
        self.last = decision
        self._debug(self.policy, sample, decision)
        self.settled_now = self._measured(decision)
        if not decision.replan:
            return None
        return self._take(decision, step=int(getattr(report, "iteration", decision.step)))

    def _observe_replicas(self, samples: tuple, report: Any) -> Optional[Any]:
        """Each replica's policy fed its own replica's sample; any decision moves the world at once."""
        decisions = [policy.observe(sample) for policy, sample in zip(self.policies, samples)]
        self.last = decisions[self.dp_rank]
        self._debug(self.policy, samples[self.dp_rank], self.last)
        settled = [self._measured(decision, replica=d) for d, decision in enumerate(decisions)]
        self.settled_now = settled[self.dp_rank]
        if not any(decision.replan for decision in decisions):
            return None
        return self._take_replicas(decisions, step=int(getattr(report, "iteration", self.last.step)))

    def _debug(self, policy: ReshardPolicy, sample: ReshardSample, decision: ReshardDecision) -> None:
        if self._speaks and logger.isEnabledFor(logging.DEBUG):  # the policy's every step, to diagnose a plan
            logger.debug("semimig reshard step %d: compute %s s, shardable %s s, R/S %.3f, plan %s: %s", decision.step,
                         [round(c, 3) for c in sample.compute_s], [round(b, 3) for b in sample.shardable_s],
                         policy.replicated_ratio, [p.units for p in policy.plans], decision.reason)

    def probe(self, clock: Any = None, *, device: Any = None, dtype: Any = None) -> Optional[Any]:
        """Before the first step: the device probe (:func:`probe_times`, collective over the TP group)
        and, when :meth:`ReshardPolicy.profile` decides, the move; returns this replica's new plan or
        ``None``.  ``clock``: the controller's :class:`~semimig.straggler.device.DeviceClock`, attached
        only under a whole-device test straggler (which slows the probe through it); ``None`` times the
        work alone.  With several replicas every TP group probes at once and the times are gathered
        over the world (:meth:`_probe_rows`): with a plan per replica each replica's policy profiles
        its own replica's times; with one shared plan each repeat is read at the slowest rank of each TP
        position (:meth:`_slowest_probe`), so every replica takes the same decision.  Off with ``probe=0``."""
        if self.size == 1 or self.policy.config.probe <= 0.0:
            return None
        hidden = getattr(self.model_config, "hidden_size", None) or getattr(self.model_config, "n_embd")
        size = min(int(hidden), PROBE_MAX_SIZE)  # three size x size matrices live for the probe's ~0.1 s
        times = probe_times(self.group, clock, size=size, device=device or self._device, dtype=dtype)
        if self.per_replica:
            by_replica = self._replica_probes(times)
            decisions = [policy.profile(t) for policy, t in zip(self.policies, by_replica)]
            if self._speaks:
                logger.debug("semimig reshard probe of replica %d: seconds per repeat %s: %s", self.dp_rank,
                             [[round(t, 4) for t in row] for row in times], decisions[self.dp_rank].reason)
            new = self._take_replicas(decisions, step=-1) if any(d.replan for d in decisions) else None
        else:
            if self.replicas > 1:
                times = self._slowest_probe(times)
            decision = self.policy.profile(times)
            if self._speaks:
                logger.debug("semimig reshard probe: seconds per repeat %s: %s",
                             [[round(t, 4) for t in row] for row in times], decision.reason)
            new = self._take(decision, step=-1) if decision.replan else None
        if clock is not None:
            clock.take()  # the probe and its move are not the first step's work or traffic
        return new

    def _probe_rows(self, times: list[list[float]]) -> list[list[float]]:
        """``[tp_rank, dp_rank, t_0, t_1, …]`` of every rank of the world (collective over the world)."""
        return P.all_gather_rows([self.rank, self.dp_rank, *(row[self.rank] for row in times)], self.world_group)

    def _replica_probes(self, times: list[list[float]]) -> list[list[list[float]]]:
        """This replica's probe ``times[i][r]`` → every replica's, ``out[d][i][r]`` (collective over the
        world).  Each replica sized its work to its own fastest rank: its times compare within it."""
        grid = {(int(row[1]), int(row[0])): row[2:] for row in self._probe_rows(times)}
        return [[[grid[(d, r)][i] for r in range(self.size)] for i in range(len(times))] for d in range(self.replicas)]

    def _slowest_probe(self, times: list[list[float]]) -> list[list[float]]:
        """This replica's probe ``times[i][r]`` → the world's, per repeat the slowest rank at each TP
        position relative to its own replica's fastest (:func:`slowest_per_position`, as the steps are
        read; collective over the world).  Each replica sized its work to its own fastest rank, so only
        the ratios within a replica compare: the one time base is what the selection puts them on."""
        rows = self._probe_rows(times)
        out = []
        for i in range(len(times)):
            grid = [[row[0], row[1], row[2 + i]] for row in rows]
            out.append([row[2] for row in slowest_per_position(grid, tp=self.size)])
        return out

    def _uneven(self, decision: ReshardDecision) -> Any:
        from semimig.shardformer.uneven import UnevenPlan

        mlp, kv = decision.plans
        new = UnevenPlan(mlp_units=mlp.units, kv_units=kv.units, block_size=self.plan.block_size)
        new.resolve(self.model_config, self.size)
        return new

    def _take(self, decision: ReshardDecision, *, step: int) -> Any:
        """Move to ``decision``'s plans (collective), note the cost, log it; the new plan."""
        new = self._uneven(decision)
        bytes_moved, seconds = self._agreed_cost(*self._move(new))
        self.policy.moved_to(decision.plans, seconds=seconds, bytes_moved=int(bytes_moved))
        self._local.clear()
        if self._lagged is not None:
            self._lagged.collect()  # measured under the old plan: dropped
        self._record(decision, new, step=step, bytes_moved=bytes_moved, seconds=seconds, replica=None)
        self.plan = new
        self.plans = (new,)
        return new

    def _take_replicas(self, decisions: list[ReshardDecision], *, step: int) -> Optional[Any]:
        """Every replica to its policy's plan (those that did not decide keep theirs) at once
        (``move_replicas``, collective over the world); each deciding policy told its own replica's
        cost; this replica's new plan, or ``None`` when it kept its plan."""
        plans = tuple(self._uneven(decision) if decision.replan else plan
                      for decision, plan in zip(decisions, self.plans))
        costs = self._replica_costs(*self._move_replicas(plans))
        if self._lagged is not None:
            self._lagged.collect()  # measured under the old plans: dropped
        for d, decision in enumerate(decisions):
            if decision.replan:
                bytes_moved, seconds = costs[d]
                self.policies[d].moved_to(decision.plans, seconds=seconds, bytes_moved=int(bytes_moved))
                self._record(decision, plans[d], step=step, bytes_moved=bytes_moved, seconds=seconds, replica=d)
        mine = plans[self.dp_rank]
        changed = decisions[self.dp_rank].replan
        self.plans, self.plan = plans, mine
        return mine if changed else None

    def _record(self, decision: ReshardDecision, new: Any, *, step: int, bytes_moved: int, seconds: float,
                replica: Optional[int]) -> None:
        """The move's :class:`ReplanEvent`, and its INFO line (TP rank 0 of the replica that moved)."""
        event = ReplanEvent(step=step, plan=str(new), mlp_units=new.mlp_units, kv_units=new.kv_units,
                            predicted_s=decision.predicted_s, before_s=decision.current_s,
                            bytes_moved=int(bytes_moved), move_s=float(seconds), reason=decision.reason,
                            replica=replica)
        self.events.append(event)
        if not self._speaks or (replica is not None and replica != self.dp_rank):
            return
        who = "" if replica is None else f" of replica {replica}"
        if step < 0:
            logger.info("semimig re-plan%s before the first step: %s (speed ratios %s); predicted step %.2fx the even "
                        "one; moved %.2f MB in %.3f s (%s)", who, new,
                        "/".join(f"{s:.2f}" for s in decision.speed_ratios), decision.predicted_s,
                        bytes_moved / 1e6, seconds, decision.reason)
        else:
            logger.info("semimig re-plan%s at step %d: %s (speed ratios %s); step %.4f s -> predicted %.4f s; moved "
                        "%.2f MB in %.3f s (%s)", who, event.step, new,
                        "/".join(f"{s:.2f}" for s in decision.speed_ratios), decision.current_s,
                        decision.predicted_s, bytes_moved / 1e6, seconds, decision.reason)

    def _agreed_cost(self, bytes_sent: int, seconds: float) -> tuple[int, float]:
        """The group's move cost, the same on every rank (the policy's next decisions depend on it):
        bytes sent by all ranks, seconds of the slowest (collective over the TP group)."""
        if self.replicas > 1:  # the replicas move at once: one replica's bytes, the slowest rank's seconds
            rows = P.all_gather_rows([bytes_sent, seconds], self.world_group)
            return int(sum(r[0] for r in rows) // self.replicas), max(r[1] for r in rows)
        if self.size == 1:
            return int(bytes_sent), float(seconds)
        rows = P.all_gather_rows([bytes_sent, seconds], self.group)
        return int(sum(r[0] for r in rows)), max(r[1] for r in rows)

    def _replica_costs(self, bytes_sent: int, seconds: float) -> list[tuple[int, float]]:
        """Each replica's move cost, the same on every rank: the bytes its ranks sent, the seconds of
        its slowest rank (collective over the world)."""
        rows = P.all_gather_rows([self.dp_rank, bytes_sent, seconds], self.world_group)
        return [(int(sum(r[1] for r in rows if int(r[0]) == d)), max(r[2] for r in rows if int(r[0]) == d))
                for d in range(self.replicas)]

    def _measured(self, decision: ReshardDecision, *, replica: Optional[int] = None) -> bool:
        """The first full window after a re-plan (of ``replica``, with a plan per replica): its measured
        step beside the predicted one (True then)."""
        event = next((e for e in reversed(self.events) if e.replica == replica), None)
        if event is None or event.measured_s is not None or decision.current_s <= 0.0:
            return False
        event.measured_s = decision.current_s
        if not self._speaks or (replica is not None and replica != self.dp_rank):
            return True
        who = "" if replica is None else f" of replica {replica}"
        if event.step < 0:  # the probe's: predicted relative to the even step
            logger.info("semimig re-plan%s before the first step: measured step %.4f s over the first %d steps under "
                        "it (predicted %.2fx the even step)", who, event.measured_s, self.policy.config.window,
                        event.predicted_s)
        else:
            logger.info("semimig re-plan%s of step %d: measured step %.4f s over the next %d steps (predicted %.4f s, "
                        "%.4f s before)", who, event.step, event.measured_s, self.policy.config.window,
                        event.predicted_s, event.before_s)
        return True

    def busy_scale(self) -> tuple[float, ...]:
        """:func:`gemm_scale` of the policy's window under the plan in force (this replica's own
        steps in it when there are several replicas: its resizing compares its own ranks)."""
        if self.per_replica:
            return gemm_scale(self.policy.samples, self.size)
        return gemm_scale(self._local if self.replicas > 1 else self.policy.samples, self.size)

    # ------------------------------------------------------------------ reporting
    def summary(self) -> dict:
        """Re-plans of the run: count, plans, bytes moved and seconds (JSON-friendly)."""
        out = {"replans": len(self.events), "plan": str(self.plan),
               "bytes_moved": sum(e.bytes_moved for e in self.events),
               "move_s": sum(e.move_s for e in self.events),
               "events": [e.as_dict() for e in self.events]}
        if self.per_replica:
            out["plans"] = [str(p) for p in self.plans]  # every replica's, in DP rank order
        return out


def probe_times(group: Any, clock: Any = None, *, size: int, device: Any = None, dtype: Any = None,
                repeats: int = PROBE_REPEATS, target_s: float = PROBE_TARGET_S) -> list[list[float]]:
    """Every rank's seconds for the same fixed work, ``repeats`` times: ``out[i][r]`` (collective over
    ``group``; identical on every rank).

    The work is ``n`` products of two ``size x size`` matrices (constant values: the global random
    stream is not touched), ``n`` chosen from one timed product so that the *fastest* rank takes about
    ``target_s``; every rank runs the same ``n``.  Each repeat ends with a one-element all-reduce, so
    that an emulated whole-device straggler (``scope=device``) sleeps its slowdown of the repeat there
    (:class:`~semimig.straggler.device.DeviceClock`), and a repeat's seconds are the clock's compute
    (wall minus time in collectives: a fast rank's wait for the slow one is not its work).

    Without a clock a repeat's seconds are its own products alone, between two synchronisations of
    the device (enable-time code): on CUDA the boundary's all-reduce returns at enqueue and the next
    repeat's products queue behind it, so a repeat timed from the host without the first wait would
    hold the slowest rank's previous repeat and every rank would read the same time."""
    check_int("size", size, minimum=1)
    check_int("repeats", repeats, minimum=1)
    device = torch.device(device or "cpu")
    a = torch.full((size, size), 1.0 / size, device=device, dtype=dtype or torch.float32)
    b, c = a.clone(), torch.empty_like(a)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    torch.mm(a, b, out=c)  # first touch
    sync()
    start = time.perf_counter()
    torch.mm(a, b, out=c)
    sync()
    one = min(P.all_gather_floats(time.perf_counter() - start, group))
    n = max(1, min(10_000, math.ceil(target_s / max(one, 1e-7))))
    flag = torch.zeros(1, device=P.collective_device(group))
    seconds = []
    for _ in range(repeats):
        sync()  # the previous boundary's all-reduce (and the wait for the slowest rank in it) is done
        if clock is not None:
            clock.take()
        start = time.perf_counter()
        for _ in range(n):
            torch.mm(a, b, out=c)
        sync()
        elapsed = time.perf_counter() - start  # without a clock: the work alone, not the wait for the others
        dist.all_reduce(flag, group=group)  # the repeat's boundary (an emulated straggler sleeps before it)
        seconds.append(clock.take().compute_s if clock is not None else elapsed)
    columns = P.all_gather_rows(seconds, group)  # columns[r][i]: rank r, repeat i
    return [[columns[r][i] for r in range(len(columns))] for i in range(repeats)]


def _row_sample(rows: list[list[float]]) -> ReshardSample:
    """The policy's sample from one replica's rows ``[tp_rank, dp_rank, compute, shardable, comm, gemm, …]``
    in TP rank order (seconds at full work)."""
    return ReshardSample(tuple(r[2] for r in rows), tuple(r[3] for r in rows), tuple(r[4] for r in rows),
                         gemm_s=tuple(r[5] for r in rows))


def _sample(split: list[tuple[float, float]], rows: list[list[float]], *,
            step_s: Optional[float] = None) -> ReshardSample:
    """The policy's sample from each rank's unshed ``(compute, GEMM)`` and its gathered row: the pair's
    non-GEMM work (attention core, activation, ``row[6]``) is shardable too; pruning does not shrink it."""
    return ReshardSample(tuple(c for c, _ in split), tuple(b + row[6] for (_, b), row in zip(split, rows)),
                         tuple(row[2] for row in rows), gemm_s=tuple(b for _, b in split), step_s=step_s)


def gemm_scale(samples: Any, size: int) -> tuple[float, ...]:
    """Per rank, its median GEMM seconds (``ReshardSample.gemm``: what the resizing controller's busy
    time measures, not the spans between a pair's layers) over ``samples``, relative to the least:
    a resizing controller on top divides busy times by it, so it compares what *varies* and leaves
    the re-planned split alone (all 1 without samples).  The GEMMs' own split, not the shardable
    one: an uneven plan gives a rank a share of the attention core different from its share of the
    GEMMs, and a scale from GEMMs + spans read a balanced rank 1.27x slow (the example's tiny Llama
    at `7,1:3,1`), which resizing then pruned."""
    samples = list(samples)
    if not samples:
        return (1.0,) * size
    medians = [statistics.median(s.gemm[r] for s in samples) for r in range(size)]
    low = min(medians)
    return tuple(m / low if low > 0 else 1.0 for m in medians)


# ----------------------------------------------------------------------------- semimig.enable
def resizing_mode(config: Any) -> str:
    """Mode semi on uneven shards: the zero-* mode of its resizing variant (migration assumes equal K)."""
    return "zero-" + config.resizing.variant


def check_reshard(mode: str, model: Any, plugin: Any, reshard: Any, optimizer: Any) -> Optional[Any]:
    """The model's plan in units when this mode re-shards (``None`` for semi on a model that cannot),
    or :class:`ConfigError` naming what stops it."""
    if reshard is not None and not isinstance(reshard, ReshardConfig):
        raise ConfigError(f"reshard must be a semimig.controller.reshard.ReshardConfig or None, got {reshard!r}")
    if mode not in ("reshard", "semi") or plugin.tp_size == 1:
        return None
    try:
        plan = reshardable_plan(model, plugin, block_size=getattr(reshard, "block_size", None))
    except ConfigError as err:
        if mode == "reshard":
            raise ConfigError(f"mode='reshard': {err}") from None
        logger.info("semimig: mode=semi without re-sharding (%s)", err)
        return None
    blockers = [(plugin.pp_size > 1, f"pp_size={plugin.pp_size} (each stage would re-plan alone)"),
                (getattr(plugin, "dp_size", 1) > 1 and plugin.tp_size * plugin.dp_size != dist.get_world_size(),
                 f"tp_size={plugin.tp_size} x dp_size={getattr(plugin, 'dp_size', 1)} != world size "
                 f"{dist.get_world_size()} (the replicas agree on one plan over the whole world)"),
                (getattr(plugin, "zero_stage", 0) > 0 and getattr(plugin, "zero_config", {}).get("overlap_allgather"),
                 "zero_stage>0 with overlap_allgather=True (pending all-gather handles on the parameters)"),
                (getattr(plugin, "zero_stage", 0) > 0 and getattr(plugin, "cpu_offload", False),
                 "zero_stage>0 with cpu_offload=True (its masters live on the host)")]
    for blocked, why in blockers:
        if blocked:
            if mode == "reshard":
                raise ConfigError(f"mode='reshard' cannot re-plan with {why}")
            logger.info("semimig: mode=semi without re-sharding: %s", why)
            return None
    try:
        import semimig.shardformer.replan  # noqa: F401  (the mechanics that move weights and optimizer state)
    except ImportError:
        if mode == "reshard":
            raise ConfigError("mode='reshard' needs semimig.shardformer.replan (apply_plan), which this install "
                              "lacks") from None
        logger.info("semimig: mode=semi without re-sharding: semimig.shardformer.replan is missing")
        return None
    if optimizer is None:
        if mode == "reshard":
            raise ConfigError("mode='reshard' moves the optimizer state with the weights: pass optimizer= (the "
                              "boosted optimizer)")
        logger.info("semimig: mode=semi without re-sharding: no optimizer= to move the state of")
        return None
    return plan


def make_resharder(model: Any, optimizer: Any, plugin: Any, plan: Any, mode: str, balance_config: Any,
                   reshard: Any, iterations_per_epoch: Optional[int]):
    """The :class:`~semimig.resharder.Resharder` and the function that rebuilds the controller on
    the new shapes after a move (the controller's binding caches every layer's shape)."""
    from semimig.controller import BalanceController
    from semimig.nn.balanced import BalancedLinearMixin

    group = plugin.tp_group
    config = getattr(model, "unwrap", lambda: model)().config

    def move(new_plan: Any) -> tuple[int, float]:
        from semimig.shardformer.replan import apply_plan

        report = apply_plan(model, optimizer, new_plan, group=group)
        return int(report.bytes_sent), float(report.seconds)

    def rebuild(old: Any, new_plan: Any, *, settled: bool):
        """A controller on the new shapes (``None``: keep ``old``).  Mode semi on uneven shards: only
        measuring until the policy has a full window under the new plan (``settled``), then resizing
        only, comparing each rank's busy time to the share of it the new plan gives the rank."""
        even = len(set(new_plan.mlp_units)) == 1 and len(set(new_plan.kv_units)) == 1
        if mode == "semi":
            wanted = "semi" if even else (resizing_mode(balance_config) if settled else "baseline")
        else:
            wanted = balance_config.mode
        if settled and wanted == old.config.mode:
            return None
        for layer in (m for m in model.modules() if isinstance(m, BalancedLinearMixin)):
            layer.directive = None
        old.close()
        base = balance_config if wanted == balance_config.mode else dataclasses.replace(balance_config, mode=wanted)
        if mode == "semi" and old.rank == 0 and wanted != old.config.mode:
            logger.info("semimig: shards %s: %s", "even again, migration back on (semi)" if even else
                        "uneven, resizing only (%s) for what varies from step to step, against the busy times "
                        "measured under the new plan (migration assumes equal K per rank)" % wanted if settled else
                        "uneven: resizing paused until a window of steps is measured under the new plan", new_plan)
        new = BalanceController(model, base, process_group=group, iterations_per_epoch=iterations_per_epoch)
        new.iteration, new.epoch = old.iteration, old.epoch
        for timing, before in zip(new.timings, old.timings):
            timing.carry_history(before)  # warm: a slowdown after the move is seen within a few steps
        new.injector.set_position(old.epoch, old.iteration)  # a time-varying straggler keeps its phase
        # resizing compares what varies, not the planned split
        new.busy_scale = resharder.busy_scale() if settled and not even else (1.0,) * resharder.size
        return new, [m for m in model.modules() if isinstance(m, BalancedLinearMixin)]

    reshard = reshard or ReshardConfig()  # the same policy in both modes: the config is taken as given
    replicas = int(getattr(plugin, "dp_size", 1))
    zero_stage = int(getattr(plugin, "zero_stage", 0))
    if zero_stage > 0 and reshard.min_units < 1:
        # LowLevelZero cuts every parameter into equal flat shards per DP rank; a parameter with no
        # elements has none to cut, so under ZeRO every rank keeps at least one unit of each kind
        reshard = dataclasses.replace(reshard, min_units=1)
        if dist.get_rank() == 0:
            logger.info("semimig: zero_stage=%d: every rank keeps at least one unit of each kind (ZeRO's flat "
                        "master shards cannot hold an empty parameter); zero_stage=0 lets a slow rank hold none",
                        zero_stage)

    def move_replicas(plans: tuple) -> tuple[int, float]:
        from semimig.shardformer.replicas import apply_replica_plans

        report = apply_replica_plans(model, optimizer, plans)
        return int(report.bytes_sent), float(report.seconds)

    if replicas > 1 and zero_stage > 0 and dist.get_rank() == 0:
        logger.info("semimig: zero_stage=%d with dp_size=%d: the replicas share one plan, planned for the slowest "
                    "rank at each TP position (ZeRO's flat gradient buckets and master shards need equal shapes "
                    "across the data-parallel group; zero_stage=0 lets each replica plan for itself)",
                    zero_stage, replicas)
    resharder = Resharder(plan, config, group=group, move=move, config=reshard, replicas=replicas,
                          world_group=None, dp_rank=P.group_rank(plugin.dp_group) if replicas > 1 else 0,
                          dp_group=plugin.dp_group if replicas > 1 else None,
                          move_replicas=move_replicas if replicas > 1 and zero_stage == 0 else None)
    return resharder, rebuild
