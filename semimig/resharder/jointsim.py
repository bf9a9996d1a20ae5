"""The joint planner and the replicas' policies on a family of simulated tp × dp jobs (DESIGN §8).

The re-sharder's own decision path — each replica's policy fed its replica's step a step late, the job's
readings on a policy's decision and on the schedule, the joint planner's answer and the job's gain test
(:mod:`.jointmoves`) — driven by steps a known job model produces, and scored by time to ``N`` steps
against the oracle's.  :class:`SimulatedJob` is a :class:`~semimig.resharder.core.Resharder` whose search
runs in this process and whose moves change the model's plans instead of the layers; nothing else of the
decision path is replaced.

The job model is the planner's own (:class:`~semimig.sharding.jobmodel.JointProblem`), so what is tested is
the loop, not the model's fit to a device (the policy simulator's replay does that): ``tp × dp`` ranks,
``12·tp`` MLP blocks and 8 KV groups, attention a share ``a`` of the shardable work, the replicated work a
share ``ρ`` of a healthy even step, the layers' reductions a share ``c`` of it at their slowest member's
pace, every slow rank at speed ``1/χ``.  A rank's compute in a step is the model's times a log-normal
factor of spread ``σ``, its shardable part alike; its collectives are its replica's step less its compute,
plus its replica's wait for the slowest replica in the data-parallel reduction, told apart as the step
clock tells it.  A move costs its bytes at ``move_steps`` healthy steps for all the units, at the pace the
policies price it (:func:`~semimig.controller.policy.gain.move_pace`); the replicas move at once.

The oracle knows the speeds: from the first step (or from the straggler's onset) it holds the planner's
plan and split for the true model where it beats the even layout, paying the one move; a run's ratio is
its time over the oracle's, each step at the model's step for the layout in force (the noise moves the
decisions, not the clock).  The reactive bound is that oracle holding the even layout for the steps any
policy reading measured steps needs after a change (:func:`reaction_steps`): what reacting costs by itself,
which a real run saves at the start with the device probe (not simulated here).  The ratio to it scores
the loop: a move late, wrong, undone or repeated.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from types import SimpleNamespace
from typing import NamedTuple, Optional, Sequence

import numpy as np

from semimig.controller.policy.gain import move_pace, movers
from semimig.controller.policy.states import N_MIN
from semimig.controller.reshard import ReshardConfig, ReshardPolicy, ReshardSample, moved_units
from semimig.errors import ConfigError
from semimig.resharder.core import Resharder
from semimig.resharder.joint import JointSetup, SeatMemory, even_samples
from semimig.sharding.jobmodel import JointProblem, UnitKind, job_step, rank_times, replica_step, unit_counts
from semimig.sharding.joint import plan_job
from semimig.sharding.plan import ShardPlan

__all__ = ["CATEGORIES", "JointScenario", "SimulatedJob", "make_joint_scenario", "run_joint", "summarize_joint"]

CATEGORIES = ("none", "one", "onset", "two")
"""No straggler; one slow rank from the first step; one that appears after a few steps; a slow rank in
each of two replicas, of different speeds."""

KV_UNITS = 8
BYTES = (3.0, 1.0)
"""One MLP block's and one KV group's bytes, relative (the example's h768 Llama: 9.4 and 7.1 MB with its
block of 128 columns; the ratio only sets which units a move prefers)."""


class LayerPlans(NamedTuple):
    """A replica's plans as the re-sharder's events read them (``mlp_units``, ``kv_units``)."""

    mlp_units: tuple
    kv_units: tuple

    def __str__(self) -> str:
        return f"{','.join(map(str, self.mlp_units))}:{','.join(map(str, self.kv_units))}"


@dataclass(frozen=True)
class JointScenario:
    """One simulated job: its shape, its model before and after the onset, the noise and the moves' cost."""

    name: str
    category: str
    tp: int
    dp: int
    steps: int
    global_batch: int
    healthy: JointProblem
    slow: JointProblem
    onset: int
    """The first step at the slow speeds (0: from the start)."""
    noise: float
    move_steps: float
    seed: int

    def truth(self, step: int) -> JointProblem:
        return self.slow if step >= self.onset else self.healthy


def _problem(tp: int, dp: int, batch: int, rho: float, attention: float, seats: float,
             speeds: Sequence[Sequence[float]]) -> JointProblem:
    """The job model with a healthy even step of 1 s at ``batch/dp`` samples a replica (module docstring)."""
    mean = batch / dp
    k = rho / (tp * (1.0 - rho))  # R/S
    sigma = (1.0 - seats) / ((k + 1.0 / tp) * mean)
    kinds = (UnitKind(name="mlp", total_units=12 * tp, work_per_sample=sigma * (1.0 - attention), bytes_per_unit=BYTES[0]),
             UnitKind(name="kv", total_units=KV_UNITS, work_per_sample=sigma * attention, bytes_per_unit=BYTES[1]))
    return JointProblem(speeds=tuple(tuple(row) for row in speeds), kinds=kinds, global_batch=batch,
                        replicated_per_sample=k * sigma, seat_per_sample=seats / (3.0 * mean))


def make_joint_scenario(seed: int, category: str) -> JointScenario:
    """Scenario ``seed`` of ``category`` (:data:`CATEGORIES`): tp 2 or 4, dp 2 or 4, 4–10 samples a replica,
    60–150 steps, ``ρ`` 5–45 %, ``a`` 20–45 %, ``c`` 2–10 %, ``σ`` 1–8 %, ``χ`` 1.5–8, moves of 1–4 steps."""
    if category not in CATEGORIES:
        raise ConfigError(f"category must be one of {CATEGORIES}, got {category!r}")
    rng = np.random.default_rng([seed, CATEGORIES.index(category)])
    tp, dp = int(rng.choice((2, 4))), int(rng.choice((2, 4)))
    batch = dp * int(rng.integers(4, 11))
    steps = int(rng.integers(60, 151))
    rho, attention, seats = rng.uniform(0.05, 0.45), rng.uniform(0.2, 0.45), rng.uniform(0.02, 0.10)
    speeds = [[1.0] * tp for _ in range(dp)]
    healthy = _problem(tp, dp, batch, rho, attention, seats, speeds)
    onset = int(rng.integers(5, steps // 3)) if category == "onset" else 0
    if category != "none":
        stragglers = 2 if category == "two" else 1
        replicas = rng.choice(dp, size=stragglers, replace=False)
        chis = sorted(rng.uniform(1.5, 8.0, size=stragglers))
        for d, chi in zip(replicas, chis):
            speeds[int(d)][int(rng.integers(tp))] = 1.0 / chi
    slow = _problem(tp, dp, batch, rho, attention, seats, speeds)
    return JointScenario(name=f"{category}-{seed}", category=category, tp=tp, dp=dp, steps=steps, global_batch=batch,
                         healthy=healthy, slow=slow, onset=onset, noise=float(rng.uniform(0.01, 0.08)),
                         move_steps=float(rng.uniform(1.0, 4.0)), seed=seed)


def _even(problem: JointProblem) -> tuple:
    return tuple(tuple(ShardPlan.even(k.total_units, problem.tp) for k in problem.kinds) for _ in range(problem.dp))


class SimulatedJob(Resharder):
    """The re-sharder's decision path on :class:`JointScenario` (module docstring): one replica's view (every
    rank holds every replica's policy, so one view is every rank's), its search in this process, its moves
    made on the model."""

    def __init__(self, scenario: JointScenario, config: Optional[ReshardConfig] = None) -> None:
        problem, self.scenario = scenario.healthy, scenario
        config = config or ReshardConfig(horizon=scenario.steps)
        weights = tuple(k.work_per_sample for k in problem.kinds)
        self.replicas, self.dp_rank, self.size, self.rank, self.per_replica = scenario.dp, 0, scenario.tp, 0, True
        self.policies = tuple(ReshardPolicy(row, weights=weights, bytes_per_unit=tuple(int(b) for b in BYTES),
                                            config=config) for row in _even(problem))
        self.policy = self.policies[0]
        self.joint = JointSetup(global_batch=scenario.global_batch, dp=scenario.dp, bytes_per_unit=BYTES,
                                fixed_bytes=0.0, capacity_bytes=None)
        self.samples = even_samples(scenario.global_batch, scenario.dp)
        self.plans = tuple(self._layers(row) for row in _even(problem))
        self.plan = self.plans[0]
        self.events, self.joint_replans, self.last, self.settled_now = [], [], None, False
        self._speaks, self._lagged, self._seats = False, None, SeatMemory()
        self._job_moved, self._job_read, self._job_blocked, self._job_held = 0, None, 0.0, None
        self.moved_s = 0.0
        """Seconds of the moves made at the last step."""

    @staticmethod
    def _layers(row: Sequence[ShardPlan]) -> LayerPlans:
        return LayerPlans(mlp_units=row[0].units, kv_units=row[1].units)

    def _search(self, problem: JointProblem, reference: tuple):
        return plan_job(problem, reference=reference)

    def _carry_out(self, step: int, plans: tuple, changed: list):
        truth = self.scenario.truth(step)
        costs = [_move(self.scenario, policy.plans, row, truth.speeds[d]) if moved else (0, 0.0)
                 for d, (policy, row, moved) in enumerate(zip(self.policies, plans, changed))]
        self.moved_s = max(seconds for _, seconds in costs)
        return tuple(self._layers(row) if moved else old for row, moved, old in zip(plans, changed, self.plans)), costs


def _move(scenario: JointScenario, old: Sequence[ShardPlan], new: Sequence[ShardPlan],
          speeds: Sequence[float]) -> tuple[int, float]:
    """A replica's move from ``old`` to ``new`` at ``speeds``: its bytes (the units that change owner, as the layers
    send them and the policies price them), and its seconds (``move_steps`` healthy steps for all the units'
    bytes, at its movers' pace)."""
    total = sum(b * k.total_units for b, k in zip(BYTES, scenario.healthy.kinds))
    nbytes = sum(b * moved_units(o, n) for b, o, n in zip(BYTES, old, new))
    return int(round(nbytes)), nbytes / total * scenario.move_steps * move_pace(movers(old, new), speeds)


def _rows(truth: JointProblem, samples: Sequence[int], plans: Sequence, noise: float,
          rng: np.random.Generator) -> tuple:
    """Every replica's step under ``plans`` at ``samples`` as its ranks measure it (module docstring)."""
    units = unit_counts(truth, plans)
    per_unit = np.array([k.work_per_sample / k.total_units for k in truth.kinds])
    own, measured = [], []
    for d, b in enumerate(samples):
        factor = np.exp(rng.normal(0.0, noise, size=truth.tp))
        compute = rank_times(truth, d, b, units[d]) * factor
        shardable = np.array([b * (units[d, r] @ per_unit) / truth.speeds[d][r] for r in range(truth.tp)]) * factor
        step = replica_step(truth, d, b, plans[d]) + float(np.max(compute) - np.max(compute / factor))
        own.append(step)
        measured.append((compute, shardable))
    job = max(own)
    return tuple(ReshardSample(tuple(float(c) for c in compute), tuple(float(s) for s in shardable),
                               tuple(float(max(own[d] - c, 0.0) + job - own[d]) for c in compute),
                               dp_wait_s=tuple(float(job - own[d]) for _ in compute))
                 for d, (compute, shardable) in enumerate(measured))


def _oracle(scenario: JointScenario, delay: int = 0) -> float:
    """The oracle's seconds: the even layout until the onset, then the better of it and the planner's answer
    on the true model, its one move paid (module docstring); ``delay``: the answer taken only that many
    steps after the onset (the reactive bound, :func:`reaction_steps`)."""
    even, samples = _even(scenario.healthy), even_samples(scenario.global_batch, scenario.dp)
    before = scenario.onset * job_step(scenario.healthy, samples, even)
    after, slow_even = scenario.steps - scenario.onset, job_step(scenario.slow, samples, even)
    best = plan_job(scenario.slow, reference=even)
    move = max(_move(scenario, old, row, scenario.slow.speeds[d])[1] for d, (row, old) in enumerate(zip(best.plans, even)))
    delay = min(delay, after)
    return before + min(after * slow_even, delay * slow_even + (after - delay) * best.step + move)


def reaction_steps(config: ReshardConfig) -> int:
    """The steps after a change of speed before a policy that confirms it over measured steps moves: the
    warm-up step, ``N_MIN`` steps measured, and the step the rows arrive late (a policy that bets on its
    first slow steps may move sooner, and run below this bound)."""
    return config.warmup + N_MIN + 1


def run_joint(scenario: JointScenario, config: Optional[ReshardConfig] = None) -> dict:
    """``scenario`` through :class:`SimulatedJob`: its seconds over the oracle's, its joint moves and when."""
    job, rng = SimulatedJob(scenario, config), np.random.default_rng([scenario.seed, 7])
    seconds, pending, moves = 0.0, None, []
    for step in range(scenario.steps):
        truth, current = scenario.truth(step), tuple(policy.plans for policy in job.policies)
        seconds += job_step(truth, job.samples, current)
        rows = _rows(truth, job.samples, current, scenario.noise, rng)
        previous, pending = pending, rows
        if previous is None:
            continue  # the rows are read a step late (the re-sharder's lagged exchange)
        before, job.moved_s = (job.samples, current), 0.0
        job._observe_replicas(previous, SimpleNamespace(iteration=step))
        if (job.samples, tuple(policy.plans for policy in job.policies)) != before:
            moves.append(step)
            seconds += job.moved_s
            pending = None  # measured under the layout left: dropped
    oracle, reactive = _oracle(scenario), _oracle(scenario, reaction_steps(job.policy.config))
    return {"name": scenario.name, "category": scenario.category, "tp": scenario.tp, "dp": scenario.dp,
            "steps": scenario.steps, "ratio": seconds / oracle, "ratio_to_reactive": seconds / reactive,
            "reactive": reactive / oracle, "moves": len(moves), "move_steps": moves, "noise": scenario.noise}


def summarize_joint(records: Sequence[dict]) -> dict:
    """Per category and overall: the median ratio, the share within 1.10 and the worst, against the oracle and
    against the reactive bound, and the joint moves (mean, most, and the share of runs with at most two after
    the first)."""
    def one(rows: Sequence[dict]) -> dict:
        ratios, reacting = [r["ratio"] for r in rows], [r["ratio_to_reactive"] for r in rows]
        return {"scenarios": len(rows), "median_ratio": round(statistics.median(ratios), 5),
                "share_within_1_10": round(sum(x <= 1.10 for x in ratios) / len(ratios), 4),
                "max_ratio": round(max(ratios), 5),
                "reactive_bound_median": round(statistics.median(r["reactive"] for r in rows), 5),
                "median_ratio_to_reactive": round(statistics.median(reacting), 5),
                "share_within_1_10_of_reactive": round(sum(x <= 1.10 for x in reacting) / len(reacting), 4),
                "max_ratio_to_reactive": round(max(reacting), 5), "mean_moves": round(statistics.mean(r["moves"] for r in rows), 3),
                "max_moves": max(r["moves"] for r in rows),
                "share_at_most_two_after_first": round(sum(r["moves"] <= 3 for r in rows) / len(rows), 4)}
    out = {"overall": one(records), "categories": {}}
    for category in CATEGORIES:
        rows = [r for r in records if r["category"] == category]
        if rows:
            out["categories"][category] = one(rows)
    return out
