"""Tiny Hugging Face models and a 3-step AdamW run under ``HybridParallelPlugin``, shared by the
plugin-matrix, checkpoint and ``semimig.enable`` tests.

Every model is built from the same seed in every process, so a run with ``SemiMigPolicy`` and a
run with Colossal-AI's own policy start from identical weights and see identical batches.
Sizes are the smallest each architecture accepts at ``tp=2`` with whole attention heads per rank
(hidden 32, 2 layers, 4 heads, 2 KV heads where the model has grouped-query attention); the
vocabulary is 128, a multiple of ``make_vocab_size_divisible_by * tp`` (64 * 2): with 64 tokens
Colossal-AI's own policy fails in ``dist_cross_entropy`` ("cannot reshape tensor of 0 elements").
OPT is built with ``attn_implementation="eager"``: Colossal-AI's OPT policy has no entry for
transformers' default ``"sdpa"`` (``KeyError: 'sdpa'``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn as nn

VOCAB = 128
SEQ = 16
BATCH = 4
MODELS = ("llama", "qwen2", "mistral", "gpt2", "bert", "opt", "vit")
"""The models of the matrix (``build_model`` also knows ``llama-mha``: Llama with 4 KV heads)."""


def _decoder_kwargs() -> dict:
    return dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=2 * SEQ)


def build_model(name: str) -> nn.Module:
    """The tiny model ``name`` (one of :data:`MODELS`), initialised from seed 0, dropout off."""
    import transformers as T

    torch.manual_seed(0)
    if name == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(**_decoder_kwargs(), num_key_value_heads=2))
    if name == "llama-mha":  # all_to_all sequence parallelism splits KV heads over tp x sp = 4 ranks
        return T.LlamaForCausalLM(T.LlamaConfig(**_decoder_kwargs(), num_key_value_heads=4))
    if name == "qwen2":
        return T.Qwen2ForCausalLM(T.Qwen2Config(**_decoder_kwargs(), num_key_value_heads=2))
    if name == "mistral":
        return T.MistralForCausalLM(T.MistralConfig(**_decoder_kwargs(), num_key_value_heads=2))
    if name == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=2 * SEQ,
                                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    if name == "opt":
        return T.OPTForCausalLM(T.OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                            num_attention_heads=4, max_position_embeddings=2 * SEQ,
                                            word_embed_proj_dim=32, dropout=0.0, attention_dropout=0.0,
                                            attn_implementation="eager"))  # Colossal-AI's OPT policy knows no "sdpa"
    if name == "bert":
        return T.BertForMaskedLM(T.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=4, intermediate_size=64,
                                              max_position_embeddings=2 * SEQ, hidden_dropout_prob=0.0,
                                              attention_probs_dropout_prob=0.0))
    if name == "vit":
        return T.ViTForImageClassification(T.ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=32,
                                                       num_hidden_layers=2, num_attention_heads=4,
                                                       intermediate_size=64, num_labels=4, hidden_dropout_prob=0.0,
                                                       attention_probs_dropout_prob=0.0))
    raise ValueError(f"unknown model {name!r}; one of {MODELS}")


def batch_for(name: str, step: int = 0) -> dict:
    """Batch ``step`` of a fixed seeded stream: token ids (labels = inputs) or images and classes."""
    gen = torch.Generator().manual_seed(1000 + step)
    if name == "vit":
        return {"pixel_values": torch.randn(BATCH, 3, 8, 8, generator=gen),
                "labels": torch.randint(0, 4, (BATCH,), generator=gen)}
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    # Colossal-AI's GPT-2 forward needs the mask (it builds its own attention bias from it)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


@dataclass
class Boosted:
    """A model, optimizer and booster after ``booster.boost``."""

    model: Any
    optimizer: Any
    booster: Any
    plugin: Any


def boost(name: str, plugin_kwargs: dict, *, semimig: bool, lr: float = 1e-2,
          model: Optional[nn.Module] = None) -> Boosted:
    """Boost ``build_model(name)`` (or ``model``) with AdamW under ``HybridParallelPlugin(**plugin_kwargs)``,
    with ``SemiMigPolicy`` when ``semimig`` else Colossal-AI's auto policy."""
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    from semimig.shardformer import SemiMigPolicy

    kwargs = dict(plugin_kwargs)
    if kwargs.get("zero_stage", 0) > 0:
        kwargs.setdefault("overlap_communication", False)  # CUDA streams only (semimig._compat)
    plugin = HybridParallelPlugin(**kwargs, custom_policy=SemiMigPolicy() if semimig else None)
    booster = Booster(plugin=plugin)
    model = build_model(name) if model is None else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model, optimizer, *_ = booster.boost(model, optimizer)
    return Boosted(model, optimizer, booster, plugin)


def train_step(run: Boosted, batch: dict) -> Optional[float]:
    """One forward/backward/AdamW step; the loss on ranks that hold it (pipeline: last stage), else None."""
    # (HybridParallelModule casts floating inputs, ViT's pixels, to the half precision itself)
    if run.plugin.pp_size > 1:
        out = run.booster.execute_pipeline(iter([batch]), run.model, _loss_of, run.optimizer, return_loss=True)
        loss = out["loss"]
    else:
        loss = run.model(**batch).loss
        run.booster.backward(loss, run.optimizer)
    run.optimizer.step()
    run.optimizer.zero_grad()
    return None if loss is None else float(loss.detach().float())


def _loss_of(outputs: Any, inputs: Any) -> torch.Tensor:
    return outputs.loss


def train_losses(run: Boosted, name: str, batches: Sequence[int] = (0, 0, 0)) -> list:
    """One step per entry of ``batches`` (indices into :func:`batch_for`'s stream; the default
    trains 3 steps on one batch, so the loss must fall); every rank's losses, gathered
    (``None`` where a rank holds no loss)."""
    import torch.distributed as dist

    mine = [train_step(run, batch_for(name, b)) for b in batches]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def semimig_layer_count(module: nn.Module) -> int:
    """How many balanced (semimig) layers ``module`` holds."""
    from semimig.nn.balanced import BalancedLinearMixin

    return sum(isinstance(m, BalancedLinearMixin) for m in module.modules())


def outcome(call: Callable[[], Any]) -> str:
    """``"ok"`` or ``"<ExceptionType>: <message>"`` of ``call()`` (for tests that show a refusal)."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - reported, not handled
        return f"{type(exc).__name__}: {exc}"
    return "ok"
