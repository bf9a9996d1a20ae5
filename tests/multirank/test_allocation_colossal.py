"""Uneven Poplar batches under Colossal-AI give exactly the single-process full-batch gradient.

Each case allocates a global batch unevenly (different speeds and max batch sizes, so devices get
different sample counts, micro-batch sizes and accumulation steps, sometimes empty micro-steps),
runs one iteration through the plugin with :func:`run_iteration` and compares every parameter's
reduced gradient with the gradient of the mean loss over the same global batch computed by one
process on an unsharded copy of the model (same seed).  fp32 throughout; atol 1e-5 covers the
reassociation of sums across micro-steps and ranks (values are O(1)).
"""
from __future__ import annotations


import pytest
import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

from dist_harness import run_on_ranks
from tiny_models import TinyMLP
from semimig._compat import apply_cpu_shim
from semimig.allocation import (
    HeteroDataLoader,
    SpeedCurve,
    allocate,
    check_plan,
    data_parallel_info,
    run_iteration,
)

ATOL = 1e-5
DATASET_SIZE = 40


# full_batch_dataset, mse_loss, uneven_plan and reference_grads are shared with test_allocation_zero3.py
def full_batch_dataset() -> TensorDataset:
    gen = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(DATASET_SIZE, 4, generator=gen), torch.randn(DATASET_SIZE, 2, generator=gen))


def mse_loss(model: nn.Module, data) -> torch.Tensor:
    x, y = data
    return nn.functional.mse_loss(model(x), y, reduction="mean")


def uneven_plan(world: int, zero_stage: int, global_batch_size: int):
    speeds = [1.0, 3.0, 2.0, 0.5][:world]
    max_batches = [3, 5, 2, 4][:world]
    curves = [
        SpeedCurve.constant(peak_speed=s, max_batch_size=m, name=f"dev{i}") for i, (s, m) in enumerate(zip(speeds, max_batches))
    ]
    return allocate(curves, global_batch_size, zero_stage=zero_stage, comm_time_s=0.3)


def reference_grads(global_batch_size: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyMLP()
    x, y = full_batch_dataset()[:global_batch_size]
    mse_loss(model, (x, y)).backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def _zero_body(rank: int, world: int, stage: int, global_batch_size: int):
    apply_cpu_shim()  # RNG, ZeRO sanity check and streams on CPU (semimig._compat)
    from colossalai.booster import Booster
    from colossalai.booster.plugin import LowLevelZeroPlugin

    torch.manual_seed(0)
    model = TinyMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plugin = LowLevelZeroPlugin(stage=stage, precision="fp32", overlap_communication=False)
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(model, optimizer)

    info = data_parallel_info(plugin)
    plan = uneven_plan(world, stage, global_batch_size)
    check_plan(plan, info)
    loader = HeteroDataLoader(full_batch_dataset(), plan, info.rank)
    run_iteration(booster, model, optimizer, iter(loader), mse_loss, zero_stage=info.zero_stage)
    grads = {name: optimizer.get_param_grad(p).detach().numpy().copy() for name, p in model.unwrap().named_parameters()}
    return plan, grads


@pytest.mark.parametrize(
    ("stage", "world", "global_batch_size"),
    [(1, 2, 13), (1, 3, 17), (2, 2, 13), (2, 4, 23)],
)
def test_low_level_zero_uneven_batches_match_full_batch_gradient(stage: int, world: int, global_batch_size: int) -> None:
    plan, grads = run_on_ranks(_zero_body, world, stage, global_batch_size, timeout_s=90)
    assert len(set(plan.samples)) > 1, f"plan is not uneven: {plan.samples}"
    if stage == 1:
        assert len({d.accumulation_steps for d in plan.devices}) > 1 or max(d.accumulation_steps for d in plan.devices) > 1
    else:
        assert plan.devices[0].accumulation_steps > 1, "stage-2 case should accumulate"
    reference = reference_grads(global_batch_size)
    assert set(grads) == set(reference)
    for name, expected in reference.items():
        torch.testing.assert_close(torch.from_numpy(grads[name]), expected, atol=ATOL, rtol=0, msg=name)


def test_stage2_rejects_plan_with_different_accumulation_steps() -> None:
    plan = uneven_plan(2, 1, 13)
    assert len({d.accumulation_steps for d in plan.devices}) > 1
    from semimig.allocation import DataParallelInfo

    info = DataParallelInfo(rank=0, size=2, group=None, zero_stage=2)
    with pytest.raises(ValueError, match="same accumulation_steps"):
        check_plan(plan, info)
    with pytest.raises(ValueError, match="3 ranks"):
        check_plan(plan, DataParallelInfo(rank=0, size=3, group=None, zero_stage=1))


# ------------------------------------------------------------------------ hybrid parallel (TP x DP)
def _mlp_policy():
    from colossalai.shardformer.layer import Linear1D_Col, Linear1D_Row
    from colossalai.shardformer.policies.base_policy import ModulePolicyDescription, Policy, SubModuleReplacementDescription

    class TinyMLPPolicy(Policy):
        def config_sanity_check(self) -> None:
            pass

        def preprocess(self) -> nn.Module:
            return self.model

        def postprocess(self) -> nn.Module:
            return self.model

        def module_policy(self):
            return {
                TinyMLP: ModulePolicyDescription(
                    sub_module_replacement=[
                        SubModuleReplacementDescription(suffix="fc1", target_module=Linear1D_Col),
                        SubModuleReplacementDescription(suffix="fc2", target_module=Linear1D_Row),
                    ]
                )
            }

        def get_held_layers(self):
            return [self.model]

        def get_shared_params(self):
            return []

    return TinyMLPPolicy()


def _hybrid_body(rank: int, world: int, global_batch_size: int):
    apply_cpu_shim()  # RNG, ZeRO sanity check and streams on CPU (semimig._compat)
    import torch.distributed as dist
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    torch.manual_seed(0)
    model = TinyMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, zero_stage=0, precision="fp32", custom_policy=_mlp_policy())
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(model, optimizer)

    info = data_parallel_info(plugin)
    plan = uneven_plan(info.size, 1, global_batch_size)
    check_plan(plan, info)
    loader = HeteroDataLoader(full_batch_dataset(), plan, info.rank)
    run_iteration(booster, model, optimizer, iter(loader), mse_loss, zero_stage=info.zero_stage)
    tp_rank = dist.get_group_rank(plugin.tp_group, dist.get_rank())
    shards = {name: p.grad.detach().numpy().copy() for name, p in model.unwrap().named_parameters()}
    gathered = [None] * world
    dist.all_gather_object(gathered, (info.rank, tp_rank, shards))
    return plan, gathered


def test_hybrid_parallel_tp_groups_as_devices_match_full_batch_gradient() -> None:
    """tp=2 x dp=2 on 4 ranks: both TP ranks of a group get the group's batch; DP over groups."""
    plan, gathered = run_on_ranks(_hybrid_body, 4, 11, timeout_s=120)
    assert len(set(plan.samples)) > 1, f"plan is not uneven: {plan.samples}"
    reference = reference_grads(11)
    # column layer fc1: weight/bias split along the output dim; row layer fc2: weight split along input
    split_dim = {"fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 1, "fc2.bias": None}
    for dp_rank, tp_rank, shards in gathered:
        for name, expected in reference.items():
            dim = split_dim[name]
            want = expected if dim is None else expected.chunk(2, dim=dim)[tp_rank]
            torch.testing.assert_close(
                torch.from_numpy(shards[name]), want, atol=ATOL, rtol=0, msg=f"{name} dp{dp_rank} tp{tp_rank}"
            )
