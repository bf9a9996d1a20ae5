"""Checkpoints under uneven tensor-parallel shards are Colossal-AI's even checkpoints (DESIGN §8).

``booster.save_model``/``save_optimizer`` under ``SemiMigPolicy(shard_plan=UnevenPlan(...))`` and
loading them into stock Colossal-AI (``HybridParallelPlugin`` with its default policy), into
another plan and into the same plan; and a stock checkpoint loaded under plans.  Two ranks, gloo,
``tp_size=2``, tiny Llama (GQA: 8 query, 4 KV heads) and tiny GPT-2 (fused ``c_attn``), AdamW.

Every source trains 2 steps, saves (sharded; the Llama sources also unsharded), then trains 2 more
(the uninterrupted losses).  Each target is a fresh model built from the same seed (its AdamW has
no state until it loads one, so a load that did nothing fails), loads, and then:

- every parameter, ``exp_avg``, ``exp_avg_sq`` and ``step``, each gathered to the full tensor by
  the target's own layout (Colossal-AI's ``to_global``/``gather_fn`` for its shards, the plan's
  ``gather_fn`` for ours), equals the source's gathered at save time, bit for bit (a load copies);
  GPT-2's packed ``c_attn`` checks the optimizer file's rank-major order against stock's reading;
- the 2 training steps after the load give the source's continued losses: exactly when the layout
  is the source's (fp32), and within reassociation otherwise.  fp32: an uneven plan changes only the
  order of the sums over the intermediate dimension and the heads' columns, measured ≤ 4.8e-7 on
  these losses (~4.87); ``atol = 5e-6``.  bf16: Colossal-AI never saves the fp32 masters (it rebuilds
  them from the bf16 weights on load, stock -> stock included), so every resume drifts by bf16
  rounding of the weights; measured ≤ 3.8e-4, ``atol = 2e-3``.

The model files are also the dense model's: ``from_pretrained`` reads the sharded one and
``load_state_dict(strict=True)`` the unsharded one; and a dense ``save_pretrained`` checkpoint loads
under a plan.  Under ZeRO-1 (bf16, dp = 1 here) the same round trips hold.  After a re-plan (the
MLP shards and moments moved by hand, fresh shard functions attached) the files are still the
dense model's.  The stock model's files are bit-equal with semimig's patch installed and without.  A truncated checkpoint file is refused in one
line naming it (Colossal-AI alone raises ``torch.load``'s error deep inside, naming no file).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from _backends import run_on_ranks

pytestmark = pytest.mark.usefixtures("cpu_path")

from tiny_lms import BATCH, SEQ, VOCAB, boost_lm, gather_like, tiny_lm, train_steps  # noqa: E402,F401
SAME_LAYOUT = dict(atol=0.0, rtol=0.0)
REASSOCIATION = {"fp32": dict(atol=5e-6, rtol=0.0), "bf16": dict(atol=2e-3, rtol=0.0)}
PLANS = {  # (mlp_units, kv_units, block_size) per rank of 2: "plan" saves, "other" only loads
    "llama": {"plan": ((3, 1), (3, 1), 64), "other": ((1, 3), (1, 3), 64)},
    "gpt2": {"plan": ((3, 1), (5, 3), 64), "other": ((1, 7), (3, 5), 32)},
}


def _boost(name, layout, precision, zero_stage=0):
    """``layout``: ``"stock"`` (Colossal-AI's policy) or a key of :data:`PLANS`."""
    from semimig.shardformer import SemiMigPolicy, UnevenPlan

    policy = None
    if layout != "stock":
        mlp, kv, block = PLANS[name][layout]
        policy = SemiMigPolicy(shard_plan=UnevenPlan(mlp_units=mlp, kv_units=kv, block_size=block))
    booster, model, optimizer, _ = boost_lm(tiny_lm(name), precision=precision, policy=policy, zero_stage=zero_stage)
    return booster, model, optimizer


def _train(run, steps):
    booster, model, optimizer = run
    return train_steps(booster, model, optimizer, steps)


def _full_states(run):
    """Every parameter and its AdamW state, full (gathered by the run's own layout); fp32 masters too."""
    _, model, optimizer = run
    to_master = optimizer.get_working_to_master_map() if hasattr(optimizer, "get_working_to_master_map") else None
    out = {}
    for name, param in model.unwrap().named_parameters():
        master = to_master[id(param)] if to_master else param
        state = optimizer.optim.state[master]
        entry = {"weight": gather_like(param, param.data), "step": float(state["step"])}
        for key in ("exp_avg", "exp_avg_sq"):
            value = state[key]
            if value.shape != param.shape:  # ZeRO: flat dp shard (dp = 1 here: the whole TP shard, padded)
                value = value[: param.numel()].reshape(param.shape)
            entry[key] = gather_like(param, value)
            assert entry[key].dtype == torch.float32, (name, key, entry[key].dtype)
        if master is not param:
            entry["master"] = gather_like(param, master.data[: param.numel()].reshape(param.shape))
        out[name] = entry
    return out


def _save(run, root, *, unsharded=False):
    booster, model, optimizer = run
    booster.save_model(model, os.path.join(root, "model"), shard=True, size_per_shard=1)
    booster.save_optimizer(optimizer, os.path.join(root, "optim"), shard=True, size_per_shard=1)
    if unsharded:
        booster.save_model(model, os.path.join(root, "model.bin"), shard=False)
        booster.save_optimizer(optimizer, os.path.join(root, "optim.bin"), shard=False)


def _save_unpatched(run, root):
    """Save with Colossal-AI's own methods (what :func:`semimig.shardformer.uneven_ckpt.install` wrapped)."""
    from colossalai.checkpoint_io.hybrid_parallel_checkpoint_io import HybridParallelCheckpointIO as IO

    patched = IO.__dict__["gather_from_sharded_optimizer_state"]
    assert getattr(patched.__func__, "semimig_uneven_ckpt", False)  # installed by the semimig policy
    IO.gather_from_sharded_optimizer_state = staticmethod(patched.__func__.__wrapped__)
    try:
        _save(run, root)
    finally:
        IO.gather_from_sharded_optimizer_state = patched


def _load(run, root, *, unsharded=False):
    booster, model, optimizer = run
    booster.load_model(model, os.path.join(root, "model.bin" if unsharded else "model"))
    booster.load_optimizer(optimizer, os.path.join(root, "optim.bin" if unsharded else "optim"))


def _round_trip_body(rank, world, name, precision, root, targets, zero_stage=0):
    """Sources ``plan`` and ``stock`` save after steps 0, 1 and continue with 2, 3; each target
    ``(source, layout, unsharded)`` loads and trains 2, 3."""
    import torch.distributed as dist

    out = {"source": {}, "continued": {}, "target": {}, "loaded": {}}
    for source in ("plan", "stock"):
        run = _boost(name, source, precision, zero_stage)
        _train(run, (0, 1))
        out["source"][source] = _full_states(run)
        _save(run, os.path.join(root, source), unsharded=True)
        if source == "stock":
            _save_unpatched(run, os.path.join(root, "stock-unpatched"))
        out["continued"][source] = _train(run, (2, 3))
    dist.barrier()
    for source, layout, unsharded in targets:
        run = _boost(name, layout, precision, zero_stage)
        _load(run, os.path.join(root, source), unsharded=unsharded)
        key = f"{source}->{layout}" + (" unsharded" if unsharded else "")
        out["loaded"][key] = _full_states(run)
        out["target"][key] = _train(run, (2, 3))
    if rank == 0:  # tensors through a file: the pipe would share their storage with a process that exits
        torch.save(out, os.path.join(root, "results.pt"))


def _move_mlp_shards(run, units, block):
    """What a re-plan does to the Llama MLP shards, by hand: every rank's ``gate/up/down`` weights and
    AdamW moments re-cut to ``units`` blocks of ``block``, and fresh shard functions attached."""
    import torch.distributed as dist

    from semimig.sharding.plan import ShardPlan
    from semimig.sharding.split import shard_functions

    booster, model, optimizer = run
    group = booster.plugin.tp_group
    plan = ShardPlan(units=units, unit_size=block)
    for name, param in model.unwrap().named_parameters():
        if ".mlp." not in name:
            continue
        dim = 1 if "down_proj" in name else 0
        shard_fn, gather_fn = shard_functions(plan, dist.get_rank(group), dim=dim, group=group)
        state = optimizer.optim.state[param]
        for key in ("exp_avg", "exp_avg_sq"):
            state[key] = shard_fn(param.gather_fn(state[key]))
        param.data = shard_fn(param.gather_fn(param.data))
        param.shard_fn, param.gather_fn = shard_fn, gather_fn


def _replanned_body(rank, world, root):
    """Train under one plan, move the MLP shards to another, save; load into stock Colossal-AI."""
    import torch.distributed as dist

    run = _boost("llama", "plan", "fp32")
    _train(run, (0, 1))
    before = _full_states(run)
    _move_mlp_shards(run, (1, 3), 64)
    widths = tuple(run[1].unwrap().model.layers[0].mlp.up_proj.weight.shape)
    after = _full_states(run)
    _save(run, root)
    dist.barrier()
    stock = _boost("llama", "stock", "fp32")
    _load(stock, root)
    if rank == 0:
        torch.save({"before": before, "after": after, "loaded": _full_states(stock), "widths": widths},
                   os.path.join(root, "results.pt"))
    else:
        _full_states(stock)  # the gathers are collective


def test_checkpoints_follow_a_replan(tmp_path: Path, backend: str):
    """The shard functions are read at save time: after a move the files are still the dense model's."""
    run_on_ranks(_replanned_body, 2, str(tmp_path), backend=backend, timeout_s=300)
    out = torch.load(tmp_path / "results.pt", weights_only=False)
    assert out["widths"] == (64, 64)  # rank 0 went from 3 blocks of 64 to 1
    _assert_states_equal(out["after"], out["before"], "the move itself")
    _assert_states_equal(out["loaded"], out["before"], "saved after the move, loaded into stock")


def _hugging_face_body(rank, world, root, name):
    """A dense Hugging Face checkpoint (``save_pretrained``, safetensors, weights moved off the seed's)
    loaded by ``booster.load_model`` under a plan; the full weights of every rank's model come back."""
    import torch.distributed as dist

    if rank == 0:
        dense = tiny_lm(name)
        with torch.no_grad():
            for param in dense.parameters():
                param.add_(torch.randn_like(param))
        dense.save_pretrained(os.path.join(root, "hf"), safe_serialization=True)
    dist.barrier()
    run = _boost(name, "plan", "fp32")
    run[0].load_model(run[1], os.path.join(root, "hf", "model.safetensors"))
    widths = tuple(p.shape for n, p in run[1].unwrap().named_parameters() if n.endswith("mlp.c_fc.weight")
                   or n.endswith("mlp.up_proj.weight"))[:1]
    weights = {n: e["weight"] for n, e in _full_states_after_step(run).items()}
    if rank == 0:
        torch.save({"weights": weights, "widths": widths}, os.path.join(root, "results.pt"))


def _full_states_after_step(run):
    """:func:`_full_states` needs AdamW's state: a step at lr 0 creates it and leaves the weights."""
    booster, model, optimizer = run
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    _train(run, (0,))
    return _full_states(run)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_dense_hugging_face_checkpoint_loads_under_a_plan(tmp_path: Path, name: str, backend: str):
    from safetensors.torch import load_file

    run_on_ranks(_hugging_face_body, 2, str(tmp_path), name, backend=backend, timeout_s=300)
    out = torch.load(tmp_path / "results.pt", weights_only=False)
    assert out["widths"][0] == ((192, 64) if name == "llama" else (64, 192))  # rank 0 holds 3 of 4 blocks
    saved = load_file(tmp_path / "hf" / "model.safetensors")
    assert out["weights"]
    for param_name, weight in out["weights"].items():
        assert torch.equal(weight, saved[param_name]), param_name


BAD_FILES = {  # what is truncated: (part, file name pattern)
    "model shard": ("model", "pytorch_model-"), "model index": ("model", ".index.json"),
    "optimizer shard": ("optim", "pytorch_optim-"), "optimizer groups": ("optim", "pytorch_optim_group"),
}


def _bad_file_body(rank, world, root):
    """Load checkpoints with one file truncated each (:data:`BAD_FILES`); return what each load raised."""
    import torch.distributed as dist

    run = _boost("llama", "plan", "fp32")
    _train(run, (0,))
    _save(run, os.path.join(root, "good"))
    dist.barrier()
    out = {}
    for case, (part, pattern) in BAD_FILES.items():
        bad = os.path.join(root, case.replace(" ", "-"))
        if rank == 0:
            shutil.copytree(os.path.join(root, "good"), bad)
            victim = sorted(p for p in os.listdir(os.path.join(bad, part)) if pattern in p)[-1]
            path = os.path.join(bad, part, victim)
            with open(path, "r+b") as handle:
                handle.truncate(os.path.getsize(path) // 2)
            out[case] = (path,)
        dist.barrier()
        fresh = _boost("llama", "plan", "fp32")
        try:
            _load(fresh, bad)
            outcome = ("loaded", "")
        except Exception as err:  # noqa: BLE001 - the test reports what was raised
            outcome = (type(err).__name__, str(err))
        out[case] = out.get(case, ("",)) + outcome
    return out


LLAMA_TARGETS = (("plan", "stock", False), ("plan", "stock", True), ("plan", "plan", False),
                 ("plan", "other", False), ("stock", "plan", False), ("stock", "other", True),
                 ("stock", "stock", False))
SHORT_TARGETS = (("plan", "stock", False), ("plan", "plan", False), ("stock", "plan", False),
                 ("stock", "other", False), ("stock", "stock", False))
CASES = {"llama-fp32": ("llama", "fp32", LLAMA_TARGETS), "gpt2-fp32": ("gpt2", "fp32", SHORT_TARGETS),
         "llama-bf16": ("llama", "bf16", SHORT_TARGETS),
         "llama-bf16-zero1": ("llama", "bf16", SHORT_TARGETS, 1)}


@pytest.fixture(scope="module", params=list(CASES))
def round_trip(request, tmp_path_factory, backend: str):
    name, precision, targets, *zero_stage = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    run_on_ranks(_round_trip_body, 2, name, precision, str(root), targets, *zero_stage, backend=backend, timeout_s=400)
    return name, precision, root, torch.load(root / "results.pt", weights_only=False)


def _assert_states_equal(got, want, what):
    assert sorted(got) == sorted(want), what
    for param, entry in want.items():
        for key, value in entry.items():
            if key == "master":
                continue
            same = torch.equal(got[param][key], value) if torch.is_tensor(value) else got[param][key] == value
            assert same, f"{what}: {param}.{key}"


def test_every_tensor_survives_every_round_trip(round_trip):
    name, precision, _, out = round_trip
    for key, loaded in out["loaded"].items():
        source = key.split("->")[0]
        _assert_states_equal(loaded, out["source"][source], key)
        for param, entry in loaded.items():
            if "master" in entry:  # Colossal-AI rebuilds the fp32 masters from the loaded bf16 weights
                assert torch.equal(entry["master"], entry["weight"].float()), f"{key}: {param} master"
    # the plan really is uneven and the checkpoint really came from training (moments non-zero)
    some = next(iter(out["source"]["plan"].values()))
    assert some["exp_avg"].abs().sum() > 0 and int(some["step"]) == 2


def test_training_after_a_load_continues_the_source_run(round_trip):
    name, precision, _, out = round_trip
    for key, losses in out["target"].items():
        source, layout = key.split(" ")[0].split("->")
        want = out["continued"][source]
        # bf16: the fp32 masters are rebuilt from the bf16 weights on load, so even the same layout drifts
        tol = SAME_LAYOUT if source == layout and precision == "fp32" else REASSOCIATION[precision]
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want), **tol, msg=lambda m: f"{key}: {m}")


def _file_tensors(directory: Path, index_name: str) -> dict:
    import json

    weight_map = json.loads((directory / index_name).read_text())["weight_map"]
    out = {}
    for shard in sorted(set(weight_map.values())):
        for key, value in torch.load(directory / shard, weights_only=False).items():
            if isinstance(value, dict):
                out.update({f"{key}.{k}": v for k, v in value.items() if torch.is_tensor(v)})
            else:
                out[key] = value
    return out


INDEX = {"model": "pytorch_model.bin.index.json", "optim": "pytorch_optim.bin.index.json"}


def test_uneven_checkpoint_files_are_the_stock_files(round_trip):
    """Same keys and shapes as stock's checkpoint, tensor by tensor (model and optimizer)."""
    _, _, root, _ = round_trip
    for part, index in INDEX.items():
        ours, theirs = _file_tensors(root / "plan" / part, index), _file_tensors(root / "stock" / part, index)
        assert {k: tuple(t.shape) for k, t in ours.items()} == {k: tuple(t.shape) for k, t in theirs.items()}
        assert ours, part


def test_other_parameters_are_saved_by_colossalai_bit_for_bit(round_trip):
    """The stock model's files are the same with the patch installed and without it."""
    _, _, root, _ = round_trip
    for part, index in INDEX.items():
        ours = _file_tensors(root / "stock" / part, index)
        theirs = _file_tensors(root / "stock-unpatched" / part, index)
        assert sorted(ours) == sorted(theirs) and ours
        for key in ours:
            assert torch.equal(ours[key], theirs[key]), key


def test_model_files_are_the_dense_hugging_face_model(round_trip):
    import transformers as T

    name, precision, root, out = round_trip
    if precision != "fp32":
        pytest.skip("the fp32 cases cover the files' form")
    cls = T.LlamaForCausalLM if name == "llama" else T.GPT2LMHeadModel
    want = out["source"]["plan"]
    sharded = cls.from_pretrained(root / "plan" / "model")
    dense = tiny_lm(name)
    dense.load_state_dict(torch.load(root / "plan" / "model.bin", weights_only=False), strict=True)
    for model in (sharded, dense):
        for param_name, param in model.named_parameters():
            assert torch.equal(param.detach(), want[param_name]["weight"]), param_name


def test_a_truncated_checkpoint_file_is_named_in_one_line(tmp_path: Path, backend: str):
    out = run_on_ranks(_bad_file_body, 2, str(tmp_path), backend=backend, timeout_s=300)
    assert sorted(out) == sorted(BAD_FILES)
    for case, (path, kind, message) in out.items():
        assert kind == "ConfigError", (case, kind, message)
        assert "\n" not in message and path in message and "cannot be read" in message, (case, message)


# ----------------------------------------------------------------------------- pure parts (one process)
@pytest.mark.parametrize("tp, parts, dim", [(2, [8, 8, 8], 1), (4, [8, 4, 4], 0), (2, [6], 0), (3, [6, 3], 1)])
def test_file_order_is_colossalai_rank_major_order(tp, parts, dim):
    """Rank r holds the r-th even chunk of every part (Colossal-AI's packed layout); its file is the ranks'
    shards concatenated; from_file_order inverts it."""
    from semimig.shardformer.uneven_ckpt import from_file_order, to_file_order

    shape = [5, 5]
    shape[dim] = sum(parts)
    full = torch.arange(float(shape[0] * shape[1])).reshape(shape)
    shards = [torch.cat([part.chunk(tp, dim=dim)[r] for part in full.split(parts, dim=dim)], dim=dim)
              for r in range(tp)]
    saved = to_file_order(full, parts, tp, dim=dim)
    assert torch.equal(saved, torch.cat(shards, dim=dim))
    assert torch.equal(from_file_order(saved, parts, tp, dim=dim), full)


def test_file_order_is_the_true_order_when_no_even_layout_exists():
    from semimig.shardformer.uneven_ckpt import from_file_order, to_file_order

    full = torch.arange(10.0).reshape(1, 10)
    assert torch.equal(to_file_order(full, [5, 5], 2, dim=1), full)  # 5 does not divide by 2
    assert torch.equal(from_file_order(full, [5, 5], 2, dim=1), full)


def test_split_dim_and_semimig_shard_recognition():
    from semimig.errors import ConfigError
    from semimig.sharding.plan import ShardPlan
    from semimig.sharding.split import shard_functions
    from semimig.shardformer.uneven_ckpt import is_semimig_shard, split_dim

    assert split_dim((3, 4), (8, 4)) == 0 and split_dim((8, 2), (8, 4)) == 1 and split_dim((8, 4), (8, 4)) is None
    with pytest.raises(ConfigError, match="more than one dimension"):
        split_dim((3, 2), (8, 4))
    param = torch.nn.Parameter(torch.zeros(3, 4))
    assert not is_semimig_shard(param)
    param.shard_fn, param.gather_fn = (lambda t: t), (lambda t: t)  # somebody else's customised tensor
    assert not is_semimig_shard(param)
    param.shard_fn, param.gather_fn = shard_functions(ShardPlan(units=(3, 5)), 0, dim=0)
    assert is_semimig_shard(param)


def test_install_is_idempotent_and_keeps_colossalai_reachable():
    from colossalai.checkpoint_io import hybrid_parallel_checkpoint_io as hpcio

    from semimig.shardformer import uneven_ckpt

    uneven_ckpt.install()
    first = {name: hpcio.HybridParallelCheckpointIO.__dict__[name] for name in
             ("gather_from_sharded_optimizer_state", "load_states_into_optimizer", "load_sharded_optimizer")}
    readers = (hpcio.load_shard_state_dict, hpcio.load_state_dict, hpcio.CheckpointIndexFile)
    uneven_ckpt.install()
    assert all(hpcio.HybridParallelCheckpointIO.__dict__[name] is fn for name, fn in first.items())
    assert (hpcio.load_shard_state_dict, hpcio.load_state_dict, hpcio.CheckpointIndexFile) == readers
    gather = first["gather_from_sharded_optimizer_state"].__func__
    assert gather.__wrapped__.__module__ == "colossalai.checkpoint_io.hybrid_parallel_checkpoint_io"
