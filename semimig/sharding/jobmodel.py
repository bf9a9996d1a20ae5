"""The step and memory model of a tensor × data-parallel job, which the joint planner (:mod:`.joint`) minimises.

``D`` replicas (data-parallel groups), each a TP group of ``e`` ranks; replica ``d`` takes ``b_d`` of the global
batch's ``B`` samples.  The paired work is split in units of several kinds (MLP blocks, KV groups): kind ``k``
has ``U_k`` units, ``n_{d,r,k}`` of them on rank ``r`` of replica ``d``.  At speed ``v_{d,r}`` (work per
second) the rank's step is

    t_{d,r} = (A(b_d) + Σ_k c_k(b_d)·n_{d,r,k}) / v_{d,r}
    A(b) = R_0 + b·R_s                   the replicated work, every rank whole (norms, embeddings, head, host)
    c_k(b) = (S_{0,k} + b·S_{s,k}) / U_k one unit's work (its GEMMs per sample, its parameters' update per step)

and the job's ``max_d T_d + comm``: the data-parallel gradient reduction waits for the slowest replica.

Segments.  A TP group's ranks meet at every layer's reduction, so a replica's step is not its slowest rank's
total but, kind by kind, its slowest rank's share of that kind's layers: each kind's layers (with the
replicated work beside them, norms, residuals and the host's part, in proportion to the kind's work) form
one segment,

    t_{d,r,k} = (w_k(b_d)·A(b_d) + c_k(b_d)·n_{d,r,k}) / v_{d,r}     w_k(b) = c_k(b)·U_k / Σ_j c_j(b)·U_j
    T_d = Σ_k max_r t_{d,r,k}

(:func:`segment_times`; ``Σ_k t_{d,r,k} = t_{d,r}``).  A plan giving every rank the same share of every kind
steps ``max_r t_{d,r}``; one that balances the ranks' totals with a slow rank holding many units of one kind
and few of another does not: the others wait for it in the first kind's reductions and it waits for them in
the second's.  With :attr:`JointProblem.idle_free` a rank holding no unit skips the step (``t_{d,r,k} = 0``);
a replica left with one holder is that rank alone, at :attr:`JointProblem.lone_speeds` (:func:`rank_speeds`).

Rank ``r``'s peak bytes under a plan are

    m_{d,r} = F + b_d·a_0 + Σ_k n_{d,r,k}·(β_k + b_d·a_k)  ≤  C_{d,r}

``F`` the replicated parameters' state and buffers, ``a_0`` the replicated activations per sample, ``β_k`` one
unit's parameters, gradients and optimizer state (:func:`state_bytes_per_param` per parameter), ``a_k`` its
activations per sample, ``C_{d,r}`` the rank's capacity (``math.inf``: unlimited).

Seats.  A rank holding a unit of kind ``k`` takes part in every reduction of its layers, and a reduction
runs at the pace of its slowest member; a rank holding none of a kind only receives the sum
(:mod:`semimig.comm.holders`).  With ``s`` the seconds per sample one kind's reductions take among
full-speed ranks, replica ``d``'s layers' collectives take ``b_d·s·Σ_k 1/min_{r seated in k} v_{d,r}``
(``v`` relative to the replica's fastest rank; :func:`seat_scale`, the re-shard policy's pricing), added to
its step: ``T_d = Σ_k max_r t_{d,r,k} + b_d·s·seat_scale``.  :func:`with_seats` fits ``s`` from the collectives
measured under the plans in force.  The vocabulary's collectives (the vocabulary-parallel embedding, head
and loss, timed as communication: :mod:`semimig.shardformer.vocab_clock`) are one more such group; every
rank sits in it, or, where a rank holding no unit skips the step (``idle_free``), every rank holding a
unit of any kind: a plan seats a slow rank there unless it empties it and it skips.  A replica left with
one holder (every other rank skipping) runs no collective: its seats cost nothing.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

from semimig._validate import check_choice, check_int, check_number
from semimig.errors import ConfigError
from semimig.sharding.plan import ShardPlan

__all__ = ["UnitKind", "JointProblem", "JointPlan", "from_measured", "job_step", "lone", "peak_bytes",
           "rank_speeds", "replica_step", "seat_scale", "seat_seconds", "segment_times", "segment_work",
           "state_bytes_per_param", "with_seats"]

_BYTES = {"fp32": (4, 4, 0), "bf16": (2, 2, 4), "fp16": (2, 2, 4)}
"""Per parameter: (weight, gradient, fp32 master copy) bytes of each precision."""
_MOMENTS = {"adam": 8, "sgd-momentum": 4, "sgd": 0}
"""Optimizer state bytes per parameter (fp32 moments)."""


def state_bytes_per_param(precision: str = "fp32", optimizer: str = "adam") -> int:
    """Bytes one trained parameter holds: weight + gradient (+ fp32 master under bf16/fp16) + the optimizer's
    fp32 moments.  fp32 with Adam: 4 + 4 + 8 = 16; bf16 with Adam: 2 + 2 + 4 + 8 = 16."""
    weight, grad, master = _BYTES[check_choice("precision", precision, tuple(_BYTES))]
    return weight + grad + master + _MOMENTS[check_choice("optimizer", optimizer, tuple(_MOMENTS))]


def _grid(name: str, value: object, *, allow_inf: bool, allow_zero: bool = False,
          shape: Optional[Tuple[int, int]] = None, like: str = "speeds") -> Tuple[Tuple[float, ...], ...]:
    """A non-empty rectangular ``[replica][tp position]`` table of numbers > 0 (``allow_zero``: ≥ 0); ``shape``:
    the ``(replicas, ranks)`` it must have, as ``like`` has."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)) or not value or any(
            isinstance(row, (str, bytes)) or not isinstance(row, (tuple, list)) or not row for row in value):
        raise ConfigError(f"{name} must be a non-empty tuple of non-empty tuples ([replica][tp position]), got {value!r}")
    if len({len(row) for row in value}) != 1:
        raise ConfigError(f"{name} must give every replica the same number of ranks, got {value!r}")
    out = []
    for d, row in enumerate(value):
        out.append(tuple(math.inf if allow_inf and x == math.inf else
                         check_number(f"{name}[{d}][{r}]", x, minimum=0.0, low_open=not allow_zero)
                for r, x in enumerate(row)))
    if shape is not None and (len(out), len(out[0])) != shape:
        raise ConfigError(f"{name} must be {shape[0]} replicas x {shape[1]} ranks like {like}, got "
                          f"{len(out)} x {len(out[0])}")
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class UnitKind:
    """One paired dimension a plan splits in whole units (MLP blocks, KV groups)."""

    name: str
    total_units: int
    """``U_k``."""
    work_per_sample: float
    """``S_{s,k}``: the work of all its units per sample (seconds at speed 1)."""
    work_fixed: float = 0.0
    """``S_{0,k}``: its work per step whatever the batch (its parameters' optimizer update)."""
    min_units: int = 0
    """Units every rank keeps (0: a rank may hold none of this kind)."""
    bytes_per_unit: float = 0.0
    """``β_k``: one unit's parameters, gradients and optimizer state (:func:`state_bytes_per_param` each)."""
    activation_bytes_per_unit_sample: float = 0.0
    """``a_k``: one unit's activations kept for the backward, per sample."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"UnitKind.name must be a non-empty string, got {self.name!r}")
        check_int(f"UnitKind({self.name}).total_units", self.total_units, minimum=1)
        check_int(f"UnitKind({self.name}).min_units", self.min_units, minimum=0)
        for field in ("work_per_sample", "work_fixed", "bytes_per_unit", "activation_bytes_per_unit_sample"):
            object.__setattr__(self, field, check_number(f"UnitKind({self.name}).{field}", getattr(self, field),
                                                         minimum=0.0))
        if self.work_per_sample + self.work_fixed <= 0.0:
            raise ConfigError(f"UnitKind({self.name}) has no work (work_per_sample=0, work_fixed=0): nothing to plan")


@dataclass(frozen=True, kw_only=True)
class JointProblem:
    """Everything the joint planner decides from (module docstring).  Work in seconds at speed 1; to give it
    per step at the current batch ``b``, divide the per-sample parts by ``b``."""

    speeds: Tuple[Tuple[float, ...], ...]
    """``v_{d,r} > 0`` per replica (DP rank order) and TP position."""
    kinds: Tuple[UnitKind, ...]
    global_batch: int
    """``B``: samples per step over all replicas."""
    replicated_per_sample: float = 0.0
    """``R_s``."""
    replicated_fixed: float = 0.0
    """``R_0``."""
    comm_s: float = 0.0
    """The step's collectives, seconds, the same under every plan."""
    micro_batch: int = 1
    """Every replica takes a multiple of this many samples, at least one multiple."""
    capacity_bytes: Optional[Tuple[Tuple[float, ...], ...]] = None
    """``C_{d,r}`` per replica and TP position (``math.inf``: unlimited); ``None``: every rank unlimited."""
    fixed_bytes: float = 0.0
    """``F``: bytes every rank holds whatever the plan (replicated parameters' state, buffers)."""
    activation_bytes_per_sample: float = 0.0
    """``a_0``: the replicated activations per sample."""
    seat_per_sample: float = 0.0
    """``s``: seconds per sample one kind's layer reductions take among full-speed ranks (0: seats not
    priced; module docstring)."""
    idle_free: bool = False
    """A rank holding no unit of any kind skips the step (:mod:`semimig.shardformer.skip`): ``t_{d,r} = 0``,
    its replica's replicated work being its holders'."""
    lone_speeds: Optional[Tuple[Tuple[float, ...], ...]] = None
    """With :attr:`idle_free`, the speeds of replica ``d``'s ranks under a plan that leaves one rank holding every
    unit (:func:`lone`): that rank meets no other, so a pace read from the ranks' meetings does not apply to it
    (:func:`~semimig.resharder.joint.at_measured_pace`); ``None``: :attr:`speeds`."""

    def __post_init__(self) -> None:
        speeds = _grid("speeds", self.speeds, allow_inf=False)
        object.__setattr__(self, "speeds", speeds)
        dp, tp = len(speeds), len(speeds[0])
        if isinstance(self.kinds, UnitKind) or not isinstance(self.kinds, (tuple, list)) or not self.kinds or \
                not all(isinstance(k, UnitKind) for k in self.kinds):
            raise ConfigError(f"kinds must be a non-empty tuple of UnitKind, got {self.kinds!r}")
        object.__setattr__(self, "kinds", tuple(self.kinds))
        names = [k.name for k in self.kinds]
        if len(set(names)) != len(names):
            raise ConfigError(f"kinds must have distinct names, got {names}")
        for k in self.kinds:
            if k.total_units < tp * k.min_units:
                raise ConfigError(f"UnitKind({k.name}).total_units={k.total_units} cannot give each of tp={tp} ranks "
                                  f"min_units={k.min_units}")
        check_int("global_batch", self.global_batch, minimum=1)
        check_int("micro_batch", self.micro_batch, minimum=1)
        if self.global_batch % self.micro_batch or self.global_batch // self.micro_batch < dp:
            raise ConfigError(f"global_batch={self.global_batch} must be a multiple of micro_batch={self.micro_batch} "
                              f"giving each of the {dp} replicas at least one")
        for field in ("replicated_per_sample", "replicated_fixed", "comm_s", "fixed_bytes",
                      "activation_bytes_per_sample", "seat_per_sample"):
            object.__setattr__(self, field, check_number(field, getattr(self, field), minimum=0.0))
        for field, allow_inf in (("capacity_bytes", True), ("lone_speeds", False)):
            if getattr(self, field) is not None:
                table = _grid(field, getattr(self, field), allow_inf=allow_inf, shape=(dp, tp))
                object.__setattr__(self, field, table)

    @property
    def dp(self) -> int:
        return len(self.speeds)

    @property
    def tp(self) -> int:
        return len(self.speeds[0])

    def capacity(self, replica: int, rank: int) -> float:
        return math.inf if self.capacity_bytes is None else self.capacity_bytes[replica][rank]

    def unit_work(self, b: float) -> Tuple[float, ...]:
        """``c_k(b)`` per kind."""
        return tuple((k.work_fixed + b * k.work_per_sample) / k.total_units for k in self.kinds)

    def unit_bytes(self, b: float) -> Tuple[float, ...]:
        """``β_k + b·a_k`` per kind."""
        return tuple(k.bytes_per_unit + b * k.activation_bytes_per_unit_sample for k in self.kinds)

    def replicated(self, b: float) -> float:
        """``A(b)``."""
        return self.replicated_fixed + b * self.replicated_per_sample


@dataclass(frozen=True, kw_only=True)
class JointPlan:
    """The planner's answer: identical on every rank given the same problem."""

    samples: Tuple[int, ...]
    """``b_d`` per replica (sums to the global batch)."""
    plans: Tuple[Tuple[ShardPlan, ...], ...]
    """``[replica][kind]``: every replica's plan of every kind."""
    replica_steps: Tuple[float, ...]
    """``T_d``: each replica's compute and its layers' reductions at its seats (no other collectives)."""
    step: float
    """The job's predicted step: ``max_d T_d + comm_s``."""
    peak_bytes: Tuple[Tuple[float, ...], ...]
    """``m_{d,r}``: every rank's predicted peak bytes."""
    memory_bound: Optional[str] = None
    """Why the plan is slower than the speeds alone would allow (a capacity, named), or ``None``."""


def unit_counts(problem: JointProblem, plans: Sequence[Sequence[ShardPlan]]) -> np.ndarray:
    """``[replica, rank, kind]`` unit counts, checked against the problem."""
    if len(plans) != problem.dp or any(len(p) != len(problem.kinds) for p in plans):
        raise ConfigError(f"plans must be {problem.dp} replicas x {len(problem.kinds)} kinds, got {plans!r}")
    for d, row in enumerate(plans):
        for plan, kind in zip(row, problem.kinds):
            plan.check_tp(problem.tp)
            if plan.total_units != kind.total_units:
                raise ConfigError(f"replica {d}'s {kind.name} plan {plan.units} does not hold its {kind.total_units} units")
    return np.array([[[p.units[r] for p in row] for r in range(problem.tp)] for row in plans], dtype=float)


def _samples(problem: JointProblem, samples: Sequence[int]) -> Tuple[int, ...]:
    if len(samples) != problem.dp or sum(samples) != problem.global_batch:
        raise ConfigError(f"samples must give {problem.dp} replicas the global batch {problem.global_batch}, "
                          f"got {tuple(samples)}")
    return tuple(check_int(f"samples[{d}]", b, minimum=0) for d, b in enumerate(samples))


def rank_times(problem: JointProblem, d: int, b: int, units: np.ndarray) -> np.ndarray:
    """``t_{d,r} = Σ_k t_{d,r,k}`` for ``units`` ``[rank, kind]`` (0 for a rank holding none with
    :attr:`JointProblem.idle_free`)."""
    return segment_times(problem, d, b, units).sum(axis=1)


def segment_work(problem: JointProblem, b: float, units: np.ndarray) -> np.ndarray:
    """``w_k(b)·A(b) + c_k(b)·n_k`` ``[row, kind]`` for each row of ``units`` ``[row, kind]``: a rank's work in
    every kind's segment, holding the row's units and taking part in the step."""
    work = np.array(problem.unit_work(b))
    whole = work * np.array([k.total_units for k in problem.kinds])
    weights = whole / whole.sum() if whole.sum() > 0.0 else np.full(len(whole), 1.0 / len(whole))
    return problem.replicated(b) * weights[None, :] + np.asarray(units, dtype=float) * work[None, :]


def segment_times(problem: JointProblem, d: int, b: float, units: np.ndarray) -> np.ndarray:
    """``t_{d,r,k}`` ``[rank, kind]`` for ``units`` ``[rank, kind]`` (module docstring): every kind's segment of each
    rank, its share of the replicated work included (0 for a rank holding none with
    :attr:`JointProblem.idle_free`: it skips the step)."""
    units = np.asarray(units, dtype=float)
    seconds = segment_work(problem, b, units) / np.array(rank_speeds(problem, d, units))[:, None]
    if problem.idle_free:
        seconds = np.where(np.all(units == 0, axis=1)[:, None], 0.0, seconds)
    return seconds


def lone(problem: JointProblem, units: np.ndarray) -> bool:
    """Whether ``units`` ``[rank, kind]`` leave one rank holding every unit while the others skip the step
    (:attr:`JointProblem.idle_free`): the replica is that rank alone, meeting no other."""
    return problem.idle_free and int(np.any(np.asarray(units) > 0, axis=1).sum()) == 1


def rank_speeds(problem: JointProblem, d: int, units: np.ndarray) -> Tuple[float, ...]:
    """Replica ``d``'s speeds under ``units`` ``[rank, kind]``: :attr:`JointProblem.lone_speeds` for a lone
    holder (:func:`lone`), else :attr:`JointProblem.speeds`."""
    if problem.lone_speeds is not None and lone(problem, units):
        return problem.lone_speeds[d]
    return problem.speeds[d]


def seat_scale(speeds: Sequence[float], plans: Sequence[ShardPlan], *, idle_free: bool = False,
               memo: Optional[dict] = None) -> float:
    """``Σ_k 1/min_{r seated in k} v_r`` over the plans' kinds and the vocabulary, ``v`` relative to the
    fastest rank (module docstring): a reduction runs at its slowest member's pace.  The vocabulary seats
    every rank, or with ``idle_free`` the ranks holding any unit (ranks holding none skip the step).  The
    re-shard policy prices seats with this same function (:mod:`semimig.controller.policy.propose`); ``memo``:
    each plan's term already read at ``speeds``.  With ``idle_free`` and a single rank holding any unit the
    group runs no collective at all (every other rank skips the step, the holder's sums and its vocabulary
    are whole on it): 0."""
    vocab = speeds if not idle_free else [v for r, v in enumerate(speeds) if any(p.units[r] > 0 for p in plans)]
    if idle_free and len(vocab) <= 1:
        return 0.0
    top, total = max(speeds), 0
    for p in plans:
        if memo is not None and p in memo:
            total += memo[p]
            continue
        term = top / (min(speeds) if min(p.units) > 0 else min([v for v, n in zip(speeds, p.units) if n > 0],
                                                                default=top))
        if memo is not None:
            memo[p] = term
        total += term
    return total + top / min(vocab, default=top)


def seat_seconds(problem: JointProblem, d: int, b: float, plans: Sequence[ShardPlan]) -> float:
    """Replica ``d``'s layer reductions at ``b`` samples under ``plans``: ``b·s·seat_scale``."""
    if problem.seat_per_sample <= 0.0:
        return 0.0
    return b * problem.seat_per_sample * seat_scale(problem.speeds[d], plans, idle_free=problem.idle_free)


def replica_step(problem: JointProblem, d: int, b: int, plans: Sequence[ShardPlan]) -> float:
    """``T_d``: replica ``d``'s segments at ``b`` samples under ``plans``, each at its slowest rank, plus its
    seats."""
    units = np.array([[p.units[r] for p in plans] for r in range(problem.tp)], dtype=float)
    return float(segment_times(problem, d, b, units).max(axis=0).sum()) + seat_seconds(problem, d, b, plans)


def with_seats(problem: JointProblem, samples: Sequence[int], plans: Sequence[Sequence[ShardPlan]],
               comm_s: Sequence[float]) -> JointProblem:
    """``problem`` with ``s`` fitted to ``comm_s[d]``, replica ``d``'s layer reductions measured at
    ``samples[d]`` under ``plans[d]``: the mean over the replicas that measured any of ``m_d/(b_d·seat_scale)``
    (0 where none did: seats not priced; a replica whose lone holder runs no collective fits nothing)."""
    unit_counts(problem, plans)
    samples = _samples(problem, samples)
    if len(comm_s) != problem.dp:
        raise ConfigError(f"comm_s must give one time per replica ({problem.dp}), got {tuple(comm_s)!r}")
    measured = [check_number(f"comm_s[{d}]", m, minimum=0.0) for d, m in enumerate(comm_s)]
    scales = [seat_scale(problem.speeds[d], plans[d], idle_free=problem.idle_free) for d in range(problem.dp)]
    fits = [m / (b * scale) for m, b, scale in zip(measured, samples, scales) if m > 0.0 and b > 0 and scale > 0.0]
    return dataclasses.replace(problem, seat_per_sample=sum(fits) / len(fits) if fits else 0.0)


def peak_bytes(problem: JointProblem, samples: Sequence[int],
               plans: Sequence[Sequence[ShardPlan]]) -> Tuple[Tuple[float, ...], ...]:
    """``m_{d,r}`` of every rank under ``samples`` and ``plans`` (module docstring)."""
    units, samples = unit_counts(problem, plans), _samples(problem, samples)
    return tuple(tuple(float(problem.fixed_bytes + b * problem.activation_bytes_per_sample
                             + units[d, r] @ np.array(problem.unit_bytes(b))) for r in range(problem.tp))
                 for d, b in enumerate(samples))


def job_step(problem: JointProblem, samples: Sequence[int], plans: Sequence[Sequence[ShardPlan]]) -> float:
    """The job's step under ``samples`` and ``plans``: ``max_d T_d + comm_s`` (memory not checked)."""
    unit_counts(problem, plans)
    samples = _samples(problem, samples)
    return max(replica_step(problem, d, b, plans[d]) for d, b in enumerate(samples)) + problem.comm_s


def from_measured(compute_s: Sequence[Sequence[float]], samples: Sequence[int], plans: Sequence[Sequence[ShardPlan]],
                  *, replicated_over_shardable: float, kinds: Sequence[UnitKind], global_batch: int,
                  update_s: Optional[Sequence[Sequence[float]]] = None, **fields: object) -> JointProblem:
    """The problem whose speeds explain every rank's compute seconds ``compute_s[d][r]``, measured with
    ``samples[d]`` samples under ``plans[d]`` (one plan per kind), from a step model's ``k = R/S`` (at run time
    read from the ranks' measured split of compute into shardable and replicated seconds,
    :func:`~semimig.resharder.joint.split_ratio`) and the kinds' relative weights (their ``work_per_sample``,
    rescaled).

    Work per sample, in healthy even replica steps at ``b̄ = B/D`` samples: ``σ = 1/((k + 1/e)·b̄)`` of
    shardable work split over the kinds by weight, ``ρ = k·σ`` replicated (the per-sample parts); then
    ``v_{d,r} = b_d·(ρ + Σ_k σ_k·n_{d,r,k}/U_k)/c_{d,r}``: a rank holding no unit reads ``b_d·ρ/c_{d,r}``,
    its compute all replicated work, so its speed is only as right as ``k``.  ``fields``: the rest of
    :class:`JointProblem`.

    ``update_s[d][r]``: the part of ``compute_s[d][r]`` in the optimizer's step, the parameters' update.  It is
    work per step whatever the batch, in proportion to the state the rank holds: ``τ·(F + Σ_k n_{d,r,k}·β_k)``
    (``F`` the ``fixed_bytes`` field, ``β_k`` the kinds' ``bytes_per_unit``).  Then the speeds are read from the
    compute less the update, and ``τ`` is the median over the ranks holding a unit of ``u_{d,r}·v_{d,r}`` over
    their state: ``R_0 = τ·F`` and ``S_{0,k} = τ·β_k·U_k``.  A rank taking every unit of a replica at fewer
    samples updates every unit's parameters all the same, which the per-sample parts alone would scale
    down with its samples.  Without ``update_s`` (or without the bytes to weigh it) the update is read as
    per-sample work, as before."""
    k = check_number("replicated_over_shardable", replicated_over_shardable, minimum=0.0)
    if isinstance(plans, (str, bytes)) or not plans or not plans[0]:
        raise ConfigError(f"plans must be one row of plans (one per kind) per replica, got {plans!r}")
    dp, tp = len(plans), plans[0][0].tp
    weights = [check_number(f"kinds[{i}].work_per_sample", kind.work_per_sample, minimum=0.0, low_open=True)
               for i, kind in enumerate(kinds)]
    sigma = 1.0 / ((k + 1.0 / tp) * global_batch / dp)
    scaled = tuple(UnitKind(name=kind.name, total_units=kind.total_units, work_per_sample=sigma * w / sum(weights),
                            min_units=kind.min_units, bytes_per_unit=kind.bytes_per_unit,
                            activation_bytes_per_unit_sample=kind.activation_bytes_per_unit_sample)
                   for kind, w in zip(kinds, weights))
    shape = JointProblem(speeds=((1.0,) * tp,) * dp, kinds=scaled, global_batch=global_batch,
                         replicated_per_sample=k * sigma, **fields)
    units, samples = unit_counts(shape, plans), _samples(shape, samples)
    grid = _grid("compute_s", compute_s, allow_inf=False, shape=(dp, tp), like="the plans")
    state_f = float(fields.get("fixed_bytes", 0.0))  # type: ignore[arg-type]
    state = units @ np.array([kind.bytes_per_unit for kind in kinds], dtype=float) + state_f
    update = None if update_s is None else _grid("update_s", update_s, allow_inf=False, allow_zero=True,
                                                 shape=(dp, tp), like="the plans")
    if update is not None and not any(u > 0.0 and state[d, r] > state_f for d, row in enumerate(update)
                                      for r, u in enumerate(row)):
        update = None  # nothing to weigh it by: the update stays per-sample work
    work = [[float(b * (k * sigma + units[d, r] @ np.array(shape.unit_work(1.0)))) for r in range(tp)]
            for d, b in enumerate(samples)]
    own = [[grid[d][r] - (0.0 if update is None else update[d][r]) for r in range(tp)] for d in range(dp)]
    for d, r in np.ndindex(dp, tp):
        if own[d][r] <= 0.0:
            raise ConfigError(f"update_s[{d}][{r}]={update[d][r]!r} leaves no compute of "  # type: ignore[index]
                              f"compute_s[{d}][{r}]={grid[d][r]!r}: the update is a part of the compute")
    speeds = tuple(tuple(work[d][r] / own[d][r] for r in range(tp)) for d in range(dp))
    replicated_fixed = 0.0
    if update is not None:
        tau = float(np.median([update[d][r] * speeds[d][r] / state[d, r] for d in range(dp) for r in range(tp)
                               if update[d][r] > 0.0 and state[d, r] > state_f]))
        replicated_fixed = tau * state_f
        scaled = tuple(dataclasses.replace(kind, work_fixed=tau * kind.bytes_per_unit * kind.total_units)
                       for kind in scaled)
    return JointProblem(speeds=speeds, kinds=scaled, global_batch=global_batch, replicated_per_sample=k * sigma,
                        replicated_fixed=replicated_fixed, **fields)
