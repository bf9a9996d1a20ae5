"""The re-sharder's joint step: every replica's plan and the batch split from one planner (DESIGN §8).

Under plain data parallelism (``zero_stage=0``) with a batch split (``enable(..., mode="reshard",
batch=BatchSplit(...))``) the replicas' policies say *when* (any of them deciding), and
:func:`~semimig.sharding.joint.plan_job` says *what*: every replica's plan and every replica's samples
together, from one step model, within every rank's memory.  The batch balancer then only carries the
split out (:meth:`~semimig.hybrid.HybridBalancer.adopt`, no re-plan trigger of its own): one owner.

The policies read times per sample.  Replica ``d`` runs ``b_d`` of the global batch's ``B`` samples, so
its rows are scaled by ``b̄/b_d`` (``b̄ = B/D``, compute, shardable and GEMM seconds; the collectives as
they are) before a policy sees them (:func:`per_mean_batch`): a change of split is then no change of
speed to the policy, and its ``R/S`` fits compare plans at one batch.  :func:`joint_problem` scales them
back to each replica's own batch for :func:`~semimig.sharding.jobmodel.from_measured`.  A rank's compute
is its own work: a replica faster than another waits for it in DDP's gradient all-reduce, and that wait
is communication on the step clock (:mod:`semimig.straggler.ddp_wait`), not compute.

Noise between healthy ranks.  The ranks of a healthy TP group read apart by their noise.  The planner
reads each replica as its policy does (:func:`~semimig.controller.policy.propose.pooled`): the ranks outside the
policy's slow set at their median speed, so what its slow-set test calls noise moves no unit, and with
no rank slow anywhere the planner's plans are the plans in force.  ``k = R/S`` is read from the windows' own split of every
rank's compute into shardable and replicated seconds (:func:`split_ratio`), the policies' fitted ratio
only where no rank measured a split: the replicated work a slow rank keeps when emptied is then what it
measures, not what a fit over plan changes made of it.  Seats
(:func:`~semimig.sharding.jobmodel.with_seats`): the layers' reductions as each replica's policy reads
them (:func:`~semimig.controller.policy.propose.seat_reading`, the least time in collectives of the
ranks seated, so no wait for a slow rank's compute) while a slow rank sits in some kind (a replica with
no rank slow measures none), kept across the move that empties it (:class:`SeatMemory`).  Only the replica with the
longest compute is read: the others' collectives hold their wait for it in DDP's all-reduce (communication
on the step clock, but no seat's), which would price every seat at that wait.

Each replica at its measured pace (:func:`at_measured_pace`).  The step model puts a rank's replicated work
beside the others' shardable work; on a real step part of it runs while the others wait (the
vocabulary-parallel embedding, the head and loss, the optimizer, the host), so a slow rank pays its share
of that part in series and its replica steps slower than the model says.  While some rank is slow, every
replica's own step (:func:`own_steps`: its ranks' compute and collectives less their wait for the other
replicas in the data-parallel reduction, which the step clock times apart) over the model's step for it
under the plans and split in force, ``m_d``, divides that replica's speeds: the split then gives each
replica the samples it really steps at.  Each factor is read from the replica's own measurement, never
from another's, so it cannot feed on itself; with no rank slow anywhere nothing is scaled.  What it reads
beyond the model arises where the ranks meet, so a lone holder (a tp 2 replica whose other rank skips)
keeps a factor of its own, and each form's is kept across a move into the other (:class:`SeatMemory`).

The optimizer's update.  The step clock times the optimizer's step apart (the balancer's hook, region
``"update"``): it is work per step in proportion to the state a rank holds, whatever its samples, so it is
neither scaled per mean batch (:func:`per_mean_batch`) nor read as replicated work (:func:`split_ratio`), and
:func:`~semimig.sharding.jobmodel.from_measured` reads it as the model's per-step parts.  Read per sample
instead, a rank that takes every unit at fewer samples (the lone holder of a replica given less of the
batch) would be priced as if it updated fewer parameters.

Memory (:class:`JointSetup`): every rank's capacity (``BatchSplit.capacity``), the bytes of one unit of
each kind (its parameters over the layers, times the bytes a trained parameter holds: weight, gradient,
fp32 master under bf16/fp16, the optimizer's moments) and the most any rank holds outside its units.
Activations are not in the model (they depend on the sequence length the loop feeds, not known at
``enable``); ``memory_bytes`` below the device's size leaves them room.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from semimig.comm import primitives as P
from semimig.controller.policy.propose import pooled, seat_reading
from semimig.controller.policy.stepmodel import K_FLOOR
from semimig.controller.reshard import ReshardSample
from semimig.errors import ConfigError
from semimig.sharding.jobmodel import (JointProblem, UnitKind, from_measured, lone, replica_step, seat_seconds,
                                      state_bytes_per_param, unit_counts, with_seats)
from semimig.sharding.plan import ShardPlan
from semimig.sharding.solver import StepModel

__all__ = ["JointSetup", "SeatMemory", "at_measured_pace", "at_samples", "even_samples", "joint_problem",
           "joint_setup", "noise_blocked", "own_steps", "per_mean_batch", "reading_due", "same_speeds", "search_root",
           "split_ratio", "update_part"]

KINDS = ("mlp", "kv")
"""The paired dimensions a plan splits, in the policies' order."""


@dataclass(frozen=True, kw_only=True)
class JointSetup:
    """What the joint planner needs beyond the policies' windows (identical on every rank)."""

    global_batch: int
    dp: int
    bytes_per_unit: tuple[float, ...]
    """One unit's parameters, gradients and optimizer state per kind (:data:`KINDS`), bytes."""
    fixed_bytes: float
    """The most any rank holds outside its units (replicated parameters and their state), bytes."""
    capacity_bytes: Optional[tuple[tuple[float, ...], ...]]
    """``[replica][TP rank]`` bytes each rank may hold; ``None``: every rank unlimited."""
    min_units: int = 0

    def __post_init__(self) -> None:
        if self.global_batch < self.dp:
            raise ConfigError(f"the joint planner gives each of the {self.dp} data-parallel replicas at least one "
                              f"sample: BatchSplit.global_batch_size={self.global_batch} is too small")


def reading_due(age: int, last: Optional[int], *, needed: float = 0.0, blocked: float = 0.0) -> bool:
    """Whether the job's gain is read again at ``age`` steps since the job last moved, the last reading taken
    at age ``last`` (``None``: none since the move, or a policy has since left its plan held).

    With the speeds held, the gain test's answer changes with the life it counts (the age), with the noise
    the replicas' windows allow (``needed``, ``ε``, which shrinks as a window gains steps) and with drift
    within that noise.  It is read at once, then whenever the age has doubled since the last reading: a gain
    that needs a life ``L`` is taken by age ``2L`` at the latest, and a run of ``T`` steps reads it about
    ``log₂ T`` times instead of every step (the planner's search is host work every rank waits for).  A
    scheduled reading whose gain only the noise held back (:func:`noise_blocked`) is read once more as soon as
    ``needed`` falls below ``blocked``, the most noise with which it passes: ``ε`` falls as the windows gain
    steps, about as ``1/√n``, well before the age doubles."""
    return last is None or age >= 2 * max(last, 1) or needed < blocked


def noise_blocked(test: Any, step_s: float) -> float:
    """The largest ``ε`` with which the failed gain ``test`` (:class:`~semimig.controller.policy.gain.Gain` of a
    step of ``step_s``) would have passed: ``(g − C/L)/t₀``; 0 where it passed or where no ``ε`` would let it
    pass (the gain does not pay the moves over its life even without noise)."""
    if test.passed or test.life <= 0 or step_s <= 0.0:
        return 0.0
    return max(0.0, (test.gain_s - test.cost_s / test.life) / step_s)


def same_speeds(speeds: Sequence[Sequence[float]], held: Optional[Sequence[Sequence[float]]], band: float) -> bool:
    """Whether every rank's speed relative to the job's fastest in ``speeds`` is within ``band`` (a relative
    error, the least gain a move is taken on) of its speed in ``held`` (``None``: no reading held)."""
    if held is None or len(held) != len(speeds) or any(len(a) != len(b) for a, b in zip(speeds, held)):
        return False
    top, was = max(map(max, speeds)), max(map(max, held))
    return all(abs(math.log((v / top) / (h / was))) <= band for row, old in zip(speeds, held) for v, h in zip(row, old))


def search_root(speeds: Sequence[Sequence[float]], seats: Sequence[tuple[int, int]]) -> int:
    """The rank that searches the joint plan: of ``seats`` (each rank's ``(replica, TP rank)`` in the
    group's order) the one at the fastest of ``speeds[replica][TP rank]``, ties to the lowest replica,
    then TP rank."""
    where = [(d, r) for d, row in enumerate(speeds) for r in range(len(row))]
    fastest = max(where, key=lambda seat: (speeds[seat[0]][seat[1]], -seat[0], -seat[1]))
    if list(seats).count(fastest) != 1:
        raise ConfigError(f"search_root: seat {fastest} must be held by exactly one rank of {list(seats)}")
    return list(seats).index(fastest)


def even_samples(global_batch: int, dp: int) -> tuple[int, ...]:
    """``B`` samples over ``D`` replicas, the first ``B mod D`` taking one more."""
    return tuple(global_batch // dp + (1 if d < global_batch % dp else 0) for d in range(dp))


def update_part(sample: ReshardSample, r: int) -> float:
    """Rank ``r``'s optimizer step in ``sample`` (0 where it was not timed), at most its compute."""
    return 0.0 if sample.update_s is None else min(sample.update_s[r], sample.compute_s[r])


def at_samples(sample: ReshardSample, r: int, scale: float) -> float:
    """Rank ``r``'s compute in ``sample`` with its per-sample part times ``scale`` (its update as it is)."""
    update = update_part(sample, r)
    return (sample.compute_s[r] - update) * scale + update


def per_mean_batch(sample: ReshardSample, samples: int, mean: float) -> ReshardSample:
    """``sample`` (a replica's step at ``samples`` samples) scaled to ``mean`` samples: compute (less the
    optimizer's update, work per step), shardable and GEMM seconds times ``mean/samples``, the collectives
    and the update as they are (module docstring)."""
    scale = mean / samples
    if scale == 1.0:
        return sample
    ranks = range(len(sample.compute_s))
    return dataclasses.replace(sample, compute_s=tuple(at_samples(sample, r, scale) for r in ranks),
                               shardable_s=tuple(b * scale for b in sample.shardable_s),
                               gemm_s=None if sample.gemm_s is None else tuple(g * scale for g in sample.gemm_s))


def split_ratio(windows: Sequence[Sequence[ReshardSample]], shares: Sequence[Sequence[float]]) -> Optional[float]:
    """``k = R/S`` from the measured split of every rank's compute (``None`` where no rank measured one).

    Rank ``r`` of a replica at ``b`` samples, speed ``v_r``, holding the share ``p_r`` of the shardable work
    (``shares[d]``, the kinds' weights included: the policy's :meth:`shares`) computes
    ``c_r = b·(ρ + σ·p_r)/v_r`` seconds besides its optimizer's update (timed apart where
    ``ReshardSample.update_s`` is given, and taken off), ``b_r = b·σ·p_r/v_r`` of them shardable (``ρ``, ``σ``:
    the replicated and shardable work per sample, ``k = ρ/σ``).  So ``(c_r − b_r)/b_r = k/p_r``, whatever the
    rank's speed and batch (a window scaled per mean batch reads the same):

        k_r = p_r·(c_r − b_r)/b_r

    Each rank with ``p_r > 0`` reads the median of ``k_r`` over its window's steps with ``b_r > 0``, and ``k``
    is the median of those readings over every replica's ranks: one outlier step or one rank's timer off
    moves neither.  A rank holding nothing measures no split (its compute is all replicated).  Shardable
    seconds the timers miss read as replicated work, so ``k`` errs high, never towards a slow rank's
    replicated work being free.  Floored at :data:`~semimig.controller.policy.stepmodel.K_FLOOR`: a rank
    holding no unit is read through ``R``."""
    readings = []
    for window, p in zip(windows, shares):
        for r, share in enumerate(p):
            steps = [share * (s.compute_s[r] - update_part(s, r) - s.shardable_s[r]) / s.shardable_s[r]
                     for s in window if share > 0.0 and s.shardable_s[r] > 0.0]
            if steps:
                readings.append(statistics.median(steps))
    return max(K_FLOOR, statistics.median(readings)) if readings else None


def joint_problem(setup: JointSetup, policies: Sequence[Any], samples: Sequence[int],
                  memory: Optional["SeatMemory"] = None) -> Optional[JointProblem]:
    """The problem every replica's window poses (``None`` while some window is empty), read over its steps at
    one set of speeds (the steps since some rank's speed last changed, as the policy reads its own model:
    the older steps of a window hold the speeds before the change until they leave it): per rank the median
    compute per mean batch scaled to its replica's ``samples``, ``R/S`` from the windows' split
    (:func:`split_ratio`; the policies' mean ``R/S`` where no rank measured one) and the kinds' weights of
    replica 0's policy (every replica's policy starts from the same); each replica's ranks outside its
    policy's slow set at their median speed, the seats fitted to the reductions they measure while a slow
    rank is seated (module docstring; ``memory``: the fit kept across a move that empties it)."""
    windows = [policy.samples.steady() or list(policy.samples) for policy in policies]  # at one set of speeds
    if any(not window for window in windows):
        return None
    mean = setup.global_batch / setup.dp
    tp = len(windows[0][0].compute_s)
    k = split_ratio(windows, [policy.shares() for policy in policies])
    if k is None:
        k = sum(policy.replicated_ratio for policy in policies) / len(policies)
    per_sample = [[statistics.median(s.compute_s[r] - update_part(s, r) for s in window) * b / mean
                   for r in range(tp)] for window, b in zip(windows, samples)]
    update = None
    if all(s.update_s is not None for window in windows for s in window) and min(map(min, per_sample)) > 0.0:
        update = [[statistics.median(update_part(s, r) for s in window) for r in range(tp)] for window in windows]
        compute = [[c + u for c, u in zip(part, whole)] for part, whole in zip(per_sample, update)]
    else:  # the update not timed (or all of some rank's compute): read per sample
        compute = [[statistics.median(s.compute_s[r] for s in window) * b / mean for r in range(tp)]
                   for window, b in zip(windows, samples)]
    kinds = tuple(UnitKind(name=name, total_units=plan.total_units, work_per_sample=float(weight),
                           min_units=setup.min_units, bytes_per_unit=nbytes)
                  for name, plan, weight, nbytes in zip(KINDS, policies[0].plans, policies[0].weights,
                                                        setup.bytes_per_unit))
    plans = [policy.plans for policy in policies]
    problem = from_measured(compute, samples, plans, replicated_over_shardable=k, kinds=kinds,
                            global_batch=setup.global_batch, update_s=update,
                            capacity_bytes=setup.capacity_bytes,
                            fixed_bytes=setup.fixed_bytes, idle_free=policies[0].learned.idle_free)
    slow = [frozenset(policy.slowdown.slow) for policy in policies]
    speeds = tuple(pooled(StepModel(speeds=row, replicated=0.0, shardable=1.0), s).speeds
                   for row, s in zip(problem.speeds, slow))
    slowest = max(range(len(compute)), key=lambda d: (max(compute[d]), -d))
    seats = [_seat_comm(window, s, row) if d == slowest and _seated(row, s) else 0.0
             for d, (window, s, row) in enumerate(zip(windows, slow, plans))]
    problem = with_seats(dataclasses.replace(problem, speeds=speeds), samples, plans, seats)
    if memory is not None:
        problem = memory.apply(problem, slow=any(slow))
    own = own_steps(windows, samples, mean, plans if problem.idle_free else None)
    if own is None or not any(slow):
        return problem
    return at_measured_pace(problem, own, samples, plans, memory)


def own_steps(windows: Sequence[Sequence[ReshardSample]], samples: Sequence[int], mean: float,
              plans: Optional[Sequence[Sequence[ShardPlan]]] = None) -> Optional[list]:
    """Each replica's own step: per step the longest of its ranks' compute (scaled back from the mean batch to
    its ``samples``) and collectives less their wait in the data-parallel reduction, the median over its
    window; ``None`` unless every sample tells that wait apart (``dp_wait_s``).  ``plans``: where a rank
    holding no unit skips the step, each replica's plans in force — a skipping rank runs no step (its row
    is what it would compute if it held work, read by its probe) and is left out."""
    if any(s.dp_wait_s is None for window in windows for s in window):
        return None
    out = []
    for d, (window, b) in enumerate(zip(windows, samples)):
        ranks = [r for r in range(len(window[0].compute_s))
                 if plans is None or any(p.units[r] > 0 for p in plans[d])]
        out.append(statistics.median(max(at_samples(s, r, b / mean) + s.comm_s[r] - s.dp_wait_s[r] for r in ranks)
                                     for s in window))
    return out


def at_measured_pace(problem: JointProblem, own: Sequence[float], samples: Sequence[int],
                     plans: Sequence[Sequence[ShardPlan]], memory: Optional["SeatMemory"] = None) -> JointProblem:
    """``problem`` with every replica's speeds over ``m_d``, its own step measured under the plans and split in
    force over the model's (module docstring; the seats' reductions, which the speeds do not scale, taken off
    both): each replica is read at the pace it steps at.

    What ``m_d`` reads beyond the model comes from the ranks meeting at every reduction (a slow rank's work at
    the meetings, the order they arrive in); a lone holder (:func:`~semimig.sharding.jobmodel.lone`) meets no
    one.  So a pace read under a plan whose ranks meet scales the plans whose ranks meet, one read under a lone
    holder scales lone holders (:attr:`~semimig.sharding.jobmodel.JointProblem.lone_speeds`), and the other is
    the one ``memory`` kept from the last plan of that form (1 where none was read: the model's pace)."""
    speeds, alone, counts = [], [], unit_counts(problem, plans)
    for d, (row, b, mine) in enumerate(zip(problem.speeds, samples, own)):
        seats = seat_seconds(problem, d, b, plans[d])
        predicted = replica_step(problem, d, b, plans[d]) - seats
        scale = (mine - seats) / predicted if predicted > 0.0 and mine > seats else 1.0
        now_lone = lone(problem, counts[d])
        paces = memory.pace(d, now_lone, scale) if memory is not None else ((1.0, scale) if now_lone else (scale, 1.0))
        speeds.append(tuple(v / paces[0] for v in row))
        alone.append(tuple(v / paces[1] for v in row))
    return dataclasses.replace(problem, speeds=tuple(speeds), lone_speeds=tuple(alone) if problem.idle_free else None)


class SeatMemory:
    """The last seat fit measured with a slow rank seated, and each replica's last pace read under each form of
    plan (its ranks meeting, a lone holder: :func:`at_measured_pace`), kept while some rank stays slow.

    Emptied of a kind, a slow rank leaves no trace of its pace in what the others measure (at tp 2 its
    partner holds the kind alone and reduces nothing), so a fit read then would price seating it again at
    nothing and the planner would hand it units back, to find the old pace and move again.  The fit in
    force is the last one read with the slow rank seated; likewise a lone holder's pace says nothing of
    its ranks' meetings, nor theirs of it.  All is forgotten when no rank is slow."""

    def __init__(self) -> None:
        self.seat_per_sample = 0.0
        self.paces: dict = {}
        """``(replica, lone)``: the last pace read under a plan of that form."""

    def pace(self, d: int, alone: bool, scale: float) -> tuple[float, float]:
        """Replica ``d``'s (meeting, lone) paces, ``scale`` just read under the form ``alone`` says."""
        self.paces[(d, alone)] = scale
        return self.paces.get((d, False), 1.0), self.paces.get((d, True), 1.0)

    def apply(self, problem: JointProblem, *, slow: bool) -> JointProblem:
        if not slow:
            self.seat_per_sample = 0.0
            self.paces.clear()
            return problem
        if problem.seat_per_sample > 0.0:
            self.seat_per_sample = problem.seat_per_sample
            return problem
        return dataclasses.replace(problem, seat_per_sample=self.seat_per_sample)


def _seated(plans: Sequence[ShardPlan], slow: frozenset) -> bool:
    """Whether a rank of ``slow`` holds a unit of some kind under ``plans``: its pace is in the reductions."""
    return any(p.units[r] > 0 for p in plans for r in slow)


def _seat_comm(window: Sequence[ReshardSample], slow: frozenset, plans: Sequence[ShardPlan]) -> float:
    """A replica's layer reductions under ``plans`` as the re-shard policy reads them
    (:func:`~semimig.controller.policy.propose.seat_reading`; 0 with no rank slow)."""
    return seat_reading(window, plans) if slow else 0.0


def as_policy_plans(plans: Sequence[ShardPlan], like: Sequence[ShardPlan]) -> tuple[ShardPlan, ...]:
    """The planner's plans with the unit sizes of the plans in force (``like``)."""
    return tuple(ShardPlan(units=p.units, unit_size=q.unit_size) for p, q in zip(plans, like))


def _optimizer_kind(optimizer: Any) -> str:
    inner = getattr(optimizer, "optim", optimizer)
    name = type(inner).__name__.lower()
    if "sgd" in name:
        groups = getattr(inner, "param_groups", None) or [{}]
        return "sgd-momentum" if groups[0].get("momentum", 0) else "sgd"
    return "adam"  # Adam, AdamW and anything else: two fp32 moments per parameter, the larger guess


def joint_setup(model: Any, optimizer: Any, plugin: Any, plan: Any, batch: Any, *, units: tuple[float, float],
                min_units: int) -> JointSetup:
    """The :class:`JointSetup` of this job (collective over the world: every rank's capacity and bytes
    outside its units are gathered).  ``units``: one MLP block's and one KV group's parameters over the
    layers (:func:`~semimig.resharder.plans.params_per_unit`); ``plan``: the plan in force (every replica's)."""
    per_param = state_bytes_per_param(str(getattr(plugin, "precision", "fp32")), _optimizer_kind(optimizer))
    unit_bytes = tuple(float(n * per_param) for n in units)
    tp_rank = P.group_rank(plugin.tp_group)
    config = getattr(model, "unwrap", lambda: model)().config
    resolved = plan.resolve(config, P.group_size(plugin.tp_group))
    held = (resolved.mlp.units[tp_rank], resolved.q.units[tp_rank])
    params = list(model.parameters())
    outside = sum(p.numel() for p in params) * per_param - sum(n * b for n, b in zip(held, unit_bytes))
    device = next((p.device for p in params), None)
    dp_rank = P.group_rank(plugin.dp_group)
    rows = P.all_gather_rows([dp_rank, tp_rank, batch.capacity(device), max(outside, 0.0)], None)
    dp = int(plugin.dp_size)
    grid = {(int(r[0]), int(r[1])): r[2] for r in rows}
    tp = P.group_size(plugin.tp_group)
    caps = tuple(tuple(grid[(d, r)] for r in range(tp)) for d in range(dp))
    unlimited = all(c == math.inf for row in caps for c in row)
    return JointSetup(global_batch=batch.global_batch_size, dp=dp, bytes_per_unit=unit_bytes,
                      fixed_bytes=max(r[3] for r in rows), capacity_bytes=None if unlimited else caps,
                      min_units=min_units)
