"""Poplar Algorithm 1 on CPU: max-batch search, CAPTURE fit, CPU peak memory, speed factors, collectives."""
from __future__ import annotations

import math
import time

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_harness import run_on_ranks
from tiny_models import TinyMLP
from semimig.errors import ConfigError
from semimig.allocation import (
    LinearMemoryFit,
    ModelStepDevice,
    ProbeResult,
    ProfilerConfig,
    SavedActivationMeter,
    SimulatedOutOfMemoryError,
    SimulatedSpeed,
    SlowedModule,
    measure_collective_time,
    model_state_bytes,
    profile_device,
    timed_collectives,
)

F32 = 4  # bytes


PARAM_BYTES = (4 * 8 + 8 + 8 * 2 + 2) * F32


def _activation_bytes(batch: int) -> int:
    """By hand: fc1 saves its input x [b,4]; tanh saves its output [b,8], which fc2 saves too."""
    return batch * (4 + 8) * F32


def _make_batch(batch: int):
    gen = torch.Generator().manual_seed(batch)
    return torch.randn(batch, 4, generator=gen), torch.randn(batch, 2, generator=gen)


def _mse(model: nn.Module, data) -> torch.Tensor:
    x, y = data
    return nn.functional.mse_loss(model(x), y)


# ------------------------------------------------------------------------------ memory model
@pytest.mark.parametrize("batch", [1, 3, 17])
def test_saved_activation_meter_counts_activations_not_parameters(batch: int) -> None:
    model = TinyMLP()
    meter = SavedActivationMeter(exclude=list(model.parameters()))
    with meter.measure():
        loss = _mse(model, _make_batch(batch))
    loss.backward()
    # mse_loss saves its input (the output, [b,2]) and the target ([b,2]) as well
    assert meter.bytes == _activation_bytes(batch) + 2 * batch * 2 * F32
    assert model_state_bytes(model) == 2 * PARAM_BYTES  # parameters + gradients, plain SGD has no state


def test_model_state_counts_optimizer_state_once_it_exists() -> None:
    model = TinyMLP()
    optimizer = torch.optim.Adam(model.parameters())
    assert model_state_bytes(model, optimizer) == 2 * PARAM_BYTES
    _mse(model, _make_batch(2)).backward()
    optimizer.step()
    assert model_state_bytes(model, optimizer) == 4 * PARAM_BYTES + 4 * len(list(model.parameters()))  # exp_avg, exp_avg_sq, step


def test_linear_fit_through_two_points() -> None:
    fit = LinearMemoryFit.through(2, 1000.0, 6, 1400.0)
    assert (fit.intercept_bytes, fit.bytes_per_sample) == (800.0, 100.0)
    assert fit.max_batch_within(1750) == 9
    assert LinearMemoryFit.through(2, 1000.0, 6, 1000.0) is None
    with pytest.raises(ValueError, match="two different batch sizes, got 3 twice"):
        LinearMemoryFit.through(3, 1.0, 3, 2.0)


# ------------------------------------------------------------------------------ the search
def _synthetic_device(before: int, fixed: int, per_sample: int, cliff: int, cap: int, calls: list[int]):
    """peak(b) = before + fixed + per_sample·b, plus a jump of ``cap`` beyond batch ``cliff`` (non-linear)."""

    def step(batch: int) -> ProbeResult:
        calls.append(batch)
        peak = before + fixed + per_sample * batch + (cap if batch > cliff else 0)
        if peak > cap:
            raise torch.OutOfMemoryError(f"synthetic OOM at {batch}")
        return ProbeResult(batch_size=batch, time_s=0.01 + 0.001 * batch, peak_bytes=peak, before_bytes=before)

    return step


@settings(max_examples=60, deadline=None)
@given(
    st.integers(100, 10_000),
    st.integers(0, 50_000),
    st.integers(1, 5_000),
    st.integers(1, 3000),
    st.integers(1, 400),
    st.integers(1, 300),
)
def test_search_finds_exact_max_batch_size(before, fixed, per_sample, cliff, target, ceiling) -> None:
    cap = before + fixed + per_sample * target
    calls: list[int] = []
    step = _synthetic_device(before, fixed, per_sample, cliff, cap, calls)
    profile = profile_device(step, memory_capacity_bytes=cap, config=ProfilerConfig(max_batch_size=ceiling, warmup=0))
    expected = min(target, cliff, ceiling)  # brute force: largest b whose peak fits, within the ceiling
    assert profile.max_batch_size == expected
    assert all(b > expected for b in profile.failed_batch_sizes)
    assert len(set(calls)) == len(calls)  # no batch size probed twice
    assert len(calls) <= 2 * math.ceil(math.log2(ceiling + 1)) + 4


def test_linear_memory_needs_few_probes_thanks_to_capture_fit() -> None:
    calls: list[int] = []
    cap = 1000 + 64 * 777
    step = _synthetic_device(1000, 0, 64, 10**9, cap, calls)
    profile = profile_device(step, memory_capacity_bytes=cap, config=ProfilerConfig(max_batch_size=100_000, warmup=0))
    assert profile.max_batch_size == 777
    # Algorithm 1's doubling (which also gives the speed curve its points) up to the fit's answer,
    # then the answer and its check: 12 probes where a plain binary search over 1e5 would need 17+
    assert calls == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 777, 778]
    assert profile.memory_fit is not None and profile.memory_fit.bytes_per_sample == 64


def test_search_without_capacity_stops_at_ceiling() -> None:
    calls: list[int] = []
    step = _synthetic_device(0, 0, 1, 10**9, 10**12, calls)
    profile = profile_device(step, config=ProfilerConfig(max_batch_size=40, warmup=0))
    assert profile.max_batch_size == 40
    assert calls == [1, 2, 4, 8, 16, 32, 40]


def test_device_that_cannot_hold_one_sample_is_an_error() -> None:
    step = _synthetic_device(0, 10, 10, 10**9, 15, [])
    with pytest.raises(RuntimeError, match="cannot run a single sample"):
        profile_device(step, memory_capacity_bytes=15, config=ProfilerConfig(warmup=0))


def test_profiler_config_validation() -> None:
    with pytest.raises(ConfigError, match="ProfilerConfig.max_batch_size must be an int >= 1 and <= 1048576, got 0"):
        ProfilerConfig(max_batch_size=0)
    with pytest.raises(ConfigError, match="ProfilerConfig.repeats must be an int >= 1, got 0"):
        ProfilerConfig(repeats=0)
    with pytest.raises(ConfigError, match="ProfilerConfig.warmup must be an int >= 0, got '1'"):
        ProfilerConfig(warmup="1")
    with pytest.raises(ConfigError, match="memory_capacity_bytes must be an int >= 1 or None, got -5"):
        profile_device(lambda b: None, memory_capacity_bytes=-5)
    with pytest.raises(ConfigError, match="ProbeResult.time_s must be a finite number >= 0, got nan"):
        ProbeResult(batch_size=1, time_s=float("nan"), peak_bytes=1, before_bytes=0)
    with pytest.raises(ConfigError, match="ProbeResult.after_forward_bytes must be an int >= 0 or None, got 1.5"):
        ProbeResult(batch_size=1, time_s=1.0, peak_bytes=1, before_bytes=0, after_forward_bytes=1.5)


# ------------------------------------------------------------------------------ a real model step
def test_model_step_device_with_memory_cap_finds_the_true_max_batch() -> None:
    torch.manual_seed(0)
    model = TinyMLP()
    per_sample = _activation_bytes(1) + 2 * 2 * F32  # + mse's saved output and target
    cap = 2 * PARAM_BYTES + per_sample * 37 + per_sample // 2
    device = ModelStepDevice(model, _mse, _make_batch, memory_cap_bytes=cap, name="capped")
    with pytest.raises(SimulatedOutOfMemoryError, match="batch 38 needs .* over the cap"):
        device(38)
    profile = profile_device(device, memory_capacity_bytes=device.memory_capacity_bytes, config=ProfilerConfig(max_batch_size=1000))
    assert profile.max_batch_size == 37
    assert profile.first_estimate is not None and profile.first_estimate >= 37  # ignores gradients: over-estimates
    assert profile.memory_fit == LinearMemoryFit(intercept_bytes=2 * PARAM_BYTES, bytes_per_sample=per_sample)
    for probe in profile.probes:
        assert probe.peak_bytes == 2 * PARAM_BYTES + per_sample * probe.batch_size
        assert probe.before_bytes == PARAM_BYTES
    curve = profile.curve()
    assert curve.max_batch_size == 37
    for probe in profile.probes:
        assert curve.time(probe.batch_size) == pytest.approx(probe.compute_s, rel=1e-12)
    assert all(p.grad is None for p in model.parameters())  # profiling leaves no gradients behind


def test_speed_factor_slows_each_step_by_the_factor() -> None:
    speed = SimulatedSpeed(speed_factor=3.0, base_time_s=0.01, per_sample_time_s=0.002)
    assert speed.synthetic_time(5) == pytest.approx(0.02)
    assert speed.delay(5, measured_s=0.001) == pytest.approx(2 * 0.001 + 3 * 0.02)
    model = SlowedModule(TinyMLP(), speed)
    device = ModelStepDevice(model, _mse, _make_batch)
    result = device(5)
    assert result.time_s >= 3 * 0.02  # lower bound is deterministic: the sleep alone
    assert result.time_s < 3 * 0.02 + 0.5  # and nothing else of note (loose: shared CI cores)
    with pytest.raises(ConfigError, match="speed_factor must be a finite number >= 1 and <= 1000, got 0.5"):
        SimulatedSpeed(speed_factor=0.5)
    with pytest.raises(ConfigError, match="speed_factor must be a finite number >= 1 and <= 1000, got 1000000.0"):
        SimulatedSpeed(speed_factor=1e6)  # would sleep for hours
    with pytest.raises(ConfigError, match="per_sample_time_s must be a finite number >= 0 and <= 60, got 'slow'"):
        SimulatedSpeed(per_sample_time_s="slow")


# ------------------------------------------------------------------------------ collectives
def _collective_body(rank: int, world: int, lag_s: float):
    import torch.distributed as dist

    def loss_with_collective(model: nn.Module, data) -> torch.Tensor:
        loss = _mse(model, data)
        if rank == 1:
            time.sleep(lag_s)  # rank 1 computes slower; rank 0 waits inside the all-reduce
        total = loss.detach().clone()
        dist.all_reduce(total)
        return loss

    torch.manual_seed(0)
    device = ModelStepDevice(TinyMLP(), loss_with_collective, _make_batch)
    result = device(4)
    comm = measure_collective_time(lambda: dist.all_reduce(torch.zeros(16)), repeats=3)
    with timed_collectives() as clock:
        dist.all_reduce(torch.ones(4))
    with timed_collectives():
        with pytest.raises(RuntimeError, match="cannot be nested"):
            with timed_collectives():
                pass
    gathered = [None] * world
    dist.all_gather_object(gathered, (result.time_s, result.collective_s, result.compute_s, comm, clock.calls))
    return gathered


def test_waiting_in_collectives_is_not_counted_as_compute() -> None:
    lag = 0.3
    (fast, slow) = run_on_ranks(_collective_body, 2, lag, timeout_s=60)
    fast_time, fast_collective, fast_compute, comm, calls = fast
    assert calls == 1
    assert fast_time >= lag * 0.9 and fast_collective >= lag * 0.8
    assert fast_compute < lag / 2  # rank 0 is fast: its waiting was subtracted
    assert slow[2] >= lag  # rank 1's own sleep is its compute
    assert 0 < comm < lag / 2  # after a barrier nobody waits


# ------------------------------------------------------------------------------ a TP group as one device
def _tp_group_body(rank: int, world: int):
    import torch.distributed as dist

    per_sample = _activation_bytes(1) + 2 * 2 * F32
    cap = 2 * PARAM_BYTES + per_sample * (20 if rank == 0 else 11) + per_sample // 2  # rank 1 holds less
    torch.manual_seed(0)
    model = SlowedModule(TinyMLP(), SimulatedSpeed(speed_factor=1.0 + rank, base_time_s=0.005))
    device = ModelStepDevice(model, _mse, _make_batch, memory_cap_bytes=cap, group=dist.group.WORLD, name="tp-group")
    profile = profile_device(device, config=ProfilerConfig(max_batch_size=64))
    gathered = [None] * world
    dist.all_gather_object(gathered, profile)
    return gathered


def test_tp_group_ranks_agree_on_max_batch_and_times() -> None:
    """All ranks of a TP group probe together: the group's peak and time are the max over ranks."""
    first, second = run_on_ranks(_tp_group_body, 2, timeout_s=60)
    assert first.max_batch_size == second.max_batch_size == 11  # the smaller rank's memory decides
    assert [p.time_s for p in first.probes] == [p.time_s for p in second.probes]
    assert all(p.time_s >= 2 * 0.005 for p in first.probes)  # the slower rank's time decides
