"""Poplar batch allocation vs. an even split on a simulated heterogeneous 4-rank CPU cluster.

    python benchmarks/poplar_bench.py [--quick] --json PATH [--zero-stage 1|2]

Four gloo ranks train a small model under Colossal-AI's ``LowLevelZeroPlugin`` (fp32).  Each rank
plays a device with a speed factor ``f`` and a memory cap (:mod:`semimig.allocation.simulate`):

    (a) compute   speed factors 1, 1, 2, 4        equal memory caps (2X bytes)
    (b) memory    speed factors 1, 1, 1, 1        caps 2X, 2X, X, X
    (c) both      speed factors 1, 1, 2, 4        caps X, 2X, X, 2X

Per scenario every rank profiles its own device (Poplar Algorithm 1: max batch size under its cap,
micro-step times, speed curve), the profiles are all-gathered, and the iteration's fixed costs are
measured on the training path itself: two iterations of one sample per device, timing the time
inside collectives (the minimum over ranks: the last rank to arrive waits for nobody, so its time
is the collectives' own) and the optimizer step's own work.  Every rank computes the same plans and
bounds, all charging those measured costs:

    even     the homogeneous setup: equal samples, one micro-batch size (the smallest max batch)
    poplar   semimig.allocation.allocate (Algorithm 2)
    ideal    the continuous bound gbs/Σ peak speed + measured fixed costs (not a run)
    integer  the exact optimum of the speed model over whole samples and whole micro-steps
             + measured fixed costs (not a run; semimig.allocation.bounds)

``even`` and ``poplar`` then train for a few iterations; an iteration's time is the slowest rank's
wall time from a barrier to the end of ``optimizer.step()``, and the median over iterations is
reported.  Records ``{"scenario", "allocation", "iter_time_s", ...}`` go to ``--json``.

Where the time goes (printed per scenario for ``poplar``).  Every rank times each iteration's
parts: fetching micro-batches, forwards (sleep included), backwards, the optimizer step, and the
time inside collectives (:func:`~semimig.allocation.timed_collectives`).  The *critical* rank is
the one with the most own work (wall minus time inside collectives).  Its wall time splits
exactly into

    ideal + granularity + allocator + compute error + collectives + optimizer + data

    granularity    integer - ideal: whole samples and whole micro-steps (the speed model's own
                   optimum, which no allocation beats)
    allocator      plan model time - integer (Algorithm 2's distance from that optimum)
    compute error  critical rank's forward+backward - the plan's model compute (interpolation
                   error, profile noise, sleep overshoot, Python between micro-steps)
    collectives    its time inside collectives - the measured collective cost the model charges
                   (waiting for later ranks, noise)
    optimizer      its optimizer step outside collectives - the measured one the model charges
    data           fetching its micro-batches (not part of the profiled step)

(means over the timed iterations, so the parts add up; the headline iteration time is the
median).  ``overshoot`` (sleep taken - sleep asked) is shown as a part of the compute error.

Why the numbers mean something on 2 cores.  Four ranks share two cores, so real compute is
contended and noisy.  The simulated devices therefore spend their time in deterministic sleeps
(``base_time_s + per_sample_time_s·b`` per micro-step, times ``f``), which do not compete for
cores; the toy model's real forward/backward and Colossal-AI's bookkeeping are ~1 ms per
micro-step against tens of milliseconds of sleep.  On a loaded machine sleeps overshoot and
collectives wait for descheduled ranks: the breakdown shows how much.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import TensorDataset

from bench_output import add_json_flag, write_result
from semimig._compat import apply_cpu_shim
from semimig.allocation import (
    AllocationRequest,
    HeteroDataLoader,
    ModelStepDevice,
    ProfilerConfig,
    SimulatedSpeed,
    SlowedModule,
    check_plan,
    data_parallel_info,
    even_plan,
    gather_profiles,
    ideal_time,
    integer_time,
    poplar_plan,
    profile_device,
    run_iteration,
    timed_collectives,
)
from semimig.launch import run_on_ranks

WORLD = 4
FEATURES = 512  # wide input, few parameters: activations dominate memory, so 2x bytes ~ 2x batch
BASE_TIME_S = 0.012
PER_SAMPLE_TIME_S = 0.006
SMALL_CAP_SAMPLES = 16.5  # cap X holds the model states plus this many samples' activations
TERMS = ("granularity", "allocator", "compute_error", "collectives", "optimizer", "data")


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    speed_factors: tuple[float, ...]
    big_memory: tuple[bool, ...]
    """Per rank: cap 2X (True) or X (False)."""


SCENARIOS = (
    Scenario(name="a_compute", speed_factors=(1, 1, 2, 4), big_memory=(True, True, True, True)),
    Scenario(name="b_memory", speed_factors=(1, 1, 1, 1), big_memory=(True, True, False, False)),
    Scenario(name="c_both", speed_factors=(1, 1, 2, 4), big_memory=(False, True, False, True)),
)


class WideMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 2)
        self.fc2 = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def _mse(model: nn.Module, data) -> torch.Tensor:
    x, y = data
    return nn.functional.mse_loss(model(x), y)


def speed_of(scenario: Scenario, rank: int) -> SimulatedSpeed:
    return SimulatedSpeed(
        speed_factor=float(scenario.speed_factors[rank]), base_time_s=BASE_TIME_S, per_sample_time_s=PER_SAMPLE_TIME_S
    )


def _make_batch(batch: int):
    return torch.randn(batch, FEATURES), torch.randn(batch, 1)


def _memory_caps() -> tuple[int, int]:
    """(X, 2X) bytes: X = model states + SMALL_CAP_SAMPLES samples' activations (CPU memory model)."""
    device = ModelStepDevice(WideMLP(), _mse, _make_batch)
    one, two = device(1), device(2)
    per_sample = two.peak_bytes - one.peak_bytes
    small = int(one.peak_bytes - per_sample + per_sample * SMALL_CAP_SAMPLES)
    return small, 2 * small


# ------------------------------------------------------------------------------ instrumentation
class IterationProbe:
    """Times one iteration's parts on this rank: micro-batch fetches and forwards (sleep included).

    Wraps the micro-batch iterator (``fetch_s``) and the loss function (``forward_s``); the caller
    times the rest.  ``reset()`` before each iteration.
    """

    def __init__(self, micro_batches: Iterator[Any], loss_fn: Callable[[nn.Module, Any], torch.Tensor]) -> None:
        self._micro_batches = micro_batches
        self._loss_fn = loss_fn
        self.reset()

    def reset(self) -> None:
        self.fetch_s = 0.0
        self.forward_s = 0.0

    def __iter__(self) -> "IterationProbe":
        return self

    def __next__(self) -> Any:
        started = time.perf_counter()
        try:
            return next(self._micro_batches)
        finally:
            self.fetch_s += time.perf_counter() - started

    def loss(self, model: nn.Module, data: Any) -> torch.Tensor:
        started = time.perf_counter()
        try:
            return self._loss_fn(model, data)
        finally:
            self.forward_s += time.perf_counter() - started


def _time_iterations(booster, model, optimizer, plan, rank: int, zero_stage: int, iterations: int,
                     warmup: int) -> list[dict[str, float]]:
    """This rank's timings of ``iterations`` iterations (after ``warmup`` untimed ones)."""
    dataset = TensorDataset(*_make_batch(plan.global_batch_size * (iterations + warmup)))
    probe = IterationProbe(iter(HeteroDataLoader(dataset, plan, rank)), _mse)
    slowed = model.unwrap()
    timings = []
    for i in range(warmup + iterations):
        probe.reset()
        asked, taken = slowed.requested_sleep_s, slowed.slept_s
        dist.barrier()
        with timed_collectives() as clock:
            started = time.perf_counter()
            run_iteration(booster, model, optimizer, probe, probe.loss, zero_stage=zero_stage)
            ran = time.perf_counter()
            run_collectives = clock.seconds
            optimizer.step()
            stepped = time.perf_counter()
        optimizer.zero_grad()
        if i >= warmup:
            timings.append({
                "wall_s": stepped - started, "run_s": ran - started, "step_s": stepped - ran,
                "fetch_s": probe.fetch_s, "forward_s": probe.forward_s,
                "run_collectives_s": run_collectives, "step_collectives_s": clock.seconds - run_collectives,
                "sleep_asked_s": slowed.requested_sleep_s - asked, "sleep_taken_s": slowed.slept_s - taken,
            })
    return timings


@dataclass(frozen=True, kw_only=True)
class FixedCosts:
    """Per-iteration costs every allocation pays, measured on the training path (module docstring)."""

    reduce_s: float
    """Time inside the collectives of the backward (gradient reduction) of one micro-step."""
    step_collectives_s: float
    """Time inside the collectives of the optimizer step (the parameter all-gather)."""
    optimizer_s: float
    """The optimizer step's own work (outside collectives)."""

    def comm_time_s(self, zero_stage: int) -> float:
        """The allocator's ``t_comm``: per iteration (ZeRO-1) or per micro-step (ZeRO-2)."""
        return self.reduce_s + self.step_collectives_s if zero_stage < 2 else self.reduce_s

    def beyond_comm_s(self, zero_stage: int) -> float:
        """What an iteration pays besides the allocator's ``t_comm`` (once per iteration)."""
        return self.optimizer_s + (self.step_collectives_s if zero_stage >= 2 else 0.0)


def measure_fixed_costs(every_rank: list[list[dict[str, float]]]) -> FixedCosts:
    """:class:`FixedCosts` from every rank's timings of a one-micro-step-per-device run.

    Per iteration the collectives' own cost is the least time any rank spent inside them (the
    last to arrive waits for nobody); the optimizer's the most any rank spent; medians over
    iterations.
    """
    per_iteration = list(zip(*every_rank))
    reduce_s = statistics.median(min(t["run_collectives_s"] for t in it) for it in per_iteration)
    gather_s = statistics.median(min(t["step_collectives_s"] for t in it) for it in per_iteration)
    optimizer_s = statistics.median(max(t["step_s"] - t["step_collectives_s"] for t in it) for it in per_iteration)
    return FixedCosts(reduce_s=reduce_s, step_collectives_s=gather_s, optimizer_s=optimizer_s)


def breakdown(timings_by_rank: list[list[dict[str, float]]], *, ideal_s: float, integer_s: float,
              predicted_s: float, model_compute_s: float, collectives_s: float, optimizer_s: float) -> dict[str, float]:
    """The module docstring's split of the critical rank's wall time, as means over iterations.

    ``timings_by_rank[r][i]`` is rank ``r``'s :func:`_time_iterations` record of iteration ``i``.
    The model's iteration time ``predicted_s`` (the plan's, plus the fixed costs it leaves out)
    is ``model_compute_s + collectives_s + optimizer_s``; all three bounds include the same
    measured ``collectives_s`` and ``optimizer_s``.  Returns :data:`TERMS` plus ``ideal_s``,
    ``wall_s`` (their sum) and ``sleep_overshoot_s``.
    """
    rows = []
    for per_rank in zip(*timings_by_rank):  # one iteration, every rank
        own = [t["wall_s"] - t["run_collectives_s"] - t["step_collectives_s"] for t in per_rank]
        t = per_rank[own.index(max(own))]
        backward_own = t["run_s"] - t["fetch_s"] - t["forward_s"] - t["run_collectives_s"]
        rows.append({
            "compute_error": t["forward_s"] + backward_own - model_compute_s,
            "collectives": t["run_collectives_s"] + t["step_collectives_s"] - collectives_s,
            "optimizer": t["step_s"] - t["step_collectives_s"] - optimizer_s,
            "data": t["fetch_s"],
            "sleep_overshoot_s": t["sleep_taken_s"] - t["sleep_asked_s"],
            "wall_s": t["wall_s"],
        })
    out = {"ideal_s": ideal_s, "granularity": integer_s - ideal_s, "allocator": predicted_s - integer_s}
    out.update({key: statistics.fmean(r[key] for r in rows) for key in rows[0]})
    return out


# ------------------------------------------------------------------------------ one scenario
def _train(plan, speed: SimulatedSpeed, zero_stage: int, iterations: int) -> list[dict[str, float]]:
    """This rank's :func:`_time_iterations` for ``plan`` on a fresh model, optimizer and plugin."""
    from colossalai.booster import Booster
    from colossalai.booster.plugin import LowLevelZeroPlugin

    torch.manual_seed(0)
    model = SlowedModule(WideMLP(), speed)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    plugin = LowLevelZeroPlugin(stage=zero_stage, precision="fp32", overlap_communication=False)
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(model, optimizer)
    info = data_parallel_info(plugin)
    check_plan(plan, info)
    return _time_iterations(booster, model, optimizer, plan, info.rank, info.zero_stage, iterations, warmup=1)


def _scenario(rank: int, scenario: Scenario, caps: tuple[int, int], gbs: int, iterations: int, repeats: int,
              zero_stage: int) -> list[dict]:
    small_cap, big_cap = caps
    speed = speed_of(scenario, rank)
    torch.manual_seed(rank)
    device = ModelStepDevice(SlowedModule(WideMLP(), speed), _mse, _make_batch,
                             memory_cap_bytes=big_cap if scenario.big_memory[rank] else small_cap,
                             name=f"rank{rank}(f={speed.speed_factor:g})")
    profiles = gather_profiles(profile_device(device, config=ProfilerConfig(max_batch_size=256, repeats=repeats)))
    curves = [p.curve() for p in profiles]
    one_each = even_plan(AllocationRequest(curves=curves, global_batch_size=WORLD, zero_stage=zero_stage))
    fixed = measure_fixed_costs(_gather(_train(one_each, speed, zero_stage, iterations=2)))
    request = AllocationRequest(curves=curves, global_batch_size=gbs, zero_stage=zero_stage,
                                comm_time_s=fixed.comm_time_s(zero_stage))
    extra = fixed.beyond_comm_s(zero_stage)
    ideal, integer = ideal_time(request) + extra, integer_time(request) + extra
    records = []
    for allocation, plan in (("even", even_plan(request)), ("poplar", poplar_plan(request))):
        every_rank = _gather(_train(plan, speed, zero_stage, iterations))
        walls = [max(t["wall_s"] for t in per_rank) for per_rank in zip(*every_rank)]
        rounds = plan.devices[0].accumulation_steps if zero_stage >= 2 else 1
        collectives = fixed.reduce_s * rounds + fixed.step_collectives_s
        predicted = plan.predicted_iteration_time_s + extra
        records.append({
            "scenario": scenario.name,
            "allocation": allocation,
            "iter_time_s": statistics.median(walls),
            "iter_times_s": walls,
            "predicted_iteration_time_s": predicted,
            "samples": list(plan.samples),
            "micro_batch_sizes": [list(d.micro_batch_sizes) for d in plan.devices],
            "max_batch_sizes": [p.max_batch_size for p in profiles],
            "fixed_costs": dataclasses.asdict(fixed),
            "timings_by_rank": every_rank,
            "breakdown": breakdown(every_rank, ideal_s=ideal, integer_s=integer, predicted_s=predicted,
                                   model_compute_s=predicted - collectives - fixed.optimizer_s,
                                   collectives_s=collectives, optimizer_s=fixed.optimizer_s),
        })
    for allocation, value in (("ideal", ideal), ("integer", integer)):
        records.append({
            "scenario": scenario.name, "allocation": allocation, "iter_time_s": value, "measured": False,
            "max_batch_sizes": [p.max_batch_size for p in profiles], "peak_speeds": [c.peak_speed for c in curves],
            "fixed_costs": dataclasses.asdict(fixed),
            "profiled_points": [[[b, t] for b, t in zip(c.batch_sizes, c.times_s)] for c in curves],
        })
    return records


def _gather(timings: list[dict[str, float]]) -> list[list[dict[str, float]]]:
    """Every rank's timings (collective over the world), index = rank."""
    every_rank: list = [None] * dist.get_world_size()
    dist.all_gather_object(every_rank, timings)
    return every_rank


def _body(rank: int, world: int, gbs: int, iterations: int, repeats: int, zero_stage: int) -> list[dict]:
    apply_cpu_shim()  # RNG, ZeRO sanity check and streams on CPU (semimig._compat)
    caps = _memory_caps()
    return [r for scenario in SCENARIOS for r in _scenario(rank, scenario, caps, gbs, iterations, repeats, zero_stage)]


# ------------------------------------------------------------------------------ report
def _report(records: list[dict]) -> dict:
    by = {(r["scenario"], r["allocation"]): r for r in records}
    print(f"{'scenario':<10} {'alloc':<8} {'iter_s':>8} {'model_s':>8}  samples / micro-batches / max batch")
    for scenario in SCENARIOS:
        for allocation in ("even", "poplar", "integer", "ideal"):
            r = by[(scenario.name, allocation)]
            if r.get("measured", True):
                print(f"{scenario.name:<10} {allocation:<8} {r['iter_time_s']:>8.4f} {r['predicted_iteration_time_s']:>8.4f}"
                      f"  {r['samples']} {r['micro_batch_sizes']} {r['max_batch_sizes']}")
            else:
                print(f"{scenario.name:<10} {allocation:<8} {r['iter_time_s']:>8.4f} {'':>8}  peak speeds "
                      f"{[round(s, 1) for s in r['peak_speeds']]} samples/s")
    print("\nwhere poplar's time goes (critical rank, ms, means; see the module docstring)")
    print(f"{'scenario':<10} {'ideal':>7} " + " ".join(f"{t[:11]:>11}" for t in TERMS) + f" {'= wall':>7} {'overshoot':>9}")
    for scenario in SCENARIOS:
        b = by[(scenario.name, "poplar")]["breakdown"]
        print(f"{scenario.name:<10} {1e3 * b['ideal_s']:>7.1f} " + " ".join(f"{1e3 * b[t]:>11.1f}" for t in TERMS)
              + f" {1e3 * b['wall_s']:>7.1f} {1e3 * b['sleep_overshoot_s']:>9.2f}")
    print("fixed costs measured on the training path (ms):", {s.name: {k: round(1e3 * v, 2) for k, v in
          by[(s.name, "ideal")]["fixed_costs"].items()} for s in SCENARIOS})
    verdict = {}
    for scenario in SCENARIOS:
        poplar, even, ideal, integer = (by[(scenario.name, a)]["iter_time_s"] for a in ("poplar", "even", "ideal", "integer"))
        verdict[scenario.name] = {
            "poplar_over_ideal": poplar / ideal,
            "poplar_over_integer": poplar / integer,
            "even_over_poplar": even / poplar,
            "within_5pct_of_ideal": poplar <= 1.05 * ideal,
            "within_5pct_of_integer": poplar <= 1.05 * integer,
        }
    verdict["a_compute"]["at_least_1.5x_faster_than_even"] = verdict["a_compute"]["even_over_poplar"] >= 1.5
    print()
    for name, v in verdict.items():
        print(f"{name}: poplar/ideal = {v['poplar_over_ideal']:.3f}, poplar/integer = {v['poplar_over_integer']:.3f}, "
              f"even/poplar = {v['even_over_poplar']:.2f}x, "
              + ", ".join(f"{k}={'yes' if ok else 'NO'}" for k, ok in v.items() if isinstance(ok, bool)))
    return verdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations and profiling repeats")
    add_json_flag(parser, required=True, help="write the records here")
    parser.add_argument("--zero-stage", type=int, choices=(1, 2), default=1)
    parser.add_argument("--global-batch-size", type=int, default=192)
    args = parser.parse_args(argv)
    if args.global_batch_size < 1:
        parser.error(f"--global-batch-size must be >= 1, got {args.global_batch_size}")
    iterations, repeats = (5, 3) if args.quick else (10, 5)
    started = time.perf_counter()
    records = run_on_ranks(
        _body, WORLD, args.global_batch_size, iterations, repeats, args.zero_stage, timeout_s=1200
    )
    verdict = _report(records)
    meta = {
        "world_size": WORLD,
        "zero_stage": args.zero_stage,
        "global_batch_size": args.global_batch_size,
        "iterations": iterations,
        "profiling_repeats": repeats,
        "base_time_s": BASE_TIME_S,
        "per_sample_time_s": PER_SAMPLE_TIME_S,
    }
    write_result(args.json, "poplar_bench", argv, vars(args), meta=meta, records=records, verdict=verdict)
    print(f"wrote {args.json} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
