"""Poplar's batch allocation (Algorithm 2): speed curves and a global batch in, a frozen plan out.

Notation: devices ``i = 1 … n`` with speed curve ``τ_i`` (:class:`~.speed.SpeedCurve`), max
micro-batch ``M_i``, peak speed ``s_i = max_b b/τ_i(b)``; global batch ``gbs``; optional cap
``A`` on accumulation steps (``None``: unlimited); ``t_comm`` the collective time.

ZeRO-0/1 (:func:`allocate_zero01`).  Gradients are reduced once per iteration, so each device
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

ZeRO-2/3 (:func:`allocate_zero23`).  Every micro-step ends in a reduce-scatter that all devices
join, so all share one ``gas``.  For each candidate step time ``t`` (every value ``τ_i(b)``
takes, which is every ``t`` at which some device's answer changes): ``b_i(t)`` = the largest batch
device ``i`` finishes within ``t`` (Poplar's find), ``S = Σ b_i``, ``gas = ⌈gbs/S⌉ <= A``, and
the objective ``(t + t_comm)·gas`` with ``t = max_i τ_i(b_i(t))``; minimise (ties: fewer
micro-steps).  The ``R = gbs - (gas-1)·S`` samples of the last micro-step go one at a time to the
device with the smallest ``τ_i(l_i + 1)``, ``l_i < b_i``.  Reported iteration time:
``(gas-1)·(max_i τ_i(b_i) + t_comm) + max_i τ_i(l_i) + t_comm``.

All functions are deterministic: same numbers in, same plan out, on every rank.
"""
from __future__ import annotations

import logging
import math
from typing import Optional, Sequence

import numpy as np

from semimig.allocation.plan import AllocationPlan, DevicePlan
from semimig.allocation.speed import SpeedCurve

logger = logging.getLogger(__name__)

__all__ = ["allocate", "allocate_zero01", "allocate_zero23", "allocate_even", "ideal_iteration_time"]

_REL_TOL = 1e-12


# ------------------------------------------------------------------------------ validation
def _check_request(
    curves: Sequence[SpeedCurve], global_batch_size: int, comm_time_s: float, max_accumulation_steps: Optional[int]
) -> list[SpeedCurve]:
    curves = list(curves)
    if not curves:
        raise ValueError("cannot allocate a batch over an empty cluster: got 0 devices")
    for i, curve in enumerate(curves):
        if not isinstance(curve, SpeedCurve):
            raise ValueError(f"device {i} must be a SpeedCurve, got {type(curve).__name__}")
    if not isinstance(global_batch_size, int) or isinstance(global_batch_size, bool) or global_batch_size < 1:
        raise ValueError(f"global_batch_size must be an int >= 1, got {global_batch_size!r}")
    if not (isinstance(comm_time_s, (int, float)) and math.isfinite(comm_time_s) and comm_time_s >= 0):
        raise ValueError(f"comm_time_s must be finite and >= 0, got {comm_time_s!r}")
    if max_accumulation_steps is not None and (
        not isinstance(max_accumulation_steps, int) or isinstance(max_accumulation_steps, bool) or max_accumulation_steps < 1
    ):
        raise ValueError(f"max_accumulation_steps must be None or an int >= 1, got {max_accumulation_steps!r}")
    steps = global_batch_size if max_accumulation_steps is None else max_accumulation_steps
    capacity = sum(c.max_batch_size for c in curves) * steps
    if capacity < global_batch_size:
        raise ValueError(
            f"global_batch_size={global_batch_size} exceeds what the devices can hold: "
            f"max batch sizes {[c.max_batch_size for c in curves]} x max_accumulation_steps="
            f"{max_accumulation_steps} = {capacity} samples per iteration"
        )
    return curves


def _check_stage(zero_stage: int, allowed: tuple[int, ...]) -> None:
    if zero_stage not in allowed or isinstance(zero_stage, bool):
        raise ValueError(f"zero_stage must be one of {allowed} here, got {zero_stage!r}")


# ------------------------------------------------------------------------------ ZeRO-0/1
class _Realiser:
    """``T_i(B)`` and the micro-batch realising it, memoised per sample count."""

    def __init__(self, curve: SpeedCurve, max_steps: Optional[int]) -> None:
        self.curve = curve
        self.tau = curve.micro_step_times
        self.max_steps = max_steps
        self._cache: dict[int, tuple[float, int, int, int]] = {}

    def capacity(self, global_batch_size: int) -> int:
        if self.max_steps is None:
            return global_batch_size
        return min(global_batch_size, self.curve.max_batch_size * self.max_steps)

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
                raise ValueError(
                    f"device {self.curve.name!r} cannot take {samples} samples within "
                    f"max_accumulation_steps={self.max_steps} (max batch size {self.curve.max_batch_size})"
                )
            k = int(np.flatnonzero(times <= best_time * (1 + _REL_TOL))[-1])
            result = (float(times[k]), int(m[k]), int(gas[k]), int(lbs[k]))
        self._cache[samples] = result
        return result

    def time(self, samples: int) -> float:
        return self.best(samples)[0]


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


def allocate_zero01(
    curves: Sequence[SpeedCurve],
    global_batch_size: int,
    *,
    zero_stage: int = 1,
    comm_time_s: float = 0.0,
    max_accumulation_steps: Optional[int] = None,
) -> AllocationPlan:
    """Poplar ZeRO-0/1 allocation (see the module docstring); ``comm_time_s`` once per iteration."""
    _check_stage(zero_stage, (0, 1))
    curves = _check_request(curves, global_batch_size, comm_time_s, max_accumulation_steps)
    realisers = [_Realiser(c, max_accumulation_steps) for c in curves]
    caps = [r.capacity(global_batch_size) for r in realisers]
    shares = _water_level([c.peak_speed for c in curves], caps, global_batch_size)
    samples = [min(int(math.floor(x + 1e-9)), cap) for x, cap in zip(shares, caps)]

    for _ in range(global_batch_size - sum(samples)):  # remainder, least-loaded first
        open_devices = [i for i in range(len(curves)) if samples[i] < caps[i]]
        target = min(open_devices, key=lambda i: (realisers[i].time(samples[i] + 1), realisers[i].time(samples[i]), i))
        samples[target] += 1

    _refine(samples, caps, realisers)
    devices = []
    for curve, realiser, count in zip(curves, realisers, samples):
        time_s, mbs, gas, lbs = realiser.best(count)
        devices.append(
            DevicePlan(name=curve.name, micro_batch_size=mbs, accumulation_steps=gas, last_batch_size=lbs, predicted_time_s=time_s)
        )
    makespan = max(d.predicted_time_s for d in devices)
    plan = AllocationPlan(
        zero_stage=zero_stage,
        global_batch_size=global_batch_size,
        devices=tuple(devices),
        comm_time_s=float(comm_time_s),
        predicted_iteration_time_s=makespan + comm_time_s,
    )
    logger.debug("ZeRO-%d allocation: samples %s, predicted %.4g s", zero_stage, plan.samples, plan.predicted_iteration_time_s)
    return plan


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
def _largest_batch_table(curve: SpeedCurve, candidates: np.ndarray) -> np.ndarray:
    """``b_i(t)`` for every candidate ``t``: the largest ``b`` with ``τ_i(b) <= t`` (0 if none)."""
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


def allocate_zero23(
    curves: Sequence[SpeedCurve],
    global_batch_size: int,
    *,
    zero_stage: int = 2,
    comm_time_s: float = 0.0,
    max_accumulation_steps: Optional[int] = None,
) -> AllocationPlan:
    """Poplar ZeRO-2/3 search (see the module docstring); ``comm_time_s`` once per micro-step."""
    _check_stage(zero_stage, (2, 3))
    curves = _check_request(curves, global_batch_size, comm_time_s, max_accumulation_steps)
    candidates = np.unique(np.concatenate([c.micro_step_times[1:] for c in curves]))
    per_device = np.stack([_largest_batch_table(c, candidates) for c in curves])  # [n, K]
    step_batch = per_device.sum(axis=0)  # S(t)
    step_time = np.stack([c.micro_step_times[b] for c, b in zip(curves, per_device)]).max(axis=0)
    gas = np.where(step_batch > 0, -(-global_batch_size // np.maximum(step_batch, 1)), np.iinfo(np.int64).max)
    wall = np.where(step_batch > 0, (step_time + comm_time_s) * gas, np.inf)
    if max_accumulation_steps is not None:
        wall = np.where(gas <= max_accumulation_steps, wall, np.inf)
    best_wall = wall.min()
    # _check_request guarantees t = max τ gives S = Σ M_i, within the step cap
    assert math.isfinite(best_wall), "capacity check let an infeasible request through"
    ties = np.flatnonzero(wall <= best_wall * (1 + 1e-9))
    k = int(ties[np.argmin(gas[ties])])  # among (near-)ties: fewest micro-steps, then smallest t

    batches = [int(b) for b in per_device[:, k]]
    steps = int(gas[k])
    last = _fill_last_step(batches, global_batch_size - (steps - 1) * sum(batches), curves)
    devices = tuple(
        DevicePlan(
            name=c.name,
            micro_batch_size=b,
            accumulation_steps=steps,
            last_batch_size=lbs,
            predicted_time_s=(steps - 1) * c.time(b) + c.time(lbs),
        )
        for c, b, lbs in zip(curves, batches, last)
    )
    full_step = max(c.time(b) for c, b in zip(curves, batches))
    last_step = max(c.time(lbs) for c, lbs in zip(curves, last))
    plan = AllocationPlan(
        zero_stage=zero_stage,
        global_batch_size=global_batch_size,
        devices=devices,
        comm_time_s=float(comm_time_s),
        predicted_iteration_time_s=(steps - 1) * (full_step + comm_time_s) + last_step + comm_time_s,
    )
    logger.debug("ZeRO-%d allocation: batches %s x %d, predicted %.4g s", zero_stage, batches, steps, plan.predicted_iteration_time_s)
    return plan


# ------------------------------------------------------------------------------ entry points
def allocate(
    curves: Sequence[SpeedCurve],
    global_batch_size: int,
    *,
    zero_stage: int,
    comm_time_s: float = 0.0,
    max_accumulation_steps: Optional[int] = None,
) -> AllocationPlan:
    """Dispatch to :func:`allocate_zero01` (stages 0, 1) or :func:`allocate_zero23` (2, 3)."""
    _check_stage(zero_stage, (0, 1, 2, 3))
    fn = allocate_zero01 if zero_stage <= 1 else allocate_zero23
    return fn(
        curves,
        global_batch_size,
        zero_stage=zero_stage,
        comm_time_s=comm_time_s,
        max_accumulation_steps=max_accumulation_steps,
    )


def allocate_even(
    curves: Sequence[SpeedCurve],
    global_batch_size: int,
    *,
    zero_stage: int,
    comm_time_s: float = 0.0,
    max_accumulation_steps: Optional[int] = None,
) -> AllocationPlan:
    """The homogeneous baseline: what a heterogeneity-unaware ZeRO setup runs.

    One micro-batch size ``m = min(min_i M_i, ⌈gbs/n⌉)`` everywhere (it must fit on the smallest
    device), ``gas = ⌈⌈gbs/n⌉/m⌉`` micro-steps, full micro-steps of ``m`` on every device and the
    ``R = gbs - (gas-1)·n·m`` samples of the last micro-step split evenly (the first ``R mod n``
    devices take one more).  ``1 <= R <= n·m``, so every last batch fits.
    """
    _check_stage(zero_stage, (0, 1, 2, 3))
    curves = _check_request(curves, global_batch_size, comm_time_s, max_accumulation_steps)
    n = len(curves)
    per_device = -(-global_batch_size // n)
    m = min(min(c.max_batch_size for c in curves), per_device)
    steps = -(-per_device // m)
    if max_accumulation_steps is not None and steps > max_accumulation_steps:
        raise ValueError(
            f"even split of global_batch_size={global_batch_size} over {n} devices needs {steps} "
            f"micro-steps of {m} (the smallest max batch size), above max_accumulation_steps={max_accumulation_steps}"
        )
    remaining = global_batch_size - (steps - 1) * n * m
    last = [remaining // n + (1 if i < remaining % n else 0) for i in range(n)]
    devices = tuple(
        DevicePlan(
            name=c.name,
            micro_batch_size=m,
            accumulation_steps=steps,
            last_batch_size=lbs,
            predicted_time_s=(steps - 1) * c.time(m) + c.time(lbs),
        )
        for c, lbs in zip(curves, last)
    )
    if zero_stage <= 1:
        predicted = max(d.predicted_time_s for d in devices) + comm_time_s
    else:
        full_step = max(c.time(m) for c in curves)
        last_step = max(c.time(lbs) for c, lbs in zip(curves, last))
        predicted = (steps - 1) * (full_step + comm_time_s) + last_step + comm_time_s
    return AllocationPlan(
        zero_stage=zero_stage,
        global_batch_size=global_batch_size,
        devices=devices,
        comm_time_s=float(comm_time_s),
        predicted_iteration_time_s=predicted,
    )


def ideal_iteration_time(
    curves: Sequence[SpeedCurve],
    global_batch_size: int,
    *,
    zero_stage: int,
    comm_time_s: float = 0.0,
    max_accumulation_steps: Optional[int] = None,
) -> float:
    """The speed model's optimum: every device busy at its peak speed until the same instant.

    ``gbs / Σ_i s_i`` (fractional samples, no micro-step granularity) plus the collectives:
    ``t_comm`` once (ZeRO-0/1) or once per micro-step of the fewest micro-steps any allocation
    needs, ``⌈gbs / Σ_i M_i⌉`` (ZeRO-2/3).  No integer allocation beats it.
    """
    _check_stage(zero_stage, (0, 1, 2, 3))
    curves = _check_request(curves, global_batch_size, comm_time_s, max_accumulation_steps)
    compute = global_batch_size / sum(c.peak_speed for c in curves)
    if zero_stage <= 1:
        return compute + comm_time_s
    return compute + comm_time_s * -(-global_batch_size // sum(c.max_batch_size for c in curves))
