"""``semimig.enable(..., batch=BatchSplit(...))``: the 2-D composition from the TP entry point.

tp = 2 x dp = 2 on four gloo ranks, the bench ViT under ``HybridParallelPlugin`` +
``SemiMigPolicy``:

- with profiled curves, one iteration through :meth:`Balancer.micro_batches` and
  ``run_iteration`` gives every rank the gradient of the global-batch mean computed by one
  process on an unsharded copy (fp32, atol 2e-5: sums over micro-steps and ranks reassociate);
- with no curves, the plan starts even and calibrates itself from training: DP group 0's TP rank 1
  is made four times slower (an injected straggler, ``mode="off"`` so nothing balances it away),
  and after the trigger's window the fast group takes most of the samples;
- bad input is refused by name before any layer is touched.
"""
from __future__ import annotations

import pytest
import torch

from dist_harness import run_pooled
from semimig.bench.models import VitSize, tiny_vit
from semimig.errors import ConfigError
from tiny_models import digits_batch, vit_loss

SIZE = VitSize(hidden=16, layers=1, heads=2, intermediate=32)
GLOBAL_BATCH = 11
ATOL = 2e-5


def _batch(n: int = GLOBAL_BATCH, start: int = 0):
    return digits_batch(n, start)


def _boost(zero_stage: int = 0, precision: str = "fp32", size: VitSize = SIZE):
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    from semimig.shardformer import SemiMigPolicy

    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, zero_stage=zero_stage, precision=precision,
                                  overlap_communication=False, custom_policy=SemiMigPolicy())
    model = tiny_vit(size, seed=0, num_labels=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(model, optimizer)
    return plugin, booster, model, optimizer


def _gradients_body(rank: int, world: int):
    import torch.distributed as dist

    import semimig
    from semimig.allocation import SpeedCurve, run_iteration

    plugin, booster, model, optimizer = _boost()
    # group 1 three times faster: it takes most samples, in two micro-steps of at most 5
    curves = tuple(SpeedCurve.constant(peak_speed=s, max_batch_size=m, name=f"group{g}")
                   for g, (s, m) in enumerate([(1.0, 3), (3.0, 5)]))
    balancer = semimig.enable(model, plugin, optimizer=optimizer, mode="semi",
                              batch=semimig.BatchSplit(global_batch_size=GLOBAL_BATCH, curves=curves, replan=None))
    try:
        run_iteration(booster, model, optimizer, iter(balancer.micro_batches(_batch())), vit_loss,
                      zero_stage=plugin.zero_stage)
        grads = {name: p.grad.detach().float().numpy().copy() for name, p in model.unwrap().named_parameters()}
        gathered = [None] * world
        dist.all_gather_object(gathered, (balancer.hybrid.layout.dp_rank, balancer.hybrid.layout.tp_rank, grads))
        return balancer.batch_plan, gathered
    finally:
        balancer.close()


def _shard(full: torch.Tensor, shard_shape: tuple[int, ...], tp_rank: int, tp: int = 2) -> torch.Tensor:
    """The part of ``full`` that TP rank ``tp_rank`` holds: Colossal-AI chunks one dimension."""
    if tuple(full.shape) == shard_shape:
        return full
    (dim,) = [d for d, (a, b) in enumerate(zip(full.shape, shard_shape)) if a == tp * b]
    return full.chunk(tp, dim=dim)[tp_rank]


def test_enable_with_a_batch_split_gives_the_global_batch_gradient() -> None:
    plan, gathered = run_pooled(_gradients_body, 4, timeout_s=180)
    assert len(set(plan.samples)) > 1, f"plan is not uneven: {plan.samples}"
    reference_model = tiny_vit(SIZE, seed=0, num_labels=10)
    vit_loss(reference_model, _batch()).backward()
    reference = {name: p.grad.detach() for name, p in reference_model.named_parameters()}
    for dp_rank, tp_rank, grads in gathered:
        assert set(grads) == set(reference)
        for name, expected in reference.items():
            got = torch.from_numpy(grads[name])
            torch.testing.assert_close(got, _shard(expected, tuple(got.shape), tp_rank), atol=ATOL, rtol=0.0,
                                       msg=f"{name} dp{dp_rank} tp{tp_rank}")


CALIBRATION_BATCH = 32
CALIBRATION_SIZE = VitSize(hidden=64, layers=1, heads=2, intermediate=256)


def _calibration_body(rank: int, world: int, iterations: int):
    import semimig
    from semimig.allocation import run_iteration
    from semimig.hybrid import ReplanConfig

    plugin, booster, model, optimizer = _boost(size=CALIBRATION_SIZE)
    dp_rank = rank // 2  # HybridParallelPlugin makes TP groups of consecutive ranks
    # DP group 0's TP rank 1 eight times slower at its GEMMs: 4x left the calibrated split at 1.9-3x
    # with 4 ranks on 2 cores under a loaded suite (one CI run: 11/21), too near the 2x asserted below
    straggler = "fixed:1:8" if dp_rank == 0 else None
    balancer = semimig.enable(model, plugin, optimizer=optimizer, mode="off", straggler=straggler,
                              batch=semimig.BatchSplit(global_batch_size=CALIBRATION_BATCH,
                                                       replan=ReplanConfig(window=3, patience=2)))
    plans = []
    try:
        for i in range(iterations):
            plans.append(balancer.batch_plan.samples)
            run_iteration(booster, model, optimizer, iter(balancer.micro_batches(_batch(CALIBRATION_BATCH, 32 * i))),
                          vit_loss, zero_stage=plugin.zero_stage)
            optimizer.step()  # hooked: the controller's step, then the batch plan's
            optimizer.zero_grad()
        return plans, [d.iteration for d in balancer.hybrid.replans]
    finally:
        balancer.close()


def test_without_a_profile_the_plan_starts_even_and_calibrates_from_training() -> None:
    plans, replans = run_pooled(_calibration_body, 4, 8, timeout_s=300)
    assert plans[0] == (16, 16), f"the uncalibrated start must be the even split, got {plans[0]}"
    assert replans and replans[0] <= 4, f"calibration needs window + patience - 1 = 4 iterations, got {replans}"
    slow, fast = plans[-1]
    assert fast >= 2 * slow, f"the group without the 8x straggler should take most samples, got {plans[-1]}"


def _refusal_body(rank: int, world: int, case: str):
    import semimig
    from semimig.allocation import SpeedCurve

    plugin, booster, model, optimizer = _boost()
    kwargs = {"bad-type": {"batch": {"global_batch_size": 8}},
              "curve-count": {"batch": semimig.BatchSplit(global_batch_size=8, curves=(
                  SpeedCurve.constant(peak_speed=1.0, max_batch_size=8),))}}[case]
    try:
        semimig.enable(model, plugin, optimizer=optimizer, **kwargs)
    except ConfigError as err:
        layers_clean = all(m.directive is None for m in model.modules() if hasattr(m, "directive"))
        return str(err), layers_clean
    return None, None


@pytest.mark.parametrize(("case", "needle"), [
    ("bad-type", "batch must be a semimig.BatchSplit"),
    ("curve-count", "BatchSplit.curves has 1 curves, the plugin has 2 data-parallel groups"),
])
def test_enable_refuses_a_bad_batch_split_by_name_and_leaves_no_state(case, needle) -> None:
    message, layers_clean = run_pooled(_refusal_body, 4, case, timeout_s=180)
    assert message is not None and needle in message, message
    assert layers_clean, "a refused enable() must leave no directive on the layers"


def test_batch_split_checks_its_fields_by_name() -> None:
    from semimig import BatchSplit
    from semimig.allocation import SpeedCurve
    from semimig.hybrid import ReplanConfig

    curve = SpeedCurve.constant(peak_speed=1.0, max_batch_size=8)
    for kwargs, needle in [
        ({"global_batch_size": 0}, "BatchSplit.global_batch_size"),
        ({"global_batch_size": 8, "allocation": "fast"}, "BatchSplit.allocation"),
        ({"global_batch_size": 8, "max_batch_size": 0}, "BatchSplit.max_batch_size"),
        ({"global_batch_size": 8, "comm_time_s": -1.0}, "BatchSplit.comm_time_s"),
        ({"global_batch_size": 8, "curves": ()}, "BatchSplit.curves must be a non-empty tuple"),
        ({"global_batch_size": 8, "curves": ("fast",)}, "BatchSplit.curves[0] must be a SpeedCurve"),
        ({"global_batch_size": 8, "curves": (curve,), "max_batch_size": 4}, "max_batch_size is for curves=None"),
        ({"global_batch_size": 8, "replan": None}, "give replan=ReplanConfig"),
        ({"global_batch_size": 8, "replan": "often"}, "BatchSplit.replan must be a ReplanConfig"),
    ]:
        with pytest.raises(ConfigError, match=None) as info:
            BatchSplit(**kwargs)
        assert needle in str(info.value), (kwargs, str(info.value))
    # the even split needs no trigger, and a profiled split may keep its first plan
    assert not BatchSplit(global_batch_size=8, allocation="even", replan=None).calibrates
    assert not BatchSplit(global_batch_size=8, curves=(curve,), replan=ReplanConfig()).calibrates
    assert BatchSplit(global_batch_size=8).calibrates
    start = BatchSplit(global_batch_size=8).curves_for(3)
    assert [c.max_batch_size for c in start] == [8, 8, 8] and len({c.times_s for c in start}) == 1


def _plugin_refusal_body(rank: int, world: int, tp: int, pp: int):
    from colossalai.booster.plugin import HybridParallelPlugin

    import semimig

    plugin = HybridParallelPlugin(tp_size=tp, pp_size=pp, num_microbatches=2 if pp > 1 else None)
    try:
        semimig.enable(tiny_vit(SIZE, seed=0, num_labels=10), plugin, batch=semimig.BatchSplit(global_batch_size=8))
    except ConfigError as err:
        return str(err)
    return None


@pytest.mark.parametrize(("tp", "pp", "needle"), [(1, 1, "tp_size=1 has none"), (2, 2, "needs pp_size=1 (got 2)")])
def test_tp_1_and_pipelines_are_refused_with_a_batch_split(tp, pp, needle) -> None:
    message = run_pooled(_plugin_refusal_body, 4, tp, pp, timeout_s=120)
    assert message is not None and needle in message, message


def _llama_global_losses(rank: int, world: int, speeds):
    """Global-batch mean losses of 4 AdamW steps of the tiny Llama under enable(..., batch=...) with
    profiled constant curves of the given per-group speeds (a group may get no sample at all)."""
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    import semimig
    from semimig.allocation import SpeedCurve
    from semimig.shardformer import SemiMigPolicy
    from tiny_lms import split_step, tiny_lm

    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, precision="fp32", overlap_communication=False,
                                  custom_policy=SemiMigPolicy())
    model = tiny_lm("llama")
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    curves = tuple(SpeedCurve.constant(peak_speed=s, max_batch_size=4, name=f"group{g}") for g, s in enumerate(speeds))
    balancer = semimig.enable(model, plugin, optimizer=optimizer, mode="off",
                              batch=semimig.BatchSplit(global_batch_size=4, curves=curves, replan=None))
    losses = []
    try:
        for step in range(4):
            gen = torch.Generator().manual_seed(100 + step)
            ids = torch.randint(0, 128, (4, 16), generator=gen)
            batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
            losses.append(split_step(booster, model, optimizer, balancer, plugin, batch))
        return balancer.batch_plan.samples, losses
    finally:
        balancer.close()


def test_a_group_with_no_sample_runs_a_zero_weighted_stand_in_and_training_is_exact():
    """A Hugging Face Llama cannot run a batch of zero rows; the group the plan starves runs the global
    batch's first row with its loss times 0, so training equals the even split's (fp32 reassociation)."""
    starved, starved_losses = run_pooled(_llama_global_losses, 4, (1.0, 1000.0), timeout_s=240)
    even, even_losses = run_pooled(_llama_global_losses, 4, (1.0, 1.0), timeout_s=240)
    assert starved == (0, 4) and even == (2, 2), (starved, even)
    torch.testing.assert_close(torch.tensor(starved_losses), torch.tensor(even_losses), atol=1e-5, rtol=0.0)


def _own_batches_body(rank: int, world: int):
    import semimig
    from semimig.allocation import run_iteration

    plugin, booster, model, optimizer = _boost()
    balancer = semimig.enable(model, plugin, optimizer=optimizer, mode="off",
                              batch=semimig.BatchSplit(global_batch_size=8))
    said = []
    try:
        # the same global batch on every rank, then each rank its own sampler's, then one more step: the
        # per-step exchange is read a step late, so iteration 1's batches are refused at iteration 2's step
        for own in (False, True, False):
            data = _batch(8, 8 * rank if own else 0)
            run_iteration(booster, model, optimizer, iter(balancer.micro_batches(data)), vit_loss,
                          zero_stage=plugin.zero_stage)
            try:
                optimizer.step()
                said.append("ok")
            except ConfigError as err:
                said.append(str(err))
            optimizer.zero_grad()
        return said
    finally:
        balancer.close()


def test_ranks_that_feed_their_own_batches_are_refused_at_the_step() -> None:
    """Review: micro_batches() checked only the row count, so ranks fed by their own samplers (a
    ``DistributedSampler``) trained on a mix of batches with no error."""
    same, _, own = run_pooled(_own_batches_body, 4, timeout_s=180)
    assert same == "ok", same
    assert "iteration 1: the ranks passed micro_batches() different global batches" in own, own
    assert "ranks [0] vs ranks [1] vs ranks [2] vs ranks [3]" in own, own


def test_the_batch_fingerprint_sees_values_shapes_and_dtypes_at_any_size() -> None:
    from semimig.hybrid.balancer import batch_fingerprint

    x = torch.arange(10_000, dtype=torch.float32).reshape(100, 100)
    base = batch_fingerprint((x, x[:, 0].long()))
    assert base == batch_fingerprint((x.clone(), x[:, 0].long().clone())) and 0 < base < 2 ** 48
    assert base != batch_fingerprint((x + 1, x[:, 0].long()))
    assert base != batch_fingerprint((x.reshape(50, 200), x[:, 0].long()))
    assert base != batch_fingerprint((x.double(), x[:, 0].long()))
    assert batch_fingerprint({"ids": torch.zeros(0, 3, dtype=torch.bool)}) != batch_fingerprint({"ids": torch.zeros(0, 4)})
    # review: a stride of a multiple of the row length read column 0 only (a BOS token in every row)
    ids = torch.randint(1, 256, (2048, 16), generator=torch.Generator().manual_seed(0))
    ids[:, 0] = 0
    other = ids.clone()
    other[:, 1:] = torch.randint(1, 256, (2048, 15), generator=torch.Generator().manual_seed(1))
    assert batch_fingerprint(ids) != batch_fingerprint(other)
