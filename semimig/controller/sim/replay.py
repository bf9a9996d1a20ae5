"""Recorded runs through the step model: does the simulator's model reproduce what real runs measured?

A ``time_to_loss`` result file holds, per mode and run, every step's wall time, the re-plans of its
``reshard`` runs and the layout; :mod:`~semimig.controller.sim.recorded` reads every constant of the model
from it (none is carried over from another run).

The run's recorded plan schedule then runs through the model (no policy involved: this checks the
model), the throttled rank at ``1/χ`` on every step (a pattern: on the steps its ``throttled``
flags mark, a straggler that moves: the rank its ``throttled_ranks`` name; a run without them is skipped), and the mean simulated step is set against the
mean measured one, both over the steps after the first.  A move is made in its step's optimizer hook, so the
measured step that decided it holds its seconds: the simulated step holds the seconds the run recorded for
it, and the step after it runs longer than steady by what the two steps after the runs' moves ran over
it (:func:`_settle_measured`, as the policy's replay below prices it).

A throttle pattern (``on:off`` seconds) is also run through the policy itself (:func:`pattern_policy`):
the pattern laid on the wall clock from the run's first step at the file's constants (a straggler that moves
visiting its ranks in turn, one a phase; the device probe, which ran before the pattern started, takes no
plan), its moves priced at the
fastest rate and the bytes per unit its ``reshard`` runs measured, the step after each move longer than
steady by what the two steps after the runs' moves ran over it (their median), its noise the healthy runs' own (the
one estimator, :class:`~semimig.controller.policy.gain.Noise`), over as many steps as the runs took and a
few seeds of that noise; the policy's mean step and Colossal-AI's (the even plan) are set against the
``reshard`` and ``off`` runs' measured ones.  This checks what the schedule replay cannot: whether the
policy, meeting the pattern, chooses as the runs chose and gains as much over doing nothing.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Optional, Sequence, Tuple

import numpy as np

from semimig.controller.policy.gain import Noise
from semimig.controller.policy.records import moved_units
from semimig.controller.sim.oracle import best_plans, fixed_time
from semimig.controller.sim.recorded import (chi_of, file_constants, file_workload, held_ranks, run_idle_skips,
                                              plan_schedule, run_events)
from semimig.controller.sim.scenarios import WALL_ROWS, Scenario
from semimig.controller.sim.simulate import reshard_policy, run_policy
from semimig.controller.sim.stepmodel import Workload
from semimig.errors import ConfigError
from semimig.sharding.plan import ShardPlan
from semimig.straggler.throttle_pattern import ThrottlePattern

__all__ = ["SPLITS", "PATTERN_SEEDS", "replay_file", "replay_summary", "pattern_policy"]

SPLITS: Tuple[float, ...] = tuple(i / 10 for i in range(11))
"""The shares ``f`` of a healthy step's non-shardable seconds taken as replicated work (module docstring)."""
PATTERN_SEEDS = 4
"""Seeds of the measurement noise a pattern's policy run is averaged over."""


def _simulated_mean(c: dict, split: float, run: dict, events: Sequence[dict], pattern: bool, settle_s: float) -> float:
    """The mean simulated step of ``run`` after the first (module docstring): the model's step under the recorded
    plans, the recorded moves' seconds in the steps that made them and ``settle_s`` in the step after each."""
    idle_skips = run_idle_skips(run)
    workload = file_workload(c, split, events, idle_skips)
    steps = len(run["step_s"])
    schedule = plan_schedule(events, steps, workload.even_plans())
    total = 0.0
    for i in range(1, steps):
        speeds = [1.0] * c["tp"]
        for r in held_ranks(c, run, i, pattern):
            speeds[r] = 1.0 / chi_of(c, r)
        total += workload.step_seconds(schedule[i], speeds)
    for e in events:  # a move after step s is in step s; the step after it settles
        total += (e.get("move_s") or 0.0) * (1 <= e["step"] < steps) + settle_s * (0 <= e["step"] < steps - 1)
    return total / (steps - 1)


def _moves_measured(runs: Sequence[dict], workload: Workload) -> Optional[Tuple[int, float]]:
    """``(state bytes, bytes per second)`` of the runs' moves after the first step: every unit's bytes, the
    median over moves of their bytes over the units' weights they moved, and the fastest move's rate
    (a free move's: :meth:`~semimig.controller.sim.stepmodel.Workload.move` stretches it by its pace)."""
    sizes, rates = [], []
    for run in runs:
        plans = workload.even_plans()
        for e in sorted(run_events(run), key=lambda e: e["step"]):
            new = (ShardPlan(units=tuple(e["mlp_units"])), ShardPlan(units=tuple(e["kv_units"])))
            weight = sum(moved_units(o, n) * w / n.total_units for o, n, w in zip(plans, new, workload.weights))
            if e["step"] >= 0 and weight > 0.0 and e.get("bytes_moved") and e.get("move_s"):
                sizes.append(e["bytes_moved"] / weight)
                rates.append(e["bytes_moved"] / e["move_s"])
            plans = new
    return (int(statistics.median(sizes)), max(rates)) if sizes else None


def _settle_measured(runs: Sequence[dict]) -> Optional[float]:
    """Seconds the two steps after a move ran over the plan's steady step (the median of the three after them),
    the median over the runs' moves after the first step whose five steps after it kept one throttle state
    (``None``: no such move).  A move is made in its step's optimizer hook, so a run's step ``s`` holds it."""
    excess = []
    for run in runs:
        steps = run["step_s"]
        flags = [str(h) for h in run.get("throttled_ranks") or run.get("throttled") or [False] * len(steps)]
        for e in run_events(run):
            s = e["step"]
            if s >= 0 and s + 6 <= len(steps) and len(set(flags[s + 1:s + 6])) == 1:
                steady = statistics.median(steps[s + 3:s + 6])
                excess.append(steps[s + 1] + steps[s + 2] - 2.0 * steady)
    return max(0.0, statistics.median(excess)) if excess else None


def pattern_policy(data: dict, c: dict, settle_s: Optional[float] = None) -> Optional[dict]:
    """The policy in use through the file's throttle pattern on the wall clock (module docstring):
    ``{"simulated": {"policy_s", "even_s", "moves"}, "measured": {"reshard_s", "off_s", "moves"}, "settle_s",
    "policy_vs_even": {"simulated", "measured"}}``, mean steps in seconds (``settle_s``: what the two steps
    after a move ran over steady in the runs, :func:`_settle_measured`, read here where not given); ``None``
    without a pattern, an ``off`` run or a measured move."""
    try:  # the throttle's own schedule (its fraction is not read here: the slowdown is the file's χ)
        pattern = ThrottlePattern.parse(str(data.get("pattern")), fraction=1.0)
    except ConfigError:
        return None
    raw = data["raw"]
    if not raw.get("off"):
        return None
    workload = file_workload(c, c["split"], run_events(raw["reshard"][0]))
    moves = _moves_measured(raw["reshard"], workload)
    if moves is None:
        return None
    steps, T = len(raw["reshard"][0]["step_s"]), c["healthy_step_s"]
    settle = (_settle_measured(raw["reshard"]) or 0.0) if settle_s is None else settle_s
    workload = dataclasses.replace(workload, state_bytes=moves[0], bandwidth_bytes_s=moves[1], latency_s=0.0,
                                   settle=settle / T)
    rows = np.arange(steps * WALL_ROWS)
    speeds = np.ones((rows.size, c["tp"]))
    ranks = c["straggler_rank"] if isinstance(c["straggler_rank"], list) else [c["straggler_rank"]]
    for r, turn in zip(ranks, pattern.in_turn(len(ranks))):  # on from the start; several ranks in turn
        speeds[[turn.held_at(t) for t in rows * T], r] = 1.0 / c["chi"]
    noise = Noise(prior=0.0)
    for run in raw["healthy"]:
        noise.add_rows([[t] for t in run["step_s"][1:]])
    # the throttle's pattern starts with the first step (time_to_loss's --pattern-after), after the device probe
    # read every rank at full speed: a probe that reads the ranks alike takes no plan
    scenario = Scenario(name="pattern", category="moving" if len(ranks) > 1 else "come_and_go", workload=workload,
                        speeds=speeds, noise=min(noise.sigma, 1.0), clock="wall", length=steps, probe=False)
    runs = [run_policy(dataclasses.replace(scenario, seed=seed), reshard_policy) for seed in range(PATTERN_SEEDS)]
    simulated = {"policy_s": statistics.fmean(r.time_s for r in runs) / steps,
                 "even_s": fixed_time(scenario, workload.even_plans()) / steps,
                 "moves": statistics.fmean(r.moves for r in runs)}
    measured = {"reshard_s": statistics.fmean(statistics.fmean(r["step_s"]) for r in raw["reshard"]),
                "off_s": statistics.fmean(statistics.fmean(r["step_s"]) for r in raw["off"]),
                "moves": statistics.fmean(len(run_events(r)) for r in raw["reshard"])}
    return {"simulated": simulated, "measured": measured, "settle_s": settle,
            "policy_vs_even": {"simulated": simulated["policy_s"] / simulated["even_s"],
                               "measured": measured["reshard_s"] / measured["off_s"]}}


def replay_file(data: dict, name: str = "") -> dict:
    """Every ``reshard`` run of a ``time_to_loss`` result through the model (module docstring):
    ``{"file", "constants", "runs": [{"measured_mean_s", "simulated_mean_s", "ratio", "band_s", "moves",
    "plan"}], "ratio", "model_best", "error"}`` (``model_best``: under a steady throttle, the best plan the
    model finds at the throttled speeds and its step over the model's healthy step: the layout's limit
    with the file's replicated work, which stays on the slow rank) (``ratio``: simulated over measured, the mean over runs; ``error``:
    the mean of ``|ratio − 1|``), or ``{"file", "skipped": why}``."""
    c = file_constants(data)
    if "skipped" in c:
        return {"file": name, "skipped": c["skipped"]}
    pattern = bool(data.get("pattern"))
    settle = _settle_measured(data["raw"]["reshard"]) or 0.0
    out = []
    for run in data["raw"]["reshard"]:
        events = run_events(run)
        if any(len(e["mlp_units"]) != c["tp"] or len(e["kv_units"]) != c["tp"] for e in events):
            return {"file": name, "skipped": f"a plan whose length is not tp {c['tp']}"}
        band = [_simulated_mean(c, f, run, events, pattern, settle) for f in SPLITS]
        measured = statistics.fmean(run["step_s"][1:])
        point = _simulated_mean(c, c["split"], run, events, pattern, settle)
        out.append({"measured_mean_s": measured, "simulated_mean_s": point, "ratio": point / measured,
                    "band_s": [min(band), max(band)], "moves": len(events),
                    "plan": [e["mlp_units"], e["kv_units"]] if (e := events[-1] if events else None) else None})
    ratios = [r["ratio"] for r in out]
    best = None
    if not pattern:  # the best plan the model finds at the throttled speeds, over the healthy step
        first = data["raw"]["reshard"][0]
        workload = file_workload(c, c["split"], run_events(first), run_idle_skips(first))
        speeds = [1.0] * c["tp"]
        for r in held_ranks(c, first, 0, False):
            speeds[r] = 1.0 / chi_of(c, r)
        plans = best_plans(workload, speeds)
        best = {"plan": [list(p.units) for p in plans],
                "vs_healthy": workload.step_seconds(plans, speeds) / workload.step_seconds(workload.even_plans(),
                                                                                          [1.0] * c["tp"])}
    policy = pattern_policy(data, c, settle) if pattern else None
    return {"file": name, "constants": c, "runs": out, "ratio": statistics.fmean(ratios), "model_best": best,
            **({"pattern_policy": policy} if policy is not None else {}),
            "error": statistics.fmean(abs(x - 1.0) for x in ratios),
            "in_band": all(r["band_s"][0] * 0.9 <= r["measured_mean_s"] <= r["band_s"][1] * 1.1 for r in out)}


def replay_summary(results: Sequence[dict]) -> dict:
    """How many replayed files are within 10 % (mean ``|ratio − 1|`` over their runs), how many lie in
    their band widened by 10 %, the median and worst error, and every skipped file with its reason."""
    done = [r for r in results if "error" in r]
    return {"files": len(done), "skipped": {r["file"]: r["skipped"] for r in results if "skipped" in r},
            "within_10pct": sum(r["error"] <= 0.10 for r in done),
            "in_band": sum(bool(r["in_band"]) for r in done),
            "median_abs_error": statistics.median(r["error"] for r in done) if done else None,
            "max_abs_error": max((r["error"] for r in done), default=None)}
