"""Re-sharding under a pipeline: ``pp_size=2 x tp_size=2`` (1F1B), each stage's TP group planning for itself.

4 ranks, gloo, fp32, a Llama of 4 decoder layers (2 per stage; hidden 128, 4 heads / 2 KV groups,
intermediate 1024 = 32 blocks of 32 columns), 2 micro-batches per step.  A straggler whose GEMMs are
charged at a fixed nominal rate (:data:`STRAGGLER`) is injected on TP rank 1 of stage 1 only
(``semimig.enable`` takes a rank's own test straggler), so stage 1's TP group re-plans from its
steps and stage 0's keeps the even plan.  Every run trains the same batches from the same seed:

- the re-sharded run's losses and every parameter after the last step equal the healthy pipeline's
  (``mode="off"``) within fp32 reassociation (an uneven split only reorders sums over the
  intermediate dimension and the heads' columns), and the healthy pipeline's equal a dense
  single-process reference (the same model and optimizer on the whole batch: 1F1B averages the two
  micro-batches' mean losses, equal token counts, so only the order of sums differs);
- with no straggler nothing moves and the run equals Colossal-AI's own pp 2 x tp 2 (its policy, no
  semimig) bit for bit;
- a checkpoint saved after the move loads into the even plan with every parameter bit-equal (the
  files are Colossal-AI's full tensors, whatever the plan);
- mode semi runs a re-sharder per stage too;
- the training binary (``benchmarks/llm_run.py --pp 2 --tp 2``) re-plans stage 1 only and trains and
  validates as ``--balance off`` does.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from _backends import run_on_ranks
from tiny_lms import VOCAB, token_batch

pytestmark = pytest.mark.usefixtures("cpu_path")

BLOCK = 32
HIDDEN, INTERMEDIATE, LAYERS = 256, 1024, 4
STEPS = 14
# GEMM time charged at a nominal rate (a quarter of 2e10 FLOP/s): the same every step, so a loaded machine's
# noise cannot hide it; the device probe is not slowed by it and reads only the machine's load (four ranks on
# two cores), so it is off and the steps decide
STRAGGLER = "fixed:1:4:mode=flops:flops=2e10"
WINDOW = 4  # a first slow rank is flagged once a window holds more than the policy's 3-step minimum
# fp32 reassociation (the uneven split's sums over the intermediate dimension and the heads' columns, 1F1B's
# micro-batch means); SGD with momentum is linear in the gradients, so the weights keep differences of that
# size (AdamW's normalisation would magnify them where a gradient is near zero)
TOL = dict(atol=2e-5, rtol=1e-4)


def _optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _model():
    import transformers as T

    torch.manual_seed(0)
    return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                                            num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                                            max_position_embeddings=64))


def _batch(step):
    return token_batch(step, seq=64)


def _boost(semimig: bool):
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    from semimig.resharder import even_reshardable_plan
    from semimig.shardformer import SemiMigPolicy

    model = _model()
    policy = SemiMigPolicy(shard_plan=even_reshardable_plan(model.config, 2, block_size=BLOCK)) if semimig else None
    plugin = HybridParallelPlugin(tp_size=2, pp_size=2, num_microbatches=2, precision="fp32", custom_policy=policy)
    booster = Booster(plugin=plugin)
    optimizer = _optimizer(model)
    model, optimizer, *_ = booster.boost(model, optimizer)
    return booster, model, optimizer, plugin


def _step(booster, model, optimizer, step):
    out = booster.execute_pipeline(iter([_batch(step)]), model, lambda o, i: o.loss, optimizer, return_loss=True)
    optimizer.step()
    optimizer.zero_grad()
    return None if out["loss"] is None else float(out["loss"].detach())


def _params(model) -> dict:
    """This stage's parameters (Colossal-AI drops the other stages'), each gathered to its full tensor, as
    numpy arrays (a plain pickle back to the test: torch's would share memory with an exiting rank)."""
    from tiny_lms import gather_like

    return {name: gather_like(param, param.data).numpy() for name, param in model.unwrap().named_parameters()}


def _everywhere(mine):
    import torch.distributed as dist

    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def _run(mode, straggler_on_stage, *, semimig=True, save=None, steps=STEPS):
    """Train ``steps``; every rank's ``(stage, tp rank, losses, params, reshard summary)``."""
    import semimig as sm
    from semimig.controller.reshard import ReshardConfig

    booster, model, optimizer, plugin = _boost(semimig)
    stage = plugin.stage_manager.stage
    balancer = None
    if semimig:
        straggler = STRAGGLER if stage == straggler_on_stage else None
        balancer = sm.enable(model, plugin, optimizer=optimizer, mode=mode, straggler=straggler,
                             reshard=ReshardConfig(window=WINDOW, block_size=BLOCK, probe=0.0))
    losses = [_step(booster, model, optimizer, step) for step in range(steps)]
    summary = balancer.reshard_summary if balancer is not None else None
    if save is not None:
        booster.save_model(model, save, shard=True, size_per_shard=1)
    if balancer is not None:
        balancer.close()
    import torch.distributed as dist

    from semimig.resharder.plans import held_layers

    return {"stage": int(stage), "tp_rank": dist.get_rank(plugin.tp_group), "losses": losses, "params": _params(model),
            "summary": summary, "held": held_layers(model.unwrap(), model.unwrap().config) if semimig else None}


def _dense():
    model = _model()
    optimizer = _optimizer(model)
    losses = []
    for step in range(STEPS):
        loss = model(**_batch(step)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses, {name: p.detach().numpy().copy() for name, p in model.named_parameters()}


def _load_even(root):
    booster, model, optimizer, plugin = _boost(True)
    booster.load_model(model, root)
    return {"params": _params(model)}


def _body(rank, world, root):
    out = {"healthy": _everywhere(_run("off", None)),
           "reshard": _everywhere(_run("reshard", 1, save=os.path.join(root, "model"))),
           "calm": _everywhere(_run("reshard", None)),
           "stock": _everywhere(_run("off", None, semimig=False)),
           "semi": _everywhere(_run("semi", 1, steps=4))}
    out["loaded"] = _everywhere(_load_even(os.path.join(root, "model")))
    if rank == 0:
        out["dense"] = _dense()
    return out


def _merged(ranks) -> dict:
    """Every stage's parameters in one dict (a stage's TP ranks hold the same full tensors)."""
    out = {}
    for r in ranks:
        out.update({name: torch.from_numpy(array) for name, array in r["params"].items()})
    return out


def _last_stage_losses(ranks):
    return next(r["losses"] for r in ranks if r["losses"][0] is not None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pp_reshard")
    return run_on_ranks(_body, 4, str(root), timeout_s=600)


def test_the_slow_stage_replans_and_the_other_stage_keeps_its_plan(runs):
    for r in runs["reshard"]:
        summary = r["summary"]
        if r["stage"] == 1:
            assert summary["replans"] >= 1, summary
            first = summary["events"][0]
            assert first["mlp_units"][1] < first["mlp_units"][0], first
            assert sum(first["mlp_units"]) == INTERMEDIATE // BLOCK and sum(first["kv_units"]) == 2, first
        else:
            assert summary["replans"] == 0, summary
            assert summary["plan"] == str(runs["calm"][0]["summary"]["plan"]), summary
    # each stage holds (and a unit weighs over) its own 2 of the 4 decoder layers
    assert [r["held"] for r in runs["reshard"]] == [LAYERS // 2] * 4
    # both TP ranks of a stage took the same decisions
    by_stage = {}
    for r in runs["reshard"]:
        by_stage.setdefault(r["stage"], []).append(r["summary"]["plan"])
    assert all(len(set(plans)) == 1 for plans in by_stage.values()), by_stage


def test_the_resharded_pipeline_trains_exactly(runs):
    healthy, reshard = _last_stage_losses(runs["healthy"]), _last_stage_losses(runs["reshard"])
    torch.testing.assert_close(torch.tensor(reshard), torch.tensor(healthy), **TOL)
    want, got = _merged(runs["healthy"]), _merged(runs["reshard"])
    assert want.keys() == got.keys() and len(want) > 0
    for name in want:
        torch.testing.assert_close(got[name], want[name], **TOL, msg=lambda m, name=name: f"{name}: {m}")


def test_the_healthy_pipeline_equals_the_dense_reference(runs):
    dense_losses, dense_params = runs["dense"]
    torch.testing.assert_close(torch.tensor(_last_stage_losses(runs["healthy"])), torch.tensor(dense_losses), **TOL)
    got = _merged(runs["healthy"])
    assert got.keys() == dense_params.keys()
    for name, want in dense_params.items():
        torch.testing.assert_close(got[name], torch.from_numpy(want), **TOL, msg=lambda m, name=name: f"{name}: {m}")


def test_no_straggler_moves_nothing_and_equals_colossalai_bit_for_bit(runs):
    assert all(r["summary"]["replans"] == 0 for r in runs["calm"]), [r["summary"] for r in runs["calm"]]
    assert _last_stage_losses(runs["calm"]) == _last_stage_losses(runs["stock"])
    want, got = _merged(runs["stock"]), _merged(runs["calm"])
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=0.0, rtol=0.0, msg=lambda m, name=name: f"{name}: {m}")


def test_mode_semi_runs_a_resharder_per_stage(runs):
    """Mode semi re-shards under a pipeline too (it resizes and prunes as well, so it is not exact)."""
    for r in runs["semi"]:
        assert r["summary"] is not None and r["summary"]["plan"].startswith("UnevenPlan"), r["summary"]
    losses = _last_stage_losses(runs["semi"])
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses), losses


def test_a_checkpoint_saved_after_the_move_loads_into_the_even_plan(runs):
    want, got = _merged(runs["reshard"]), _merged(runs["loaded"])
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=0.0, rtol=0.0, msg=lambda m, name=name: f"{name}: {m}")


# ----------------------------------------------------------------------------- the training binary, end to end
BINARY_FLAGS = ["--pp", "2", "--tp", "2", "--hidden", "256", "--layers", "4", "--heads", "4", "--kv-heads", "2",
                "--seq-len", "64", "--batch-size", "4", "--steps", "12", "--data", "synthetic", "--eval-every", "6",
                "--eval-batches", "2", "--timeout-s", "120", "--shard-block", "32", "--reshard-window", "4",
                "--log-every", "6"]


def _binary(tmp_path: Path, name: str, *flags: str) -> dict:
    import json

    from example_ranks import run_example

    out = tmp_path / f"{name}.json"
    done = run_example([*BINARY_FLAGS, *flags, "--json", str(out)], ranks=4, timeout_s=400)
    assert done.returncode == 0, f"exit {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}"
    return json.loads(out.read_text())


def test_the_binary_trains_a_pipeline_and_replans_the_slow_stage(tmp_path: Path) -> None:
    """``--pp 2 --tp 2``: the losses (the last stage's, sent to rank 0) and validation losses of
    ``--balance reshard`` with the straggler in stage 1 equal ``--balance off``'s; the record holds
    each stage's re-plans, stage 1's only."""
    off = _binary(tmp_path, "off", "--balance", "off")
    run = _binary(tmp_path, "reshard", "--balance", "reshard", "--straggler", STRAGGLER, "--straggler-stage", "1")
    summary = run["summary"]
    assert summary["pp"] == 2 and summary["replans"] >= 1, summary
    stages = summary["reshard"]["stages"]
    assert stages[0]["replans"] == 0 and stages[1]["replans"] >= 1, stages
    assert {e["stage"] for e in summary["reshard"]["events"]} == {1}
    torch.testing.assert_close(torch.tensor(run["losses"]), torch.tensor(off["losses"]), **TOL)
    torch.testing.assert_close(torch.tensor([v for _, v in run["val_losses"]]),
                               torch.tensor([v for _, v in off["val_losses"]]), **TOL)
    assert len(off["val_losses"]) == 2 and len(run["losses"]) == 12
