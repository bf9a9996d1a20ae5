"""Under ``split_gather`` sequence parallelism semimig's layers move what Colossal-AI's move.

A column -> row MLP on a real two-rank gloo group, built twice from one dense pair: from
semimig's layers and from Colossal-AI's own ``Linear1D_Col`` / ``Linear1D_Row`` with
``seq_parallel_mode="split_gather"``.  Every collective of ``torch.distributed`` that a forward
and backward issue is recorded with the bytes of the tensors it carries (the recorder calls the
real collective); the two layers' lists must be equal, and so must their outputs and gradients,
bit for bit.  With semimig's pruning directive the same collectives run on the same tensors.
"""
import contextlib
import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from dist_harness import run_pooled

HIDDEN, FFN, BATCH, SEQ = 8, 16, 2, 6
COLLECTIVES = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single")


def _bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


@contextlib.contextmanager
def _recorded():
    """Every torch.distributed collective called inside, as ``(name, bytes of its tensor arguments)``."""
    calls, originals = [], {name: getattr(dist, name) for name in COLLECTIVES}

    def recorder(name, real):
        def call(*args, **kwargs):
            calls.append((name, sum(_bytes(a) for a in args)))
            return real(*args, **kwargs)
        return call

    for name, real in originals.items():
        setattr(dist, name, recorder(name, real))
    try:
        yield calls
    finally:
        for name, real in originals.items():
            setattr(dist, name, real)


def _step(col, row, x):
    """Forward and backward of the pair on this rank's sequence chunk ``x``; output and gradients."""
    x = x.clone().requires_grad_(True)
    y = row(torch.relu(col(x)))
    (y.square().sum()).backward()
    return [y.detach(), x.grad] + [p.grad for p in (*col.parameters(), *row.parameters())]


def _traffic_body(rank, world):
    import colossalai.shardformer.layer as cl

    import semimig.nn as snn
    from semimig.nn.directive import LayerDirective

    group = dist.group.WORLD
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)
    x = torch.randn(BATCH, SEQ, HIDDEN).chunk(world, dim=1)[rank]
    sp = dict(seq_parallel_mode="split_gather")
    runs = {}
    for name, lib in (("colossalai", cl), ("semimig", snn)):
        col = lib.Linear1D_Col.from_native_module(copy.deepcopy(fc1), group, **sp)
        row = lib.Linear1D_Row.from_native_module(copy.deepcopy(fc2), group, parallel_input=True, **sp)
        with _recorded() as calls:
            out = _step(col, row, x)
        runs[name] = (calls, out)
    (cai_calls, cai_out), (semi_calls, semi_out) = runs["colossalai"], runs["semimig"]
    assert cai_calls, "Colossal-AI's split_gather layers issued no collective"
    assert sorted(semi_calls) == sorted(cai_calls), (semi_calls, cai_calls)
    assert sum(b for _, b in semi_calls) == sum(b for _, b in cai_calls)
    for got, want in zip(semi_out, cai_out):
        assert torch.equal(got, want)

    # a pruning directive on both layers: the GEMMs shrink, the collectives stay Colossal-AI's
    col = snn.Linear1D_Col.from_native_module(copy.deepcopy(fc1), group, **sp)
    row = snn.Linear1D_Row.from_native_module(copy.deepcopy(fc2), group, parallel_input=True, **sp)
    col.directive = LayerDirective(iteration=0, keep=torch.tensor([0, 2, 3, 5, 6, 7]))
    row.directive = LayerDirective(iteration=0, keep=torch.tensor([1, 2, 4, 6, 7]))
    with _recorded() as pruned_calls:
        _step(col, row, x)
    assert sorted(pruned_calls) == sorted(cai_calls), (pruned_calls, cai_calls)


def test_split_gather_moves_the_bytes_colossalai_moves():
    run_pooled(_traffic_body, 2, timeout_s=90)
