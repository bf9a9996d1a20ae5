"""What a scenario could have cost: the oracle, the even plan and the group's limit.

The oracle knows the whole speed trace.  Its plans: the even plan, and for each distinct state of the
trace (at most :data:`MAX_STATES`, evenly spread over it when there are more), for the same state half-way
back to healthy speeds (a compromise for a straggler that comes and goes) and for the trace's mean
speeds, the best plan it finds in the real plan space (whole units, a rank may hold none of a
dimension): the best of :func:`~semimig.sharding.solve_plan` per dimension on the true step model and
joint roundings (the KV groups by the solver, by the solver with one rank's all or one moved to or
from the fastest rank, or handed out greedily first, then the MLP blocks handed out greedily around
them, each unit to the rank that finishes it soonest; and the other way round, the KV groups around
the solved or greedy MLP blocks; and the slowest rank taken out of one dimension's reductions or of both,
since a reduction runs at its slowest member's pace, :meth:`~semimig.controller.sim.stepmodel.Workload.seat_comm`,
each kind then balanced alone; and, where idle ranks skip, the slowest ranks emptied of both).  The step is
the model's, kind by kind (:meth:`~semimig.controller.sim.stepmodel.Workload.bound`), so the plan solved per
dimension alone is among the candidates for every balance of the kinds.  Over those plans it picks the best schedule exactly, paying every
move and what the step after it runs over steady (one before the first step sends weights only, as the
device probe's does, and runs before the run's first step): a dynamic programme
over the trace's constant
segments (within a segment whose speeds do not change, a schedule that moves at most once, at its
start, is as good as any: the step costs are constant and the bytes of two moves are at least those of
one move to the same end, so the triangle inequality holds for the bytes; a move's pace is its slowest
rank's, so two moves that keep a slow rank out of the bulk of the bytes can beat one, which the oracle
does not try).  Restricted to those plans it can be a
little slower than the best schedule over every plan (another plan with the same step, cheaper to reach,
or a compromise between phases): on scenarios small enough to list every plan, within 2 %.

The *reactive bound* is the same schedule over the same plans, allowed to move only before the steps
at which a change of speeds has just become known to a policy: 0, and ``s + lag + 1`` for a change at
step ``s`` (the plan of step ``t`` is chosen at the end of step ``t − 1``, on the steps measured up to
``t − 1 − lag``).  Between two such steps what a policy knows does not change; it picks, clairvoyantly,
the best plan for each of those intervals (the true speeds over it, which may already be those of the
next change).  It bounds from below every policy that pays the same moves and moves only on what it
has measured, never in anticipation of a change it has not seen: a move later than the knowledge that
justifies it costs at least as much as the same move when the knowledge came (the plan it leaves was
the one held, and the plan it takes is better for the speeds known, which are the interval's until its
last ``lag + 1`` steps).  A policy that predicts changes (a strict period learnt from the past) can beat
it, and so can one whose late move happens to land in those last steps.  The ratio of the bound to the oracle is what reacting
costs by itself: where it is above 1.10, no reactive policy is within 1.10 of the oracle.

The *limit* is what no plan of whole units beats: each segment at the continuous optimum
(:func:`~semimig.sharding.continuous_shares`, no minimum share), moves free.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import numpy as np

from semimig.controller.policy.gain import move_pace, movers
from semimig.controller.sim.scenarios import Scenario
from semimig.controller.sim.stepmodel import Plans, Workload
from semimig.sharding.plan import ShardPlan
from semimig.sharding.solver import StepModel, continuous_shares, solve_plan, soonest_first

__all__ = ["MAX_STATES", "best_plans", "candidate_plans", "segments", "oracle_time", "reactive_starts", "reactive_time",
           "fixed_time", "limit_time"]

MAX_STATES = 40
"""Distinct states of a trace the oracle solves a plan for (a ramp has one per step)."""


def _greedy(model: StepModel, total: int, weight: float, base: Sequence[float], skip: Optional[int] = None, *,
            out: Sequence[int] = ()) -> ShardPlan:
    """``total`` units of ``weight`` each (share of the shardable work), each to the rank that finishes it
    soonest, on top of each rank's ``base`` share (a rank may get none; ``skip``, ``out``: ranks given none)."""
    ranks = [r for r in range(model.tp) if r != skip and r not in out]
    return ShardPlan(units=tuple(soonest_first(model, base, weight, ranks, total)))


def best_plans(workload: Workload, speeds: Sequence[float]) -> Plans:
    """The best plan found for constant ``speeds`` (module docstring)."""
    a, U, K = workload.attention_share, workload.mlp_units, workload.kv_units
    model = workload.step_model(speeds)
    solved_kv = solve_plan(model, total_units=K)
    candidates = [(solve_plan(model, total_units=U), solved_kv)]
    fastest = max(range(workload.tp), key=lambda r: speeds[r])
    nearby = []  # the solved KV groups with one rank's all, or one, moved to or from the fastest rank
    for r in (q for q in range(workload.tp) if q != fastest):
        for give in (solved_kv.units[r], 1, -1):
            units = list(solved_kv.units)
            units[fastest], units[r] = units[fastest] + give, units[r] - give
            if min(units) >= 0 and give and units != list(solved_kv.units):
                nearby.append(ShardPlan(units=tuple(units)))
    for kv in (solved_kv, _greedy(model, K, a / K, [0.0] * workload.tp), *nearby):
        base = [a * k / K for k in kv.units]
        candidates.append((_greedy(model, U, (1.0 - a) / U, base), kv))
    for mlp in (candidates[0][0], _greedy(model, U, (1.0 - a) / U, [0.0] * workload.tp)):
        base = [(1.0 - a) * n / U for n in mlp.units]  # the other way round: the KV groups around the MLP
        candidates.append((mlp, _greedy(model, K, a / K, base)))
    slowest = min(range(workload.tp), key=lambda r: speeds[r])
    if speeds[slowest] < max(speeds):  # the slowest rank out of one dimension's reductions, or of both
        mlp, kv = candidates[0]
        kv_out = _greedy(model, K, a / K, [(1.0 - a) * n / U for n in mlp.units], skip=slowest)
        mlp_out = _greedy(model, U, (1.0 - a) / U, [a * k / K for k in kv.units], skip=slowest)
        kv_first = _greedy(model, K, a / K, [0.0] * workload.tp, skip=slowest)
        candidates += [(mlp, kv_out), (mlp_out, kv),
                       (_greedy(model, U, (1.0 - a) / U, [a * k / K for k in kv_first.units],
                                skip=slowest), kv_first)]
        alone = [_greedy(model, n, 1.0 / n, [0.0] * workload.tp, skip=slowest) for n in (U, K)]
        candidates += [(candidates[0][0], alone[1]), (alone[0], candidates[0][1]), tuple(alone)]  # each kind alone
    if workload.idle_skips:  # the k slowest ranks emptied of both kinds: they skip the step
        order = sorted(range(workload.tp), key=lambda r: speeds[r])
        for k in range(1, workload.tp):
            if speeds[order[k - 1]] >= max(speeds):
                break
            kv = _greedy(model, K, a / K, [0.0] * workload.tp, out=order[:k])
            candidates.append((_greedy(model, U, (1.0 - a) / U, [a * n / K for n in kv.units],
                                       out=order[:k]), kv))
            candidates.append(tuple(_greedy(model, n, 1.0 / n, [0.0] * workload.tp, out=order[:k])
                                    for n in (U, K)))
    return min(candidates, key=lambda plans: workload.step_seconds(plans, model.speeds))


def segments(speeds: np.ndarray) -> List[Tuple[int, int]]:
    """``(start, length)`` of each run of steps with the same speeds."""
    change = np.flatnonzero(np.any(np.diff(speeds, axis=0) != 0.0, axis=1)) + 1
    starts = np.concatenate(([0], change))
    ends = np.concatenate((change, [speeds.shape[0]]))
    return [(int(s), int(e - s)) for s, e in zip(starts, ends)]


def candidate_plans(scenario: Scenario) -> List[Plans]:
    """The even plan, the best plan of each distinct state (at most :data:`MAX_STATES`), of each state
    half-way to healthy and of the mean speeds, without repeats."""
    workload, speeds = scenario.workload, scenario.speeds
    states = np.unique(speeds, axis=0)
    if len(states) > MAX_STATES:
        states = states[np.linspace(0, len(states) - 1, MAX_STATES).round().astype(int)]
    out = [workload.even_plans()]
    rows = [row for state in states for row in (state, 0.5 * (1.0 + state))]  # and half-way to healthy
    for row in rows + [speeds.mean(axis=0)]:
        plans = best_plans(workload, row)
        if plans not in out:
            out.append(plans)
    return out


def _step_matrix(workload: Workload, plans: Sequence[Plans], speeds: np.ndarray) -> np.ndarray:
    """``[k, s]``: the step of plan ``k`` at speeds ``speeds[s]``."""
    a, S = workload.attention_share, workload.shardable
    mlp = np.array([p[0].units for p in plans], dtype=float) / workload.mlp_units  # (K, tp)
    kv = np.array([p[1].units for p in plans], dtype=float) / workload.kv_units
    held = (mlp + kv > 0.0) if workload.idle_skips else np.ones(mlp.shape, dtype=bool)  # an idle rank bounds nothing
    R = workload.replicated_at(speeds)  # (s, tp): it may depend on each state's speeds
    work = [np.where(held[:, None, :], omega * (R[None, :, :] + S * share[:, None, :]), 0.0)
            for omega, share in ((1.0 - a, mlp), (a, kv))]
    compute = sum(np.max(w / speeds[None, :, :], axis=2) for w in work)  # (K, s): each kind's segment at its slowest rank
    comm = workload.seat_comms(plans, speeds)  # (K, s): each dimension's reductions at its slowest member's pace
    return workload.compute_s * compute + comm


def _moves(scenario: Scenario, plans: Sequence[Plans]) -> Tuple[List[Plans], int, np.ndarray, np.ndarray, np.ndarray]:
    """What both clocks' schedules move between: ``plans`` with the even plan among them, its index, the bytes
    of every move ``[from, to]``, which ranks take part in it ``[from, to, rank]``, and the seconds of each
    first move from even (before the first step: weights only, at the trace's first speeds)."""
    workload = scenario.workload
    plans = list(plans)
    even = workload.even_plans()
    if even not in plans:
        plans.insert(0, even)
    nbytes = np.array([[workload.move(p, q)[0] for q in plans] for p in plans], dtype=float)
    moving = np.array([[movers(p, q) for q in plans] for p in plans], dtype=bool)
    first = np.array([workload.move(even, q, first=True, speeds=scenario.speeds[0])[1] for q in plans])
    return plans, plans.index(even), nbytes, moving, first


def _move_cost(workload: Workload, nbytes: np.ndarray, pace: np.ndarray) -> np.ndarray:
    """Seconds a move costs in a run (not the first, before any step): its own and what the step after it runs
    over the plan's steady step (``settle`` healthy steps)."""
    return workload.move_seconds(nbytes, pace) + workload.settle * workload.step_s


def _schedule(scenario: Scenario, plans: Sequence[Plans], starts: Sequence[int]) -> Tuple[float, int]:
    """``(seconds, moves)`` of the best schedule over ``plans`` from the even plan that may move only before
    the steps ``starts`` (the first is 0; one move before it sends weights only), paying each move."""
    workload = scenario.workload
    plans, start, nbytes, moving, first = _moves(scenario, plans)
    changed = moving.any(axis=2)  # the plans differ: a move, with its latency
    pieces = sorted(set(starts) | {s for s, _ in segments(scenario.speeds)})  # constant speeds, one interval
    lengths = np.diff(np.array(pieces + [scenario.steps], dtype=float))
    piece_cost = _step_matrix(workload, plans, scenario.speeds[pieces]) * lengths[None, :]  # (K, pieces)
    owner = np.searchsorted(np.array(starts), np.array(pieces), side="right") - 1
    cost = np.zeros((len(plans), len(starts)))
    np.add.at(cost.T, owner, piece_cost.T)  # (K, intervals)
    speeds = np.asarray(scenario.speeds, dtype=float)
    value = first + cost[:, 0]
    count = (np.arange(len(plans)) != start).astype(int)
    for s in range(1, len(starts)):
        moves = np.where(changed, _move_cost(workload, nbytes, move_pace(moving, speeds[starts[s]])), 0.0)
        total = value[:, None] + moves  # from j to k
        best = np.argmin(total, axis=0)
        count = count[best] + (best != np.arange(len(plans)))
        value = total[best, np.arange(len(plans))] + cost[:, s]
    k = int(np.argmin(value))
    return float(value[k]), int(count[k])


def _wall_segments(scenario: Scenario) -> Tuple[List[Tuple[int, int]], np.ndarray, np.ndarray]:
    """A wall trace's constant segments: ``(rows, start seconds, lengths in seconds)``, the last one open."""
    segs = segments(scenario.speeds)
    T = scenario.workload.step_s
    begins = np.array([s for s, _ in segs], dtype=float) * T
    lengths = np.array([n for _, n in segs], dtype=float) * T
    lengths[-1] = math.inf
    return segs, begins, lengths


def _wall_schedule(scenario: Scenario, plans: Sequence[Plans], reactive: bool) -> Tuple[float, int]:
    """:func:`_schedule` on a wall trace: ``(seconds to the last step, moves)`` of the best schedule over
    ``plans`` from the even plan, moving at most once per segment of constant speeds, at its start (a
    segment's step costs are constant, so a later move only loses what the plan moved to saves), or with
    ``reactive`` only once the plan in force has run ``lag + 1`` steps at the segment's speeds (the
    first segment's move, before the first step, sends weights only).

    A dynamic programme over the segments: the steps done by each segment's end, by plan held.  Steps are
    counted in fractions (a step that straddles a change runs each part at its segment's pace, as a
    policy's run counts it), and a move longer than its segment is charged at that segment's pace."""
    workload = scenario.workload
    plans, start, nbytes, moving, first = _moves(scenario, plans)
    K, changed = len(plans), moving.any(axis=2)
    segs, begins, lengths = _wall_segments(scenario)
    speeds = np.asarray(scenario.speeds, dtype=float)
    step = _step_matrix(workload, plans, speeds[[s for s, _ in segs]])  # (K, segments)
    N, wait = float(scenario.steps), float(scenario.lag + 1)
    done = np.full(K, -math.inf)
    done[start] = 0.0
    count = np.zeros(K, dtype=int)
    best, best_moves = math.inf, 0
    ks = np.arange(K)
    for j, (row, _) in enumerate(segs):
        t0, length, cost = begins[j], lengths[j], step[:, j]
        if j == 0:
            moves = np.full((K, K), math.inf)
            moves[start] = first
        else:
            moves = np.where(changed, _move_cost(workload, nbytes, move_pace(moving, speeds[row])), 0.0)
        need = N - done  # (K,) steps left, by plan held
        ran = np.zeros((K, K))  # steps the plan held runs at this segment's speeds before the move
        if reactive and j > 0:
            ran = np.where(changed, np.minimum(wait, need)[:, None], 0.0)
        spent = ran * cost[:, None] + moves  # (from, to): seconds before the plan moved to runs
        reached = np.isfinite(done)[:, None] & np.isfinite(spent)
        with np.errstate(invalid="ignore"):
            progress = done[:, None] + ran + (length - spent) / cost[None, :]
            finish = t0 + spent + np.maximum(need[:, None] - ran, 0.0) * cost[None, :]
        ends = reached & (finish <= t0 + length)  # the run's last step falls in this segment
        if np.any(ends):
            q, k = np.unravel_index(np.argmin(np.where(ends, finish, math.inf)), finish.shape)
            if finish[q, k] < best:
                best, best_moves = float(finish[q, k]), int(count[q] + changed[q, k])
        progress = np.where(reached & ~ends, progress, -math.inf)
        came = np.argmax(progress, axis=0)
        done = progress[came, ks]
        count = count[came] + ((came != ks) & changed[came, ks])
        if not np.any(np.isfinite(done)):
            break
    return best, best_moves


def oracle_time(scenario: Scenario, plans: Sequence[Plans] | None = None) -> Tuple[float, int]:
    """``(seconds, moves)`` of the best schedule over ``plans`` (default :func:`candidate_plans`) that
    starts from the even plan and pays each move (module docstring)."""
    plans = list(plans) if plans is not None else candidate_plans(scenario)
    if scenario.wall:
        return _wall_schedule(scenario, plans, reactive=False)
    return _schedule(scenario, plans, [s for s, _ in segments(scenario.speeds)])


def reactive_starts(scenario: Scenario) -> List[int]:
    """The steps before which a reactive schedule may move: 0, and ``s + lag + 1`` for each change of speeds
    at step ``s`` (the first step whose plan can be chosen on a measured step of the new speeds)."""
    out = [0] + [s + scenario.lag + 1 for s, _ in segments(scenario.speeds)[1:]]
    return sorted({s for s in out if s < scenario.steps})


def reactive_time(scenario: Scenario, plans: Sequence[Plans] | None = None) -> Tuple[float, int]:
    """``(seconds, moves)`` of the reactive bound (module docstring): the oracle's schedule, allowed to move
    only where a change of speeds has just been measured (:func:`reactive_starts`)."""
    plans = list(plans) if plans is not None else candidate_plans(scenario)
    if scenario.wall:
        return _wall_schedule(scenario, plans, reactive=True)
    return _schedule(scenario, plans, reactive_starts(scenario))


def _run_time(scenario: Scenario, steps: np.ndarray) -> float:
    """Seconds to the last step with segment ``j`` of the trace stepping ``steps[j]`` seconds: their sum over
    each segment's steps, or on a wall trace the time the steps done over the segments' seconds reach the
    run's (counted in fractions, as :func:`_wall_schedule` counts them)."""
    if not scenario.wall:
        return float(steps @ np.array([n for _, n in segments(scenario.speeds)], dtype=float))
    _, begins, lengths = _wall_segments(scenario)
    left = float(scenario.steps)
    for t0, length, step in zip(begins, lengths, steps):
        if left * step <= length:
            return float(t0 + left * step)
        left -= length / step
    raise AssertionError("the last segment is open")  # pragma: no cover


def fixed_time(scenario: Scenario, plans: Plans) -> float:
    """Seconds of the run under one plan, never moved (the even plan: Colossal-AI alone)."""
    rows = np.array([scenario.speeds[s] for s, _ in segments(scenario.speeds)])
    return _run_time(scenario, _step_matrix(scenario.workload, [plans], rows)[0])


def limit_time(scenario: Scenario) -> float:
    """Seconds of the run at the continuous optimum of every segment, moves free (module docstring)."""
    workload = scenario.workload
    steps = []
    for start, _ in segments(scenario.speeds):
        model = workload.step_model(scenario.speeds[start])
        steps.append(workload.compute_s * model.step(continuous_shares(model)) + workload.comm_s)
    return _run_time(scenario, np.array(steps))
