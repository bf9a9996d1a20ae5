"""Poplar's batch allocation (Algorithm 2): speed curves and a global batch in, a frozen plan out.

Notation: devices ``i = 1 … n`` with speed curve ``τ_i`` (:class:`~.speed.SpeedCurve`), max
micro-batch ``M_i``, peak speed ``s_i = max_b b/τ_i(b)``; global batch ``gbs``; optional cap
``A`` on accumulation steps (``None``: unlimited); ``t_comm`` the collective time.

Every function takes its inputs as an :class:`~.request.AllocationRequest` (validated once);
:func:`allocate` and :func:`allocate_even` are the same with the request's fields as arguments.

ZeRO-0/1 (:func:`poplar_plan`, stages 0 and 1).  Gradients are reduced once per iteration, so each device
only has to finish its own ``B_i`` samples; the iteration takes ``max_i T_i(B_i) + t_comm`` with
``T_i(B) = min over micro-batch m of (gas-1)·τ_i(m) + τ_i(lbs)`` (``gas = ⌈B/m⌉ <= A``,
``lbs = B - (gas-1)·m``, ties to the larger ``m``).

1. Proportional split with capacities ``C_i = M_i·A``: the water level ``T`` with
   ``Σ_i min(C_i, T·s_i) = gbs``, ``B_i = ⌊min(C_i, T·s_i)⌋`` (Poplar: ``⌊gbs·s_i/Σ s⌋``
   when no device is capped).
2. Remainder, one sample at a time, to the least-loaded device: the one with room left whose
   finish time after taking the sample, ``T_i(B_i + 1)``, is smallest (ties: lowest index).
3. (Beyond the paper.)  Local refinement: move one sample from the device that finishes last to
   the device where it lowers the makespan most, while the makespan strictly drops.  Peak-speed
   proportions ignore that a device given few samples runs below its peak speed; this undoes that
   error and can only improve the model time.

ZeRO-2/3 (:func:`poplar_plan`, stages 2 and 3).  Every micro-step ends in a reduce-scatter that all devices
join, so all share one ``gas``.  For each candidate step time ``t`` (every value ``τ_i(b)``
takes, which is every ``t`` at which some device's answer changes): ``b_i(t)`` = the largest batch
device ``i`` finishes within ``t`` (Poplar's find), ``S = Σ b_i``, ``gas = ⌈gbs/S⌉ <= A``, and
the objective ``(t + t_comm)·gas`` with ``t = max_i τ_i(b_i(t))``; minimise (ties: fewer
micro-steps).  The ``R = gbs - (gas-1)·S`` samples of the last micro-step go one at a time to the
device with the smallest ``τ_i(l_i + 1)``, ``l_i < b_i``.  Reported iteration time:
``(gas-1)·(max_i τ_i(b_i) + t_comm) + max_i τ_i(l_i) + t_comm``.

The baseline (:func:`even_plan`) is what a heterogeneity-unaware setup runs; the bounds that
no integer allocation beats are in :mod:`.bounds`.

All functions are deterministic: same numbers in, same plan out, on every rank.
"""
from __future__ import annotations

import logging
import math
from typing import Optional, Sequence

import numpy as np

from semimig.allocation.plan import AllocationPlan, DevicePlan
from semimig.allocation.request import AllocationRequest
from semimig.allocation.speed import SpeedCurve
from semimig.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["allocate", "allocate_even", "even_plan", "poplar_plan"]

_REL_TOL = 1e-12


# ------------------------------------------------------------------------------ entry points
def allocate(curves: Sequence[SpeedCurve], global_batch_size: int, *, zero_stage: int, comm_time_s: float = 0.0,
             max_accumulation_steps: Optional[int] = None) -> AllocationPlan:
    """:func:`poplar_plan` of the request these arguments describe (:class:`~.request.AllocationRequest`)."""
    return poplar_plan(AllocationRequest.of(curves, global_batch_size, zero_stage=zero_stage, comm_time_s=comm_time_s,
                                            max_accumulation_steps=max_accumulation_steps))


def allocate_even(curves: Sequence[SpeedCurve], global_batch_size: int, *, zero_stage: int, comm_time_s: float = 0.0,
                  max_accumulation_steps: Optional[int] = None) -> AllocationPlan:
    """:func:`even_plan` of the request these arguments describe."""
    return even_plan(AllocationRequest.of(curves, global_batch_size, zero_stage=zero_stage, comm_time_s=comm_time_s,
                                          max_accumulation_steps=max_accumulation_steps))


def poplar_plan(request: AllocationRequest) -> AllocationPlan:
    """Poplar's Algorithm 2 for the request's stage: ZeRO-0/1 split or ZeRO-2/3 search (module docs)."""
    plan = _zero23(request) if request.lockstep else _zero01(request)
    logger.debug("ZeRO-%d allocation: samples %s, predicted %.4g s", request.zero_stage, plan.samples,
                 plan.predicted_iteration_time_s)
    return plan


# ------------------------------------------------------------------------------ realisation
def _device_plans(request: AllocationRequest, micro: Sequence[int], steps: Sequence[int],
                  last: Sequence[int]) -> tuple[DevicePlan, ...]:
    """Device ``i`` runs ``steps[i] - 1`` micro-steps of ``micro[i]`` samples, then one of ``last[i]``."""
    return tuple(
        DevicePlan(name=c.name, micro_batch_size=m, accumulation_steps=g, last_batch_size=lbs,
                   predicted_time_s=(g - 1) * c.time(m) + c.time(lbs))
        for c, m, g, lbs in zip(request.curves, micro, steps, last)
    )


def _plan(request: AllocationRequest, devices: tuple[DevicePlan, ...]) -> AllocationPlan:
    """The plan and its model iteration time.

    ZeRO-0/1: ``max_i T_i + t_comm`` (devices run their micro-steps independently).
    ZeRO-2/3 (one ``gas``): ``(gas-1)·(max_i τ_i(mbs_i) + t_comm) + max_i τ_i(lbs_i) + t_comm``.
    """
    comm = request.comm_time_s
    if request.lockstep:
        steps = devices[0].accumulation_steps
        full_step = max(c.time(d.micro_batch_size) for c, d in zip(request.curves, devices))
        last_step = max(c.time(d.last_batch_size) for c, d in zip(request.curves, devices))
        predicted = (steps - 1) * (full_step + comm) + last_step + comm
    else:
        predicted = max(d.predicted_time_s for d in devices) + comm
    return AllocationPlan(zero_stage=request.zero_stage, global_batch_size=request.global_batch_size,
                          devices=devices, comm_time_s=float(comm), predicted_iteration_time_s=predicted)


class _Realiser:
    """``T_i(B)`` and the micro-batch realising it, memoised per sample count."""

    def __init__(self, curve: SpeedCurve, max_steps: Optional[int]) -> None:
        self.curve = curve
        self.tau = curve.micro_step_times
        self.max_steps = max_steps
        self._cache: dict[int, tuple[float, int, int, int]] = {}

    def best(self, samples: int) -> tuple[float, int, int, int]:
        """``(time, mbs, gas, lbs)`` minimising the time of ``samples`` samples."""
        if samples in self._cache:
            return self._cache[samples]
        if samples == 0:
            result = (0.0, 0, 1, 0)
        else:
            m = np.arange(1, min(samples, self.curve.max_batch_size) + 1)
            gas = -(-samples // m)
            lbs = samples - (gas - 1) * m
            times = (gas - 1) * self.tau[m] + self.tau[lbs]
            if self.max_steps is not None:
                times = np.where(gas <= self.max_steps, times, np.inf)
            best_time = times.min()
            if not math.isfinite(best_time):
                raise ConfigError(
                    f"device {self.curve.name!r} cannot take {samples} samples within "
                    f"max_accumulation_steps={self.max_steps} (max batch size {self.curve.max_batch_size})"
                )
            k = int(np.flatnonzero(times <= best_time * (1 + _REL_TOL))[-1])
            result = (float(times[k]), int(m[k]), int(gas[k]), int(lbs[k]))
        self._cache[samples] = result
        return result

    def time(self, samples: int) -> float:
        return self.best(samples)[0]


# ------------------------------------------------------------------------------ ZeRO-0/1
def _water_level(speeds: list[float], caps: list[int], total: int) -> list[float]:
    """Continuous shares ``min(C_i, T·s_i)`` summing to ``total``."""
    capped = [False] * len(speeds)
    while True:
        if all(capped):  # Σ C_i == total (the capacity check guarantees >=)
            return [float(c) for c in caps]
        free = total - sum(c for c, k in zip(caps, capped) if k)
        speed_sum = sum(s for s, k in zip(speeds, capped) if not k)
        level = free / speed_sum
        newly = [i for i, (s, c, k) in enumerate(zip(speeds, caps, capped)) if not k and level * s > c * (1 + 1e-12)]
        if not newly:
            return [float(c) if k else level * s for s, c, k in zip(speeds, caps, capped)]
        for i in newly:
            capped[i] = True


def _zero01(request: AllocationRequest) -> AllocationPlan:
    """Steps 1-3 of the module docstring's ZeRO-0/1 allocation."""
    curves, gbs = request.curves, request.global_batch_size
    realisers = [_Realiser(c, request.max_accumulation_steps) for c in curves]
    caps = [request.device_capacity(i) for i in range(len(curves))]
    shares = _water_level([c.peak_speed for c in curves], caps, gbs)
    samples = [min(int(math.floor(x + 1e-9)), cap) for x, cap in zip(shares, caps)]

    for _ in range(gbs - sum(samples)):  # remainder, least-loaded first
        open_devices = [i for i in range(len(curves)) if samples[i] < caps[i]]
        target = min(open_devices, key=lambda i: (realisers[i].time(samples[i] + 1), realisers[i].time(samples[i]), i))
        samples[target] += 1

    _refine(samples, caps, realisers)
    best = [r.best(count) for r, count in zip(realisers, samples)]
    return _plan(request, _device_plans(request, [b[1] for b in best], [b[2] for b in best], [b[3] for b in best]))


def _refine(samples: list[int], caps: list[int], realisers: list[_Realiser]) -> None:
    """Move single samples off the last-finishing device while the makespan strictly drops."""
    n = len(samples)
    for _ in range(sum(samples)):
        times = [realisers[i].time(samples[i]) for i in range(n)]
        makespan = max(times)
        slowest = times.index(makespan)
        if samples[slowest] == 0:
            return
        best: tuple[float, int] | None = None
        for j in range(n):
            if j == slowest or samples[j] >= caps[j]:
                continue
            trial = times.copy()
            trial[slowest] = realisers[slowest].time(samples[slowest] - 1)
            trial[j] = realisers[j].time(samples[j] + 1)
            candidate = max(trial)
            if best is None or candidate < best[0]:
                best = (candidate, j)
        if best is None or best[0] >= makespan * (1 - 1e-9):
            return
        samples[slowest] -= 1
        samples[best[1]] += 1


# ------------------------------------------------------------------------------ ZeRO-2/3
def largest_batch_table(curve: SpeedCurve, candidates: np.ndarray) -> np.ndarray:
    """``b(t)`` for every candidate ``t``: the largest ``b`` with ``τ(b) <= t`` (0 if none)."""
    tau = curve.micro_step_times[1:]
    order = np.argsort(tau, kind="stable")
    running_max_batch = np.maximum.accumulate(order + 1)
    count_within = np.searchsorted(tau[order], candidates, side="right")
    padded = np.concatenate(([0], running_max_batch))
    return padded[count_within]


def _fill_last_step(batches: list[int], remaining: int, curves: Sequence[SpeedCurve]) -> list[int]:
    """Split the last micro-step's ``remaining`` samples: each to the device with least ``τ(l+1)``."""
    last = [0] * len(batches)
    for _ in range(remaining):
        open_devices = [i for i in range(len(batches)) if last[i] < batches[i]]
        target = min(open_devices, key=lambda i: (curves[i].time(last[i] + 1), i))
        last[target] += 1
    return last


def _zero23(request: AllocationRequest) -> AllocationPlan:
    """The module docstring's ZeRO-2/3 search over candidate step times ``t``.

    Memory ``O(Σ_i M_i)``: ``S(t)`` and ``max_i τ_i(b_i(t))`` are accumulated device by device.
    """
    curves, gbs, comm = request.curves, request.global_batch_size, request.comm_time_s
    candidates = np.unique(np.concatenate([c.micro_step_times[1:] for c in curves]))
    step_batch = np.zeros(candidates.shape, dtype=np.int64)  # S(t)
    step_time = np.zeros(candidates.shape, dtype=np.float64)  # max_i τ_i(b_i(t))
    for c in curves:
        b = largest_batch_table(c, candidates)
        step_batch += b
        np.maximum(step_time, c.micro_step_times[b], out=step_time)
    gas = np.where(step_batch > 0, -(-gbs // np.maximum(step_batch, 1)), np.iinfo(np.int64).max)
    wall = np.where(step_batch > 0, (step_time + comm) * gas, np.inf)
    if request.max_accumulation_steps is not None:
        wall = np.where(gas <= request.max_accumulation_steps, wall, np.inf)
    best_wall = wall.min()
    # the request's capacity check guarantees t = max τ gives S = Σ M_i, within the step cap
    assert math.isfinite(best_wall), "capacity check let an infeasible request through"
    ties = np.flatnonzero(wall <= best_wall * (1 + 1e-9))
    k = int(ties[np.argmin(gas[ties])])  # among (near-)ties: fewest micro-steps, then smallest t

    batches = [int(largest_batch_table(c, candidates[k:k + 1])[0]) for c in curves]  # b_i(t) at the best t
    steps = int(gas[k])
    last = _fill_last_step(batches, gbs - (steps - 1) * sum(batches), curves)
    return _plan(request, _device_plans(request, batches, [steps] * len(curves), last))


# ------------------------------------------------------------------------------ baseline
def even_plan(request: AllocationRequest) -> AllocationPlan:
    """The homogeneous baseline: what a heterogeneity-unaware ZeRO setup runs.

    One micro-batch size ``m = min(min_i M_i, ⌈gbs/n⌉)`` everywhere (it must fit on the smallest
    device), ``gas = ⌈⌈gbs/n⌉/m⌉`` micro-steps, full micro-steps of ``m`` on every device and the
    ``R = gbs - (gas-1)·n·m`` samples of the last micro-step split evenly (the first ``R mod n``
    devices take one more).  ``1 <= R <= n·m``, so every last batch fits.
    """
    curves, gbs = request.curves, request.global_batch_size
    n = len(curves)
    per_device = -(-gbs // n)
    m = min(min(c.max_batch_size for c in curves), per_device)
    steps = -(-per_device // m)
    if request.max_accumulation_steps is not None and steps > request.max_accumulation_steps:
        raise ConfigError(
            f"even split of global_batch_size={gbs} over {n} devices needs {steps} micro-steps of {m} "
            f"(the smallest max batch size), above max_accumulation_steps={request.max_accumulation_steps}"
        )
    remaining = gbs - (steps - 1) * n * m
    last = [remaining // n + (1 if i < remaining % n else 0) for i in range(n)]
    return _plan(request, _device_plans(request, [m] * n, [steps] * n, last))
