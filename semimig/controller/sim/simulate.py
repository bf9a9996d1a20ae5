"""Drive a re-shard policy through a scenario, as :class:`semimig.resharder.Resharder` drives it in a run.

The policy is the real object, unmodified: anything with the interface of
:class:`~semimig.controller.reshard.ReshardPolicy` (``plans``; ``profile(times)`` before the first step;
``observe(sample) -> decision`` once a step; ``moved_to(plans, seconds=, bytes_moved=)`` after a move),
built by a *factory* ``factory(plans, weights=, bytes_per_unit=)`` exactly as the resharder builds it
(the weights are the paired parameters' shares; a unit's bytes are its weights and optimizer state).

Per step ``i`` the group runs the plan in force at the speeds of the trace (the row of step ``i``, or on a
wall trace each share of the step's work at the row it runs in: a step that spans a change of speeds
runs partly at each, as the oracle counts it, and every rank's reading of it mixes the two alike)
and the step costs what the step model says (:meth:`~semimig.controller.sim.stepmodel.Workload.step_seconds`: time is the model's,
noise-free).  What the policy reads is a :class:`~semimig.controller.reshard.ReshardSample` of that
step as the ranks would measure it: each rank's compute times ``exp(σ·z)`` (and, for an outlier, a
further 1.5-3x), its timed shardable seconds (``timed_share`` of the shardable work, with its own
noise, at most its compute), its seconds in collectives (the step's collectives plus the wait for the
slowest rank as measured).  With a lag of ``L`` steps the policy reads step ``i − L`` at the end of
step ``i``.  A decision to move is carried out before the next step: the move costs its bytes over the
link, stretched by its slowest rank's pace at that step's speeds, plus its latency
(:meth:`~semimig.controller.sim.stepmodel.Workload.move`), and the policy is told that cost; the step
after it runs ``settle`` healthy steps longer (every rank's compute as measured too): what the policy
reads of that step, as on a real run.  Before the
first step, when the scenario has the device probe, the policy's ``profile`` reads five repeats of a
fixed GEMM work timed at each rank's speed in the trace's first row (with the same noise); a move then sends weights only
(:data:`~semimig.controller.sim.stepmodel.FIRST_MOVE_SHARE`).

The noise is drawn once per scenario from its seed, so every policy meets the same measurements
for the same plans (common random numbers).
"""
from __future__ import annotations

import collections
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, List, Sequence, Tuple

import numpy as np

from semimig.controller.reshard import PROBE_REPEATS, ReshardConfig, ReshardPolicy, ReshardSample
from semimig.controller.sim.oracle import segments
from semimig.controller.sim.scenarios import Scenario
from semimig.controller.sim.stepmodel import Plans

__all__ = ["PolicyFactory", "RunResult", "run_policy", "ratio", "reshard_policy", "PROBE_REPEATS"]

PolicyFactory = Callable[..., Any]
"""``factory(plans, *, weights, bytes_per_unit) -> policy`` (module docstring)."""


@dataclass
class RunResult:
    """One policy's run of a scenario."""

    time_s: float
    """Seconds to the scenario's last step: steps plus moves."""
    moves: int = 0
    bytes_moved: int = 0
    move_s: float = 0.0
    plans: List[tuple] = field(default_factory=list)
    """``(step, mlp units, kv units, reason)`` of each move (step -1: before the first)."""


class _Noise:
    """The scenario's measurement noise, drawn once from its seed."""

    def __init__(self, scenario: Scenario) -> None:
        rng = np.random.default_rng(scenario.seed + 7)
        n, tp = scenario.steps, scenario.tp
        sigma = scenario.noise
        self.compute = np.exp(sigma * rng.standard_normal((n, tp)))
        self.shardable = np.exp(sigma * rng.standard_normal((n, tp)))
        outlier = rng.random((n, tp)) < scenario.outliers
        self.outlier = np.where(outlier, rng.uniform(1.5, 3.0, (n, tp)), 1.0)
        self.compute *= self.outlier
        self.comm = np.exp(0.5 * sigma * rng.standard_normal((n, tp)))
        self.probe = np.exp(sigma * rng.standard_normal((PROBE_REPEATS, tp)))
        for name in ("compute", "shardable", "outlier", "comm", "probe"):  # rows of floats: read once a step
            setattr(self, name, getattr(self, name).tolist())


class _Step:
    """What step ``i`` costs and how its ranks measure it (module docstring); the noise-free parts read once
    for each plan and speeds (a trace holds both for many steps)."""

    def __init__(self, scenario: Scenario, noise: _Noise) -> None:
        self.workload, self.noise = scenario.workload, noise
        self.speeds = [tuple(row) for row in scenario.speeds.tolist()]
        self._key, self._parts = None, None

    def _read(self, plans: Plans, row: int) -> tuple:
        key = (plans, self.speeds[row])
        if key != self._key:
            workload, speeds = self.workload, self.speeds[row]
            self._key = key
            self._parts = (workload.step_seconds(plans, speeds), workload.rank_compute(plans, speeds),
                           workload.shardable_compute(plans, speeds), workload.seat_comm(plans, speeds),
                           [workload.idle_skips and p == 0.0 for p in workload.shares(plans)])  # idle: waits the step
        return self._parts

    def seconds(self, plans: Plans, row: int) -> float:
        """The step's time under ``plans`` at the speeds of the trace's ``row`` (the model's, noise-free)."""
        return self._read(plans, row)[0]

    def sample(self, plans: Plans, i: int, row: int) -> ReshardSample:
        """Step ``i``, run at the speeds of ``row``, as the ranks measure it (module docstring)."""
        _, rank, sharded, seats, idle = self._read(plans, row)
        workload, noise = self.workload, self.noise
        compute = [c * f for c, f in zip(rank, noise.compute[i])]
        shardable = [min(workload.timed_share * b * f * o, 0.98 * c) for b, f, o, c in
                     zip(sharded, noise.shardable[i], noise.outlier[i], compute)]
        slowest = workload.bound(plans, self.speeds[row], noise.compute[i])
        comm = [(seats + max(0.0, slowest - (0.0 if skips else c))) * f
                for c, f, skips in zip(compute, noise.comm[i], idle)]
        return ReshardSample(tuple(compute), tuple(shardable), tuple(comm))


def run_policy(scenario: Scenario, factory: PolicyFactory) -> RunResult:
    """Run ``factory``'s policy through ``scenario`` (module docstring)."""
    workload = scenario.workload
    plans: Plans = workload.even_plans()
    policy = factory(plans, weights=workload.weights, bytes_per_unit=workload.bytes_per_unit)
    if workload.idle_skips and hasattr(policy, "learned"):  # as the resharder tells it when ranks may skip
        policy.learned.idle_free = True
    noise = _Noise(scenario)
    result = RunResult(time_s=0.0)
    settle = 0.0  # what the step after a move runs over its steady time

    def move(new: Sequence[Any], step: int, reason: str) -> Plans:
        nonlocal settle
        row = scenario.row_at(step + 1, result.time_s)  # at the speeds of the step after it
        nbytes, seconds = workload.move(plans, tuple(new), first=step < 0, speeds=scenario.speeds[row])
        settle = 0.0 if step < 0 or not nbytes else workload.settle * workload.step_s
        result.time_s += seconds
        result.moves += 1
        result.bytes_moved += nbytes
        result.move_s += seconds
        result.plans.append((step, tuple(new[0].units), tuple(new[1].units), reason))
        policy.moved_to(tuple(new), seconds=seconds, bytes_moved=nbytes)
        return tuple(new)

    if scenario.probe and hasattr(policy, "profile"):
        first = scenario.speeds[0]
        times = [[0.02 / v * f for v, f in zip(first, row)] for row in noise.probe]
        decision = policy.profile(times)
        if decision.plans is not None:
            plans = move(decision.plans, -1, decision.reason)
    pending: collections.deque = collections.deque()
    step, ends = _Step(scenario, noise), _segment_ends(scenario)
    for i in range(scenario.steps):
        seconds, parts = _spans(scenario, ends, result.time_s, i, lambda row: step.seconds(plans, row))
        result.time_s += seconds + settle
        sample = _mixed([(step.sample(plans, i, row), share) for row, share in parts])
        if settle:  # every rank's step ran longer: its own work (the first touches) or the wait for it
            sample = dataclasses.replace(sample, compute_s=tuple(c + settle for c in sample.compute_s))
            settle = 0.0
        pending.append(sample)
        if len(pending) <= scenario.lag:
            continue
        decision = policy.observe(pending.popleft())
        if decision.plans is not None and i + 1 < scenario.steps:
            plans = move(decision.plans, i, decision.reason)
    return result


def _segment_ends(scenario: Scenario) -> List[float]:
    """Per row of a wall trace, the second its run of equal speeds (:func:`~.oracle.segments`) ends (the last: never)."""
    runs = segments(scenario.speeds)
    return [math.inf if k == len(runs) - 1 else (start + n) * scenario.workload.step_s
            for k, (start, n) in enumerate(runs) for _ in range(n)]


def _spans(scenario: Scenario, ends: Sequence[float], start_s: float, i: int,
           seconds_at: Callable[[int], float]) -> Tuple[float, List[Tuple[int, float]]]:
    """Step ``i``, started ``start_s`` into the run: its seconds and ``(row, share of its work)`` for each run of
    equal speeds it spans.  On a wall trace a step runs each share of its work at the speeds in force while it
    runs (a slowdown from outside the job slows it while it lasts, as the oracle counts it), where
    ``seconds_at(row)`` is the whole step's at a row's speeds; on the step clock, one row, the step's."""
    row = scenario.row_at(i, start_s)
    if not scenario.wall:
        return seconds_at(row), [(row, 1.0)]
    left, t, parts, T, last = 1.0, start_s, [], scenario.workload.step_s, scenario.speeds.shape[0] - 1
    while True:
        seconds = seconds_at(row)
        if left * seconds <= ends[row] - t:
            parts.append((row, left))
            return t + left * seconds - start_s, parts
        share = (ends[row] - t) / seconds
        parts.append((row, share))
        left, t = left - share, ends[row]
        row = min(int(round(t / T)), last)


def _mixed(parts: Sequence[Tuple[ReshardSample, float]]) -> ReshardSample:
    """One step's reading from its parts' readings, each weighed by its share of the work."""
    if len(parts) == 1:
        return parts[0][0]
    return ReshardSample(*(tuple(sum(getattr(sample, name)[r] * share for sample, share in parts)
                                 for r in range(len(getattr(parts[0][0], name))))
                           for name in ("compute_s", "shardable_s", "comm_s")))


def ratio(time_s: float, oracle_s: float) -> float:
    """Time to the last step over the oracle's (1: as good as the oracle)."""
    return time_s / oracle_s if oracle_s > 0.0 else math.inf


def reshard_policy(plans: Sequence[Any], *, weights: Sequence[float], bytes_per_unit: Sequence[int]) -> ReshardPolicy:
    """The policy in use: :class:`ReshardPolicy` (the state machine of :mod:`semimig.controller.policy`) with
    the default :class:`ReshardConfig`, as both re-sharding modes run it."""
    return ReshardPolicy(plans, weights=weights, bytes_per_unit=bytes_per_unit, config=ReshardConfig())
