"""The tiny causal language models and token batches the uneven-shard tests share.

``tiny_lm("llama")``: Llama with GQA (8 query heads, 4 KV heads, hidden 64, MLP 256, 2 layers);
``tiny_lm("gpt2")``: GPT-2 with the same widths (fused QKV, dropout off).  Both are built under
``torch.manual_seed(0)``, so every rank and the dense reference hold the same weights.
``token_batch(step)``: a deterministic batch of random token ids for step ``step`` (labels = ids).
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


def token_batch(step: int) -> dict:
    gen = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
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
