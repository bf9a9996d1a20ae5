"""Recorded runs through the step model: does the simulator's model reproduce what real runs measured?

A ``time_to_loss`` result file holds, per mode and run, every step's wall time (``step_s``), for
throttle patterns which steps ran throttled (``throttled``, when the run recorded it) and every
re-plan (``summary.reshard.events``: the step it was decided at, the MLP and KV units, the bytes and
seconds of the move).  It does not hold any rank's own numbers: no per-rank compute, shardable or
communication seconds per step, no device-probe times, no ``R/S`` the policy measured.  So the replay
derives what the model needs from what is there:

- the healthy step: the median of the healthy mode's steps after the first (warm-up) one;
- the throttled rank's slowdown ``χ``: from the ``off`` mode (Colossal-AI alone, even plan) where the
  file has it (its throttled steps' median over the healthy step, the collectives' share taken out),
  else the throttle's nominal ``χ`` (``chi``, or one over the core ``fraction``);
- which steps are throttled: all of them for a steady throttle, the run's own ``throttled`` flags for
  a pattern (a pattern run without them is skipped);
- the replicated share: :data:`REPLICATED_RATIO`; the attention's share of the shardable work: its
  share of the paired parameters (the example's Llama: ``2·h·(h + h_kv)`` per layer against the
  MLP's ``3·h·I``);

then runs the run's recorded plan schedule through the model (no policy involved: this checks the
model) and compares the mean simulated step with the mean measured one, both over the steps after the
first (a move's own seconds are in neither).
"""
from __future__ import annotations

import statistics
from typing import List, Optional, Sequence

import numpy as np

from semimig.controller.sim.stepmodel import Workload
from semimig.sharding.plan import ShardPlan

__all__ = ["REPLICATED_RATIO", "COMM_SHARE", "replay_file", "replay_summary"]

REPLICATED_RATIO = 0.032
"""``R/S`` of the example's tiny Llama (h1024, 2 layers, tp 2) as the re-shard policy measured it across
moves under a real throttle (0.030-0.034)."""
COMM_SHARE = 0.05
"""The collectives' share of a healthy step assumed for those runs (gloo on one machine)."""
BLOCK = 128


def _nominal_chi(data: dict) -> Optional[float]:
    if data.get("chi"):
        return float(data["chi"])
    fraction = (data.get("config") or {}).get("fraction")
    return 1.0 / float(fraction) if fraction else None


def _workload(data: dict, healthy_s: float, mlp_units: int, kv_units: int) -> Workload:
    model = data.get("model") or {}
    h = int(model.get("hidden", 1024))
    heads = int(model.get("heads", 16))
    kv_heads = int(model.get("kv_heads") or kv_units)
    h_kv = h // heads * kv_heads
    intermediate = mlp_units * BLOCK
    attention = 2 * h * (h + h_kv) / (2 * h * (h + h_kv) + 3 * h * intermediate)
    k = REPLICATED_RATIO
    return Workload(tp=2, replicated_share=k / (k + 0.5), mlp_units=mlp_units, kv_units=kv_units,
                    attention_share=attention, attention_param_share=attention, comm_share=COMM_SHARE,
                    step_s=healthy_s)


def _schedule(events: Sequence[dict], steps: int, even: tuple) -> List[tuple]:
    """The plans in force at each step: a decision at step ``i`` is in force from step ``i + 1``."""
    plans, out = even, []
    moves = sorted(events, key=lambda e: e["step"])
    j = 0
    for i in range(steps):
        while j < len(moves) and moves[j]["step"] < i:
            plans = (ShardPlan(units=tuple(moves[j]["mlp_units"])), ShardPlan(units=tuple(moves[j]["kv_units"])))
            j += 1
        out.append(plans)
    return out


def replay_file(data: dict, name: str = "") -> dict:
    """Every ``reshard`` run of a ``time_to_loss`` result through the model (module docstring):
    ``{"file", "chi", "chi_from", "runs": [{"measured_mean_s", "simulated_mean_s", "error"}],
    "error"}`` (the mean absolute error over the runs), or ``{"file", "skipped": why}``."""
    raw = data.get("raw") or {}
    if "reshard" not in raw or "healthy" not in raw:
        return {"file": name, "skipped": "no healthy and reshard runs"}
    if not all(run.get("step_s") for run in raw["reshard"] + raw["healthy"]):
        return {"file": name, "skipped": "a run without per-step times"}
    healthy = statistics.median(s for run in raw["healthy"] for s in run["step_s"][1:])
    pattern = data.get("pattern")
    runs = raw["reshard"]
    if pattern and any(run.get("throttled") is None for run in runs):
        return {"file": name, "skipped": "a throttle pattern without per-step throttled flags"}
    chi, source = _nominal_chi(data), "nominal"
    if "off" in raw:
        throttled = [s for run in raw["off"] for i, s in enumerate(run["step_s"][1:], start=1)
                     if not pattern or (run.get("throttled") or [True] * len(run["step_s"]))[i]]
        if throttled:
            ratio = statistics.median(throttled) / healthy
            chi, source = (ratio - COMM_SHARE) / (1.0 - COMM_SHARE), "off"
    if chi is None:
        return {"file": name, "skipped": "no off run and no nominal slowdown to read the slowdown from"}
    out = []
    for run in runs:
        events = ((run.get("summary") or {}).get("reshard") or {}).get("events") or []
        units = [(e["mlp_units"], e["kv_units"]) for e in events]
        mlp_units = sum(units[0][0]) if units else 32
        kv_units = sum(units[0][1]) if units else int((data.get("model") or {}).get("kv_heads") or 8)
        workload = _workload(data, healthy, mlp_units, kv_units)
        steps = len(run["step_s"])
        flags = run.get("throttled") if pattern else None
        speeds = np.ones((steps, 2))
        for i in range(steps):
            if flags is None or flags[i]:
                speeds[i, 1] = 1.0 / chi
        schedule = _schedule(events, steps, workload.even_plans())
        simulated = [workload.step_seconds(schedule[i], speeds[i]) for i in range(1, steps)]
        measured = run["step_s"][1:]
        sim, meas = statistics.fmean(simulated), statistics.fmean(measured)
        out.append({"measured_mean_s": meas, "simulated_mean_s": sim, "error": sim / meas - 1.0,
                    "moves": len(events), "plan": [list(p) for p in units[-1]] if units else None})
    return {"file": name, "chi": chi, "chi_from": source, "healthy_step_s": healthy, "runs": out,
            "error": statistics.fmean(abs(r["error"]) for r in out)}


def replay_summary(results: Sequence[dict]) -> dict:
    """How many replayed files are within 10 % (mean absolute error over their runs), and the worst."""
    done = [r for r in results if "error" in r]
    return {"files": len(done), "skipped": {r["file"]: r["skipped"] for r in results if "skipped" in r},
            "within_10pct": sum(r["error"] <= 0.10 for r in done),
            "median_abs_error": statistics.median(r["error"] for r in done) if done else None,
            "max_abs_error": max((r["error"] for r in done), default=None)}
