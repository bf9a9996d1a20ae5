"""Evaluation split between data-parallel groups (two gloo ranks, one per group, the model under torch DDP,
whose every forward broadcasts its buffers over the group): each group evaluates its rows of every batch
(:func:`semimig.allocation.evaluation_share`), one forward per batch on both, and the rows' summed loss
over the summed rows is the single-process mean over every batch."""
from __future__ import annotations

import math

import pytest

from dist_harness import run_pooled

BATCHES, ROWS = 3, 8


def _model_and_batches():
    import types

    import torch

    torch.manual_seed(0)

    class WithLoss(torch.nn.Module):  # the Hugging Face surface evaluate() reads: model(**batch).loss
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(6, 3)
            self.register_buffer("scale", torch.tensor(1.5))  # DDP broadcasts it in every forward

        def forward(self, x, y):
            return types.SimpleNamespace(loss=torch.nn.functional.cross_entropy(self.net(x) * self.scale, y))

    g = torch.Generator().manual_seed(1)
    batches = [{"x": torch.randn(ROWS, 6, generator=g), "y": torch.randint(0, 3, (ROWS,), generator=g)}
               for _ in range(BATCHES)]
    return WithLoss(), batches


def _body(rank, world, samples):
    import torch
    import torch.distributed as dist

    from semimig.allocation import evaluation_share
    from semimig.bench.llm.build import evaluate

    model, batches = _model_and_batches()
    rows = evaluation_share(ROWS, samples, rank)
    loss = evaluate(torch.nn.parallel.DistributedDataParallel(model), batches, rows=rows, dp_group=None)
    every = [None] * world
    dist.all_gather_object(every, (len(rows), loss))
    return every


@pytest.mark.parametrize("samples", [(1, 1), (5, 3), (0, 8)])
def test_each_group_evaluates_its_rows_and_the_mean_is_over_every_batch(samples):
    from semimig.bench.llm.build import evaluate

    model, batches = _model_and_batches()
    whole = evaluate(model, batches)
    every = run_pooled(_body, 2, samples)
    assert sum(n for n, _ in every) == ROWS and [n for n, _ in every] != [ROWS, ROWS]
    for _, loss in every:
        assert math.isclose(loss, whole, rel_tol=1e-6), (samples, loss, whole)
