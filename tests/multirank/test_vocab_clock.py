"""The vocabulary's collectives on the step clock (:mod:`semimig.shardformer.vocab_clock`): Colossal-AI's
embedding, head and vocabulary-parallel cross-entropy, timed, compute bit-equal outputs and gradients to
Colossal-AI's own, and a rank that reaches one of their collectives before a slower rank reads its wait as
communication (gloo, two ranks; rank 1 late by ``LATE_S`` before each collective in turn)."""
import time

import pytest
import torch
import torch.nn as nn

from comm_regions import recorded_comm
from dist_harness import run_pooled

LATE_S = 0.3
VOCAB, HIDDEN, TOKENS = 128, 8, 10  # a vocabulary Colossal-AI need not pad


class Tiny(nn.Module):
    """Embedding → head → Colossal-AI's vocabulary-parallel cross-entropy, as a causal LM's forward runs them."""

    def __init__(self, embedding, head, group):
        super().__init__()
        self.embedding, self.head, self.group = embedding, head, group

    def forward(self, ids):
        from colossalai.shardformer.layer import cross_entropy_1d

        logits = self.head(torch.tanh(self.embedding(ids)))
        return cross_entropy_1d(logits.view(-1, logits.shape[-1]), ids.view(-1), process_group=self.group).mean()


def _build(group):
    from colossalai.shardformer.layer import VocabParallelEmbedding1D, VocabParallelLMHead1D

    torch.manual_seed(0)
    embedding, head = nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False)
    return Tiny(VocabParallelEmbedding1D.from_native_module(embedding, process_group=group),
                VocabParallelLMHead1D.from_native_module(head, process_group=group), group)


def _run(rank, world, late_at):
    import torch.distributed as dist

    from semimig._compat import apply_cpu_shim
    from semimig.shardformer import vocab_clock

    apply_cpu_shim()
    group = dist.group.WORLD
    plain = _build(group)
    timed = _build(group)  # the same seed: the same weights
    vocab_clock.install(timed)
    assert type(timed.head).__name__ == "TimedVocabParallelLMHead1D"
    def late(*_):
        if rank == 1:
            time.sleep(LATE_S)

    ids = torch.arange(TOKENS).remainder(VOCAB).view(2, TOKENS // 2)
    out = []
    for model in (plain, timed):
        hooks = {"embedding": lambda: model.embedding.register_forward_pre_hook(late),
                 "loss": lambda: model.head.register_forward_hook(lambda *a: late()),
                 "head backward": lambda: model.head.register_full_backward_pre_hook(lambda *a: late())}
        handle = hooks[late_at]()
        try:
            with recorded_comm() as inside:
                dist.barrier()
                loss = model(ids)
                loss.backward()
        finally:
            handle.remove()
        out.append((loss.detach(), [p.grad.clone() for p in model.parameters()], sum(inside)))
    vocab_clock.uninstall(timed)
    assert type(timed.head).__name__ == "VocabParallelLMHead1D"
    return out


@pytest.mark.parametrize("late_at", ["embedding", "loss", "head backward"])
def test_vocabulary_waits_are_communication_and_the_maths_is_colossal_ais(late_at):
    (plain_loss, plain_grads, untimed), (loss, grads, timed) = run_pooled(_run, 2, late_at)  # rank 0: the early one
    assert torch.equal(loss, plain_loss)  # same operations in the same order: bit-equal
    assert len(grads) == len(plain_grads) == 2 and all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
    assert untimed == 0.0  # Colossal-AI's classes: nothing in the region
    assert timed >= 0.8 * LATE_S, (late_at, timed)
