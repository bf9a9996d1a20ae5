"""Every HybridParallelPlugin option a TP user combines: SemiMigPolicy trains like Colossal-AI's policy.

Each case boosts the same tiny model (same seed, same batch) twice on CPU/gloo — once with
Colossal-AI's auto policy, once with ``SemiMigPolicy()`` and no straggler — trains 3 AdamW steps
on one batch and compares every rank's losses.  The semimig run must hold semimig layers and the
Colossal-AI run none, so equality is between two different layer stacks, and the losses must
fall, so the optimizer really stepped.

Tolerances: fp32 ``atol=1e-5, rtol=1e-3`` and half precision ``atol=rtol=5e-3``, the ones
Colossal-AI's own ``tests/test_shardformer/test_model/test_shard_llama.py`` uses for the loss.
(At γ = 0 semimig's layers run the very GEMMs and collectives of Colossal-AI's, so the losses
agree far tighter in practice; the tolerance is Colossal-AI's promise, not semimig's slack.)

Combinations Colossal-AI itself cannot run on CPU are in :data:`REFUSED_BY_COLOSSALAI`: the test
shows both policies fail with the same error, so the limitation is Colossal-AI's.
"""
from __future__ import annotations

import pytest
import torch

import plugin_cases as pc
from _backends import run_pooled  # gloo: the test run's pool of ranks, many cases per spawn

pytestmark = pytest.mark.usefixtures("cpu_path")

TP2 = dict(tp_size=2, pp_size=1)
SPLIT_GATHER = dict(enable_sequence_parallelism=True, sequence_parallelism_mode="split_gather")

# id -> (ranks, model, HybridParallelPlugin kwargs)
CASES = {
    # every model at tp=2, fp32
    **{f"{m}-tp2-fp32": (2, m, dict(TP2, precision="fp32")) for m in pc.MODELS},
    # mixed precision (fp16 is AMP with a dynamic loss scale; bf16 needs none)
    **{f"{m}-tp2-{p}": (2, m, dict(TP2, precision=p)) for m in ("llama", "gpt2") for p in ("bf16", "fp16")},
    # ZeRO beside TP: tp=2 x dp=2 (Colossal-AI refuses ZeRO with fp32)
    "llama-tp2dp2-zero1-fp16": (4, "llama", dict(TP2, precision="fp16", zero_stage=1)),
    "llama-tp2dp2-zero2-bf16": (4, "llama", dict(TP2, precision="bf16", zero_stage=2)),
    "gpt2-tp2dp2-zero2-bf16": (4, "gpt2", dict(TP2, precision="bf16", zero_stage=2)),
    # pipeline x TP: pp=2 x tp=2, 1F1B with 2 micro-batches
    **{f"{m}-pp2tp2-fp32": (4, m, dict(tp_size=2, pp_size=2, num_microbatches=2, precision="fp32"))
       for m in ("llama", "gpt2", "opt")},
    # sequence parallelism, split_gather (the models whose policies offer it)
    **{f"{m}-tp2-sp-split_gather": (2, m, dict(TP2, precision="fp32", **SPLIT_GATHER))
       for m in ("llama", "qwen2", "gpt2", "bert")},
    "gpt2-tp2-sp-ring": (2, "gpt2", dict(TP2, precision="fp32", enable_sequence_parallelism=True,
                                         sequence_parallelism_mode="ring")),
    "llama-mha-tp2sp2-all_to_all": (4, "llama-mha", dict(TP2, sp_size=2, precision="fp32",
                                                         enable_sequence_parallelism=True,
                                                         sequence_parallelism_mode="all_to_all")),
    # kernel optimisations, where CPU has them (BERT takes none of the flash-attention paths)
    "bert-tp2-all_optimization": (2, "bert", dict(TP2, precision="fp32", enable_all_optimization=True)),
    **{f"{m}-tp2-fused_norm-jit": (2, m, dict(TP2, precision="fp32", enable_fused_normalization=True,
                                              enable_jit_fused=True)) for m in ("gpt2", "vit")},
}

# id -> (ranks, model, HybridParallelPlugin kwargs) where SemiMigPolicy keeps Colossal-AI's layers
# (with one warning naming them): nothing is balanced, training is Colossal-AI's.
LEFT_TO_COLOSSALAI = {
    # Llama's policy passes seq_parallel_mode="ring" to its layers; 'ring' overlaps its exchange
    # with the GEMM chunks, which semimig's layers do not split (semimig.nn.conversion)
    "llama-tp2-sp-ring": (2, "llama", dict(TP2, precision="fp32", enable_sequence_parallelism=True,
                                           sequence_parallelism_mode="ring")),
}

# id -> (model, HybridParallelPlugin kwargs, the error both policies raise)
REFUSED_BY_COLOSSALAI = {
    "llama-all_optimization": ("llama", dict(TP2, precision="fp32", enable_all_optimization=True),
                               "No usable kernel found for FlashAttentionForFloatAndCustomMaskLoader"),
    "llama-fused_norm": ("llama", dict(TP2, precision="fp32", enable_fused_normalization=True),
                         "Failed to replace norm of type LlamaRMSNorm with FusedRMSNorm"),
    "opt-jit_fused": ("opt", dict(TP2, precision="fp32", enable_jit_fused=True),
                      "got an unexpected keyword argument 'position_ids'"),
    "llama-zero1-fp32": ("llama", dict(TP2, precision="fp32", zero_stage=1),
                         "Please set precision to 'fp16' or 'bf16' when using ZeRO"),
}


def _tolerance(precision: str) -> dict:
    # Colossal-AI's test_shard_llama.py: loss atol/rtol 1e-5/1e-3 in fp32, 5e-3 in half precision
    return dict(atol=1e-5, rtol=1e-3) if precision == "fp32" else dict(atol=5e-3, rtol=5e-3)


def _both_policies_body(rank: int, world_size: int, name: str, plugin_kwargs: dict) -> dict:
    runs = {}
    for semimig in (False, True):
        run = pc.boost(name, plugin_kwargs, semimig=semimig)
        layers = torch.tensor([pc.semimig_layer_count(run.model)])
        torch.distributed.all_reduce(layers)  # pipeline stages hold different layers
        runs["semimig" if semimig else "colossalai"] = (pc.train_losses(run, name), int(layers))
    return runs


@pytest.mark.parametrize("case", list(CASES) + list(LEFT_TO_COLOSSALAI))
def test_semimig_policy_trains_like_colossalai(case: str, backend: str) -> None:
    world, name, plugin_kwargs = CASES.get(case) or LEFT_TO_COLOSSALAI[case]
    runs = run_pooled(_both_policies_body, world, name, plugin_kwargs, backend=backend, timeout_s=240)
    (theirs, their_layers), (ours, our_layers) = runs["colossalai"], runs["semimig"]
    assert their_layers == 0 and (our_layers == 0 if case in LEFT_TO_COLOSSALAI else our_layers > 0), \
        (their_layers, our_layers)
    holders = [r for r, losses in enumerate(theirs) if losses[0] is not None]
    assert holders == [r for r, losses in enumerate(ours) if losses[0] is not None] and holders
    tol = _tolerance(plugin_kwargs["precision"])
    for r in holders:
        torch.testing.assert_close(torch.tensor(ours[r]), torch.tensor(theirs[r]), **tol,
                                   msg=lambda m: f"rank {r}: semimig {ours[r]} vs Colossal-AI {theirs[r]}: {m}")
        assert theirs[r][2] < theirs[r][0], f"3 AdamW steps on one batch should lower the loss: {theirs[r]}"


def _refusal_body(rank: int, world_size: int, name: str, plugin_kwargs: dict) -> dict:
    def attempt(semimig: bool) -> str:
        return pc.outcome(lambda: pc.train_losses(pc.boost(name, plugin_kwargs, semimig=semimig), name, (0,)))

    return {"colossalai": attempt(False), "semimig": attempt(True)}


@pytest.mark.parametrize("case", list(REFUSED_BY_COLOSSALAI))
def test_colossalai_itself_refuses_it(case: str, backend: str) -> None:
    name, plugin_kwargs, reason = REFUSED_BY_COLOSSALAI[case]
    outcomes = run_pooled(_refusal_body, 2, name, plugin_kwargs, backend=backend, timeout_s=120)
    assert reason in outcomes["colossalai"], outcomes["colossalai"]
    assert reason in outcomes["semimig"], outcomes["semimig"]
