"""The family of scenarios a policy is judged on (DESIGN §9), generated from one seed.

A scenario is a :class:`~semimig.controller.sim.stepmodel.Workload` (group, model, machine), a speed
trace (``speeds[i][r]``: rank ``r``'s speed in row ``i``, 1 healthy), the noise of what the policy
measures and the exchange's lag.  A trace runs on one of two clocks:

- ``wall`` (the family's): row ``i`` holds over the wall-clock seconds ``[i·T, (i + 1)·T)``, ``T`` the
  healthy even step, and the run lasts ``length`` steps, each share of a step's work at the speeds of the
  row it runs in (a step that spans a change runs partly at each; the last row holds beyond the trace).  A slowdown from outside the job (a neighbour's work, a
  cooling limit, a co-scheduled job) keeps its own time: a phase of ``P`` seconds holds fewer steps
  for a plan that steps slower, so what a plan saves in a slow phase is the steps it adds to it, and
  a phase that ends sooner than a move repays runs as many steps under either plan;
- ``steps``: row ``i`` is step ``i`` (a slowdown that follows the work itself), so every policy and the
  oracle meet the same speeds at the same step.

The family's phases are drawn in healthy steps and laid on the wall clock: a phase of ``P`` seconds is
``P / T`` rows, and a wall trace holds :data:`WALL_ROWS` rows per step to run, so a pattern that
repeats still repeats while the slowest plan runs.

Categories (each drawn with its own ranges):

- ``none``: no straggler;
- ``persistent``: one rank ``χ`` times slower (1.1-8, log-uniform), from the start or from a step in
  the first third;
- ``come_and_go``: one rank at ``χ`` (1.5-8) for on-periods, healthy for off-periods, each from a few
  steps to ten minutes, the first on-period starting in the run's first half;
- ``ramp``: one rank slowing linearly to ``χ`` (1.5-8) over 10 steps to the whole run, held, and in
  half of them recovering the same way;
- ``moving``: one rank at ``χ`` (1.5-8) that moves to another rank every period;
- ``two``: two ranks at different ``χ`` (tp 4 and 8).

Common draws: tp 2, 4, 8; replicated share 5-45 %; attention 20-45 % of the shardable work (its
parameter share up to 30 % less: the core is not in the parameters); the timers see 75-100 % of the
shardable work; collectives 0-10 % of a step; healthy steps of 20 ms to 5 s (GPU-like below 0.3 s:
NVLink-class bandwidth and one step's lag on the exchange; CPU-like above: a host link, no lag); a
move of every unit costing 0.3-10 healthy steps, and the step after a move 0-1 healthy steps longer
than steady (the reference machine: 0.7-0.8); noise 1-20 % per rank and step, outliers in 0-3 %
of them.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from semimig._validate import check_int, check_number
from semimig.controller.sim.stepmodel import Workload
from semimig.errors import ConfigError

__all__ = ["Scenario", "CATEGORIES", "CLOCKS", "WALL_ROWS", "family", "make_scenario"]

CATEGORIES = ("none", "persistent", "come_and_go", "ramp", "moving", "two")
CLOCKS = ("wall", "steps")
"""What a trace's rows count (module docstring)."""
WALL_ROWS = 9
"""Rows of a wall trace per step to run: the even plan at the family's slowest straggler (``χ`` 8) steps
8 healthy steps, and no plan the oracle or a policy would hold steps slower for long."""
MIN_STEPS = 10
"""Fewest steps a scenario has: every category's trace is drawn within the run (a ramp lasts 10 steps or more)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Scenario:
    """One run to simulate: a workload, a speed trace and the noise of the measurements."""

    name: str
    category: str
    workload: Workload
    speeds: np.ndarray
    """``(rows, tp)``: each rank's speed in each row (1: healthy): a step (``clock="steps"``) or a healthy
    step's seconds of the wall clock (``clock="wall"``)."""
    noise: float = 0.02
    """Relative standard deviation of a measured time (log-normal)."""
    outliers: float = 0.0
    """Probability that a rank's step is an outlier (1.5-3x slower as measured)."""
    lag: int = 0
    """Steps between a step and the policy's reading of it (the exchange's lag)."""
    seed: int = 0
    """Seed of the measurement noise (the same for every policy run on the scenario)."""
    probe: bool = True
    """The device probe runs before the first step (as :func:`semimig.enable` does)."""
    info: dict = field(default_factory=dict)
    """What was drawn (for the record)."""
    clock: str = "steps"
    """What the trace's rows count, :data:`CLOCKS` (module docstring)."""
    length: Optional[int] = None
    """Steps the run lasts; ``None``: one per row."""

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ConfigError(f"Scenario.category must be one of {CATEGORIES}, got {self.category!r}")
        speeds = np.asarray(self.speeds, dtype=float)
        if speeds.ndim != 2 or speeds.shape[1] != self.workload.tp or speeds.shape[0] < 1:
            raise ConfigError(f"Scenario.speeds must have shape (steps, tp={self.workload.tp}), got {speeds.shape}")
        if not np.all(np.isfinite(speeds)) or np.any(speeds <= 0.0):
            raise ConfigError(f"Scenario.speeds must be finite and > 0 (scenario {self.name!r})")
        object.__setattr__(self, "speeds", speeds)
        check_number("Scenario.noise", self.noise, minimum=0.0, maximum=1.0)
        check_number("Scenario.outliers", self.outliers, minimum=0.0, maximum=1.0)
        check_int("Scenario.lag", self.lag, minimum=0, maximum=10)
        check_int("Scenario.seed", self.seed, minimum=0)
        if self.clock not in CLOCKS:
            raise ConfigError(f"Scenario.clock must be one of {CLOCKS}, got {self.clock!r}")
        check_int("Scenario.length", self.length, minimum=1, allow_none=True)
        if self.clock == "steps" and self.length not in (None, speeds.shape[0]):
            raise ConfigError(f"Scenario.length={self.length}: a trace on the step clock runs one step per row "
                              f"({speeds.shape[0]} rows)")

    @property
    def steps(self) -> int:
        """Steps the run lasts."""
        return int(self.speeds.shape[0]) if self.length is None else self.length

    @property
    def wall(self) -> bool:
        return self.clock == "wall"

    def row_at(self, step: int, seconds: float) -> int:
        """The trace's row of a step that starts ``seconds`` into the run as its ``step``-th."""
        if not self.wall:
            return step
        return min(int(seconds / self.workload.step_s), self.speeds.shape[0] - 1)

    @property
    def tp(self) -> int:
        return self.workload.tp


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def _trace(rng: np.random.Generator, category: str, steps: int, tp: int, step_s: float,
           rows: Optional[int] = None) -> tuple[np.ndarray, dict]:
    """``(speeds, what was drawn)`` for one category (module docstring): drawn for a run of ``steps``,
    ``rows`` long (default ``steps``)."""
    speeds = np.ones((rows or steps, tp))
    slow = int(rng.integers(tp))
    info: dict = {}
    if category == "none":
        return speeds, info
    if category == "persistent":
        chi = _log_uniform(rng, 1.1, 8.0)
        start = 0 if rng.random() < 0.5 else int(rng.integers(0, steps // 3))
        speeds[start:, slow] = 1.0 / chi
        info = {"chi": chi, "start": start, "rank": slow}
    elif category == "come_and_go":
        chi = _log_uniform(rng, 1.5, 8.0)
        on = max(1, round(_log_uniform(rng, 3 * step_s, 600.0) / step_s))
        off = max(1, round(_log_uniform(rng, 3 * step_s, 600.0) / step_s))
        first = int(rng.integers(0, steps // 2))  # the first on-period starts in the run's first half
        i = np.arange(speeds.shape[0])
        speeds[(i >= first) & ((i - first) % (on + off) < on), slow] = 1.0 / chi
        info = {"chi": chi, "on_steps": on, "off_steps": off, "first_on": first, "rank": slow}
    elif category == "ramp":
        chi = _log_uniform(rng, 1.5, 8.0)
        start = int(rng.integers(0, steps // 3))
        length = max(1, round(_log_uniform(rng, 10, steps)))
        hold = int(rng.integers(0, steps))
        back = bool(rng.random() < 0.5)
        i = np.arange(speeds.shape[0])
        level = np.clip((i - start) / length, 0.0, 1.0)
        if back:
            level = np.minimum(level, np.clip(1.0 - (i - start - length - hold) / length, 0.0, 1.0))
        speeds[:, slow] = 1.0 / (1.0 + (chi - 1.0) * level)
        info = {"chi": chi, "start": start, "ramp_steps": length, "hold_steps": hold, "recovers": back, "rank": slow}
    elif category == "moving":
        chi = _log_uniform(rng, 1.5, 8.0)
        period = max(2, round(_log_uniform(rng, 20, max(21, steps / 2))))
        rank = slow
        for begin in range(0, speeds.shape[0], period):
            speeds[begin:begin + period, rank] = 1.0 / chi
            # drawn over the run's steps; past them (a wall trace's tail) it moves on to the next rank
            rank = (rank + 1 + (int(rng.integers(tp - 1)) if begin < steps else 0)) % tp
        info = {"chi": chi, "period_steps": period}
    elif category == "two":
        a, b = (int(r) for r in rng.choice(tp, size=2, replace=False))
        chi_a = _log_uniform(rng, 1.3, 8.0)
        chi_b = 1.0 + (chi_a - 1.0) * rng.uniform(0.2, 0.8)
        speeds[:, a], speeds[:, b] = 1.0 / chi_a, 1.0 / chi_b
        info = {"chi": [chi_a, chi_b], "ranks": [a, b]}
    else:
        raise ConfigError(f"unknown scenario category {category!r}; expected one of {CATEGORIES}")
    return speeds, info


def _check_step_range(min_steps: int, max_steps: int) -> None:
    check_int("min_steps", min_steps, minimum=MIN_STEPS)
    check_int("max_steps", max_steps, minimum=min_steps)


def make_scenario(seed: int, category: str, *, steps: Optional[int] = None, min_steps: int = 150,
                  max_steps: int = 600, idle_skips: bool = False, clock: str = "wall") -> Scenario:
    """One scenario of ``category``, every draw from ``seed`` (module docstring): ``steps`` steps, or when ``None``
    a log-uniform draw in ``[min_steps, max_steps]`` (each at least :data:`MIN_STEPS`), on ``clock``
    (:data:`CLOCKS`; the draws are the same on both)."""
    check_int("seed", seed, minimum=0)
    if clock not in CLOCKS:
        raise ConfigError(f"clock must be one of {CLOCKS}, got {clock!r}")
    check_int("steps", steps, minimum=MIN_STEPS, allow_none=True)
    _check_step_range(min_steps, max_steps)
    rng = np.random.default_rng([seed, CATEGORIES.index(category) if category in CATEGORIES else 99])
    tp = int(rng.choice([4, 8])) if category == "two" else int(rng.choice([2, 4, 8]))
    n = steps or int(round(_log_uniform(rng, min_steps, max_steps)))
    step_s = _log_uniform(rng, 0.02, 5.0)
    gpu = step_s < 0.3
    bandwidth = _log_uniform(rng, 2e10, 2e11) if gpu else _log_uniform(rng, 5e7, 3e8)
    move_all = _log_uniform(rng, 0.3, 10.0) * step_s  # seconds to move every unit
    attention = float(rng.uniform(0.2, 0.45))
    workload = Workload(
        tp=tp, replicated_share=float(rng.uniform(0.05, 0.45)),
        mlp_units=int(rng.choice([16, 32, 64])), kv_units=int(rng.choice([k for k in (8, 16, 32) if k >= tp])),
        attention_share=attention, attention_param_share=attention * float(rng.uniform(0.7, 1.0)),
        timed_share=float(rng.uniform(0.75, 1.0)), comm_share=float(rng.uniform(0.0, 0.1)), step_s=step_s,
        state_bytes=int(move_all * bandwidth), bandwidth_bytes_s=bandwidth, latency_s=0.005 if gpu else 0.05,
        idle_skips=idle_skips)
    speeds, info = _trace(rng, category, n, tp, step_s, rows=n * WALL_ROWS if clock == "wall" else n)
    noise = _log_uniform(rng, 0.01, 0.2)
    outliers = float(rng.choice([0.0, 0.01, 0.03]))
    workload = dataclasses.replace(workload, settle=float(rng.uniform(0.0, 1.0)))  # drawn last: the others as before
    info.update(steps=n, step_s=step_s, tp=tp, replicated_share=workload.replicated_share, noise=noise,
                move_all_steps=move_all / step_s, mlp_units=workload.mlp_units, kv_units=workload.kv_units,
                settle=workload.settle)
    return Scenario(name=f"{category}-{seed}", category=category, workload=workload, speeds=speeds, noise=noise,
                    outliers=outliers, lag=1 if gpu else 0, seed=seed, info=info, clock=clock, length=n)


def family(count: int, seed: int = 0, *, min_steps: int = 150, max_steps: int = 600,
           idle_skips: bool = False, clock: str = "wall") -> List[Scenario]:
    """``count`` scenarios, the categories in turn, scenario ``i`` drawn from ``(seed, i)``; ``idle_skips``:
    a rank holding nothing skips the step (:class:`~semimig.controller.sim.stepmodel.Workload`); ``clock``:
    what the traces' rows count (:data:`CLOCKS`)."""
    check_int("count", count, minimum=1)
    check_int("seed", seed, minimum=0)
    _check_step_range(min_steps, max_steps)
    return [make_scenario(seed * 1_000_003 + i, CATEGORIES[i % len(CATEGORIES)], min_steps=min_steps,
                          max_steps=max_steps, idle_skips=idle_skips, clock=clock) for i in range(count)]
