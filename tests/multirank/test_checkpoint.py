"""Sharded checkpoints with semimig layers are Colossal-AI's checkpoints, and nothing of balancing is in them.

One 2-rank run (tiny Llama, ``HybridParallelPlugin(tp_size=2)``, AdamW) trains 2 steps with
``SemiMigPolicy`` and with Colossal-AI's policy, saves each with
``booster.save_model(..., shard=True)`` and ``booster.save_optimizer(..., shard=True)``, trains 2
more steps (the uninterrupted losses), then resumes every checkpoint into a fresh model of each
kind and trains the same 2 steps:

- semimig -> semimig resumes exactly (the losses of the uninterrupted run);
- semimig -> Colossal-AI and Colossal-AI -> semimig resume to the same losses (fp32, 1e-5 like
  the plugin matrix), and both checkpoints hold the same keys and shapes (and, after the same
  two steps, the same values), so the files cannot tell which layers wrote them;
- the semimig checkpoint is also a Hugging Face checkpoint: ``from_pretrained`` reads it;
- a checkpoint saved while ``semimig.enable`` prunes rank 1 holds the same keys and shapes, and
  a run resumed from it starts its balancer afresh (iteration 0, no flags): priorities, lineage
  and timing history describe the machine, not the model, and are rebuilt after resume
  (:mod:`semimig.balancer`, "Nothing of the balancer is saved").
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import plugin_cases as pc
from _backends import run_pooled  # gloo: the test run's pool of ranks, many cases per spawn

pytestmark = pytest.mark.usefixtures("cpu_path")

TP2 = dict(tp_size=2, pp_size=1, precision="fp32")
KINDS = {"semimig": True, "colossalai": False}


def _save(run: pc.Boosted, directory: str) -> None:
    run.booster.save_model(run.model, os.path.join(directory, "model"), shard=True)
    run.booster.save_optimizer(run.optimizer, os.path.join(directory, "optim"), shard=True)


def _losses(run: pc.Boosted, batches: tuple) -> list:
    return pc.train_losses(run, "llama", batches)[0]  # every TP rank holds the same loss


def _checkpoint_body(rank: int, world_size: int, root: str) -> dict:
    import semimig

    out: dict = {"continued": {}, "resumed": {}}
    for kind, semimig_policy in KINDS.items():
        run = pc.boost("llama", TP2, semimig=semimig_policy)
        _losses(run, (0, 1))
        _save(run, os.path.join(root, kind))
        out["continued"][kind] = _losses(run, (2, 3))
    for saved in KINDS:
        for loaded, semimig_policy in KINDS.items():
            run = pc.boost("llama", TP2, semimig=semimig_policy)
            run.booster.load_model(run.model, os.path.join(root, saved, "model"))
            run.booster.load_optimizer(run.optimizer, os.path.join(root, saved, "optim"))
            out["resumed"][f"{saved}->{loaded}"] = _losses(run, (2, 3))

    # saved while balancing: a forced prune on rank 1, the balancer 2 steps old
    run = pc.boost("llama", TP2, semimig=True)
    balancer = semimig.enable(run.model, run.plugin, optimizer=run.optimizer, mode="zero-pri")
    balancer.controller.force(prune={1: 0.5})
    _losses(run, (0, 1))
    _save(run, os.path.join(root, "balancing"))
    run = pc.boost("llama", TP2, semimig=True)
    run.booster.load_model(run.model, os.path.join(root, "balancing", "model"))
    run.booster.load_optimizer(run.optimizer, os.path.join(root, "balancing", "optim"))
    fresh = semimig.enable(run.model, run.plugin, optimizer=run.optimizer, mode="zero-pri")
    out["fresh_balancer"] = (fresh.steps, fresh.report, fresh.controller.iteration)
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, backend: str) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("checkpoints")
    return root, run_pooled(_checkpoint_body, 2, str(root), backend=backend, timeout_s=300)


def _tensors(directory: Path, index_name: str) -> dict:
    """Every tensor of a sharded checkpoint, by its key (model: parameter name; optimizer: id/state)."""
    index = json.loads((directory / index_name).read_text())
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        for key, value in torch.load(directory / shard, weights_only=False).items():
            if isinstance(value, dict):  # optimizer: {param id: {"step": ..., "exp_avg": ..., ...}}
                out.update({f"{key}.{name}": t for name, t in value.items() if torch.is_tensor(t)})
            else:
                out[key] = value
    return out


def test_semimig_checkpoint_resumes_exactly(checkpoints) -> None:
    _, out = checkpoints
    assert out["resumed"]["semimig->semimig"] == out["continued"]["semimig"]


@pytest.mark.parametrize("direction", ["semimig->colossalai", "colossalai->semimig", "colossalai->colossalai"])
def test_checkpoints_cross_between_semimig_and_colossalai(checkpoints, direction: str) -> None:
    _, out = checkpoints
    saved = direction.split("->")[0]
    # fp32, same GEMMs and collectives at γ = 0: the tolerance of the plugin matrix
    torch.testing.assert_close(torch.tensor(out["resumed"][direction]), torch.tensor(out["continued"][saved]),
                               atol=1e-5, rtol=1e-3)


@pytest.mark.parametrize("part, index", [("model", "pytorch_model.bin.index.json"),
                                         ("optim", "pytorch_optim.bin.index.json")])
def test_both_checkpoints_hold_the_same_keys_shapes_and_values(checkpoints, part: str, index: str) -> None:
    root, _ = checkpoints
    ours, theirs = _tensors(root / "semimig" / part, index), _tensors(root / "colossalai" / part, index)
    assert sorted(ours) == sorted(theirs) and ours
    assert {k: tuple(t.shape) for k, t in ours.items()} == {k: tuple(t.shape) for k, t in theirs.items()}
    for key in ours:  # the same two AdamW steps from the same weights
        torch.testing.assert_close(ours[key], theirs[key], atol=1e-5, rtol=1e-3, msg=lambda m: f"{key}: {m}")


def test_semimig_checkpoint_is_a_hugging_face_checkpoint(checkpoints) -> None:
    from transformers import LlamaForCausalLM

    root, _ = checkpoints
    model = LlamaForCausalLM.from_pretrained(root / "semimig" / "model")
    saved = _tensors(root / "semimig" / "model", "pytorch_model.bin.index.json")
    for name, param in model.named_parameters():
        assert torch.equal(param.detach(), saved[name]), name  # full, unsharded tensors


def test_nothing_of_balancing_is_saved_and_it_restarts_after_resume(checkpoints) -> None:
    root, out = checkpoints
    balancing = _tensors(root / "balancing" / "model", "pytorch_model.bin.index.json")
    plain = _tensors(root / "colossalai" / "model", "pytorch_model.bin.index.json")
    assert {k: tuple(t.shape) for k, t in balancing.items()} == {k: tuple(t.shape) for k, t in plain.items()}
    assert sorted(os.listdir(root / "balancing" / "model")) == sorted(os.listdir(root / "colossalai" / "model"))
    steps, report, iteration = out["fresh_balancer"]
    assert (steps, report, iteration) == (0, None, 0)


def _gpt2_checkpoint_body(rank: int, world_size: int, root: str) -> dict:
    """GPT-2's packed c_attn gathers its shards to save (the CPU shim's item 7): semimig saves,
    both kinds resume to the same losses."""
    run = pc.boost("gpt2", TP2, semimig=True)
    pc.train_losses(run, "gpt2", (0,))
    _save(run, root)
    continued = pc.train_losses(run, "gpt2", (1, 2))[0]
    resumed = {}
    for kind, semimig_policy in KINDS.items():
        fresh = pc.boost("gpt2", TP2, semimig=semimig_policy)
        fresh.booster.load_model(fresh.model, os.path.join(root, "model"))
        fresh.booster.load_optimizer(fresh.optimizer, os.path.join(root, "optim"))
        resumed[kind] = pc.train_losses(fresh, "gpt2", (1, 2))[0]
    return {"continued": continued, "resumed": resumed}


def test_gpt2_packed_layers_save_on_cpu_and_resume_in_both_kinds(tmp_path: Path, backend: str) -> None:
    out = run_pooled(_gpt2_checkpoint_body, 2, str(tmp_path), backend=backend, timeout_s=300)
    assert out["resumed"]["semimig"] == out["continued"]
    assert out["resumed"]["colossalai"] == pytest.approx(out["continued"], rel=1e-5)
