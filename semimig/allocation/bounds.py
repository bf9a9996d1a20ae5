"""Lower bounds on the iteration time of any allocation, under the speed model (notation of :mod:`.allocate`).

Continuous bound (:func:`ideal_time`, Poplar's "ideal"): every device busy at its peak speed
until the same instant, fractional samples allowed,

    ideal = gbs / Σ_i s_i + t_comm·G,     G = 1 (ZeRO-0/1) or ⌈gbs / Σ_i M_i⌉ (ZeRO-2/3).

It ignores that samples are whole and that a device runs whole micro-steps: a device whose share
``B_i`` is not a multiple of its best micro-batch pays a micro-step below peak speed (the fixed
cost of each micro-step is what makes large micro-batches fast).

Integer bound (:func:`integer_time`): the exact optimum of the makespan over integer allocations,

    T* = min over B (Σ_i B_i = gbs, B_i <= C_i) of max_i T_i(B_i),      integer = T* + t_comm·G,

with ``T_i(B)`` the best micro-batching of ``B`` samples (at most ``A`` micro-steps).  Computed by
bisection on ``T``: device ``i`` finishes at most ``B_i(T) = max{B : T_i(B) <= T}`` samples in
``T``, and using ``m``-sample micro-steps it fits ``k = ⌊T/τ_i(m)⌋`` of them plus a last one of
``min(m, b_i(T - k·τ_i(m)))`` samples (``b_i(t)`` the largest batch within ``t``), or ``A·m`` if
``k >= A``; ``B_i(T)`` is the largest over ``m``.  ``T* = min{T : Σ_i min(C_i, B_i(T)) >= gbs}``.
For ZeRO-2/3 ``T*`` still bounds the compute (each device's share of the lockstep steps takes at
least ``T_i(B_i)``), and the collectives run at least ``G`` times.  ``ideal <= integer <=``
every plan's model time; the gap ``integer - ideal`` is the granularity no allocation avoids.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from semimig.allocation.allocate import largest_batch_table, poplar_plan
from semimig.allocation.request import AllocationRequest
from semimig.allocation.speed import SpeedCurve

__all__ = ["ideal_iteration_time", "ideal_time", "integer_time", "max_samples_within"]

_BISECTION_REL_TOL = 1e-12


def ideal_iteration_time(curves: Sequence[SpeedCurve], global_batch_size: int, *, zero_stage: int,
                         comm_time_s: float = 0.0, max_accumulation_steps: Optional[int] = None) -> float:
    """:func:`ideal_time` of the request these arguments describe."""
    return ideal_time(AllocationRequest.of(curves, global_batch_size, zero_stage=zero_stage, comm_time_s=comm_time_s,
                                           max_accumulation_steps=max_accumulation_steps))


def _collective_rounds(request: AllocationRequest) -> int:
    """``G``: collectives per iteration of the fewest micro-steps any allocation needs."""
    return -(-request.global_batch_size // request.max_batch_total) if request.lockstep else 1


def ideal_time(request: AllocationRequest) -> float:
    """The continuous bound ``gbs / Σ_i s_i + t_comm·G`` (module docstring)."""
    compute = request.global_batch_size / sum(c.peak_speed for c in request.curves)
    return compute + request.comm_time_s * _collective_rounds(request)


def max_samples_within(curve: SpeedCurve, seconds: float, max_steps: Optional[int] = None) -> int:
    """``B(T)``: the most samples ``curve``'s device finishes in ``seconds`` (module docstring)."""
    if seconds <= 0:
        return 0
    tau = curve.micro_step_times
    m = np.arange(1, curve.max_batch_size + 1, dtype=np.float64)
    full = np.floor(seconds / tau[1:] * (1 + 1e-12))  # whole micro-steps of m that fit
    rest = np.maximum(seconds - full * tau[1:], 0.0)
    last = np.minimum(largest_batch_table(curve, rest), m)
    samples = full * m + last
    if max_steps is not None:
        samples = np.where(full >= max_steps, max_steps * m, samples)
    best = float(samples.max())
    return int(min(best, 2.0**62))


def integer_time(request: AllocationRequest) -> float:
    """The integer bound ``T* + t_comm·G`` (module docstring), ``T*`` within a relative 1e-12 below."""
    gbs, steps = request.global_batch_size, request.max_accumulation_steps
    caps = [request.device_capacity(i) for i in range(request.num_devices)]

    def feasible(seconds: float) -> bool:
        return sum(min(cap, max_samples_within(c, seconds, steps)) for c, cap in zip(request.curves, caps)) >= gbs

    plan = poplar_plan(request)
    low, high = 0.0, max(d.predicted_time_s for d in plan.devices)  # a realised makespan is feasible
    while high - low > _BISECTION_REL_TOL * high:
        middle = 0.5 * (low + high)
        if middle <= low or middle >= high:
            break
        if feasible(middle):
            high = middle
        else:
            low = middle
    assert math.isfinite(low)
    return low + request.comm_time_s * _collective_rounds(request)
