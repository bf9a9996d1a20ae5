"""Data path: disjoint covering micro-batches per device, and loss scaling to the global-batch mean."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import TensorDataset

from semimig.allocation import (
    HeteroBatchSampler,
    HeteroDataLoader,
    SpeedCurve,
    allocate,
    evaluation_share,
    loss_scale,
    partition_global_batch,
)
from semimig.errors import ConfigError


@st.composite
def plans(draw):
    n = draw(st.integers(1, 4))
    curves = [
        SpeedCurve.constant(peak_speed=draw(st.floats(0.1, 10.0)), max_batch_size=draw(st.integers(1, 6)), name=f"d{i}")
        for i in range(n)
    ]
    gbs = draw(st.integers(1, 30))
    stage = draw(st.sampled_from([1, 2]))
    return allocate(curves, gbs, zero_stage=stage, comm_time_s=draw(st.floats(0.0, 1.0)))


@settings(max_examples=50, deadline=None)
@given(plans(), st.integers(0, 7), st.booleans())
def test_devices_get_disjoint_micro_batches_covering_each_global_batch(plan, extra, shuffle) -> None:
    dataset_size = 2 * plan.global_batch_size + extra % plan.global_batch_size  # tail dropped
    samplers = [HeteroBatchSampler(plan, d, dataset_size=dataset_size, shuffle=shuffle, seed=3) for d in range(plan.num_devices)]
    streams = [list(s) for s in samplers]
    for device, (sampler, stream) in enumerate(zip(samplers, streams)):
        assert len(stream) == len(sampler) == 2 * plan.devices[device].accumulation_steps
        assert [len(m) for m in stream] == list(plan.devices[device].micro_batch_sizes) * 2
    seen: list[int] = []
    for iteration in range(2):
        batch: list[int] = []
        for device, stream in enumerate(streams):
            steps = plan.devices[device].accumulation_steps
            for micro in stream[iteration * steps : (iteration + 1) * steps]:
                batch.extend(micro)
        assert len(batch) == len(set(batch)) == plan.global_batch_size
        seen.extend(batch)
    assert len(seen) == len(set(seen))  # the two iterations are disjoint too
    if not shuffle:
        assert seen == list(range(2 * plan.global_batch_size))


def test_shuffle_is_shared_by_all_ranks_and_changes_with_epoch() -> None:
    curves = [SpeedCurve.constant(peak_speed=1.0, max_batch_size=4, name="a"), SpeedCurve.constant(peak_speed=3.0, max_batch_size=4, name="b")]
    plan = allocate(curves, 8, zero_stage=1)
    a = HeteroBatchSampler(plan, 0, dataset_size=32, shuffle=True, seed=5)
    b = HeteroBatchSampler(plan, 0, dataset_size=32, shuffle=True, seed=5)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first


def test_partition_rejects_wrong_batch_length() -> None:
    plan = allocate([SpeedCurve.constant(peak_speed=1.0, max_batch_size=4)], 4, zero_stage=1)
    with pytest.raises(ValueError, match="a global batch has 4 samples, got 3 indices"):
        partition_global_batch(plan, [0, 1, 2])
    with pytest.raises(ValueError, match="dataset_size must be an int >= global_batch_size=4, got 3"):
        HeteroBatchSampler(plan, 0, dataset_size=3)
    with pytest.raises(ValueError, match=r"device index must be an int in \[0, 1\), got 1"):
        HeteroBatchSampler(plan, 1, dataset_size=8)


def test_loss_scale_values_and_errors() -> None:
    assert loss_scale(3, global_batch_size=12, dp_world_size=4) == pytest.approx(1.0)
    assert loss_scale(3, global_batch_size=12, dp_world_size=4, reduction="sum") == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match=r"reduction must be one of \('mean', 'sum'\), got 'max'"):
        loss_scale(3, global_batch_size=12, dp_world_size=4, reduction="max")
    with pytest.raises(ValueError, match="dp_world_size must be an int >= 1, got 0"):
        loss_scale(3, global_batch_size=12, dp_world_size=0)


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


@settings(max_examples=25, deadline=None)
@given(plans(), st.sampled_from(["mean", "sum"]))
def test_dp_average_of_scaled_micro_losses_is_global_mean_gradient(plan, reduction) -> None:
    """Emulate the DP average ((1/D)·Σ_r g_r, what Colossal-AI's reduction computes) in one process."""
    gen = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(plan.global_batch_size, 3, generator=gen, dtype=torch.float64),
                            torch.randn(plan.global_batch_size, 1, generator=gen, dtype=torch.float64))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1)).double()

    x, y = dataset.tensors
    model.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    reference = _grads(model)

    averaged = [torch.zeros_like(g) for g in reference]
    for device in range(plan.num_devices):
        model.zero_grad()
        for micro in HeteroDataLoader(dataset, plan, device):
            mx, my = micro.data
            assert mx.shape[0] == micro.size
            loss = nn.functional.mse_loss(model(mx), my, reduction=reduction)
            micro.scale_loss(loss, reduction).backward()
        for acc, g in zip(averaged, _grads(model)):
            acc += g / plan.num_devices
    for got, want in zip(averaged, reference):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)  # float64: reassociation only


def test_empty_micro_batch_keeps_shapes_and_gives_zero_gradient() -> None:
    curves = [SpeedCurve.constant(peak_speed=10.0, max_batch_size=8, name="fast"), SpeedCurve.constant(peak_speed=0.01, max_batch_size=8, name="slow")]
    plan = allocate(curves, 8, zero_stage=1)
    assert plan.samples == (8, 0)
    dataset = TensorDataset(torch.randn(16, 3), torch.randn(16, 1))
    micro = next(iter(HeteroDataLoader(dataset, plan, 1)))
    assert micro.size == 0 and micro.is_last
    x, y = micro.data
    assert x.shape == (0, 3) and y.shape == (0, 1)
    model = nn.Linear(3, 1)
    loss = nn.functional.mse_loss(model(x), y)  # mean of nothing: NaN
    scaled = micro.scale_loss(loss)
    scaled.backward()
    assert scaled.item() == 0.0
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters())


@settings(max_examples=200, deadline=None)
@given(count=st.integers(0, 50), samples=st.lists(st.integers(0, 20), min_size=1, max_size=6).filter(any))
def test_evaluation_shares_cover_the_items_once_in_proportion_to_the_samples(count, samples) -> None:
    shares = [evaluation_share(count, samples, g) for g in range(len(samples))]
    assert [i for share in shares for i in share] == list(range(count))  # disjoint, in order, covering
    total = sum(samples)
    for share, rows in zip(shares, samples):
        assert abs(len(share) - count * rows / total) < len(samples)  # rounding of two cumulative bounds
        if rows == 0:
            assert len(share) == 0


def test_evaluation_share_follows_the_batch_split_and_names_bad_values() -> None:
    assert [evaluation_share(8, (5, 3), g) for g in (0, 1)] == [range(0, 5), range(5, 8)]
    assert [len(evaluation_share(8, (1, 1, 1, 1), g)) for g in range(4)] == [2, 2, 2, 2]
    with pytest.raises(ConfigError, match="no group"):
        evaluation_share(8, (0, 0), 0)
    with pytest.raises(ConfigError, match="group"):
        evaluation_share(8, (5, 3), 2)
    with pytest.raises(ConfigError, match="count"):
        evaluation_share(-1, (5, 3), 0)
