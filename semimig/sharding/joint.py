"""One planner for a tensor × data-parallel job: every replica's shard plan and the batch split together (DESIGN §8).

Model (:mod:`.jobmodel`).  Replica ``d`` takes ``b_d`` samples; rank ``r`` of it, holding ``n_{d,r,k}`` units of
kind ``k`` at speed ``v_{d,r}``, spends ``t_{d,r,k} = (w_k·A(b_d) + c_k(b_d)·n_{d,r,k}) / v_{d,r}`` in kind ``k``'s
segment (its layers up to their reductions, with their share ``w_k`` of the replicated work ``A``; ``A`` and one
unit's work ``c_k`` both linear in the batch); the replica steps ``T_d = Σ_k max_r t_{d,r,k}`` (its ranks meet
at every reduction) and the job ``max_d T_d + comm``.
Every rank's peak bytes ``m_{d,r}`` (parameters, gradients and optimizer state of its units and of the
replicated part, activations per sample) stay within its capacity ``C_{d,r}``: no plan above one is chosen.

Exact optimum.
1. One replica at ``b`` samples: ``min Σ_k τ_k`` over per-kind thresholds some whole-unit plan that fits
   meets (every rank's segment ``k`` ``≤ τ_k``).  Each ``τ_k`` is one of the finitely many values
   ``t_{r,k}(n)``; for a threshold vector each rank's admissible unit vectors are those within every
   threshold and its capacity, and a dynamic programme over the ranks on the running unit counts says
   whether admissible vectors add up to every ``U_k`` (:meth:`_Replica.feasible`).  Each kind's least
   threshold alone (a binary search) bounds it from below; without memory bounds the admissible sets are
   products over the kinds and those bounds are met together, otherwise the other kinds' thresholds are
   tried from their bounds up with the largest kind's least beside each (:meth:`_Replica.best`).
2. ``T_d(b)`` is non-decreasing in ``b`` (every plan's times and bytes grow with ``b``), so the split
   minimising ``max_d T_d(b_d)`` is the greedy: every replica starts at one granule (``micro_batch``
   samples), each further granule goes to the replica whose step after it is smallest (ties: lowest
   replica) — the exchange argument of the minimax.
3. Every replica's plan is then the one that fits the job's step with the fewest units moved from the
   plans in force (``reference``; default near-even), over the threshold vectors its step's room allows
   (:meth:`_Replica.budgets`): a replica faster than the job keeps its plan when it can, and with no
   straggler nothing moves.

Seats (``seat_per_sample > 0``, :mod:`.jobmodel`).  A replica's step adds its layers' reductions at the
pace of the slowest rank seated in each kind, so step 1 runs once per seating, as the re-shard policy's
candidates (:mod:`semimig.controller.policy.propose`): every rank seated, and each rank slower than the
replica's fastest emptied of one kind or of all (its admissible vectors those with zero units there),
each seating priced by :func:`~semimig.sharding.jobmodel.seat_scale`; ``T_d(b)`` is the least over them.
Where a rank holding nothing skips the step (``idle_free``) each slower rank emptied of all is a seating too,
priced or not: there its segments are 0.
It is exact over every plan while one rank per replica is slower than the rest (emptying a rank at the
fastest speed never lowers the pace, so the seatings left out cost no less than one priced), a lone holder
at its own speeds included (``lone_speeds``: a tp 2 replica whose other rank skips).

Limits.  :func:`continuous_limit`: fractional samples and shares, memory ignored, the replicated work still
on every rank.  :func:`job_limit`: every second of work movable to any rank, ``total work / Σ v``; with one
of ``n`` ranks ``χ`` times slower it is ``n/(n − 1 + 1/χ)`` of a healthy step.  Neither counts seats.
Pure arithmetic in a fixed order: every rank given the same numbers computes the same plans.

At run time.  :func:`~semimig.sharding.jobmodel.from_measured` reads a problem from what the re-shard
policies already hold — each replica's window of per-rank compute seconds under its plans and samples, the
``k = R/S`` their windows' split measures and the kinds' weights — and
:func:`~semimig.sharding.jobmodel.with_seats` the seats from the reductions they measure
(:mod:`semimig.resharder.joint`), so that, under plain data parallelism with a batch split, the
re-sharder's per-replica step (the policies say *when*) takes every replica's plan and the split from one
:func:`plan_job` (*what*) and hands the split to the batch balancer, whose own re-plan trigger is then
off: one owner of both.
"""
from __future__ import annotations

import itertools
import math
from typing import FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

from semimig.errors import ConfigError
from semimig.sharding.jobmodel import (JointPlan, JointProblem, UnitKind, from_measured, job_step, peak_bytes,
                                       replica_step, seat_scale, seat_seconds, segment_work, state_bytes_per_param,
                                       unit_counts, with_seats)
from semimig.sharding.plan import ShardPlan
from semimig.sharding.solver import StepModel, continuous_shares, solve_plan

__all__ = ["UnitKind", "JointProblem", "JointPlan", "plan_job", "from_measured", "job_step", "peak_bytes", "continuous_limit",
           "job_limit", "replica_step", "seat_scale", "state_bytes_per_param", "with_seats"]


# ------------------------------------------------------------------------------ one replica
class _Replica:
    """Replica ``d`` at ``b`` samples under one seating: every rank's segment times and fit over the grid of
    unit vectors.  A rank emptied of every kind where idle ranks skip the step holds none and times 0; every
    other rank's vector, the empty one too, times as a rank taking part (the seating that empties it prices
    its skip), so without memory bounds each rank's admissible vectors are a product over the kinds.  At
    tp 2 a rank holding nothing leaves its partner alone, at the lone holder's speeds
    (:attr:`~semimig.sharding.jobmodel.JointProblem.lone_speeds`): only the seating that empties it holds
    that plan."""

    def __init__(self, problem: JointProblem, d: int, b: int, *, memory: bool,
                 empty: Tuple[int, FrozenSet[int]] = (-1, frozenset())) -> None:
        kinds = problem.kinds
        self.totals = tuple(k.total_units for k in kinds)
        self.shape = tuple(U + 1 for U in self.totals)
        n = np.indices(self.shape).reshape(len(kinds), -1).T.astype(float)  # [points, kind]
        work = segment_work(problem, b, n)
        nbytes = problem.fixed_bytes + b * problem.activation_bytes_per_sample + n @ np.array(problem.unit_bytes(b))
        self.low = tuple(k.min_units for k in kinds)
        low = np.all(n >= np.array(self.low), axis=1)
        rank, emptied = empty
        pair = problem.idle_free and problem.tp == 2
        alone = pair and len(emptied) == len(kinds)  # the other rank holds every unit, alone
        speeds = problem.lone_speeds[d] if alone and problem.lone_speeds is not None else problem.speeds[d]
        self.times = [work / v for v in speeds]  # [rank][points, kind]
        self.fits = [low & (nbytes <= (problem.capacity(d, r) if memory else math.inf)) for r in range(problem.tp)]
        if pair and not alone:  # a rank of a pair holding nothing leaves a lone holder: its own seating's
            self.fits = [f & np.any(n > 0, axis=1) for f in self.fits]
        if emptied:
            self.fits[rank] = self.fits[rank] & np.all(n[:, sorted(emptied)] == 0, axis=1)
            if problem.idle_free and len(emptied) == len(kinds):
                self.times[rank] = np.zeros_like(work)
        self.points = n.astype(int)
        self.tau = self.bounds = np.full(len(kinds), math.inf)
        """The per-kind thresholds :meth:`best` found, and each kind's least alone (``inf`` until then, or when
        no plan fits)."""
        self.cands: list = []
        """Per kind, :meth:`candidates` as :meth:`best` read them."""
        self.seats = seat_seconds(problem, d, b, tuple(
            ShardPlan(units=tuple(0 if r == rank and k in emptied else 1 for r in range(problem.tp)))
            for k in range(len(kinds))))
        """The reductions' seconds with every rank seated but ``rank`` out of the kinds ``emptied``."""

    def candidates(self, k: int) -> np.ndarray:
        """Every value kind ``k``'s segment takes on a rank's admissible vector, ascending."""
        return np.unique(np.concatenate([t[f, k] for t, f in zip(self.times, self.fits)]))

    def admissible(self, tau: np.ndarray) -> list:
        return [np.flatnonzero(f & np.all(times <= tau, axis=1)) for times, f in zip(self.times, self.fits)]

    def feasible(self, tau: np.ndarray) -> bool:
        """Whether plans with every rank's segment of kind ``k`` ``≤ tau[k]`` that fit add up to every total: the
        admissible vectors of a rank are a down-set above the minimums (times and bytes grow with every count),
        so for each vector ``o`` of the other kinds its counts of the largest kind run from the minimum to a
        largest ``top(o)``; a max-plus programme over the ranks on the running ``o`` says whether ``Σ top``
        reaches that kind's total."""
        last = int(np.argmax(self.totals))
        other = tuple(U + 1 for k, U in enumerate(self.totals) if k != last)
        best = np.full(other, -np.inf)
        best[(0,) * len(other)] = 0.0
        for times, fits in zip(self.times, self.fits):
            ok = np.moveaxis((fits & np.all(times <= tau, axis=1)).reshape(self.shape), last, -1)
            count = ok.sum(axis=-1)
            top = np.where(count > 0, self.low[last] + count - 1, -np.inf)
            new = np.full(other, -np.inf)
            for o in np.argwhere(np.isfinite(top)):
                src = tuple(slice(0, n - k) for n, k in zip(other, o))
                dst = tuple(slice(k, n) for n, k in zip(other, o))
                new[dst] = np.maximum(new[dst], best[src] + top[tuple(o)])
            best = new
        return bool(best[tuple(n - 1 for n in other)] >= self.totals[last])

    def _least(self, k: int, values: np.ndarray, tau: np.ndarray) -> float:
        """The least of ``values`` (ascending) that, as kind ``k``'s threshold beside ``tau``, some plan meets
        (``inf``: none)."""
        trial = tau.copy()

        def meets(i: int) -> bool:
            trial[k] = values[i]
            return self.feasible(trial)

        lo, hi = 0, len(values) - 1
        if hi < 0 or not meets(hi):
            return math.inf
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if meets(mid) else (mid + 1, hi)
        return float(values[lo])

    def best(self) -> float:
        """The least ``Σ_k τ_k`` of segment thresholds some plan meets (``inf``: none fits).  Each kind's least
        threshold alone is a lower bound; without memory bounds the admissible sets are products over the kinds
        and those thresholds are met together.  Where memory couples the kinds, every threshold of the other
        kinds from their bounds up is tried with the least of the largest kind beside it."""
        K, free = len(self.totals), np.full(len(self.totals), math.inf)
        self.cands = cands = [self.candidates(k) for k in range(K)]
        low = np.array([self._least(k, cands[k], free) for k in range(K)])
        if not np.all(np.isfinite(low)):
            return math.inf
        self.bounds = low
        if self.feasible(low):
            self.tau = low
            return float(low.sum())
        last = int(np.argmax(self.totals))
        others = [k for k in range(K) if k != last]
        best = math.inf
        for combo in itertools.product(*[cands[k][cands[k] >= low[k]] for k in others]):
            if sum(combo) + low[last] >= best:
                continue
            tau = free.copy()
            tau[others] = combo
            t_last = self._least(last, cands[last][cands[last] >= low[last]], tau)
            if sum(combo) + t_last < best:
                best, tau[last] = sum(combo) + t_last, t_last
                self.tau = tau
        return best

    def budgets(self, budget: float) -> list:
        """Per-kind thresholds adding up to at most ``budget`` (after :meth:`best`): every threshold of the kinds
        but the largest between its bound and what the others' bounds leave, the largest taking the rest."""
        if not np.all(np.isfinite(self.tau)):
            return []
        K, last = len(self.totals), int(np.argmax(self.totals))
        others = [k for k in range(K) if k != last]
        floor = self.tau if self.tau.sum() >= budget else self.bounds
        out = [self.tau]
        for combo in itertools.product(*[self.cands[k][(self.cands[k] >= floor[k])
                                                       & (self.cands[k] <= budget - floor.sum() + floor[k])]
                                         for k in others]):
            tau = np.empty(K)
            tau[others] = combo
            tau[last] = budget - sum(combo)
            if tau[last] >= floor[last]:
                out.append(tau)
        return out


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


def _seatings(problem: JointProblem, d: int) -> List[Tuple[int, FrozenSet[int]]]:
    """The seatings replica ``d``'s plans are sought under, as the re-shard policy's candidates: every rank
    seated, and (seats priced) each rank slower than the replica's fastest emptied of one kind or of every
    kind a rank may hold none of (``min_units == 0``)."""
    out: List[Tuple[int, FrozenSet[int]]] = [(-1, frozenset())]
    free = [k for k, kind in enumerate(problem.kinds) if kind.min_units == 0]
    priced = problem.seat_per_sample > 0.0
    idle = problem.idle_free and len(free) == len(problem.kinds)
    if not free or not (priced or idle):
        return out
    speeds = problem.speeds[d]
    for r in sorted(range(problem.tp), key=lambda r: (speeds[r], r)):
        if speeds[r] < max(speeds):
            ones = [(r, frozenset((k,))) for k in free] if priced else []
            every = [(r, frozenset(free))] if (priced and len(free) > 1) or idle else []
            out += ones + [e for e in every if e not in ones]
    return out


def _replica_best(problem: JointProblem, d: int, b: int, *, memory: bool) -> float:
    """``T_d(b)``: the least of the ranks' compute plus the seats' reductions over the seatings."""
    return min(rep.best() + rep.seats for rep in (_Replica(problem, d, b, memory=memory, empty=e)
                                                  for e in _seatings(problem, d)))


def _choose(problem: JointProblem, d: int, b: int, target: float, reference: np.ndarray, *,
            memory: bool) -> Optional[np.ndarray]:
    """Replica ``d``'s units ``[rank, kind]`` at ``b`` samples whose step (compute and seats) meets
    ``target``, with the fewest units received relative to ``reference`` (ties: the smaller step, then
    the first seating); ``None`` if none."""
    best: Optional[Tuple[float, float, np.ndarray]] = None
    for empty in _seatings(problem, d):
        rep = _Replica(problem, d, b, memory=memory, empty=empty)
        least = rep.best()
        if not math.isfinite(least) or least + rep.seats > target * (1.0 + 1e-12):
            continue
        for tau in rep.budgets(max(target - rep.seats, least)):
            units = _assign(rep, rep.admissible(tau), reference)
            if units is None:
                continue
            plans = tuple(ShardPlan(units=tuple(int(n) for n in units[:, k])) for k in range(len(problem.kinds)))
            key = (float(np.maximum(units - reference, 0).sum()), replica_step(problem, d, b, plans))
            if best is None or key < best[:2]:
                best = (*key, units)
    return None if best is None else best[2]


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
            cache[(d, b)] = _replica_best(problem, d, b, memory=memory)
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
    ref = unit_counts(problem, reference if reference is not None else _near_even(problem)).astype(int)
    samples, compute = _split(problem, memory=True)
    if not math.isfinite(compute):
        _refuse_unfit(problem)
    plans = []
    for d, b in enumerate(samples):
        units = _choose(problem, d, b, compute, ref[d], memory=True)
        plans.append(tuple(ShardPlan(units=tuple(int(n) for n in units[:, k])) for k in range(len(problem.kinds))))
    plans = tuple(plans)
    replica_steps = tuple(replica_step(problem, d, b, plans[d]) for d, b in enumerate(samples))
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
        units = _choose(problem, d, b, free, ref[d], memory=False)
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
