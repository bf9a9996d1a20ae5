"""Evaluation split between data-parallel groups (two gloo ranks, one per group): each group evaluates
its share of the batches (:func:`semimig.allocation.evaluation_share`), and the summed loss over the
summed count is the single-process mean over every batch."""
from __future__ import annotations

import math

import pytest

from dist_harness import run_pooled

BATCHES = 7


def _model_and_batches():
    import types

    import torch

    torch.manual_seed(0)
    net = torch.nn.Linear(6, 3)

    class WithLoss(torch.nn.Module):  # the Hugging Face surface evaluate() reads: model(**batch).loss
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x, y):
            return types.SimpleNamespace(loss=torch.nn.functional.cross_entropy(self.net(x), y))

    g = torch.Generator().manual_seed(1)
    batches = [{"x": torch.randn(4, 6, generator=g), "y": torch.randint(0, 3, (4,), generator=g)}
               for _ in range(BATCHES)]
    return WithLoss(), batches


def _body(rank, world, samples):
    import torch.distributed as dist

    from semimig.allocation import evaluation_share
    from semimig.bench.llm.build import evaluate

    model, batches = _model_and_batches()
    share = evaluation_share(len(batches), samples, rank)
    every = [None] * world
    dist.all_gather_object(every, (len(share), evaluate(model, batches, share=share, dp_group=None)))
    return every


@pytest.mark.parametrize("samples", [(1, 1), (5, 3), (0, 8)])
def test_each_group_evaluates_its_share_and_the_mean_is_over_every_batch(samples):
    from semimig.bench.llm.build import evaluate

    model, batches = _model_and_batches()
    whole = evaluate(model, batches)
    every = run_pooled(_body, 2, samples)
    assert sum(n for n, _ in every) == BATCHES and [n for n, _ in every] != [BATCHES, BATCHES]
    for _, loss in every:
        assert math.isclose(loss, whole, rel_tol=1e-12), (samples, loss, whole)
