"""The re-sharder: feeds the pure policy every step's numbers and moves on its decision.

Once per optimizer step, after the balance controller's ``step()``, :class:`Resharder` gathers
every rank's split of the step over the tensor-parallel group (:mod:`.observe`), feeds the numbers,
identical on every rank, to :class:`~semimig.controller.reshard.ReshardPolicy`, and when it decides,
moves the weights and optimizer state (the ``move`` it was given: a collective), tells the policy
the measured cost and hands the caller the new plan.  Every rank takes the same decision at the
same step because it decides from the same gathered numbers.  At DEBUG, one line per step with every
rank's numbers and the policy's reason.
"""
from __future__ import annotations

import collections
import logging
import math
import statistics
from typing import Any, Callable, Optional

from semimig.comm import primitives as P
from semimig.comm.lagged import LaggedRows
from semimig.controller.reshard import ReshardConfig, ReshardDecision, ReshardPolicy, ReshardSample
from semimig.resharder.joint import JointSetup, SeatMemory, even_samples, per_mean_batch
from semimig.resharder.events import ReplanEvent, log_measured, log_replan
from semimig.resharder.idle import IdleReader
from semimig.resharder.jointmoves import JointMoves
from semimig.comm.holders import skipping
from semimig.resharder.observe import (PROBE_MAX_SIZE, gemm_baseline, probe_times, row_sample, slowest_per_position,
                                       step_sample, unshed)
from semimig.resharder.plans import params_per_unit
from semimig.sharding.plan import ShardPlan

__all__ = ["Resharder"]

logger = logging.getLogger(__name__)


class Resharder(JointMoves):
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
    flight at a move were measured under the old plans and are dropped.  The resizing baseline
    (:meth:`busy_baseline`) stays each replica's own GEMM split.

    ``layers``: the decoder layers this rank's model holds (a pipeline stage's own; default every
    layer of ``model_config``): what one unit weighs, and so what moving it costs, counts only them."""

    def __init__(self, plan: Any, model_config: Any, *, group: Any, move: Callable[[Any], tuple[int, float]],
                 config: ReshardConfig = ReshardConfig(), state_bytes_per_param: int = 12,
                 replicas: int = 1, world_group: Any = None, dp_rank: int = 0, dp_group: Any = None,
                 move_replicas: Optional[Callable[[tuple], tuple[int, float]]] = None,
                 joint: Optional[JointSetup] = None, layers: Optional[int] = None) -> None:
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
        mlp_params, kv_params = params_per_unit(model_config, dims, plan.block_size, layers=layers)
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
        self.joint = joint if self.per_replica else None
        """With a batch split under plain DP: every replica's plan and the split from one planner (:mod:`.joint`)."""
        self.samples: Optional[tuple[int, ...]] = None if self.joint is None else \
            even_samples(self.joint.global_batch, replicas)
        """The batch split the joint planner keeps (samples per replica, DP rank order); ``None`` without it."""
        self.joint_replans: list[dict] = []
        """Every joint decision: its step, the new split, the predicted job step, what memory bounded."""
        self._job_moved = 0  # the step the job last moved (the joint gain test's age)
        self._job_read: Optional[int] = None  # the age at which the job's gain was last read (:func:`reading_due`)
        self._job_blocked = 0.0  # the most noise the last reading's gain allowed, where only the noise held it
        self._job_held: Optional[tuple] = None  # the speeds the planner read at the last reading that moved nothing
        self._world_seats: Optional[list] = None  # (dp rank, TP rank) of each world-group rank (JointMoves._search)
        self._seats = SeatMemory()  # the joint planner's seat fit across a move that empties a slow rank
        self.probe_work: Optional[dict] = None
        """The device probe's work and every rank's seconds for it (set by :meth:`probe` with one replica)."""
        self.idle: Optional[IdleReader] = None
        """How a rank that skips the step is read (:mod:`.idle`); ``None``: no rank skips."""
        self._idle_clock: Any = None
        self.ddp_waits: tuple = ()
        """The DDP hooks that time the data-parallel all-reduce's wait on the step clock
        (:mod:`semimig.straggler.ddp_wait`; set by :func:`~semimig.resharder.make_resharder`)."""

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
            waited = getattr(device, "dp_s", None) if self.ddp_waits else None  # timed only by semimig's DDP hook
            dp = math.nan if waited is None else float(waited)
            update = getattr(device, "update_s", None)
            return self._gather_replicas(report, [compute, busy, comm, sleep, wall, work, gap, dp,
                                                  math.nan if update is None else float(update)])
        idle = skipping(self.group) if self.idle is not None else ()
        probe = [self.idle.take(wall)] if idle else []
        rows = P.all_gather_rows([compute, busy, comm, sleep, wall, work, gap] + probe, self.group)
        if idle:  # a rank that skips the step: its replicated work at its probed speed (.idle)
            rows = self.idle.rows(rows, idle)
        decision = getattr(report, "decision", None)
        fixed = getattr(decision, "fixed_fraction", None) or (math.nan,) * self.size
        shed = any(0.0 < row[5] < 1.0 for row in rows)  # the step as it ran, when a rank shed work
        return step_sample([unshed(c, b, sleep_s=s, work=w, fixed=f) for (c, b, _, s, _, w, _), f in zip(rows, fixed)],
                       rows, step_s=max(row[0] for row in rows) + min(row[2] for row in rows) if shed else None)

    def _gather_replicas(self, report: Any, mine: list[float]) -> Optional[Any]:
        """This replica's rows (each rank's own numbers, unshed with its own fixed fraction; a TP
        gather), posted to the DP group's lagged all-gather; from the previous step's rows of every
        replica, every replica's own sample (a plan per replica), or that replica's own sample kept for
        :meth:`busy_baseline` and the slowest rank per TP position for the one policy (``None`` at a step
        with nothing in flight)."""
        decision = getattr(report, "decision", None)
        fixed = getattr(decision, "fixed_fraction", None) or (math.nan,) * self.size
        *row, dp, update = mine
        idle = skipping(self.group) if self.idle is not None else ()
        wall = row[4]
        probe = [self.idle.take(wall)] if idle else []
        gathered = P.all_gather_rows(row + probe + [dp, update], self.group)
        updates = [g[-1] for g in gathered]
        rows = self.idle.rows([g[:-2] for g in gathered], idle, update=updates) if idle else [g[:7] for g in gathered]
        local = []
        for r, ((compute, busy, comm, sleep, wall, work, gap), g) in enumerate(zip(rows, gathered)):
            c, b = unshed(compute, busy, sleep_s=sleep, work=work, fixed=float(fixed[r]))
            u = 0.0 if r in idle else updates[r]  # a rank that skips the step is read without an update (.idle)
            local.append([r, self.dp_rank, c, b + gap, comm, b, sleep, wall, work, gap, g[-2], u])
        mine_sample = None if self.per_replica else row_sample(local)
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
            return tuple(row_sample([by_replica[d][r] for r in range(self.size)]) for d in range(self.replicas))
        return row_sample(slowest_per_position(rows, tp=self.size))

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
        """Each replica's policy fed its own replica's sample; any decision moves the world at once (with a
        joint planner: to its plans and split where the job gains, :meth:`_policy_move`)."""
        if self.joint is not None:  # the policies read times per mean batch (.joint)
            mean = self.joint.global_batch / self.replicas
            samples = tuple(per_mean_batch(s, b, mean) for s, b in zip(samples, self.samples))
        decisions = [policy.observe(sample) for policy, sample in zip(self.policies, samples)]
        self.last = decisions[self.dp_rank]
        self._debug(self.policy, samples[self.dp_rank], self.last)
        settled = [self._measured(decision, replica=d) for d, decision in enumerate(decisions)]
        self.settled_now = settled[self.dp_rank]
        step = int(getattr(report, "iteration", self.last.step))
        if not any(decision.replan for decision in decisions):
            return self._job_gain(decisions, step=step) if self.joint is not None else None
        if self.joint is not None:
            return self._policy_move(decisions, step=step)
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
        work: dict = {}
        times = probe_times(self.group, clock, size=size, device=device or self._device, dtype=dtype, work=work)
        if self.reads_idle:  # what an idle rank's probe reruns (.idle): its own TP group's
            self.probe_work = dict(work, device=device or self._device, dtype=dtype,
                                   base=[statistics.median(row[r] for row in times) for r in range(self.size)])
            if self.policy.learned.idle_free:
                self._read_idle()
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
        if self._speaks and (replica is None or replica == self.dp_rank):
            log_replan(event, new, decision)

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
        """The first measured step after a re-plan (of ``replica``, with a plan per replica), read over the
        policy's steps at one set of speeds: beside the predicted one (True then)."""
        event = next((e for e in reversed(self.events) if e.replica == replica), None)
        if event is None or event.measured_s is not None or decision.current_s <= 0.0:
            return False
        event.measured_s = decision.current_s
        if self._speaks and (replica is None or replica == self.dp_rank):
            log_measured(event, (self.policy if replica is None else self.policies[replica]).samples.steps)
        return True

    @property
    def reads_idle(self) -> bool:
        """Whether a rank that skips the step is read by the device probe (:mod:`.idle`): the probe runs (tp > 1,
        ``probe`` > 0) and each TP group plans for itself (one replica, or a plan per replica)."""
        return self.size > 1 and self.policy.config.probe > 0.0 and (self.per_replica or self.replicas == 1)

    def allow_idle(self, allowed: bool, *, clock: Any = None) -> Callable[[], None]:
        """Let ranks that hold nothing skip the step (or no longer): every policy's step model prices them as
        bounding no step, and from the device probe on they are read by it (:mod:`.idle`).  Returns what an
        idle rank runs while it waits (:meth:`probe_idle`)."""
        self._idle_clock = clock if allowed else None
        for policy in self.policies:
            policy.learned.idle_free = allowed
        if not allowed:
            self.idle = None
        elif self.probe_work is not None and self.idle is None:
            self._read_idle()
        return self.probe_idle

    def _read_idle(self) -> None:
        work = self.probe_work
        self.idle = IdleReader(size=work["size"], n=work["n"], base=work["base"], device=work["device"],
                               dtype=work["dtype"], clock=self._idle_clock)

    def probe_idle(self) -> None:
        """On a rank that skips the step, while it waits: the probe of its speed (:mod:`.idle`)."""
        if self.idle is not None:
            self.idle.probe()

    def busy_baseline(self) -> Optional[tuple[float, ...]]:
        """:func:`gemm_baseline` of the policy's window under the plan in force (this replica's own
        steps in it when there are several replicas: its resizing compares its own ranks)."""
        if self.per_replica:
            return gemm_baseline(self.policy.samples, self.size)
        return gemm_baseline(self._local if self.replicas > 1 else self.policy.samples, self.size)

    def close(self) -> None:
        """The DDP hooks stop timing (they keep reducing as DDP does; torch cannot unregister them)."""
        for state in self.ddp_waits:
            state.clock = None

    # ------------------------------------------------------------------ reporting
    def summary(self) -> dict:
        """Re-plans of the run: count, plans, bytes moved and seconds, whether a rank holding nothing skips
        the step (JSON-friendly)."""
        out = {"replans": len(self.events), "plan": str(self.plan),
               "bytes_moved": sum(e.bytes_moved for e in self.events),
               "move_s": sum(e.move_s for e in self.events),
               "events": [e.as_dict() for e in self.events], "idle_skips": self.idle is not None}
        if self.per_replica:
            out["plans"] = [str(p) for p in self.plans]  # every replica's, in DP rank order
        if self.joint is not None:
            out.update(samples=list(self.samples), joint_replans=list(self.joint_replans))
        return out

