"""Whole models with uneven tensor-parallel shards (DESIGN §8) train like the even layout.

``HybridParallelPlugin(tp_size=2, custom_policy=SemiMigPolicy(shard_plan=UnevenPlan(...)))`` on a
tiny Llama (hidden 64, 8 heads, 4 KV heads, intermediate 256, 2 layers) and a tiny GPT-2
(hidden 64, 8 heads, inner 256, 2 layers), fp32, gloo, 5 AdamW steps on 5 different batches.
Every model is built from the same seed; each spawn runs Colossal-AI's own policy, the even
``SemiMigPolicy()`` and several plans, so the comparison is between different layer stacks.

Checked: an even plan is the even layout bit for bit (same losses exactly); uneven plans give
the even layout's losses within fp32 reassociation tolerance; with ``max_norm`` the total
gradient norm each planned layout clips with equals the norm of the same model with TP off
(``tp_size=1``; for Llama also the dense Hugging Face model's ``torch.nn.utils.clip_grad_norm_``)
and the clipped runs agree.  Stock Colossal-AI under-counts GPT-2's ``c_attn``/``c_fc`` shards
(:mod:`semimig.shardformer.uneven_norm`); the test shows it.

Tolerances.  An uneven plan changes only the order of the sums over the MLP intermediate
dimension and over the heads' columns of ``o``/``c_proj`` (per-rank partial sums, then the
all-reduce): ~1e-7 relative per step in fp32; AdamW (lr 1e-3) carries it into the weights and
5 steps leave the losses (~4.9) equal to ~1e-6 (measured: at most 2e-6 absolute);
``atol = 2e-5``, ``rtol = 0``.  Grad norms against the reference: same reassociation,
``rtol = 1e-5``.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_harness import run_on_ranks

from tiny_lms import BATCH, SEQ, VOCAB, boost_lm, tiny_lm, token_batch, train_steps  # noqa: E402,F401
STEPS = 5
LOSS_TOL = dict(atol=2e-5, rtol=0.0)
NORM_RTOL = 1e-5


def _dense_norm(name):
    """The dense single-process Hugging Face model's gradient norm on batch 0."""
    model = tiny_lm(name)
    model(**token_batch(0)).loss.backward()
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9))  # 1e9: measure, never clip


def _untp_norm(name):
    """The gradient norm on batch 0 of Colossal-AI's model with TP off (``tp_size=1``: two data-parallel
    replicas of the same batch, so the averaged gradient is the one-process gradient): the reference for
    the TP runs' clip.  (Colossal-AI's GPT-2 forward is not Hugging Face's to the last digit — step 0's
    loss 4.885746 against 4.886991 — with TP off as well, so GPT-2's TP norms are compared with this.)"""
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    booster = Booster(plugin=HybridParallelPlugin(tp_size=1, pp_size=1, precision="fp32", max_norm=1e9))
    model = tiny_lm(name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, *_ = booster.boost(model, optimizer)
    booster.backward(model(**token_batch(0)).loss, optimizer)
    optimizer.step()
    return optimizer._current_grad_norm


def _train(name, policy, max_norm=0.0):
    """Losses and the grad norm the optimizer clipped with, per step, under tp=2 (every rank's, rank 0 returned)."""
    booster, model, optimizer, _ = boost_lm(tiny_lm(name), policy=policy, max_norm=max_norm)
    losses, norms = [], []
    for step in range(STEPS):
        loss = model(**token_batch(step)).loss
        booster.backward(loss, optimizer)
        optimizer.step()
        norms.append(getattr(optimizer, "_current_grad_norm", None))
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    widths = sorted({(n, tuple(p.shape)) for n, p in model.unwrap().named_parameters()
                     if n.endswith(("mlp.up_proj.weight", "self_attn.k_proj.weight", "attn.c_attn.weight",
                                    "mlp.c_fc.weight"))})
    return losses, norms, widths


PLANS = {  # name -> (mlp_units, kv_units, block_size); units per rank of 2
    "llama": {"even-plan": ((2, 2), (2, 2), 64), "mlp3:1-kv3:1": ((3, 1), (3, 1), 64),
              "mlp1:3-kv1:3": ((1, 3), (1, 3), 64), "mlp7:1 b32-kv even": ((7, 1), None, 32)},
    "gpt2": {"even-plan": ((2, 2), (4, 4), 64), "mlp3:1-heads5:3": ((3, 1), (5, 3), 64),
             "mlp1:7 b32-heads1:7": ((1, 7), (1, 7), 32)},
}


def _exactness_body(rank, world, name):
    from semimig.shardformer import SemiMigPolicy, UnevenPlan

    def plan(mlp, kv, block):
        return SemiMigPolicy(shard_plan=UnevenPlan(mlp_units=mlp, kv_units=kv, block_size=block))

    out = {"cai": _train(name, None), "even": _train(name, SemiMigPolicy())}
    for key, spec in PLANS[name].items():
        out[key] = _train(name, plan(*spec))
    # gradient clipping (max_norm well below the norm, so every step clips)
    clip = 0.05
    out["clip-cai"] = _train(name, None, clip)
    out["clip-even"] = _train(name, SemiMigPolicy(), clip)
    for key in ("even-plan", list(PLANS[name])[1]):
        out[f"clip-{key}"] = _train(name, plan(*PLANS[name][key]), clip)
    out["dense-norm"] = _dense_norm(name)
    out["untp-norm"] = _untp_norm(name)
    return out


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def runs(request):
    return request.param, run_on_ranks(_exactness_body, 2, request.param, timeout_s=600)


def test_even_plan_is_the_even_layout_bit_for_bit(runs):
    name, out = runs
    assert out["even"][0] == out["cai"][0]
    assert out["even-plan"][0] == out["even"][0]
    assert out["even-plan"][2] == out["even"][2]
    assert out["even"][0][-1] < out["even"][0][0]  # it trained


def test_uneven_plans_train_like_the_even_layout(runs):
    name, out = runs
    even = out["even"]
    for key in list(PLANS[name])[1:]:
        losses, _, widths = out[key]
        assert widths != even[2], key  # the shards really are uneven on rank 0
        torch.testing.assert_close(losses, even[0], **LOSS_TOL, msg=f"{name} {key}")


def test_uneven_shards_widths_follow_the_plan(runs):
    name, out = runs
    widths = dict(out["mlp3:1-kv3:1" if name == "llama" else "mlp3:1-heads5:3"][2])
    if name == "llama":  # rank 0: 3 of 4 MLP blocks of 64, 3 of 4 KV groups (head_dim 8)
        assert widths["model.layers.0.mlp.up_proj.weight"] == (192, 64)
        assert widths["model.layers.0.self_attn.k_proj.weight"] == (24, 64)
    else:  # Conv1D weights are [in, out]: c_attn holds [Q_0, K_0, V_0] of 5 heads of 8 each
        assert widths["transformer.h.0.attn.c_attn.weight"] == (64, 3 * 40)
        assert widths["transformer.h.0.mlp.c_fc.weight"] == (64, 192)


def test_clipping_counts_every_uneven_shard_once(runs):
    name, out = runs
    dense = out["untp-norm"]
    if name == "llama":  # Colossal-AI's Llama is Hugging Face's function
        assert dense == pytest.approx(out["dense-norm"], rel=NORM_RTOL)
    planned = [key for key in out if key.startswith("clip-") and key not in ("clip-cai", "clip-even")]
    for key in planned:
        norms = out[key][1]
        assert norms[0] == pytest.approx(dense, rel=NORM_RTOL), (key, norms[0], dense)
        assert norms[0] > 0.05  # the clip acted
    reference = out["clip-even-plan"]
    for key in planned:
        torch.testing.assert_close(out[key][0], reference[0], **LOSS_TOL, msg=key)
        torch.testing.assert_close(out[key][1], reference[1], rtol=NORM_RTOL, atol=0.0, msg=key)
    # shard_plan=None marks nothing: Colossal-AI's clipping bit for bit
    assert out["clip-even"][:2] == out["clip-cai"][:2]
    if name == "llama":  # every Llama shard has Colossal-AI's dist_layout: stock clipping is already right
        assert out["clip-cai"][1][0] == pytest.approx(dense, rel=NORM_RTOL)
    else:
        # Colossal-AI's own GPT-2 layers keep c_attn/c_fc as customised tensors without dist_layout,
        # and its grad norm counts them 1/tp times: stock clipping under-counts (semimig's planned runs do not)
        assert out["clip-cai"][1][0] < dense * (1 - 1e-3)


# ----------------------------------------------------------------------------- refusals (one process)
def test_plan_from_flags_parses_and_names_bad_values():
    import transformers as T

    from semimig.errors import ConfigError
    from semimig.shardformer import UnevenPlan, plan_from_flags

    cfg = T.LlamaConfig(hidden_size=1024, intermediate_size=4096, num_attention_heads=8, num_key_value_heads=4)
    assert plan_from_flags("28,4:3,1", cfg, 2) == UnevenPlan(mlp_units=(28, 4), kv_units=(3, 1))
    assert plan_from_flags("28,4", cfg, 2) == UnevenPlan(mlp_units=(28, 4))
    assert plan_from_flags(":3,1", cfg, 2) == UnevenPlan(kv_units=(3, 1))
    assert plan_from_flags(None, cfg, 2) is None and plan_from_flags("", cfg, 2) is None
    resolved = plan_from_flags("28,4:3,1", cfg, 2).resolve(cfg, 2)
    assert resolved.mlp.sizes == (3584, 512) and resolved.q.sizes == (768, 256) and resolved.kv.sizes == (384, 128)
    assert resolved.heads(1) == (2, 1)
    bad = {
        "28,x:3,1": "MLP_UNITS '28,x' must be comma-separated ints, got 'x'",
        "28,4:3,1:1": "expected MLP_UNITS",
        "32:2,2": "MLP_UNITS has 1 entries",
        "28,3:3,1": r"mlp_units=\(28, 3\) sum to 31 blocks",
        "33,-1:3,1": r"units\[1\] must be an int >= 0",
        "28,4:2,1": r"kv_units=\(2, 1\) sum to 3, the model has 4 KV heads",
    }
    for text, message in bad.items():
        with pytest.raises(ConfigError, match=message):
            plan_from_flags(text, cfg, 2)
    with pytest.raises(ConfigError, match="block_size=96"):
        plan_from_flags("28,4", cfg, 2, block_size=96)
    with pytest.raises(ConfigError, match=r"model_type='bert' \(BertConfig\)"):
        plan_from_flags("1,1", T.BertConfig(), 2)
    with pytest.raises(ConfigError, match="expects a semimig.shardformer.UnevenPlan"):
        from semimig.shardformer import SemiMigPolicy
        SemiMigPolicy(shard_plan=(3, 1))


def test_plan_for_speeds_follows_the_step_model():
    """DESIGN §8, two ranks, rank 1 χ = 4 times slower, ρ = 0.2 replicated: S = 2·0.8, t = (S + 2ρ)/Σv = 1.6,
    p_1 = (t·v_1 − ρ)/S = 0.125, i.e. 4 of 32 MLP blocks of 128; KV groups 4·0.125 = 0.5 -> none (rank 1 at
    (ρ + S/4)/v_1 = 2.4 with one, rank 0 at ρ + S = 1.8 with all four), or one with ``min_units=1``."""
    import transformers as T

    from semimig.errors import ConfigError
    from semimig.shardformer.uneven import UnevenPlan, plan_for_speeds, speeds_from_flag

    cfg = T.LlamaConfig(hidden_size=1024, intermediate_size=4096, num_attention_heads=8, num_key_value_heads=4)
    assert plan_for_speeds(cfg, speeds_from_flag("1,0.25", 2), replicated_share=0.2) == \
        UnevenPlan(mlp_units=(28, 4), kv_units=(4, 0))
    assert plan_for_speeds(cfg, (1.0, 0.25), replicated_share=0.2, min_units=1) == \
        UnevenPlan(mlp_units=(28, 4), kv_units=(3, 1))
    assert plan_for_speeds(cfg, (1.0, 1.0), replicated_share=0.3) == UnevenPlan(mlp_units=(16, 16), kv_units=(2, 2))
    with pytest.raises(ConfigError, match="speed 'x' of rank 1"):
        speeds_from_flag("1,x", 2)
    with pytest.raises(ConfigError, match="2 speeds"):
        speeds_from_flag("1,1", 4)


def _refusal_body(rank, world):
    from colossalai.shardformer import ShardConfig, ShardFormer

    import plugin_cases as pc
    from semimig.shardformer import SemiMigPolicy, UnevenPlan

    def attempt(model, plan, **config):
        shard_config = ShardConfig(tensor_parallel_process_group=dist.group.WORLD, enable_tensor_parallelism=True,
                                   enable_fused_normalization=False, enable_flash_attention=False, **config)
        return pc.outcome(lambda: ShardFormer(shard_config=shard_config).optimize(
            model, policy=SemiMigPolicy(shard_plan=plan)))

    return {
        "bert": attempt(pc.build_model("bert"), UnevenPlan(mlp_units=(1, 1), block_size=32)),
        "kv-sum": attempt(tiny_lm("llama"), UnevenPlan(kv_units=(3, 2))),
        "tp": attempt(tiny_lm("llama"), UnevenPlan(mlp_units=(1, 1, 2), block_size=64)),
    }


def test_whole_model_refusals_name_the_problem():
    out = run_on_ranks(_refusal_body, 2, timeout_s=180)
    assert "model_type='bert'" in out["bert"] and out["bert"].startswith("ConfigError"), out["bert"]
    assert "kv_units=(3, 2) sum to 5, the model has 4 KV heads" in out["kv-sum"], out["kv-sum"]
    assert "the plan has 3 ranks" in out["tp"], out["tp"]


# ----------------------------------------------------------------------------- more models and modes
def _config_model(kind, **sizes):
    import transformers as T

    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, num_hidden_layers=2, max_position_embeddings=2 * SEQ)
    if kind == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_layer=2, n_positions=2 * SEQ, resid_pdrop=0.0,
                                              embd_pdrop=0.0, attn_pdrop=0.0, **sizes))
    config_cls, model_cls = {"llama": (T.LlamaConfig, T.LlamaForCausalLM), "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM),
                             "mistral": (T.MistralConfig, T.MistralForCausalLM)}[kind]
    return model_cls(config_cls(**common, **sizes))


GQA = dict(hidden_size=64, intermediate_size=256, num_attention_heads=8, num_key_value_heads=4)
MORE = {  # case -> (model kind, sizes, (mlp_units, kv_units, block), extra plugin kwargs, reference)
    # Qwen2 (q/k/v biases: uneven column biases) and Mistral take the Llama path
    "qwen2": ("qwen2", GQA, ((3, 1), (1, 3), 64), {}, "even"),
    "mistral": ("mistral", GQA, ((1, 3), (3, 1), 64), {}, "even"),
    # heads tp does not divide (Colossal-AI's policy refuses them): 6 heads, 3 KV groups, 3 MLP blocks
    "llama-3kv": ("llama", dict(hidden_size=48, intermediate_size=192, num_attention_heads=6, num_key_value_heads=3),
                  ((2, 1), (2, 1), 64), {}, "tp1"),
    "gpt2-5heads": ("gpt2", dict(n_embd=40, n_inner=160, n_head=5), ((3, 2), (3, 2), 32), {}, "tp1"),
    # split_gather sequence parallelism with uneven shards
    "llama-split_gather": ("llama", GQA, ((3, 1), (3, 1), 64),
                           dict(enable_sequence_parallelism=True, sequence_parallelism_mode="split_gather"), "even"),
}


def _train_model(build, tp, policy, steps=3, **plugin_kwargs):
    booster, model, optimizer, _ = boost_lm(build(), tp=tp, policy=policy, **plugin_kwargs)
    return train_steps(booster, model, optimizer, range(steps))


def _more_body(rank, world):
    from semimig.shardformer import SemiMigPolicy, UnevenPlan

    out = {}
    for case, (kind, sizes, (mlp, kv, block), extra, reference) in MORE.items():
        def build():
            return _config_model(kind, **sizes)

        uneven = _train_model(build, 2, SemiMigPolicy(shard_plan=UnevenPlan(mlp_units=mlp, kv_units=kv,
                                                                            block_size=block)), **extra)
        ref = _train_model(build, 2, SemiMigPolicy(), **extra) if reference == "even" else _train_model(build, 1, None)
        out[case] = (uneven, ref)
    return out


def test_more_models_heads_tp_does_not_divide_and_split_gather():
    """Qwen2, Mistral and split_gather against the even layout; models whose heads tp=2 does not
    divide (Colossal-AI refuses them) against the same model with TP off (tp_size=1); 3 steps each."""
    out = run_on_ranks(_more_body, 2, timeout_s=600)
    for case, (uneven, ref) in out.items():
        torch.testing.assert_close(uneven, ref, **LOSS_TOL, msg=case)
        assert uneven[0] != uneven[-1], case


# ----------------------------------------------------------------------------- precision, ZeRO, pipeline
MODE_PLAN = dict(mlp_units=(3, 1), kv_units=(3, 1), block_size=64)


def _modes_body(rank, world, cases):
    """Per case, 3 steps of the tiny Llama under the even layout and under MODE_PLAN: every rank's
    losses and clip norms, the last rank's returned (it holds the loss under a pipeline)."""
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    from semimig.shardformer import SemiMigPolicy, UnevenPlan

    out = {}
    for case, kwargs in cases.items():
        layouts = (("even", SemiMigPolicy()), ("uneven", SemiMigPolicy(shard_plan=UnevenPlan(**MODE_PLAN))))
        for layout, policy in layouts:
            plugin = HybridParallelPlugin(tp_size=2, custom_policy=policy, **kwargs)
            booster = Booster(plugin=plugin)
            model = tiny_lm("llama")
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            model, optimizer, *_ = booster.boost(model, optimizer)
            losses, norms = [], []
            for step in range(3):
                if plugin.pp_size > 1:
                    loss = booster.execute_pipeline(iter([token_batch(step)]), model, lambda o, i: o.loss, optimizer,
                                                    return_loss=True)["loss"]
                else:
                    loss = model(**token_batch(step)).loss
                    booster.backward(loss, optimizer)
                optimizer.step()
                norms.append(getattr(optimizer, "_current_grad_norm", None))
                optimizer.zero_grad()
                losses.append(None if loss is None else float(loss.detach().float()))
            out[(case, layout)] = (losses, norms)
    every = [None] * world
    dist.all_gather_object(every, out)
    return every[-1]


def _compare_modes(out, cases, tolerances):
    for case in cases:
        (even_losses, even_norms), (losses, norms) = out[(case, "even")], out[(case, "uneven")]
        loss_atol, norm_rtol = tolerances[case]
        assert None not in losses, case
        torch.testing.assert_close(losses, even_losses, atol=loss_atol, rtol=0.0, msg=case)
        if cases[case].get("max_norm"):
            torch.testing.assert_close(norms, even_norms, rtol=norm_rtol, atol=0.0, msg=case)


def test_mixed_precision_clipping_counts_every_shard_once():
    """bf16 and fp16 (AMP: the norm is of the loss-scaled gradients), max_norm 0.05.  Tolerances: bf16
    weights and activations, eps 2^-8 ≈ 3.9e-3, differently rounded partial sums (measured: losses
    4e-4 apart, norms 4e-4 relative): atol 3e-3 on the losses, rtol 3e-3 on the norms; fp16, eps
    2^-11 ≈ 4.9e-4 (measured 6e-5, 3e-4): atol 5e-4, rtol 1e-3."""
    cases = {"bf16": dict(pp_size=1, precision="bf16", max_norm=0.05),
             "fp16": dict(pp_size=1, precision="fp16", max_norm=0.05)}
    out = run_on_ranks(_modes_body, 2, cases, timeout_s=300)
    _compare_modes(out, cases, {"bf16": (3e-3, 3e-3), "fp16": (5e-4, 1e-3)})


@pytest.mark.slow
def test_zero1_and_pipeline_with_uneven_shards():
    """tp=2 x dp=2 ZeRO-1 bf16 with clipping (every DP replica the same plan), and pp=2 x tp=2 fp32."""
    cases = {"zero1": dict(pp_size=1, precision="bf16", zero_stage=1, max_norm=0.05, overlap_communication=False),
             "pp2": dict(pp_size=2, num_microbatches=2, precision="fp32")}
    out = run_on_ranks(_modes_body, 4, cases, timeout_s=400)
    _compare_modes(out, cases, {"zero1": (3e-3, 3e-3), "pp2": (LOSS_TOL["atol"], None)})


def _enable_body(rank, world):
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    import plugin_cases as pc
    import semimig
    from semimig.shardformer import SemiMigPolicy, UnevenPlan

    out = {}
    for mode in ("mig", "semi", "zero-pri"):
        plugin = HybridParallelPlugin(tp_size=2, pp_size=1, precision="fp32",
                                      custom_policy=SemiMigPolicy(shard_plan=UnevenPlan(**MODE_PLAN)))
        booster = Booster(plugin=plugin)
        model = tiny_lm("llama")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, optimizer, *_ = booster.boost(model, optimizer)
        balancer = []
        out[mode] = pc.outcome(lambda: balancer.append(semimig.enable(model, plugin, optimizer=optimizer, mode=mode)))
        for b in balancer:
            b.close()
    return out


def test_migrating_modes_refuse_uneven_shards():
    """Migration moves columns between equal shards (with uneven ones gloo aborts on a size mismatch):
    semimig.enable refuses 'mig' on an uneven layout; 'semi' runs with migration off (resizing and
    re-sharding only, tests/multirank/test_reshard_enable.py); resizing modes run."""
    out = run_on_ranks(_enable_body, 2, timeout_s=180)
    assert out["mig"].startswith("ConfigError") and "uneven tensor-parallel shards" in out["mig"], out["mig"]
    assert out["semi"] == "ok" and out["zero-pri"] == "ok"
