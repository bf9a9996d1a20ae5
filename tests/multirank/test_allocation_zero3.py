"""ZeRO-3 under Colossal-AI: Poplar's lockstep plans through ``TorchFSDPPlugin`` give the full-batch gradient.

Colossal-AI offers ZeRO-3 in two plugins; on a CPU-only machine:

- ``TorchFSDPPlugin.configure`` wraps the model as ``FSDP(model, device_id=torch.cuda.current_device())``
  (colossalai/booster/plugin/torch_fsdp_plugin.py, ``configure``), which raises
  ``AssertionError: Torch not compiled with CUDA enabled`` from ``torch.cuda._lazy_init``.  That call
  is its only GPU dependence: torch FSDP itself runs on CPU/gloo when given ``device_id=cpu``.  The
  exact-gradient test therefore boosts with the unmodified plugin while :func:`_fsdp_on_cpu` answers
  ``torch.cuda.current_device()`` with the CPU device; everything else (``TorchFSDPModel``,
  ``FSDPOptimizerWrapper``, ``Booster.backward``, FSDP's all-gather / reduce-scatter) is the real path.
- ``GeminiPlugin`` cannot train on CPU at all: it refuses fp32 (``precision fp32 is not supported``,
  gemini_plugin.py ``__init__``) and ``GeminiOptimizer`` accepts only ``HybridAdam`` / ``CPUAdam`` /
  ``FusedAdam`` (gemini_optimizer.py), whose constructors load the ``cpu_adam`` kernel through
  ``CPUAdamLoader``; its extensions are CUDA extensions (``is_available`` needs CUDA), so loading
  fails with ``No usable kernel found for CPUAdamLoader on the current machine`` (kernel_loader.py).

The documenting tests below assert exactly those errors, so a Colossal-AI release that lifts them
fails here and says the workaround can go.  Gradient comparison as in test_allocation_colossal.py:
one process computes the mean loss over the same global batch on an unsharded copy (same seed);
the ranks' gradient shards are all-gathered and cut by FSDP's flat-parameter layout.  fp32; atol 1e-5
covers the reassociation of sums over micro-steps and ranks (values are O(1)).
"""
from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch
import torch.nn as nn

from dist_harness import run_on_ranks
from test_allocation_colossal import full_batch_dataset, mse_loss, reference_grads, uneven_plan
from tiny_models import TinyMLP
from semimig.allocation import HeteroDataLoader, check_plan, data_parallel_info, run_iteration

ATOL = 1e-5
needs_cpu_only_torch = pytest.mark.skipif(torch.cuda.is_available(), reason="documents the CPU-only failure")


@contextlib.contextmanager
def _fsdp_on_cpu():
    """While open, ``torch.cuda.current_device()`` is the CPU device (TorchFSDPPlugin's only GPU call)."""
    with mock.patch.object(torch.cuda, "current_device", lambda: torch.device("cpu")):
        yield


def _fsdp_body(rank: int, world: int, global_batch_size: int):
    from colossalai.booster import Booster
    from colossalai.booster.plugin import TorchFSDPPlugin

    torch.manual_seed(0)
    model = TinyMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plugin = TorchFSDPPlugin()  # sharding_strategy None: FULL_SHARD, i.e. ZeRO-3
    booster = Booster(plugin=plugin)
    with _fsdp_on_cpu():
        model, optimizer, *_ = booster.boost(model, optimizer)
    info = data_parallel_info(plugin)
    plan = uneven_plan(world, 3, global_batch_size)
    check_plan(plan, info)
    sharded = [tuple(p.shape) for p in model.parameters()]
    run_iteration(booster, model, optimizer, iter(HeteroDataLoader(full_batch_dataset(), plan, info.rank)), mse_loss,
                  zero_stage=info.zero_stage)
    return info.zero_stage, plan, sharded, _full_grads(model.module, world)


def _full_grads(fsdp: nn.Module, world: int) -> dict:
    """Un-shard FSDP's flat gradient: all-gather the ranks' shards, cut by the flat parameter's layout."""
    import torch.distributed as dist

    (flat,) = list(fsdp.parameters())  # one FlatParameter (no auto-wrap policy): this rank's shard
    shards = [torch.empty_like(flat.grad) for _ in range(world)]
    dist.all_gather(shards, flat.grad.detach().contiguous())
    full = torch.cat(shards)[: sum(flat._numels)]
    return {fqn: g.view(shape).numpy().copy()  # numpy: tensors do not survive the rank's exit
            for fqn, g, shape in zip(flat._fqns, full.split(list(flat._numels)), flat._shapes)}


@pytest.mark.parametrize(("world", "global_batch_size"), [(2, 13), (4, 23)])
def test_zero3_uneven_lockstep_batches_match_full_batch_gradient(world: int, global_batch_size: int) -> None:
    stage, plan, sharded, grads = run_on_ranks(_fsdp_body, world, global_batch_size, timeout_s=120)
    assert stage == 3
    assert len(set(plan.samples)) > 1, f"plan is not uneven: {plan.samples}"
    assert plan.devices[0].accumulation_steps > 1, "the case should accumulate over micro-steps"
    total = sum(p.numel() for p in TinyMLP().parameters())
    assert sum(torch.Size(s).numel() for s in sharded) < total, "parameters are not sharded (not ZeRO-3)"
    reference = reference_grads(global_batch_size)
    assert set(grads) == set(reference)
    for name, expected in reference.items():
        torch.testing.assert_close(torch.from_numpy(grads[name]), expected, atol=ATOL, rtol=0, msg=name)


# ------------------------------------------------------------------------ why not without the workaround
def _boost_fsdp_unmodified(rank: int, world: int) -> str:
    from colossalai.booster import Booster
    from colossalai.booster.plugin import TorchFSDPPlugin

    model = TinyMLP()
    try:
        Booster(plugin=TorchFSDPPlugin()).boost(model, torch.optim.SGD(model.parameters(), lr=0.1))
    except AssertionError as err:  # torch.cuda._lazy_init on a CPU-only build
        return str(err)
    return "boosted"


@needs_cpu_only_torch
def test_torch_fsdp_plugin_needs_cuda_unmodified() -> None:
    assert run_on_ranks(_boost_fsdp_unmodified, 1, timeout_s=60) == "Torch not compiled with CUDA enabled"


def _gemini_refusals(rank: int, world: int) -> list[str]:
    from colossalai.booster.plugin import GeminiPlugin
    from colossalai.nn.optimizer import HybridAdam

    refusals = []
    for attempt in (lambda: GeminiPlugin(precision="fp32"), lambda: HybridAdam(TinyMLP().parameters(), lr=0.1)):
        try:
            attempt()
            refusals.append("accepted")
        except AssertionError as err:
            refusals.append(str(err))
    return refusals


@needs_cpu_only_torch
def test_gemini_plugin_cannot_train_on_cpu() -> None:
    precision, optimizer = run_on_ranks(_gemini_refusals, 1, timeout_s=60)
    assert precision == "precision fp32 is not supported"
    assert optimizer == "No usable kernel found for CPUAdamLoader on the current machine."
