"""One planner for a tensor × data-parallel job: every replica's shard plan and the batch split together (DESIGN §8).

Model.  ``D`` replicas (data-parallel groups), each a TP group of ``e`` ranks; replica ``d`` takes ``b_d``
of the global batch's ``B`` samples.  The paired work is split in units of several kinds (MLP blocks, KV
groups): kind ``k`` has ``U_k`` units, ``n_{d,r,k}`` of them on rank ``r`` of replica ``d``.  At speed
``v_{d,r}`` (work per second) the rank's step is

    t_{d,r} = (A(b_d) + Σ_k c_k(b_d)·n_{d,r,k}) / v_{d,r}
    A(b) = R_0 + b·R_s                   the replicated work, every rank whole (norms, embeddings, head, host)
    c_k(b) = (S_{0,k} + b·S_{s,k}) / U_k one unit's work (its GEMMs per sample, its parameters' update per step)

the replica's step ``T_d = max_r t_{d,r}`` and the job's ``max_d T_d + comm``: the data-parallel gradient
reduction waits for the slowest replica.  Rank ``r``'s peak bytes under a plan are

    m_{d,r} = F + b_d·a_0 + Σ_k n_{d,r,k}·(β_k + b_d·a_k)  ≤  C_{d,r}

``F`` the replicated parameters' state and buffers, ``a_0`` the replicated activations per sample, ``β_k`` one
unit's parameters, gradients and optimizer state (:func:`state_bytes_per_param`), ``a_k`` its activations
per sample, ``C_{d,r}`` the rank's capacity (``math.inf``: unlimited).  No plan above a capacity is chosen.

Exact optimum.
1. One replica at ``b`` samples: ``min max_r t_r`` over whole-unit plans that fit.  The optimum is one of the
   finitely many values ``t_r(n)``; a binary search over them with an exact test — for a threshold ``t``
   each rank's admissible unit vectors are those with ``t_r(n) ≤ t`` and ``m_r(n) ≤ C_r``, and a dynamic
   programme over the ranks on the running unit counts says whether admissible vectors add up to every
   ``U_k`` (:func:`_assign`).
2. ``T_d(b)`` is non-decreasing in ``b`` (every plan's times and bytes grow with ``b``), so the split
   minimising ``max_d T_d(b_d)`` is the greedy: every replica starts at one granule (``micro_batch``
   samples), each further granule goes to the replica whose step after it is smallest (ties: lowest
   replica) — the exchange argument of the minimax.
3. Every replica's plan is then the one that fits the job's step with the fewest units moved from the
   plans in force (``reference``; default near-even): a replica faster than the job keeps its plan when it
   can, and with no straggler nothing moves.

Limits.  :func:`continuous_limit`: fractional samples and shares, memory ignored, the replicated work still
on every rank.  :func:`job_limit`: every second of work movable to any rank, ``total work / Σ v``; with one
of ``n`` ranks ``χ`` times slower it is ``n/(n − 1 + 1/χ)`` of a healthy step.
Pure arithmetic in a fixed order: every rank given the same numbers computes the same plans.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

from semimig._validate import check_choice, check_int, check_number
from semimig.errors import ConfigError
from semimig.sharding.plan import ShardPlan
from semimig.sharding.solver import StepModel, continuous_shares, solve_plan

__all__ = ["UnitKind", "JointProblem", "JointPlan", "plan_job", "job_step", "peak_bytes", "continuous_limit",
           "job_limit", "state_bytes_per_param"]

_BYTES = {"fp32": (4, 4, 0), "bf16": (2, 2, 4), "fp16": (2, 2, 4)}
"""Per parameter: (weight, gradient, fp32 master copy) bytes of each precision."""
_MOMENTS = {"adam": 8, "sgd-momentum": 4, "sgd": 0}
"""Optimizer state bytes per parameter (fp32 moments)."""


def state_bytes_per_param(precision: str = "fp32", optimizer: str = "adam") -> int:
    """Bytes one trained parameter holds: weight + gradient (+ fp32 master under bf16/fp16) + the optimizer's
    fp32 moments.  fp32 with Adam: 4 + 4 + 8 = 16; bf16 with Adam: 2 + 2 + 4 + 8 = 16."""
    weight, grad, master = _BYTES[check_choice("precision", precision, tuple(_BYTES))]
    return weight + grad + master + _MOMENTS[check_choice("optimizer", optimizer, tuple(_MOMENTS))]


def _grid(name: str, value: object, *, allow_inf: bool) -> Tuple[Tuple[float, ...], ...]:
    """A non-empty rectangular ``[replica][tp position]`` table of numbers > 0."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)) or not value or any(
            isinstance(row, (str, bytes)) or not isinstance(row, (tuple, list)) or not row for row in value):
        raise ConfigError(f"{name} must be a non-empty tuple of non-empty tuples ([replica][tp position]), got {value!r}")
    if len({len(row) for row in value}) != 1:
        raise ConfigError(f"{name} must give every replica the same number of ranks, got {value!r}")
    out = []
    for d, row in enumerate(value):
        out.append(tuple(math.inf if allow_inf and x == math.inf else
                         check_number(f"{name}[{d}][{r}]", x, minimum=0.0, low_open=True) for r, x in enumerate(row)))
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
                      "activation_bytes_per_sample"):
            object.__setattr__(self, field, check_number(field, getattr(self, field), minimum=0.0))
        if self.capacity_bytes is not None:
            caps = _grid("capacity_bytes", self.capacity_bytes, allow_inf=True)
            if (len(caps), len(caps[0])) != (dp, tp):
                raise ConfigError(f"capacity_bytes must be {dp} replicas x {tp} ranks like speeds, got "
                                  f"{len(caps)} x {len(caps[0])}")
            object.__setattr__(self, "capacity_bytes", caps)

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
    """``T_d``: each replica's compute (no collectives)."""
    step: float
    """The job's predicted step: ``max_d T_d + comm_s``."""
    peak_bytes: Tuple[Tuple[float, ...], ...]
    """``m_{d,r}``: every rank's predicted peak bytes."""
    memory_bound: Optional[str] = None
    """Why the plan is slower than the speeds alone would allow (a capacity, named), or ``None``."""


def _units_array(problem: JointProblem, plans: Sequence[Sequence[ShardPlan]]) -> np.ndarray:
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


def _rank_times(problem: JointProblem, d: int, b: int, units: np.ndarray) -> np.ndarray:
    """``t_{d,r}`` for ``units`` ``[rank, kind]``."""
    work = problem.replicated(b) + units @ np.array(problem.unit_work(b))
    return work / np.array(problem.speeds[d])


def peak_bytes(problem: JointProblem, samples: Sequence[int],
               plans: Sequence[Sequence[ShardPlan]]) -> Tuple[Tuple[float, ...], ...]:
    """``m_{d,r}`` of every rank under ``samples`` and ``plans`` (module docstring)."""
    units, samples = _units_array(problem, plans), _samples(problem, samples)
    return tuple(tuple(float(problem.fixed_bytes + b * problem.activation_bytes_per_sample
                             + units[d, r] @ np.array(problem.unit_bytes(b))) for r in range(problem.tp))
                 for d, b in enumerate(samples))


def job_step(problem: JointProblem, samples: Sequence[int], plans: Sequence[Sequence[ShardPlan]]) -> float:
    """The job's step under ``samples`` and ``plans``: ``max_{d,r} t_{d,r} + comm_s`` (memory not checked)."""
    units, samples = _units_array(problem, plans), _samples(problem, samples)
    return max(float(_rank_times(problem, d, b, units[d]).max()) for d, b in enumerate(samples)) + problem.comm_s


# ------------------------------------------------------------------------------ one replica
class _Replica:
    """Replica ``d`` at ``b`` samples: every rank's time and fit over the grid of unit vectors."""

    def __init__(self, problem: JointProblem, d: int, b: int, *, memory: bool) -> None:
        kinds = problem.kinds
        self.totals = tuple(k.total_units for k in kinds)
        self.shape = tuple(U + 1 for U in self.totals)
        n = np.indices(self.shape).reshape(len(kinds), -1).T.astype(float)  # [points, kind]
        work = problem.replicated(b) + n @ np.array(problem.unit_work(b))
        nbytes = problem.fixed_bytes + b * problem.activation_bytes_per_sample + n @ np.array(problem.unit_bytes(b))
        self.low = tuple(k.min_units for k in kinds)
        low = np.all(n >= np.array(self.low), axis=1)
        self.times = [work / v for v in problem.speeds[d]]  # [rank][points]
        self.fits = [low & (nbytes <= (problem.capacity(d, r) if memory else math.inf)) for r in range(problem.tp)]
        self.points = n.astype(int)

    def candidates(self) -> np.ndarray:
        return np.unique(np.concatenate([t[f] for t, f in zip(self.times, self.fits)]))

    def admissible(self, t: float) -> list:
        return [np.flatnonzero(f & (times <= t)) for times, f in zip(self.times, self.fits)]

    def feasible(self, t: float) -> bool:
        """Whether plans with every rank's time ``≤ t`` that fit add up to every total: the admissible vectors
        of a rank are a down-set above the minimums (time and bytes grow with every count), so for each
        vector ``o`` of the other kinds its counts of the largest kind run from the minimum to a largest
        ``top(o)``; a max-plus programme over the ranks on the running ``o`` says whether ``Σ top`` reaches
        that kind's total."""
        last = int(np.argmax(self.totals))
        other = tuple(U + 1 for k, U in enumerate(self.totals) if k != last)
        best = np.full(other, -np.inf)
        best[(0,) * len(other)] = 0.0
        for times, fits in zip(self.times, self.fits):
            ok = np.moveaxis((fits & (times <= t)).reshape(self.shape), last, -1)
            count = ok.sum(axis=-1)
            top = np.where(count > 0, self.low[last] + count - 1, -np.inf)
            new = np.full(other, -np.inf)
            for o in np.argwhere(np.isfinite(top)):
                src = tuple(slice(0, n - k) for n, k in zip(other, o))
                dst = tuple(slice(k, n) for n, k in zip(other, o))
                new[dst] = np.maximum(new[dst], best[src] + top[tuple(o)])
            best = new
        return bool(best[tuple(n - 1 for n in other)] >= self.totals[last])

    def best(self) -> float:
        """``T_d(b)``: the least threshold some plan meets (``inf``: none fits)."""
        values = self.candidates()
        lo, hi = 0, len(values) - 1
        if hi < 0 or not self.feasible(values[hi]):
            return math.inf
        while lo < hi:
            mid = (lo + hi) // 2
            if self.feasible(values[mid]):
                hi = mid
            else:
                lo = mid + 1
        return float(values[lo])


def _assign(rep: _Replica, options: list, reference: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """Unit vectors per rank from ``options`` (indices into ``rep.points``) adding up to every total, with the
    fewest units received relative to ``reference`` ``[rank, kind]`` (any when ``None``); ``None`` if none.
    A dynamic programme over the ranks on the running counts (ties: the first option in grid order)."""
    cost = np.full(rep.shape, np.inf)
    cost[(0,) * len(rep.shape)] = 0.0
    choices = []
    for r, opts in enumerate(options):
        new, choice = np.full(rep.shape, np.inf), np.full(rep.shape, -1, dtype=np.int64)
        for i in opts:
            n = rep.points[i]
            src = tuple(slice(0, U + 1 - k) for U, k in zip(rep.totals, n))
            dst = tuple(slice(k, U + 1) for U, k in zip(rep.totals, n))
            extra = 0.0 if reference is None else float(np.maximum(n - reference[r], 0).sum())
            candidate = cost[src] + extra
            better = candidate < new[dst]
            new[dst] = np.where(better, candidate, new[dst])
            choice[dst] = np.where(better, i, choice[dst])
        cost = new
        choices.append(choice)
    at = tuple(rep.totals)
    if not np.isfinite(cost[at]):
        return None
    out = []
    for choice in reversed(choices):
        n = rep.points[choice[at]]
        out.append(n)
        at = tuple(a - k for a, k in zip(at, n))
    return np.array(out[::-1])


# ------------------------------------------------------------------------------ the job
def _near_even(problem: JointProblem) -> Tuple[Tuple[ShardPlan, ...], ...]:
    """Per kind the solver's plan for equal speeds (the even plan where ``tp`` divides the units)."""
    healthy = StepModel(speeds=(1.0,) * problem.tp, replicated=0.0, shardable=1.0)
    row = tuple(solve_plan(healthy, total_units=k.total_units, min_units=k.min_units) for k in problem.kinds)
    return (row,) * problem.dp


def _split(problem: JointProblem, *, memory: bool) -> Tuple[Tuple[int, ...], float]:
    """The greedy batch split (module docstring, step 2) and its compute step ``max_d T_d(b_d)``."""
    m, dp = problem.micro_batch, problem.dp
    cache: dict = {}

    def step(d: int, b: int) -> float:
        if (d, b) not in cache:
            cache[(d, b)] = _Replica(problem, d, b, memory=memory).best()
        return cache[(d, b)]

    samples = [m] * dp
    for _ in range(problem.global_batch // m - dp):
        d = min(range(dp), key=lambda d: (step(d, samples[d] + m), d))
        samples[d] += m
    return tuple(samples), max(step(d, b) for d, b in enumerate(samples))


def _refuse_unfit(problem: JointProblem) -> None:
    """:class:`ConfigError` naming the rank (and its bytes) that cannot fit even its least share."""
    m = problem.micro_batch
    least = problem.fixed_bytes + m * problem.activation_bytes_per_sample + sum(
        k.min_units * b for k, b in zip(problem.kinds, problem.unit_bytes(m)))
    for d in range(problem.dp):
        for r in range(problem.tp):
            if least > problem.capacity(d, r):
                raise ConfigError(f"no plan fits memory: replica {d} TP rank {r} needs at least {least:.0f} bytes "
                                  f"(fixed, minimum units, {m} samples' activations), capacity "
                                  f"{problem.capacity(d, r):.0f}")
    caps = [sum(problem.capacity(d, r) for r in range(problem.tp)) for d in range(problem.dp)]
    raise ConfigError(f"no plan fits memory: some replica cannot hold every unit at {m} samples (capacities per "
                      f"replica {caps} bytes); give more capacity or fewer units per rank")


def plan_job(problem: JointProblem, *,
             reference: Optional[Sequence[Sequence[ShardPlan]]] = None) -> JointPlan:
    """Every replica's plan and the batch split minimising the job's step, each rank within its capacity
    (module docstring); ``reference``: the plans in force ``[replica][kind]`` (default near-even), kept
    where they meet the job's step.  :class:`ConfigError` when no plan fits a rank's memory."""
    ref = _units_array(problem, reference if reference is not None else _near_even(problem)).astype(int)
    samples, compute = _split(problem, memory=True)
    if not math.isfinite(compute):
        _refuse_unfit(problem)
    plans = []
    for d, b in enumerate(samples):
        rep = _Replica(problem, d, b, memory=True)
        units = _assign(rep, rep.admissible(compute), ref[d])
        plans.append(tuple(ShardPlan(units=tuple(int(n) for n in units[:, k])) for k in range(len(problem.kinds))))
    plans = tuple(plans)
    units = _units_array(problem, plans)
    replica_steps = tuple(float(_rank_times(problem, d, b, units[d]).max()) for d, b in enumerate(samples))
    bound = None
    if problem.capacity_bytes is not None:
        free_samples, free = _split(problem, memory=False)
        if compute > free * (1.0 + 1e-9):
            bound = _memory_reason(problem, free_samples, free, compute, ref)
    return JointPlan(samples=samples, plans=plans, replica_steps=replica_steps, step=max(replica_steps) + problem.comm_s,
                     peak_bytes=peak_bytes(problem, samples, plans), memory_bound=bound)


def _memory_reason(problem: JointProblem, samples: Tuple[int, ...], free: float, bound: float,
                   ref: np.ndarray) -> str:
    """Which ranks the speed-optimal plan would overfill, with their bytes and capacities."""
    over = []
    for d, b in enumerate(samples):
        rep = _Replica(problem, d, b, memory=False)
        units = _assign(rep, rep.admissible(free), ref[d])
        nbytes = problem.fixed_bytes + b * problem.activation_bytes_per_sample + units @ np.array(problem.unit_bytes(b))
        over += [f"replica {d} TP rank {r} would hold {nbytes[r]:.0f} bytes over its capacity "
                 f"{problem.capacity(d, r):.0f}" for r in range(problem.tp) if nbytes[r] > problem.capacity(d, r)]
    return (f"memory, not speed, bounds the plan: {'; '.join(over)} under the speed-optimal plan (step "
            f"{free + problem.comm_s:.4g} s); the plan that fits takes {bound + problem.comm_s:.4g} s")


# ------------------------------------------------------------------------------ limits
def _continuous_replica(problem: JointProblem, d: int, b: float) -> float:
    """Replica ``d``'s step at ``b`` samples with fractional shares (the kinds merged), memory ignored."""
    work = problem.unit_work(b)
    S = sum(c * k.total_units for c, k in zip(work, problem.kinds))
    if S <= 0.0:
        return problem.replicated(b) / min(problem.speeds[d])
    model = StepModel(speeds=problem.speeds[d], replicated=problem.replicated(b), shardable=S)
    least = sum(c * k.min_units for c, k in zip(work, problem.kinds)) / S
    return model.step(continuous_shares(model, min_share=min(least, 1.0 / problem.tp)))


def continuous_limit(problem: JointProblem) -> float:
    """The job's step with fractional samples and shares (memory ignored, the replicated work on every rank):
    the ``t`` at which the replicas' largest batches ``b_d(t)`` (``T_d(b_d) ≤ t``, by bisection) add up to
    ``B``, plus ``comm_s``."""
    B = float(problem.global_batch)

    def batch(d: int, t: float) -> float:
        lo, hi = 0.0, B
        if _continuous_replica(problem, d, hi) <= t:
            return hi
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if _continuous_replica(problem, d, mid) <= t else (lo, mid)
        return lo

    lo, hi = 0.0, max(_continuous_replica(problem, d, B / problem.dp) for d in range(problem.dp))
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if sum(batch(d, mid) for d in range(problem.dp)) >= B else (mid, hi)
    return hi + problem.comm_s


def job_limit(problem: JointProblem) -> float:
    """Every second of work movable to any rank: the job's total work over its total speed, plus ``comm_s``
    (``n/(n − 1 + 1/χ)`` of a healthy step for one of ``n`` ranks ``χ`` times slower)."""
    B, dp, tp = problem.global_batch, problem.dp, problem.tp
    total = dp * tp * problem.replicated_fixed + B * tp * problem.replicated_per_sample + sum(
        dp * k.work_fixed + B * k.work_per_sample for k in problem.kinds)
    return total / sum(sum(row) for row in problem.speeds) + problem.comm_s
