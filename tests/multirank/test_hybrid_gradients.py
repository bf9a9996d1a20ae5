"""tp=2 x dp=2: Poplar's uneven group batches with SEMI in every TP group give the full-batch gradient.

Four ranks run ``HybridParallelPlugin(tp_size=2, zero_stage=z, custom_policy=SemiMigPolicy())`` on
the bench ViT; each TP group runs a :class:`BalanceController` in mode ``semi``, and the
:class:`HybridBalancer` splits one global batch unevenly between the two groups (different sample
counts and micro-step counts).  One iteration's reduced gradients, un-sharded by matching each
shard to the dimension Colossal-AI split, must equal the gradient of the mean loss over the same
global batch computed by one process on an unsharded copy (same seed).  With a forced migration
(``force(migrate={1: 0.5})``: TP rank 1 hands half of every balanced layer's columns to rank 0 in
both groups) they must still be equal: migration is exact.  fp32; atol 2e-5 covers the
reassociation of sums over micro-steps, ranks and migrated column blocks (gradients are O(0.1)).
"""
from __future__ import annotations

import pytest
import torch

from dist_harness import run_on_ranks
from semimig.bench.models import VitSize, tiny_vit
from tiny_models import digits_batch, vit_loss

SIZE = VitSize(hidden=16, layers=1, heads=2, intermediate=32)
GLOBAL_BATCH = 11
ATOL = 2e-5


def _batch():
    return digits_batch(GLOBAL_BATCH)


def _reference_grads() -> dict[str, torch.Tensor]:
    model = tiny_vit(SIZE, seed=0, num_labels=10)
    vit_loss(model, _batch()).backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def _body(rank: int, world: int, zero_stage: int, migrate: bool, precision: str):
    import torch.distributed as dist
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    from semimig.allocation import SpeedCurve, run_iteration
    from semimig.controller import BalanceConfig, BalanceController
    from semimig.hybrid import HybridBalancer
    from semimig.nn.balanced import BalancedLinearMixin
    from semimig.shardformer import SemiMigPolicy

    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, zero_stage=zero_stage, precision=precision, overlap_communication=False,
                                  custom_policy=SemiMigPolicy())
    model = tiny_vit(SIZE, seed=0, num_labels=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(model, optimizer)
    controller = BalanceController(model, BalanceConfig(mode="semi"), process_group=plugin.tp_group)
    if migrate:
        controller.force(migrate={1: 0.5})
    # group 1 three times faster: it takes most samples, in two micro-steps of at most 5
    curves = [SpeedCurve.constant(peak_speed=s, max_batch_size=m, name=f"group{g}")
              for g, (s, m) in enumerate([(1.0, 3), (3.0, 5)])]
    balancer = HybridBalancer(plugin, curves=curves, global_batch_size=GLOBAL_BATCH, controller=controller, replan=None)
    run_iteration(booster, model, optimizer, iter(balancer.micro_batches(_batch())), vit_loss,
                  zero_stage=balancer.zero_stage)
    migrating = [m.directive.layout is not None for m in model.modules() if isinstance(m, BalancedLinearMixin)
                 and m.directive is not None]
    grads = {}
    for name, p in model.unwrap().named_parameters():
        grad = optimizer.get_param_grad(p) if zero_stage > 0 else p.grad
        grads[name] = grad.detach().float().reshape(p.shape).numpy().copy()  # numpy: tensors do not outlive the rank
    gathered = [None] * world
    dist.all_gather_object(gathered, (balancer.layout.dp_rank, balancer.layout.tp_rank, any(migrating), grads))
    return balancer.plan, gathered


def _shard(full: torch.Tensor, shard_shape: tuple[int, ...], tp_rank: int, tp: int = 2) -> torch.Tensor:
    """The part of ``full`` that TP rank ``tp_rank`` holds: Colossal-AI chunks one dimension."""
    if tuple(full.shape) == shard_shape:
        return full
    (dim,) = [d for d, (a, b) in enumerate(zip(full.shape, shard_shape)) if a == tp * b]
    return full.chunk(tp, dim=dim)[tp_rank]


@pytest.mark.parametrize(("zero_stage", "migrate", "precision", "atol", "rtol"), [
    (0, False, "fp32", ATOL, 0.0),
    (0, True, "fp32", ATOL, 0.0),
    # Colossal-AI refuses ZeRO in fp32 ("Please set precision to 'fp16' or 'bf16' when using ZeRO"):
    # bf16 keeps 8 bits of mantissa, so only a wrong loss scale (off by tens of percent) can fail here
    (1, True, "bf16", 2e-2, 5e-2),
])
def test_uneven_group_batches_with_semi_match_full_batch_gradient(zero_stage, migrate, precision, atol, rtol) -> None:
    plan, gathered = run_on_ranks(_body, 4, zero_stage, migrate, precision, timeout_s=180)
    assert len(set(plan.samples)) > 1, f"plan is not uneven: {plan.samples}"
    assert len({d.accumulation_steps for d in plan.devices}) > 1, "the groups should run different micro-step counts"
    reference = _reference_grads()
    for dp_rank, tp_rank, migrated, grads in gathered:
        assert migrated == migrate, f"dp{dp_rank} tp{tp_rank}: migration layout present={migrated}"
        assert set(grads) == set(reference)
        for name, expected in reference.items():
            got = torch.from_numpy(grads[name])
            torch.testing.assert_close(got, _shard(expected, tuple(got.shape), tp_rank), atol=atol, rtol=rtol,
                                       msg=f"{name} dp{dp_rank} tp{tp_rank}")
