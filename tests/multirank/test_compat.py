"""semimig._compat: the Colossal-AI version range, and the CPU shim is needed and sufficient.

"Needed": one fresh interpreter (this file run as a script, see ``_probe_cpu_gaps``) that has
not imported ``semimig.nn`` reproduces each gap with Colossal-AI's own error, checks that
``import semimig`` leaves them alone, applies the shim and repeats the same calls.
"Sufficient": with the shim, HybridParallelPlugin(tp_size=2) trains a tiny ViT exactly like a
dense single-process model, and LowLevelZeroPlugin stage 1/2 matches dense Adam, on 2 ranks.
The legacy engine is covered in ``test_legacy_launch.py``; pipeline parallelism, fp16 and GPT-2
under ``HybridParallelPlugin`` (shim items 4-6) in ``test_plugin_matrix.py``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch

from dist_harness import run_on_ranks

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU shim is a no-op with CUDA")

REPO = Path(__file__).resolve().parents[2]
DROPOUT_FAILURE = (
    "Failed to replace dropout of type Dropout with DropoutForReplicatedInput with the exception: "
    "get_rng_state() takes 0 positional arguments but 1 was given"
)


# --------------------------------------------------------------------------------------------
# version range
# --------------------------------------------------------------------------------------------
def test_installed_colossalai_is_supported() -> None:
    import importlib.metadata

    from semimig._compat import check_colossalai_version

    assert check_colossalai_version() == importlib.metadata.version("colossalai")


@pytest.mark.parametrize("version", ["0.4.7", "0.5.0", "0.5.3.post1"])
def test_versions_inside_the_range_pass(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    import colossalai

    from semimig._compat import check_colossalai_version

    monkeypatch.setattr(colossalai, "__version__", version)
    assert check_colossalai_version() == version


@pytest.mark.parametrize("version", ["0.3.9", "0.4.6", "0.6.0", "0.6.0rc1", "1.0.0"])
def test_versions_outside_the_range_name_version_and_range(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    import colossalai

    from semimig._compat import ColossalAIVersionError, check_colossalai_version, supported_range

    monkeypatch.setattr(colossalai, "__version__", version)
    with pytest.raises(ColossalAIVersionError) as info:
        check_colossalai_version()
    assert isinstance(info.value, ImportError)
    assert f"found colossalai {version} " in str(info.value)
    assert supported_range() in str(info.value) and supported_range() == ">=0.4.7,<0.6.0"


def test_unparsable_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import colossalai

    from semimig._compat import ColossalAIVersionError, check_colossalai_version

    monkeypatch.setattr(colossalai, "__version__", "not-a-version")
    with pytest.raises(ColossalAIVersionError, match="reports version 'not-a-version'"):
        check_colossalai_version()


def test_private_operations_are_colossalais_own_and_imported_in_one_place() -> None:
    """``semimig._compat`` hands out Colossal-AI's own private collectives (the same objects), and no other
    module of semimig imports ``colossalai.shardformer.layer._operation`` (a release that moves them breaks
    in one place)."""
    from colossalai.shardformer.layer import _operation

    import semimig._compat as compat

    for name in compat.PRIVATE_OPERATIONS:
        assert getattr(compat, name) is getattr(_operation, name)
    with pytest.raises(AttributeError, match="no_such_name"):
        compat.no_such_name  # noqa: B018
    root = Path(__file__).resolve().parents[2] / "semimig"
    importers = sorted(str(path.relative_to(root)) for path in root.rglob("*.py") if path != root / "_compat" / "private.py"
                       for line in path.read_text().splitlines()
                       if "import" in line and ("layer._operation" in line or "import _operation" in line))
    assert importers == [], importers


def test_missing_colossalai_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from semimig._compat import ColossalAIVersionError, check_colossalai_version

    monkeypatch.setitem(sys.modules, "colossalai", None)  # makes `import colossalai` fail
    with pytest.raises(ColossalAIVersionError, match=r"needs colossalai>=0\.4\.7,<0\.6\.0.*cannot be imported"):
        check_colossalai_version()


# --------------------------------------------------------------------------------------------
# needed: a fresh interpreter without the shim
# --------------------------------------------------------------------------------------------
def _outcome(call) -> str:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the probe reports whatever Colossal-AI raises
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def _shard_tiny_vit() -> None:
    """ShardFormer on a 1-rank TP group: builds DropoutForReplicatedInput like tp_size=2 does."""
    from colossalai.shardformer import ShardConfig, ShardFormer
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=8, patch_size=4, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    )
    ShardFormer(ShardConfig(enable_tensor_parallelism=True)).optimize(ViTForImageClassification(config))


def _legacy_add_seed() -> None:
    from colossalai.legacy.context import ParallelMode
    from colossalai.legacy.context.random.seed_manager import SeedManager

    SeedManager().add_seed(ParallelMode.TENSOR, 1)


def _zero_optimizer() -> None:
    from colossalai.zero import LowLevelZeroOptimizer

    model = torch.nn.Linear(2, 2)
    LowLevelZeroOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), overlap_communication=False)


def _fp16_grad_scaler() -> None:
    """What HybridParallelPlugin(precision="fp16") builds for its mixed-precision optimizer."""
    from colossalai.amp.naive_amp.grad_scaler import DynamicGradScaler

    DynamicGradScaler()


def _pipeline_backend_check() -> None:
    """What every pipeline send/recv asks first (pp_size > 1)."""
    from colossalai.pipeline.p2p import _check_for_nccl_hccl_backend

    assert _check_for_nccl_hccl_backend(None) is False  # gloo


def _gpt2_shardformer_forward() -> None:
    """Colossal-AI's GPT-2 forward (the one HybridParallelPlugin installs), on an unsharded model."""
    from colossalai.shardformer import ShardConfig
    from colossalai.shardformer.modeling.gpt2 import GPT2PipelineForwards
    from transformers import GPT2Config, GPT2Model

    model = GPT2Model(GPT2Config(vocab_size=16, n_embd=8, n_layer=1, n_head=2, n_positions=8))
    ids = torch.zeros(1, 4, dtype=torch.long)
    GPT2PipelineForwards.gpt2_model_forward(model, input_ids=ids, attention_mask=torch.ones_like(ids),
                                            shard_config=ShardConfig(enable_tensor_parallelism=False))


def _packed_qkv_state_dict() -> None:
    """The gather GPT-2's packed c_attn runs for its state dict (a checkpoint save) or gather_output."""
    import torch.distributed as dist
    from colossalai.shardformer.layer import qkv_fused_linear

    qkv = torch.arange(24.0).reshape(2, 12)  # Conv1D layout [in, out], Q K V of 4 columns each
    gathered = qkv_fused_linear.gather_fused_qkv_in_gpt2_style(qkv, [4, 4, 4], dist.group.WORLD, is_transposed=True)
    assert torch.equal(gathered, qkv) and gathered.device.type == "cpu"  # one rank: nothing moves
    assert type(gathered) is torch.Tensor  # a plain tensor again, not the shim's subclass


_PROBES = {"shard_vit": _shard_tiny_vit, "packed_qkv_state_dict": _packed_qkv_state_dict, "legacy_add_seed": _legacy_add_seed, "zero_optimizer": _zero_optimizer,
           "fp16_grad_scaler": _fp16_grad_scaler, "pipeline_backend_check": _pipeline_backend_check,
           "gpt2_forward": _gpt2_shardformer_forward}


def _probe_cpu_gaps() -> dict:
    """Run in a fresh interpreter: each probe before and after the shim."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    report = {"before": {name: _outcome(probe) for name, probe in _PROBES.items()}}
    import semimig  # noqa: F401 - importing the package must not apply the shim

    report["semimig_nn_imported"] = "semimig.nn" in sys.modules
    report["after_import_semimig"] = _outcome(_shard_tiny_vit)
    from semimig._compat import apply_cpu_shim

    report["patched"] = apply_cpu_shim()
    report["patched_again"] = apply_cpu_shim()
    report["after"] = {name: _outcome(probe) for name, probe in _PROBES.items()}
    return report


@pytest.fixture(scope="module")
def cpu_gaps() -> dict:
    tests = str(REPO / "tests")  # the shared helpers this module imports
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))
    done = subprocess.run(
        [sys.executable, __file__], cwd=tests, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_shim_sharding_a_model_with_dropout_fails(cpu_gaps: dict) -> None:
    assert cpu_gaps["before"]["shard_vit"].startswith(f"RuntimeError: {DROPOUT_FAILURE}. Please check")


def test_without_shim_legacy_seeding_and_zero_fail(cpu_gaps: dict) -> None:
    assert cpu_gaps["before"]["legacy_add_seed"] == "AssertionError: Torch not compiled with CUDA enabled"
    assert cpu_gaps["before"]["zero_optimizer"] == "AssertionError: device is required"


def test_without_shim_fp16_pipeline_and_gpt2_fail(cpu_gaps: dict) -> None:
    before = cpu_gaps["before"]
    assert before["fp16_grad_scaler"] == "RuntimeError: this method is not supported for cpu accelerator"
    if hasattr(torch.distributed, "is_hccl_available"):  # torch < 2.13 still has it: nothing to show
        assert before["pipeline_backend_check"] == "ok"
    else:
        assert before["pipeline_backend_check"] == \
            "AttributeError: module 'torch.distributed' has no attribute 'is_hccl_available'"
    assert before["gpt2_forward"] == "ValueError: Expected a cuda device, but got: cpu"
    assert before["packed_qkv_state_dict"] == "AssertionError: Torch not compiled with CUDA enabled"


def test_import_semimig_does_not_apply_the_shim(cpu_gaps: dict) -> None:
    assert not cpu_gaps["semimig_nn_imported"]
    assert DROPOUT_FAILURE in cpu_gaps["after_import_semimig"]


def test_shim_patches_exactly_the_gaps_once(cpu_gaps: dict) -> None:
    assert cpu_gaps["patched"] == [
        "CpuAccelerator.get_rng_state",
        "CpuAccelerator.manual_seed",
        "CpuAccelerator.Stream",
        "CpuAccelerator.current_stream",
        "CpuAccelerator.stream",
        "CpuAccelerator.synchronize",
        "CpuAccelerator.device_count",
        "LowLevelZeroOptimizer._sanity_checks",
        "colossalai.legacy.context.random.seed_manager.torch.cuda",
        "colossalai.legacy.context.random._helper.torch.cuda",
        "colossalai.legacy.context.parallel_context.torch.cuda",
        *(["colossalai.pipeline.p2p.torch.distributed.is_hccl_available"]
          if not hasattr(torch.distributed, "is_hccl_available") else []),
        "colossalai.shardformer.modeling.gpt2.torch.cuda.set_device",
        "colossalai.shardformer.modeling.gptj.torch.cuda.set_device",
        "colossalai.shardformer.modeling.opt.torch.cuda.set_device",
        "colossalai.shardformer.modeling.t5.torch.cuda.set_device",
        "qkv_fused_linear.gather_fused_qkv_in_gpt2_style",
    ]
    assert cpu_gaps["patched_again"] == []


def test_with_shim_the_same_calls_succeed(cpu_gaps: dict) -> None:
    assert cpu_gaps["after"] == {name: "ok" for name in _PROBES}


# --------------------------------------------------------------------------------------------
# semantics of the patched calls (in this process; semimig.nn applies the shim here anyway)
# --------------------------------------------------------------------------------------------
@pytest.fixture()
def shimmed() -> Iterator[None]:
    from semimig._compat import apply_cpu_shim

    apply_cpu_shim()
    with torch.random.fork_rng(devices=[]):  # the tests below move the global CPU generator
        yield


def test_randomizer_forks_a_seeded_cpu_stream(shimmed: None) -> None:
    from colossalai.shardformer.layer.utils import Randomizer

    torch.manual_seed(5)
    randomizer = Randomizer(seed=1234)
    own, outer = torch.Generator().manual_seed(1234), torch.Generator().manual_seed(5)
    with randomizer.fork_rng():
        assert torch.equal(torch.rand(4), torch.rand(4, generator=own))
    assert torch.equal(torch.rand(3), torch.rand(3, generator=outer))  # caller's stream untouched
    with randomizer.fork_rng():
        assert torch.equal(torch.rand(4), torch.rand(4, generator=own))  # forked stream continues


def test_patched_accelerator_rejects_a_cuda_device(shimmed: None) -> None:
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator

    with pytest.raises(ValueError, match="device='cuda'"):
        CpuAccelerator().get_rng_state("cuda")
    assert torch.equal(CpuAccelerator().get_rng_state(), torch.get_rng_state())


def test_patched_accelerator_counts_one_cpu_device(shimmed: None) -> None:
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator

    assert CpuAccelerator().device_count() == 1


def test_views_change_only_their_names_and_leave_torch_alone(shimmed: None) -> None:
    import colossalai.pipeline.p2p as p2p
    import colossalai.shardformer.modeling.gpt2 as gpt2_modeling

    view = gpt2_modeling.torch
    assert view is not torch and view.Tensor is torch.Tensor and view.cuda.is_available() is torch.cuda.is_available()
    view.cuda.set_device(torch.device("cpu"))  # the CPU: nothing to select
    with pytest.raises(Exception) as theirs:
        torch.cuda.set_device("cuda:0")
    with pytest.raises(type(theirs.value)):
        view.cuda.set_device("cuda:0")  # anything else gets torch's own answer
    assert p2p.torch.distributed.is_hccl_available() is False  # no torch_npu here
    assert p2p.torch.distributed.all_reduce is torch.distributed.all_reduce
    assert getattr(torch.distributed, "is_hccl_available", None) is not p2p.torch.distributed.is_hccl_available
    with pytest.raises(ValueError, match="Expected a cuda device"):
        torch.cuda.set_device(torch.device("cpu"))  # the real torch.cuda is unchanged


def test_legacy_seed_manager_switches_cpu_streams(shimmed: None) -> None:
    from colossalai.legacy.context import ParallelMode
    from colossalai.legacy.context.random.seed_manager import SeedManager

    manager = SeedManager()
    manager.add_seed(ParallelMode.DATA, 11)
    manager.add_seed(ParallelMode.TENSOR, 22)
    data, tensor = torch.Generator().manual_seed(11), torch.Generator().manual_seed(22)
    for mode, stream in [(ParallelMode.TENSOR, tensor), (ParallelMode.DATA, data), (ParallelMode.TENSOR, tensor)]:
        manager.set_mode(mode)
        assert torch.equal(torch.rand(3), torch.rand(3, generator=stream))


# --------------------------------------------------------------------------------------------
# sufficient: the plugins on 2 ranks
# --------------------------------------------------------------------------------------------
def _tiny_vit(dropout: float):
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, num_labels=4, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
    )  # fmt: skip
    torch.manual_seed(0)
    return ViTForImageClassification(config)


def _hybrid_vit_body(rank: int, world_size: int, dropout: float) -> None:
    import copy

    import torch.distributed as dist
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    from semimig._compat import apply_cpu_shim

    apply_cpu_shim()  # explicit; a no-op here because the harness preloads semimig.nn
    model = _tiny_vit(dropout)
    reference = copy.deepcopy(model).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    booster = Booster(plugin=HybridParallelPlugin(tp_size=2, pp_size=1, precision="fp32"))
    model, optimizer, *_ = booster.boost(model, optimizer)

    gen = torch.Generator().manual_seed(1)
    pixels, labels = torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 4, (4,), generator=gen)
    for step in range(3):
        loss = model(pixel_values=pixels, labels=labels).loss
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        ref_loss = reference(pixel_values=pixels.double(), labels=labels).loss
        ref_loss.backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad()

        losses = [torch.zeros(1) for _ in range(world_size)]
        dist.all_gather(losses, loss.detach().reshape(1))
        # The logits are gathered, so every TP rank sees the same loss; with dropout this holds
        # only if the replicated-input dropout draws the same mask on both ranks.
        assert torch.equal(losses[0], losses[1]), f"step {step}: rank losses differ {losses}"
        if dropout == 0.0:
            # fp32 sharded vs float64 dense, 3 SGD steps on a 2-layer model: 1e-5 covers
            # reassociation; a wrong gradient moves the step-2/3 losses by far more.
            assert abs(loss.item() - ref_loss.item()) < 1e-5, (step, loss.item(), ref_loss.item())
        elif step == 0:
            assert abs(loss.item() - ref_loss.item()) > 1e-4, "dropout should change the loss"


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_hybrid_tp2_trains_vit_with_shim(dropout: float) -> None:
    run_on_ranks(_hybrid_vit_body, 2, dropout, timeout_s=90)


def _zero_body(rank: int, world_size: int, stage: int) -> None:
    import copy

    from colossalai.booster import Booster
    from colossalai.booster.plugin import LowLevelZeroPlugin

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    reference = copy.deepcopy(model).double()
    initial = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    plugin = LowLevelZeroPlugin(stage=stage, precision="fp32", overlap_communication=False)
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(model, optimizer)

    gen = torch.Generator().manual_seed(1)
    xs, ys = torch.randn(world_size, 3, 8, generator=gen), torch.randn(world_size, 3, 4, generator=gen)
    for _ in range(3):
        loss = ((model(xs[rank]) - ys[rank]) ** 2).mean()
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        ref_loss = sum(((reference(xs[r].double()) - ys[r].double()) ** 2).mean() for r in range(world_size))
        (ref_loss / world_size).backward()  # data parallel averages the ranks' gradients
        ref_optimizer.step()
        ref_optimizer.zero_grad()

    for trained, ref, start in zip(model.unwrap().parameters(), reference.parameters(), initial):
        assert (trained.detach() - start).abs().max() > 1e-3  # the step really updated it
        # fp32 Adam vs float64 Adam, 3 steps of lr 0.01: differences stay around 1e-7.
        torch.testing.assert_close(trained.detach().double(), ref.detach(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("stage", [1, 2])
def test_low_level_zero_on_cpu_matches_dense_adam(stage: int) -> None:
    run_on_ranks(_zero_body, 2, stage, timeout_s=60)


def _zero_overlap_body(rank: int, world_size: int) -> None:
    from colossalai.booster import Booster
    from colossalai.booster.plugin import LowLevelZeroPlugin

    model = torch.nn.Linear(4, 4)
    booster = Booster(plugin=LowLevelZeroPlugin(stage=1, precision="fp32"))  # overlap defaults to True
    with pytest.raises(ValueError, match="on CPU pass overlap_communication=False"):
        booster.boost(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_low_level_zero_overlap_is_refused_with_advice() -> None:
    run_on_ranks(_zero_overlap_body, 1, timeout_s=30)


if __name__ == "__main__":
    print(json.dumps(_probe_cpu_gaps()))
