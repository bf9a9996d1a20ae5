"""SemiMigPolicy: swaps exactly Colossal-AI's Linear1D_Col/Row and changes no number.

Each model is sharded twice from the same seed — Colossal-AI's auto policy and SemiMigPolicy —
and logits and every parameter gradient must be identical (same arithmetic, same order).
"""
import copy

import pytest
import torch
import torch.distributed as dist

from dist_harness import run_on_ranks


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    # vocab 256: Colossal-AI pads the vocabulary to a multiple of 64·tp, and a smaller one would
    # leave rank 1 a shard of padding only, which its own loss cannot handle.
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

    import semimig.nn as snn
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


@pytest.mark.parametrize("model_name", ["vit", "llama"])
def test_policy_matches_colossalai(model_name):
    assert run_on_ranks(_policy_body, 2, model_name, timeout_s=120) > 0


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
