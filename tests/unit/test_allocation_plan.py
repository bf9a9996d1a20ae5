"""Pure allocation (Poplar Algorithm 2) and speed curves, against brute-force references."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semimig.allocation import (
    AllocationPlan,
    DevicePlan,
    SpeedCurve,
    allocate,
    AllocationRequest,
    allocate_even,
    ideal_iteration_time,
    integer_time,
    max_samples_within,
)
from semimig.errors import ConfigError


# ------------------------------------------------------------------------------ strategies
def _affine_curve(name: str, base: float, per_sample: float, max_batch: int, probes: list[int]) -> SpeedCurve:
    """τ(b) = base + per_sample·b sampled at ``probes`` (a typical GPU-like saturating speed)."""
    return SpeedCurve.from_points([(b, base + per_sample * b) for b in probes], max_batch_size=max_batch, name=name)


@st.composite
def clusters(draw, max_devices: int = 4):
    n = draw(st.integers(1, max_devices))
    curves = []
    for i in range(n):
        max_batch = draw(st.integers(1, 12))
        base = draw(st.floats(0.0, 0.05))
        per_sample = draw(st.floats(0.001, 0.05))
        probes = sorted({1, max_batch} | set(draw(st.lists(st.integers(1, max_batch), max_size=3))))
        curves.append(_affine_curve(f"d{i}", base, per_sample, max_batch, probes))
    return curves


@st.composite
def requests(draw):
    curves = draw(clusters())
    max_steps = draw(st.one_of(st.none(), st.integers(1, 4)))
    steps = 30 if max_steps is None else max_steps
    capacity = sum(c.max_batch_size for c in curves) * steps
    gbs = draw(st.integers(1, min(capacity, 40)))
    comm = draw(st.floats(0.0, 0.05))
    return curves, gbs, max_steps, comm


def _check_plan(plan: AllocationPlan, curves: list[SpeedCurve], gbs: int, max_steps) -> None:
    assert sum(d.samples for d in plan.devices) == gbs
    assert plan.num_devices == len(curves)
    for device, curve in zip(plan.devices, curves):
        assert device.micro_batch_size <= curve.max_batch_size
        assert 0 <= device.last_batch_size <= device.micro_batch_size
        if max_steps is not None:
            assert device.accumulation_steps <= max_steps
        assert sum(device.micro_batch_sizes) == device.samples


# ------------------------------------------------------------------------------ invariants
@settings(max_examples=60, deadline=None)
@given(requests(), st.sampled_from([0, 1, 2, 3]))
def test_plans_cover_global_batch_within_limits_and_are_deterministic(request, stage) -> None:
    curves, gbs, max_steps, comm = request
    plan = allocate(curves, gbs, zero_stage=stage, comm_time_s=comm, max_accumulation_steps=max_steps)
    _check_plan(plan, curves, gbs, max_steps)
    if stage >= 2:
        assert len({d.accumulation_steps for d in plan.devices}) == 1
    again = allocate(list(curves), gbs, zero_stage=stage, comm_time_s=comm, max_accumulation_steps=max_steps)
    assert again == plan
    even = allocate_even(curves, gbs, zero_stage=stage, comm_time_s=comm, max_accumulation_steps=None)
    _check_plan(even, curves, gbs, None)
    ideal = ideal_iteration_time(curves, gbs, zero_stage=stage, comm_time_s=comm, max_accumulation_steps=max_steps)
    assert ideal <= plan.predicted_iteration_time_s * (1 + 1e-9)


def _device_time(curve: SpeedCurve, samples: int, max_steps) -> float:
    """Independent: best split of ``samples`` into equal micro-batches plus a last one, by enumeration."""
    if samples == 0:
        return 0.0
    best = math.inf
    for m in range(1, min(samples, curve.max_batch_size) + 1):
        steps = math.ceil(samples / m)
        if max_steps is not None and steps > max_steps:
            continue
        best = min(best, (steps - 1) * curve.time(m) + curve.time(samples - (steps - 1) * m))
    return best


def _compositions(total: int, parts: int):
    if parts == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in _compositions(total - first, parts - 1):
            yield (first,) + rest


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0.2, 5.0), st.integers(1, 6)), min_size=1, max_size=3), st.integers(1, 14))
def test_zero01_matches_brute_force_for_constant_speeds(devices, gbs) -> None:
    """With τ(b) = b/s the makespan problem is solved exactly by the greedy hand-out."""
    curves = [SpeedCurve.constant(peak_speed=s, max_batch_size=m, name=f"d{i}") for i, (s, m) in enumerate(devices)]
    plan = allocate(curves, gbs, zero_stage=1)
    best = min(max(_device_time(c, b, None) for c, b in zip(curves, split)) for split in _compositions(gbs, len(curves)))
    assert plan.predicted_iteration_time_s == pytest.approx(best, rel=1e-9)
    for device, curve in zip(plan.devices, curves):
        assert device.predicted_time_s == pytest.approx(_device_time(curve, device.samples, None), rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(requests())
def test_zero01_never_worse_than_even_split(request) -> None:
    curves, gbs, max_steps, comm = request
    plan = allocate(curves, gbs, zero_stage=1, comm_time_s=comm, max_accumulation_steps=max_steps)
    try:
        even = allocate_even(curves, gbs, zero_stage=1, comm_time_s=comm, max_accumulation_steps=max_steps)
    except ValueError:
        return
    assert plan.predicted_iteration_time_s <= even.predicted_iteration_time_s * (1 + 1e-9)


@settings(max_examples=40, deadline=None)
@given(requests())
def test_zero23_search_minimises_poplar_objective_over_all_step_batches(request) -> None:
    """(t + t_comm)·gas is minimal over every per-micro-step batch vector, by enumeration."""
    curves, gbs, max_steps, comm = request
    if math.prod(c.max_batch_size + 1 for c in curves) > 3000:
        return
    plan = allocate(curves, gbs, zero_stage=2, comm_time_s=comm, max_accumulation_steps=max_steps)
    best = math.inf
    for batches in itertools.product(*(range(c.max_batch_size + 1) for c in curves)):
        total = sum(batches)
        if total == 0:
            continue
        steps = math.ceil(gbs / total)
        if max_steps is not None and steps > max_steps:
            continue
        step_time = max(c.time(b) for c, b in zip(curves, batches))
        best = min(best, (step_time + comm) * steps)
    chosen_step = max(c.time(d.micro_batch_size) for c, d in zip(curves, plan.devices))
    chosen = (chosen_step + comm) * plan.devices[0].accumulation_steps
    assert chosen == pytest.approx(best, rel=1e-9)


def test_zero01_splits_in_proportion_to_speed() -> None:
    curves = [SpeedCurve.constant(peak_speed=s, max_batch_size=100, name=n) for n, s in [("a", 4.0), ("b", 2.0), ("c", 1.0), ("d", 1.0)]]
    plan = allocate(curves, 80, zero_stage=1)
    assert plan.samples == (40, 20, 10, 10)
    assert plan.predicted_iteration_time_s == pytest.approx(10.0)
    assert ideal_iteration_time(curves, 80, zero_stage=1) == pytest.approx(10.0)


def test_zero01_realises_with_accumulation_when_memory_is_short() -> None:
    curves = [SpeedCurve.constant(peak_speed=1.0, max_batch_size=4, name="small"), SpeedCurve.constant(peak_speed=1.0, max_batch_size=16, name="big")]
    plan = allocate(curves, 20, zero_stage=1)
    small, big = plan.devices
    assert (small.samples, big.samples) == (10, 10)
    assert small.micro_batch_size <= 4 and small.accumulation_steps == 3
    assert big.accumulation_steps == 1


def test_zero23_prefers_fewer_micro_steps_when_communication_is_expensive() -> None:
    curves = [_affine_curve("a", 0.0, 0.01, 8, [1, 8]), _affine_curve("b", 0.0, 0.02, 8, [1, 8])]
    cheap = allocate(curves, 24, zero_stage=2, comm_time_s=0.0)
    dear = allocate(curves, 24, zero_stage=2, comm_time_s=1.0)
    assert dear.devices[0].accumulation_steps <= cheap.devices[0].accumulation_steps
    assert dear.devices[0].accumulation_steps == 2  # 24 samples need at least ⌈24/16⌉ steps


# ------------------------------------------------------------------------------ infeasible requests
def test_infeasible_requests_raise_clear_errors() -> None:
    curves = [SpeedCurve.constant(peak_speed=1.0, max_batch_size=4, name="a"), SpeedCurve.constant(peak_speed=2.0, max_batch_size=2, name="b")]
    with pytest.raises(ValueError, match=r"global_batch_size=13 exceeds .*\[4, 2\].*max_accumulation_steps=2 = 12"):
        allocate(curves, 13, zero_stage=1, max_accumulation_steps=2)
    with pytest.raises(ValueError, match=r"global_batch_size=13 exceeds"):
        allocate(curves, 13, zero_stage=2, max_accumulation_steps=2)
    with pytest.raises(ValueError, match="empty cluster"):
        allocate([], 8, zero_stage=1)
    with pytest.raises(ValueError, match="global_batch_size must be an int >= 1 and <= 2147483647, got -3"):
        allocate(curves, -3, zero_stage=1)
    with pytest.raises(ValueError, match="global_batch_size must be an int >= 1 and <= 2147483647, got 0"):
        allocate(curves, 0, zero_stage=1)
    with pytest.raises(ValueError, match="comm_time_s must be a finite number >= 0, got -0.1"):
        allocate(curves, 4, zero_stage=2, comm_time_s=-0.1)
    with pytest.raises(ValueError, match="max_accumulation_steps must be an int >= 1 or None, got 0"):
        allocate(curves, 4, zero_stage=1, max_accumulation_steps=0)
    with pytest.raises(ValueError, match="zero_stage must be one of"):
        allocate(curves, 4, zero_stage=4)
    with pytest.raises(ValueError, match=r"peak_speed \(samples/s\) must be a finite number >= 1e-09 and <= 1e\+09, got 0"):
        SpeedCurve.constant(peak_speed=0, max_batch_size=4, name="dead")
    with pytest.raises(ValueError, match=r"times_s must be finite seconds in \[1e-09, 1e\+09\]"):
        SpeedCurve.from_points([(1, 0.0)], max_batch_size=4, name="instant")
    with pytest.raises(ValueError, match="max_batch_size must be an int >= 1 and <= 1048576, got 0"):
        SpeedCurve.constant(peak_speed=1.0, max_batch_size=0, name="no-memory")
    with pytest.raises(ValueError, match="profiled batch size 8 exceeds max_batch_size=4"):
        SpeedCurve.from_points([(1, 0.1), (8, 0.5)], max_batch_size=4)


def test_plan_validation_names_bad_values() -> None:
    with pytest.raises(ValueError, match="last_batch_size=5 exceeds micro_batch_size=4"):
        DevicePlan(name="x", micro_batch_size=4, accumulation_steps=2, last_batch_size=5)
    with pytest.raises(ValueError, match="accumulation_steps must be an int >= 1, got 0"):
        DevicePlan(name="x", micro_batch_size=4, accumulation_steps=0, last_batch_size=4)
    devices = (
        DevicePlan(name="a", micro_batch_size=4, accumulation_steps=2, last_batch_size=4),
        DevicePlan(name="b", micro_batch_size=4, accumulation_steps=1, last_batch_size=4),
    )
    with pytest.raises(ValueError, match=r"sum to 12, not global_batch_size=10"):
        AllocationPlan(zero_stage=1, global_batch_size=10, devices=devices)
    with pytest.raises(ValueError, match=r"ZeRO-2 needs one accumulation_steps .*\[2, 1\]"):
        AllocationPlan(zero_stage=2, global_batch_size=12, devices=devices)


# ------------------------------------------------------------------------------ speed curves
@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 64), st.floats(1e-3, 2.0)), min_size=1, max_size=7, unique_by=lambda p: p[0]),
    st.integers(0, 32),
)
@pytest.mark.parametrize("interpolation", ["linear", "spline"])
def test_curves_pass_through_profiled_points(interpolation, points, extra) -> None:
    max_batch = max(b for b, _ in points) + extra
    curve = SpeedCurve.from_points(points, max_batch_size=max_batch, interpolation=interpolation)
    for b, t in points:
        assert curve.time(b) == pytest.approx(t, rel=1e-12)
        assert curve.speed(b) == pytest.approx(b / t, rel=1e-12)
    table = curve.micro_step_times
    assert table[0] == 0.0 and np.all(table[1:] > 0) and np.all(np.isfinite(table))
    assert curve.peak_speed >= max(b / t for b, t in points) * (1 - 1e-12)


def test_spline_is_a_natural_cubic_spline_of_speed() -> None:
    from scipy.interpolate import CubicSpline

    points = [(1, 0.010), (2, 0.012), (4, 0.016), (8, 0.030), (16, 0.058)]
    curve = SpeedCurve.from_points(points, max_batch_size=16, interpolation="spline")
    b = np.array([p[0] for p in points], float)
    reference = CubicSpline(b, b / np.array([p[1] for p in points]), bc_type="natural")
    for batch in range(1, 17):
        assert curve.speed(batch) == pytest.approx(float(reference(batch)), rel=1e-9)


def test_linear_curve_is_piecewise_linear_in_time_and_holds_speed_outside() -> None:
    points = [(1, 0.010), (4, 0.016), (8, 0.030)]
    curve = SpeedCurve.from_points(points, max_batch_size=12)
    assert curve.time(2) == pytest.approx(0.010 + (0.016 - 0.010) / 3)
    assert curve.time(6) == pytest.approx(0.023)
    assert curve.time(12) == pytest.approx(12 * 0.030 / 8)  # constant speed past the last point


def test_noisy_probe_does_not_bend_the_linear_curve_between_far_points() -> None:
    """The benchmark's case: τ = 12 ms + 6 ms/sample, probed at 1, 2, 4, 8, 16 with τ(4) 20 % high.

    The spline of speed moves τ(12) by several percent and the allocator realises 47 samples in
    four micro-steps instead of three; the linear curve keeps τ(12) exact and three micro-steps.
    """
    true = {b: 0.012 + 0.006 * b for b in (1, 2, 4, 8, 16)}
    noisy = {**true, 4: true[4] * 1.2}
    linear = SpeedCurve.from_points(list(noisy.items()), max_batch_size=16)
    spline = SpeedCurve.from_points(list(noisy.items()), max_batch_size=16, interpolation="spline")
    assert linear.time(12) == pytest.approx(0.012 + 0.006 * 12, rel=1e-12)
    assert abs(spline.time(12) / (0.012 + 0.006 * 12) - 1) > 0.02
    steps = {name: allocate([c], 47, zero_stage=1).devices[0].accumulation_steps for name, c in
             (("linear", linear), ("spline", spline))}
    assert steps == {"linear": 3, "spline": 4}


def test_largest_batch_within_is_poplar_find() -> None:
    curve = SpeedCurve.from_points([(1, 0.1), (4, 0.4)], max_batch_size=6)  # constant 10 samples/s
    assert curve.largest_batch_within(0.05) == 0
    assert curve.largest_batch_within(0.35) == 3
    assert curve.largest_batch_within(10.0) == 6
    assert curve.iteration_time(10, 4) == pytest.approx(0.4 + 0.4 + 0.2)


# ------------------------------------------------------------------------------ input validation
@pytest.mark.parametrize(
    ("build", "message"),
    [
        # 1/5e-324 overflows: the field named must be the one given, not the derived times_s
        (lambda: SpeedCurve.constant(peak_speed=5e-324, max_batch_size=4), "peak_speed (samples/s) must be a finite"),
        (lambda: SpeedCurve.constant(peak_speed=float("nan"), max_batch_size=4), "peak_speed (samples/s) must be a finite"),
        (lambda: SpeedCurve.constant(peak_speed="fast", max_batch_size=4), "got 'fast'"),
        (lambda: SpeedCurve.constant(peak_speed=True, max_batch_size=4), "got True"),
        # the tabulated curve would need 745 GiB; refused by the documented bound
        (lambda: SpeedCurve.constant(peak_speed=1.0, max_batch_size=10**11), "max_batch_size must be an int >= 1 and <= 1048576, got 100000000000"),
        (lambda: SpeedCurve.constant(peak_speed=1.0, max_batch_size=4.0), "max_batch_size must be an int"),
        (lambda: SpeedCurve.from_points([(1, "0.1")], max_batch_size=4), "points must be (batch_size int, seconds) pairs"),
        (lambda: SpeedCurve.from_points([(1.5, 0.1)], max_batch_size=4), "points must be (batch_size int, seconds) pairs"),
        (lambda: SpeedCurve.from_points(None, max_batch_size=4), "points must be (batch_size int, seconds) pairs, got None"),
        (lambda: SpeedCurve.from_points(5, max_batch_size=4), "points must be (batch_size int, seconds) pairs, got 5"),
        (lambda: SpeedCurve.from_points([(1, 0.1), (1, 0.2)], max_batch_size=4), "strictly increasing"),
        (lambda: SpeedCurve(name=3, batch_sizes=(1,), times_s=(1.0,), max_batch_size=1), "SpeedCurve.name must be a str, got 3"),
        (lambda: SpeedCurve(batch_sizes=[1], times_s=(1.0,), max_batch_size=1), "batch_sizes must be a tuple"),
        (lambda: allocate("ab", 4, zero_stage=1), "curves must be a sequence of SpeedCurve, got 'ab'"),
        (lambda: allocate([SpeedCurve.constant(peak_speed=1.0, max_batch_size=4)], 2**40, zero_stage=1), "global_batch_size must be an int >= 1 and <= 2147483647"),
        (lambda: allocate([SpeedCurve.constant(peak_speed=1.0, max_batch_size=4)], 4, zero_stage="1"), "zero_stage must be one of (0, 1, 2, 3), got '1'"),
        (lambda: allocate([SpeedCurve.constant(peak_speed=1.0, max_batch_size=4)], 4, zero_stage=1, comm_time_s=float("inf")), "comm_time_s must be a finite number >= 0, got inf"),
        (lambda: allocate([SpeedCurve.constant(peak_speed=1.0, max_batch_size=4)], 4, zero_stage=1, max_accumulation_steps=True), "max_accumulation_steps must be an int >= 1 or None, got True"),
        (lambda: allocate([SpeedCurve.constant(peak_speed=1.0, max_batch_size=2**20, name=f"d{i}") for i in range(17)], 4, zero_stage=2), "max batch sizes sum to 17825792 > 16777216"),
        (lambda: DevicePlan(name="x", micro_batch_size=4, accumulation_steps=1, last_batch_size=4, predicted_time_s="1"), "predicted_time_s must be a finite number >= 0, got '1'"),
        (lambda: AllocationPlan(zero_stage=1, global_batch_size=4, devices=("x",)), "devices must be a non-empty tuple of DevicePlan"),
    ],
)
def test_bad_inputs_raise_config_error_naming_the_field(build, message) -> None:
    with pytest.raises(ConfigError) as caught:
        build()
    assert message in str(caught.value)


def test_largest_accepted_curve_allocates() -> None:
    """At the bound the table is 8 MiB per device and both allocators still answer."""
    curves = [SpeedCurve.from_points([(1, 0.01), (2**20, 100.0)], max_batch_size=2**20, name=f"d{i}") for i in range(2)]
    assert sum(allocate(curves, 3 * 2**20, zero_stage=1).samples) == 3 * 2**20
    assert sum(allocate(curves, 3 * 2**20, zero_stage=2).samples) == 3 * 2**20


# ------------------------------------------------------------------------------ bounds
def _brute_integer_makespan(curves: list[SpeedCurve], gbs: int, max_steps) -> float:
    return min(
        max(_device_time(c, b, max_steps) for c, b in zip(curves, split))
        for split in _compositions(gbs, len(curves))
        if all(max_steps is None or b <= c.max_batch_size * max_steps for c, b in zip(curves, split))
    )


@settings(max_examples=40, deadline=None)
@given(requests(), st.sampled_from([1, 2]))
def test_integer_bound_is_the_exact_integer_optimum_between_ideal_and_the_plan(request, stage) -> None:
    curves, gbs, max_steps, comm = request
    if len(curves) > 3 or gbs > 16:
        return
    req = AllocationRequest.of(curves, gbs, zero_stage=stage, comm_time_s=comm, max_accumulation_steps=max_steps)
    bound = integer_time(req)
    rounds = 1 if stage == 1 else -(-gbs // sum(c.max_batch_size for c in curves))
    assert bound == pytest.approx(_brute_integer_makespan(curves, gbs, max_steps) + comm * rounds, rel=1e-9)
    plan = allocate(curves, gbs, zero_stage=stage, comm_time_s=comm, max_accumulation_steps=max_steps)
    ideal = ideal_iteration_time(curves, gbs, zero_stage=stage, comm_time_s=comm, max_accumulation_steps=max_steps)
    assert ideal <= bound * (1 + 1e-9) and bound <= plan.predicted_iteration_time_s * (1 + 1e-9)
    if stage == 1:  # Poplar's split plus refinement reaches the optimum on these affine curves
        assert plan.predicted_iteration_time_s == pytest.approx(bound, rel=1e-6)


def test_max_samples_within_counts_whole_micro_steps() -> None:
    curve = _affine_curve("a", 1.0, 0.5, 4, [1, 4])  # τ(b) = 1 + b/2: τ(4) = 3
    assert max_samples_within(curve, 0.5) == 0
    assert max_samples_within(curve, 1.5) == 1
    assert max_samples_within(curve, 6.0) == 8  # two full micro-steps of 4
    assert max_samples_within(curve, 7.0) == 8  # the 1 s left fits no sample (τ(1) = 1.5)
    assert max_samples_within(curve, 7.5) == 9  # 4 + 4 + 1, or 3 + 3 + 3
    assert max_samples_within(curve, 6.0, max_steps=1) == 4
