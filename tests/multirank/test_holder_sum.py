"""The holders' sum (:mod:`semimig.comm.holders`) equals the group's all-reduce on every rank.

Three gloo ranks, each with its own tensor from one seed; the ranks in ``holders`` contribute their
tensor, the others (which hold no column of the layer, so their partial is zero) receive the sum.
Checked against the sum computed on one process: the blocking and the started form, tensors of
several shapes, and a non-contiguous one (received through a contiguous buffer).  Four ranks with two
holder sets, one inside the other (a plan whose MLP and KV groups leave different ranks idle): the ranks
in both sets make their groups without waiting forever for the one that is in the larger only.
"""
from __future__ import annotations

import pytest
import torch

from dist_harness import run_pooled

TIMEOUT_S = 120
HOLDERS = (0, 2)
SHAPES = [(5, 7), (1,), (6, 4)]  # the last one transposed


def _parts(world: int) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(7)
    return [[torch.randn(shape, generator=gen) for shape in SHAPES] for _ in range(world)]


def _body(rank: int, world: int, holders: tuple[int, ...]) -> list[list[torch.Tensor]]:
    import torch.distributed as dist

    from semimig.comm import primitives as P
    from semimig.comm.holders import HolderSum

    group = dist.group.WORLD
    out = []
    for started in (False, True):
        mine = [t if rank in holders else torch.zeros_like(t) for t in _parts(world)[rank]]
        mine[-1] = mine[-1].t()  # not contiguous
        s = HolderSum(group, holders)
        for t in mine:
            if started:
                P.wait(s.start(t))
            else:
                s.all_reduce_(t)
        out.append([t.clone() for t in mine])
    every = [None] * world
    dist.all_gather_object(every, out)
    return every


@pytest.mark.parametrize("holders", [HOLDERS, (1,)])
def test_every_rank_ends_with_the_holders_sum(holders):
    world = 3
    got = run_pooled(_body, world, holders, timeout_s=TIMEOUT_S)
    parts = _parts(world)
    want = [sum(parts[r][i] for r in holders) for i in range(len(SHAPES))]
    want[-1] = want[-1].t()
    for rank in range(world):
        for form in got[rank]:
            for a, b in zip(form, want):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def _nested_body(rank: int, world: int, sets: tuple[tuple[int, ...], ...]) -> list[list[torch.Tensor]]:
    import torch.distributed as dist

    from semimig.comm.holders import HolderSum

    out = []
    for holders in sets:  # each set's group is made here, the first time it is used
        t = _parts(world)[rank][0] if rank in holders else torch.zeros(SHAPES[0])
        HolderSum(dist.group.WORLD, holders).all_reduce_(t)
        out.append(t)
    every = [None] * world
    dist.all_gather_object(every, out)
    return every


NESTED = ((1, 3), (0, 1, 3))
"""Sets no other case of the four-rank pool makes, so their groups are made by this case."""


def test_nested_holder_sets_each_reduce_on_every_rank():
    world = 4
    got = run_pooled(_nested_body, world, NESTED, timeout_s=TIMEOUT_S)
    parts = _parts(world)
    for i, holders in enumerate(NESTED):
        want = sum(parts[r][0] for r in holders)
        for rank in range(world):
            torch.testing.assert_close(got[rank][i], want, rtol=1e-6, atol=1e-6)
