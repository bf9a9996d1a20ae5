"""``semimig.enable``: straggler tolerance in a user's own loop, under HybridParallelPlugin.

What must hold: bad input is refused by name before anything runs; with balancing ``off`` the
hooked loop trains exactly like Colossal-AI's policy (and a forced prune does not, so the
comparison can fail); with an injected straggler the balancer flags it, sheds its work, logs the
plan at INFO and — with no logging configured at all — prints exactly one WARNING line; the
optimizer hook runs the controller once per ``optimizer.step()`` and ``close()`` removes it; a
1F1B pipeline's stages balance their own TP groups.
"""
from __future__ import annotations

import io
import logging
import math
import sys

import pytest
import torch

import plugin_cases as pc
from _backends import run_on_ranks

pytestmark = pytest.mark.usefixtures("cpu_path")

TP2 = dict(tp_size=2, pp_size=1, precision="fp32")
# A deterministic straggler: rank 1's GEMMs are delayed by 3 x flops / 5e7 FLOP/s (~4 ms per
# GEMM of the tiny Llama, ~160 ms per iteration), far above the timing noise of a loaded machine
# (with 2e8, ~40 ms per iteration, a 2-core machine at load 6 hid it for 12 iterations).
FLOPS_STRAGGLER = "fixed:1:4:mode=flops:flops=5e7"


# --------------------------------------------------------------------------------------------
# refusals
# --------------------------------------------------------------------------------------------
def test_enable_is_exported_lazily() -> None:
    import semimig
    from semimig.balancer import enable

    assert semimig.enable is enable and semimig.enable is enable  # the function, not the module


def test_a_plugin_that_is_not_hybrid_parallel_is_refused() -> None:
    import semimig

    with pytest.raises(semimig.ConfigError, match="plugin must be a colossalai HybridParallelPlugin.*got object"):
        semimig.enable(torch.nn.Linear(2, 2), object())


def _refusals_body(rank: int, world_size: int) -> dict:
    from colossalai.booster.plugin import HybridParallelPlugin

    import semimig

    out = {}
    plugin = HybridParallelPlugin(tp_size=1, pp_size=1, precision="fp32")
    model = torch.nn.Linear(2, 2)
    out["mode"] = pc.outcome(lambda: semimig.enable(model, plugin, mode="fast"))
    out["straggler"] = pc.outcome(lambda: semimig.enable(model, plugin, straggler="fixed:1"))
    out["log_every"] = pc.outcome(lambda: semimig.enable(model, plugin, log_every=-1))
    out["config"] = pc.outcome(lambda: semimig.enable(model, plugin, config={"mode": "semi"}))
    out["no_layers"] = pc.outcome(lambda: semimig.enable(model, plugin))
    interleaved = HybridParallelPlugin(tp_size=1, pp_size=2, num_microbatches=2, pp_style="interleaved",
                                       num_model_chunks=2, precision="fp32")
    out["interleaved"] = pc.outcome(lambda: semimig.enable(model, interleaved))
    return out


def test_bad_input_is_refused_by_name(backend: str) -> None:
    out = run_on_ranks(_refusals_body, 2, backend=backend, timeout_s=90)
    assert out["mode"].startswith("ConfigError: mode must be one of") and "'fast'" in out["mode"]
    assert out["straggler"].startswith("ConfigError: straggler spec 'fixed:1'")
    assert out["log_every"] == "ConfigError: log_every must be an int >= 0, got -1"
    assert out["config"].startswith("ConfigError: config must be a BalanceConfig or None")
    assert out["no_layers"].startswith("ConfigError: model Linear has no semimig layers") and \
        "custom_policy=semimig.shardformer.SemiMigPolicy()" in out["no_layers"]
    assert out["interleaved"].startswith("ConfigError: plugin pipeline schedule InterleavedSchedule") and \
        "pp_style='1f1b'" in out["interleaved"]


def _colossalai_model_body(rank: int, world_size: int) -> str:
    import semimig

    run = pc.boost("llama", TP2, semimig=False)
    return pc.outcome(lambda: semimig.enable(run.model, run.plugin, optimizer=run.optimizer))


def test_a_model_boosted_without_semimig_policy_is_refused(backend: str) -> None:
    assert "has no semimig layers" in run_on_ranks(_colossalai_model_body, 2, backend=backend, timeout_s=90)


# --------------------------------------------------------------------------------------------
# exactness and the hook
# --------------------------------------------------------------------------------------------
def _off_and_forced_body(rank: int, world_size: int) -> dict:
    import semimig

    out = {"colossalai": pc.train_losses(pc.boost("llama", TP2, semimig=False), "llama", (0, 1, 2, 3))}
    run = pc.boost("llama", TP2, semimig=True)
    balancer = semimig.enable(run.model, run.plugin, optimizer=run.optimizer, mode="off")
    out["off"] = pc.train_losses(run, "llama", (0, 1, 2, 3))
    out["off_steps"] = (balancer.steps, balancer.report.iteration)
    out["manual_step"] = pc.outcome(balancer.step)
    out["twice"] = pc.outcome(lambda: semimig.enable(run.model, run.plugin, mode="off"))
    balancer.close()
    out["closed_step_is_the_class_method"] = "step" not in vars(run.optimizer)
    pc.train_step(run, pc.batch_for("llama", 4))
    out["steps_after_close"] = balancer.steps

    run = pc.boost("llama", TP2, semimig=True)
    balancer = semimig.enable(run.model, run.plugin, optimizer=run.optimizer, mode="off")
    balancer.controller.force(prune={1: 0.5})
    out["forced"] = pc.train_losses(run, "llama", (0, 1, 2, 3))
    return out


def test_off_trains_exactly_like_colossalai_and_a_forced_prune_does_not(backend: str) -> None:
    out = run_on_ranks(_off_and_forced_body, 2, backend=backend, timeout_s=180)
    # balancing off: the timed dense path runs the same GEMMs and collectives as Colossal-AI's layers
    assert out["off"] == out["colossalai"]
    assert out["off_steps"] == (4, 3)
    assert out["closed_step_is_the_class_method"] and out["steps_after_close"] == 4
    assert out["manual_step"].startswith("ConfigError: balancer.step() is called by the hooked optimizer.step()")
    assert out["twice"].startswith("ConfigError: model HybridParallelModule is already balanced")
    forced, theirs = torch.tensor(out["forced"][0]), torch.tensor(out["colossalai"][0])
    assert (forced - theirs).abs().max() > 1e-3, "pruning half of rank 1's columns must change the loss"


def _refused_then_corrected_body(rank: int, world_size: int) -> dict:
    import semimig

    run = pc.boost("llama", TP2, semimig=True)
    out = {"refused": pc.outcome(lambda: semimig.enable(run.model, run.plugin, optimizer=object())),
           "not_a_model": pc.outcome(lambda: semimig.enable(object(), run.plugin))}
    balancer = semimig.enable(run.model, run.plugin, optimizer=run.optimizer, mode="off")  # the corrected call
    ctl = balancer.controller
    out["bad_force"] = [pc.outcome(lambda a=a: ctl.force(**a)) for a in (
        {"prune": {2: 0.5}}, {"prune": {1: float("nan")}}, {"prune": {1: 1.5}}, {"prune": [1]},
        {"prune": {True: 0.5}}, {"migrate": {"1": 0.5}}, {"prune": {1: 0.6}, "migrate": {1: 0.6}})]
    ctl.force(prune={1: 1.0})  # a forced full prune: rank 1 keeps no column of any layer
    out["full_prune"] = pc.train_losses(run, "llama", (0, 1, 2, 3))
    import torch.distributed as dist

    every = [None] * world_size
    dist.all_gather_object(every, (balancer.report.gamma_target, balancer.report.busy.work_fraction))
    out["targets_and_work"] = every
    balancer.close()
    return out


def test_a_refused_enable_leaves_no_state_and_a_forced_full_prune_trains(backend: str) -> None:
    """A refused enable(optimizer=object()) leaves no directives behind, so the corrected call is not
    refused as 'already balanced'; force(prune={1: 1.0}) trains, every step() without a raise from the
    timing model."""
    out = run_on_ranks(_refused_then_corrected_body, 2, backend=backend, timeout_s=180)
    assert out["refused"].startswith("ConfigError: optimizer must be the boosted optimizer") and "object" in out["refused"]
    assert out["not_a_model"] == "ConfigError: model must be the boosted torch.nn.Module, got object"
    rank, nan, share, mapping, boolean, key, total = out["bad_force"]
    assert rank.startswith("ConfigError: force(prune=...): rank 2 must be an int in [0, 2)")
    assert nan.startswith("ConfigError: force(prune=...): share for rank 1") and "nan" in nan
    assert "1.5" in share and mapping.startswith("ConfigError: force(prune=...) must be a mapping")
    assert boolean.startswith("ConfigError: force(prune=...): rank True") and key.startswith("ConfigError: force(migrate")
    assert total.startswith("ConfigError: force: rank 1 sheds 1.2 > 1")
    losses = [x for x in out["full_prune"][0] if x is not None]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert out["targets_and_work"] == [(0.0, 1.0), (1.0, 0.0)]  # rank 1 really computed nothing


def _differing_calls_body(rank: int, world_size: int) -> list:
    """Review: ranks passing enable() different settings hung in different collectives (reshard's
    gather against the embedding's all-reduce; a batch split's per-step gather on one rank only)."""
    import time

    import semimig
    from semimig.controller.reshard import ReshardConfig

    run = pc.boost("llama", TP2, semimig=True)
    said = []
    for settings in ({"mode": "reshard" if rank == 0 else "off"},
                     {"mode": "reshard", "reshard": ReshardConfig(margin=0.99 if rank == 1 else 0.1)},
                     {"batch": semimig.BatchSplit(global_batch_size=4, allocation="poplar" if rank == 0 else "even")},
                     # a test straggler refused on one rank alone (a bad rank, a typo) is refused on every rank
                     {"mode": "semi", "straggler": "fixed:5:4" if rank == 1 else None},
                     {"mode": "semi", "straggler": "fixed:1" if rank == 1 else "fixed:1:4"}):
        start = time.perf_counter()
        said.append((pc.outcome(lambda: semimig.enable(run.model, run.plugin, optimizer=run.optimizer,
                                                       **settings)), time.perf_counter() - start))
    # a test straggler in one rank's call only is fine (the example injects it in one replica)
    balancer = semimig.enable(run.model, run.plugin, optimizer=run.optimizer, mode="off",
                              straggler="fixed:1:2" if rank == 0 else None)
    balancer.close()
    every = [None] * world_size
    torch.distributed.all_gather_object(every, said)
    return every


def test_ranks_that_call_enable_differently_are_refused_on_every_rank_without_hanging(backend: str) -> None:
    for said in run_on_ranks(_differing_calls_body, 2, backend=backend, timeout_s=180, collective_timeout_s=60):
        (mode, t_mode), (reshard, t_reshard), (batch, t_batch), (rank5, t_rank5), (typo, t_typo) = said
        assert mode.startswith("ConfigError: semimig.enable: the ranks were called with different settings"), mode
        assert "mode: ranks [0] hold 'reshard'; ranks [1] hold 'off'" in mode, mode
        assert "reshard: " in reshard and "margin=0.99" in reshard, reshard
        assert "batch: " in batch and "allocation='even'" in batch, batch
        assert rank5.startswith("ConfigError: straggler ranks [5] do not exist"), rank5
        assert typo.startswith("ConfigError: ") and "fixed:1" in typo, typo
        assert max(t_mode, t_reshard, t_batch, t_rank5, t_typo) < 20


# --------------------------------------------------------------------------------------------
# a straggler is balanced, and it shows
# --------------------------------------------------------------------------------------------
def _straggler_body(rank: int, world_size: int, mode: str, steps: int) -> dict:
    import semimig

    assert not logging.getLogger().handlers, "the test needs an unconfigured logging system"
    captured, saved = io.StringIO(), sys.stderr
    sys.stderr = captured  # Python's last-resort handler writes WARNING records to sys.stderr
    try:
        # semi on a model that takes a plan in units re-shards first (tests/multirank/test_reshard_enable.py);
        # on OPT, which takes none, it is what this test reads: resizing and migration
        name = "opt" if mode == "semi" else "llama"
        run = pc.boost(name, TP2, semimig=True)
        balancer = semimig.enable(run.model, run.plugin, optimizer=run.optimizer, mode=mode,
                                  straggler=FLOPS_STRAGGLER, log_every=5)
        reports = []
        for step in range(steps):
            pc.train_step(run, pc.batch_for(name, step))
            reports.append(balancer.report)
    finally:
        sys.stderr = saved
    return {"stderr": captured.getvalue(), "flagged": [r.flagged for r in reports],
            "shed": [r.decision.shed if r.decision is not None else None for r in reports],
            "last_is_report": balancer.report is reports[-1] and balancer.report.iteration == steps - 1}


@pytest.mark.parametrize("mode", ["semi", "zero-pri", "mig"])
def test_a_straggler_is_flagged_balanced_and_warned_about_once(mode: str, backend: str) -> None:
    out = run_on_ranks(_straggler_body, 2, mode, 14, backend=backend, timeout_s=240)
    assert out["last_is_report"]
    assert any(1 in flagged for flagged in out["flagged"]), out["flagged"]
    assert not any(0 in flagged for flagged in out["flagged"]), "the fast rank must never be flagged"
    assert any(shed is not None and shed[1] > 0 for shed in out["shed"]), out["shed"]
    warnings = [line for line in out["stderr"].splitlines() if "semimig is balancing straggler" in line]
    assert len(warnings) == 1 and "[1]" in warnings[0] and "rank 1 sheds" in warnings[0], out["stderr"][-3000:]


def _info_log_body(rank: int, world_size: int) -> list:
    import semimig

    records: list = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append((record.levelname, record.getMessage()))

    logger = logging.getLogger("semimig.balancer")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    run = pc.boost("llama", TP2, semimig=True)
    semimig.enable(run.model, run.plugin, optimizer=run.optimizer, mode="zero-pri", straggler=FLOPS_STRAGGLER,
                   log_every=4)
    for step in range(8):
        pc.train_step(run, pc.batch_for("llama", step))
    return records


def test_info_logs_name_the_layers_the_first_plan_flags_changes_and_progress(backend: str) -> None:
    records = run_on_ranks(_info_log_body, 2, backend=backend, timeout_s=180)  # rank 0: the TP group's first rank speaks
    text = "\n".join(f"{level} {message}" for level, message in records)
    assert "INFO semimig: 14 semimig layers in a tensor-parallel group of 2, mode=zero-pri, straggler=fixed:1:4" in text
    assert "INFO semimig step 0: first plan: every rank dense" in text
    assert "TP rank 1 flagged as a straggler" in text
    assert "plan changed: rank 1 sheds" in text
    assert text.count("busy ") == 2, text  # log_every=4 over 8 steps


def _pipeline_body(rank: int, world_size: int) -> tuple:
    import semimig

    run = pc.boost("llama", dict(tp_size=2, pp_size=2, num_microbatches=2, precision="fp32"), semimig=True)
    balancer = semimig.enable(run.model, run.plugin, optimizer=run.optimizer, mode="zero-pri")
    balancer.controller.force(prune={1: 0.5})
    losses = pc.train_losses(run, "llama", (0, 1, 2))
    return losses, balancer.steps, balancer.report.gamma_per_layer


def test_a_1f1b_pipeline_balances_each_stage_group(backend: str) -> None:
    losses, steps, gammas = run_on_ranks(_pipeline_body, 4, backend=backend, timeout_s=180)
    assert steps == 3 and len(gammas) == 7  # rank 0 holds stage 0's 7 semimig layers
    assert all(loss is not None for loss in losses[2] + losses[3])
