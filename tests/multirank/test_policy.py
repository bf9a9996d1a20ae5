"""SemiMigPolicy: swaps exactly Colossal-AI's Linear1D_Col/Row and changes no number.

Each model is sharded twice from the same seed — Colossal-AI's auto policy and SemiMigPolicy —
and logits and every parameter gradient must be identical (same arithmetic, same order).
"""
import copy

import pytest
import torch
import torch.distributed as dist

from dist_harness import run_on_ranks
from world_sizes import TP_SIZES, tp_id


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    # vocab 256: Colossal-AI pads the vocabulary to a multiple of 64·tp (tp <= 4), and a smaller one
    # would leave a rank a shard of padding only, which its own loss cannot handle.
    cfg = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg), {"input_ids": torch.randint(0, 256, (2, 9)), "labels": torch.randint(0, 256, (2, 9))}


def _tiny_vit():
    from semimig.bench.models import tiny_vit

    torch.manual_seed(1)
    return tiny_vit(seed=0), {"pixel_values": torch.rand(4, 1, 8, 8), "labels": torch.randint(0, 10, (4,))}


MODELS = {"vit": _tiny_vit, "llama": _tiny_llama}


def _policy_body(rank, world, model_name):
    from colossalai.shardformer import ShardConfig, ShardFormer

    import semimig.nn  # noqa: F401 - the CPU compatibility shim
    from semimig.shardformer import SemiMigPolicy

    model, batch = MODELS[model_name]()
    config = ShardConfig(tensor_parallel_process_group=dist.group.WORLD, enable_tensor_parallelism=True,
                         enable_fused_normalization=False, enable_flash_attention=False)
    outs = {}
    for name, policy in (("cai", None), ("ours", SemiMigPolicy())):
        sharded, _ = ShardFormer(shard_config=config).optimize(copy.deepcopy(model), policy=policy)
        out = sharded(**batch)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in sharded.named_parameters() if p.grad is not None}
        kinds = sorted({type(m).__module__ + "." + type(m).__name__ for m in sharded.modules()
                        if "Linear1D" in type(m).__name__})
        outs[name] = (out.logits.detach(), grads, kinds, policy)
    logits_c, grads_c, kinds_c, _ = outs["cai"]
    logits_o, grads_o, kinds_o, policy = outs["ours"]
    assert torch.equal(logits_c, logits_o)
    assert grads_c.keys() == grads_o.keys() and grads_c
    for n in grads_c:
        assert torch.equal(grads_c[n], grads_o[n]), n
    assert any(k.startswith("colossalai.") for k in kinds_c)
    assert kinds_o and all(k.startswith("semimig.") for k in kinds_o), kinds_o
    assert policy.swapped
    return len(policy.swapped)


# the bench ViT's 10-class head does not split over 4 ranks (Colossal-AI refuses it); Llama at 4 holds one head a rank
@pytest.mark.parametrize("model_name,world_size", [("vit", 2), *(("llama", n) for n in TP_SIZES)], ids=tp_id)
def test_policy_matches_colossalai(model_name, world_size):
    assert run_on_ranks(_policy_body, world_size, model_name, timeout_s=120) > 0


def _unsupported_body(rank, world):
    from colossalai.shardformer import ShardConfig, ShardFormer

    from semimig.shardformer import SemiMigPolicy

    class NotAModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

    config = ShardConfig(tensor_parallel_process_group=dist.group.WORLD, enable_tensor_parallelism=True)
    with pytest.raises(ValueError, match="no policy for .*NotAModel"):
        ShardFormer(shard_config=config).optimize(NotAModel(), policy=SemiMigPolicy())


def test_policy_unsupported_model_is_a_clear_error():
    run_on_ranks(_unsupported_body, 2)


def test_policy_rejects_a_non_policy_base():
    from semimig.shardformer import SemiMigPolicy

    with pytest.raises(TypeError, match="got int"):
        SemiMigPolicy(base=3)


def _hybrid_body(rank, world):
    from semimig.bench.demo import train_hybrid

    return (train_hybrid(rank, world, "colossalai", 3, 16, 0, tp=2),
            train_hybrid(rank, world, "semimig", 3, 16, 0, tp=2))


def test_three_hybrid_parallel_steps_give_identical_losses():
    cai, ours = run_on_ranks(_hybrid_body, 2, timeout_s=180)
    assert len(cai) == 3 and cai == ours
    assert cai[0] != cai[2]  # the model really trained


# ----------------------------------------------------------------------------- lazy init
def _lazy_plugin_body(rank, world, name):
    from colossalai.lazy import LazyInitContext

    import plugin_cases as pc

    runs = {}
    for semimig in (False, True):
        with LazyInitContext():
            model = pc.build_model(name)
        run = pc.boost(name, dict(tp_size=2, pp_size=1, precision="fp32"), semimig=semimig, model=model)
        runs[semimig] = (pc.train_losses(run, name), pc.semimig_layer_count(run.model))
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_lazily_built_model_under_the_plugin_trains_like_colossalai(name):
    """LazyInitContext + HybridParallelPlugin(tp=2): SemiMigPolicy shards the materialised weights
    (keeping the full lazy weight would die in booster.boost with RecursionError) and its
    3 AdamW steps give Colossal-AI's losses (fp32, atol 1e-5)."""
    runs = run_on_ranks(_lazy_plugin_body, 2, name, timeout_s=240)
    (cai, cai_layers), (ours, our_layers) = runs[False], runs[True]
    assert cai_layers == 0 and our_layers == {"llama": 2 * 7, "gpt2": 2 * 4}[name]  # per block: q k v o gate up down; c_attn c_proj c_fc c_proj
    for rank_cai, rank_ours in zip(cai, ours):
        assert rank_cai[2] < rank_cai[0]  # it trained
        torch.testing.assert_close(rank_ours, rank_cai, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- what stays unbalanced
def _stub_policy(replacements):
    """A base policy whose ``module_policy`` holds ``replacements`` under one key (no model needed)."""
    from colossalai.shardformer.policies.base_policy import ModulePolicyDescription, Policy

    class Stub(Policy):
        def config_sanity_check(self):
            pass

        def preprocess(self):
            return self.model

        def postprocess(self):
            return self.model

        def module_policy(self):
            return {"Block": ModulePolicyDescription(sub_module_replacement=list(replacements))}

        def get_held_layers(self):
            return []

        def get_shared_params(self):
            return []

    return Stub()


def test_one_warning_names_every_layer_left_unbalanced(caplog):
    import logging

    from colossalai.shardformer import layer as cai
    from colossalai.shardformer.layer.parallel_module import ParallelModule
    from colossalai.shardformer.policies.base_policy import SubModuleReplacementDescription as R

    import semimig.nn as snn
    from semimig.shardformer import SemiMigPolicy

    class MyLinear1D(ParallelModule):  # a user's own TP linear class
        @staticmethod
        def from_native_module(module, process_group=None, **kwargs):
            return module

    class MoEGate_Col(MyLinear1D):  # named like Colossal-AI's DeepseekMoEGate_Col
        pass

    policy = SemiMigPolicy(base=_stub_policy([
        R("attn.qkv", cai.FusedLinear1D_Col, kwargs={"split_sizes": [4, 4, 4]}),
        R("attn.c_proj", cai.GPT2FusedLinearConv1D_Row, kwargs={"seq_parallel_mode": None}),
        R("mlp.up", cai.Linear1D_Col, kwargs={"fp8_communication": True}),
        R("mlp.down", cai.Linear1D_Row, kwargs={"seq_parallel_mode": "ring"}),
        R("mlp.custom", MyLinear1D),
        R("moe.gate", MoEGate_Col),
        R("lm_head", cai.VocabParallelLMHead1D),
        R("no_tp", cai.LinearWithGradAccum),
        R("norm", cai.LayerNorm),
    ]))
    with caplog.at_level(logging.INFO, logger="semimig.shardformer.policy"):
        described = policy.module_policy()
        policy.module_policy()  # asked again: no second warning
    targets = {r.suffix: r.target_module for r in described["Block"].sub_module_replacement}
    assert targets["attn.qkv"] is snn.FusedLinear1D_Col and targets["attn.c_proj"] is snn.GPT2FusedLinearConv1D_Row
    assert targets["mlp.up"] is cai.Linear1D_Col and targets["mlp.down"] is cai.Linear1D_Row  # refused: kept
    assert policy.swapped == ["Block.attn.qkv", "Block.attn.c_proj"]
    assert sorted(policy.unbalanced) == ["Block.mlp.custom", "Block.mlp.down", "Block.mlp.up", "Block.moe.gate"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    for text in ("Block.mlp.up (Linear1D_Col: fp8_communication", "Block.mlp.down (Linear1D_Row: seq_parallel_mode",
                 "Block.mlp.custom (MyLinear1D: a layer class semimig does not know"):
        assert text in warnings[0], warnings[0]
    assert "lm_head" not in warnings[0] and "no_tp" not in warnings[0] and "norm" not in warnings[0]
    infos = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    assert "Block.lm_head (VocabParallelLMHead1D)" in infos


def test_a_policy_with_nothing_to_balance_warns_once(caplog):
    import logging

    from colossalai.shardformer import layer as cai
    from colossalai.shardformer.policies.base_policy import SubModuleReplacementDescription as R

    from semimig.shardformer import SemiMigPolicy

    policy = SemiMigPolicy(base=_stub_policy([R("fc", cai.LinearWithGradAccum)]))
    with caplog.at_level(logging.WARNING, logger="semimig.shardformer.policy"):
        policy.module_policy()
    assert [r.getMessage() for r in caplog.records] == ["SemiMigPolicy: Stub replaces no tensor-parallel linear "
                                                        "layer; semimig balances nothing"]
