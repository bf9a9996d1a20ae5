"""What the per-replica plan tests share (tp 2 x dp 2 on gloo): the tiny Llama's plans in units, the optimizer,
the global batch and one training step of a replica on its rows of it."""
from __future__ import annotations

import torch

from tiny_lms import SEQ, VOCAB

BLOCK = 32
GLOBAL = 8
EVEN = ((4, 4), (2, 2))          # (mlp blocks, kv groups) per TP rank


def plan(units):
    from semimig.shardformer import UnevenPlan

    return UnevenPlan(mlp_units=units[0], kv_units=units[1], block_size=BLOCK)


def sgd(model):
    """SGD with momentum: linear in the gradients, so the weights keep their reassociation-sized differences
    (AdamW's first steps, ``g/|g|``, turn a near-zero gradient's last bits into a whole step); its momentum
    buffers are per-parameter state a re-plan moves like AdamW's moments."""
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def global_batch(step):
    gen = torch.Generator().manual_seed(2000 + step)
    ids = torch.randint(0, VOCAB, (GLOBAL, SEQ), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def replica_backward(booster, model, optimizer, step, d, micro=1):
    """Replica ``d``'s forward and backward on rows ``4d … 4d+3`` of the global batch in ``micro`` micro-batches,
    all but the last under ``no_sync``; the last micro-batch's loss, scaled by ``1/micro``."""
    rows = 4 // micro
    for m in range(micro):
        batch = {k: v[4 * d + rows * m:4 * d + rows * (m + 1)] for k, v in global_batch(step).items()}
        if m < micro - 1:
            with booster.no_sync(model, optimizer):
                loss = model(**batch).loss / micro
                booster.backward(loss, optimizer)
        else:
            loss = model(**batch).loss / micro
            booster.backward(loss, optimizer)
    return loss
