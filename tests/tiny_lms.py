"""The tiny causal language models and token batches the uneven-shard tests share.

``tiny_lm("llama")``: Llama with GQA (8 query heads, 4 KV heads, hidden 64, MLP 256, 2 layers);
``tiny_lm("gpt2")``: GPT-2 with the same widths (fused QKV, dropout off).  Both are built under
``torch.manual_seed(0)``, so every rank and the dense reference hold the same weights.
``reshardable_llama(hidden, intermediate)``: Llama with 4 query / 2 KV heads in the widths the
re-sharding tests choose (vocabulary 128, 2 layers, sequences up to 64).
``token_batch(step)``: a deterministic batch of random token ids for step ``step`` (labels = ids).
``boost_lm(model, ...)``: the model and an optimizer under ``HybridParallelPlugin`` (tensor parallel).
``gather_like(param, tensor)``: a shard-shaped tensor gathered to the full tensor by ``param``'s layout.
``split_step(...)``: one optimizer step of a global batch split over the replicas by a balancer; the
global-batch mean loss.
"""
from __future__ import annotations

import torch

VOCAB, SEQ, BATCH = 128, 16, 4


def tiny_lm(name: str):
    import transformers as T

    torch.manual_seed(0)
    if name == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=256,
                                                num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                                                max_position_embeddings=2 * SEQ))
    if name in ("qwen2", "mistral"):  # Llama's MLP and GQA under other class names (Qwen2: q/k/v biases)
        config_cls, model_cls = {"qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM),
                                 "mistral": (T.MistralConfig, T.MistralForCausalLM)}[name]
        return model_cls(config_cls(vocab_size=VOCAB, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                                    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2 * SEQ))
    if name == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_embd=64, n_inner=256, n_layer=2, n_head=8,
                                              n_positions=2 * SEQ, resid_pdrop=0.0, embd_pdrop=0.0,
                                              attn_pdrop=0.0))
    raise ValueError(f"tiny_lm: unknown model {name!r} (llama, qwen2, mistral or gpt2)")


def reshardable_llama(hidden: int, intermediate: int):
    import transformers as T

    torch.manual_seed(0)
    return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=intermediate,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            max_position_embeddings=64))


def token_batch(step: int, seq: int = SEQ) -> dict:
    gen = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, VOCAB, (BATCH, seq), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def train_steps(booster, model, optimizer, steps, batch=token_batch) -> list:
    """One booster training step per entry of ``steps`` on ``batch(step)``; the losses as floats."""
    losses = []
    for step in steps:
        loss = model(**batch(step)).loss
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def split_step(booster, model, optimizer, balancer, plugin, batch: dict) -> float:
    """One optimizer step of ``batch`` (the global batch) split over the DP replicas by ``balancer``
    (:func:`semimig.allocation.run_iteration`); returns the global-batch mean loss (the replicas' sum
    of their samples' share, all-reduced over the DP group)."""
    import torch.distributed as dist

    from semimig.allocation import run_iteration

    mine = run_iteration(booster, model, optimizer, iter(balancer.micro_batches(batch)),
                         lambda m, b: m(**b).loss, zero_stage=plugin.zero_stage)
    total = torch.tensor([mine], dtype=torch.float64)
    dist.all_reduce(total, group=plugin.dp_group)
    optimizer.step()
    optimizer.zero_grad()
    return float(total) / plugin.dp_size


def boost_lm(model, *, tp: int = 2, precision: str = "fp32", policy=None, optimizer=None, **plugin_kwargs) -> tuple:
    """``model`` boosted under ``HybridParallelPlugin(tp_size=tp, pp_size=1, precision=precision,
    custom_policy=policy, **plugin_kwargs)`` with ``optimizer`` (AdamW, lr 1e-3, when ``None``):
    ``(booster, model, optimizer, plugin)``.  Under ZeRO, communication overlap is off unless asked
    for (it needs CUDA streams)."""
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    if plugin_kwargs.get("zero_stage", 0) > 0:
        plugin_kwargs.setdefault("overlap_communication", False)
    plugin = HybridParallelPlugin(tp_size=tp, pp_size=1, precision=precision, custom_policy=policy, **plugin_kwargs)
    booster = Booster(plugin=plugin)
    if optimizer is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, *_ = booster.boost(model, optimizer)
    return booster, model, optimizer, plugin


def gather_like(param, tensor) -> torch.Tensor:
    """``tensor`` (shaped like this rank's shard of ``param``: its data, gradient or optimizer state)
    gathered to the full tensor by ``param``'s layout; a plain tensor, no attributes, so it crosses the
    pipe from a rank to the test."""
    from colossalai.tensor.d_tensor.api import is_customized_distributed_tensor, is_distributed_tensor, to_global

    piece = torch.empty_like(tensor).copy_(tensor.detach())
    if is_distributed_tensor(param):
        piece.dist_layout = param.dist_layout
        full = to_global(piece)
    elif is_customized_distributed_tensor(param):
        full = param.gather_fn(piece)
    else:
        full = piece
    return torch.empty_like(full).copy_(full)


def dense_llama_run(steps: int) -> dict:
    """The dense Hugging Face tiny Llama from the same seed, AdamW (lr 1e-3) on :func:`token_batch`: every
    step's loss, step 0's gradients and the weights after 2 steps (``losses``, ``grads``, ``weights``)."""
    model = tiny_lm("llama")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = {"losses": []}
    for step in range(steps):
        loss = model(**token_batch(step)).loss
        loss.backward()
        if step == 0:
            out["grads"] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        out["losses"].append(float(loss.detach()))
        if step == 1:
            out["weights"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out
