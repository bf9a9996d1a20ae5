"""Colossal-AI's legacy engine on CPU: ``colossalai.legacy.launch`` in 1D tensor mode and its
``Linear1D_Col`` -> ``Linear1D_Row`` MLP, with semimig's CPU shim (see ``tests/legacy_helpers.py``).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_harness import run_on_ranks
from legacy_helpers import LEGACY_HOST, free_ipv6_port, launch_legacy_1d

SEED = 1024  # launch_legacy_1d's default: DATA seed SEED, TENSOR seed SEED + tp_rank
IN, HIDDEN, OUT = 6, 8, 5  # HIDDEN divisible by every world size below
BATCH, SEQ = 2, 3  # the legacy column layer's backward needs 3-D inputs [B, S, H]


def _draw_like(tensor: torch.Tensor, fan_in: int = 0, fan_out: int = 0) -> None:
    """A legacy initializer that copies uniform draws from torch's default generator."""
    with torch.no_grad():
        tensor.copy_(torch.rand(tensor.shape, dtype=tensor.dtype))


def _seeds_body(rank: int, world_size: int, port: int) -> None:
    launch_legacy_1d(rank, world_size, port, seed=SEED)
    from colossalai.legacy.context import ParallelMode
    from colossalai.legacy.context.random import get_current_mode, get_seeds
    from colossalai.legacy.core import global_context as gpc
    from colossalai.legacy.nn import Linear1D_Col

    assert gpc.tensor_parallel_size == world_size
    assert gpc.get_world_size(ParallelMode.PARALLEL_1D) == world_size
    assert gpc.get_local_rank(ParallelMode.PARALLEL_1D) == rank
    assert get_seeds() == {ParallelMode.DATA: SEED, ParallelMode.TENSOR: SEED + rank}
    assert get_current_mode() == ParallelMode.DATA

    # The constructor initialises inside `seed(ParallelMode.TENSOR)`: on CPU that must be the
    # CPU generator seeded with SEED + rank, and the DATA stream must resume untouched after it.
    col = Linear1D_Col(IN, HIDDEN, weight_initializer=_draw_like, bias_initializer=_draw_like)
    tensor_stream = torch.Generator().manual_seed(SEED + rank)
    assert torch.equal(col.weight.detach(), torch.rand(col.weight.shape, generator=tensor_stream))
    assert torch.equal(col.bias.detach(), torch.rand(col.bias.shape, generator=tensor_stream))
    data_stream = torch.Generator().manual_seed(SEED)
    assert torch.equal(torch.rand(4), torch.rand(4, generator=data_stream))


@pytest.mark.parametrize("world_size", [1, 2])
def test_legacy_launch_registers_cpu_seeds_per_mode(world_size: int) -> None:
    run_on_ranks(_seeds_body, world_size, free_ipv6_port(), timeout_s=60)


def _all_gather_cat(shard: torch.Tensor, dim: int, group) -> torch.Tensor:
    parts = [torch.empty_like(shard) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, shard.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _mlp_body(rank: int, world_size: int, port: int) -> None:
    launch_legacy_1d(rank, world_size, port, seed=SEED)
    from colossalai.legacy.context import ParallelMode
    from colossalai.legacy.core import global_context as gpc
    from colossalai.legacy.nn import Linear1D_Col, Linear1D_Row

    group = gpc.get_group(ParallelMode.PARALLEL_1D)
    col = Linear1D_Col(IN, HIDDEN)  # weight [HIDDEN/e, IN], bias [HIDDEN/e]; output stays split
    row = Linear1D_Row(HIDDEN, OUT)  # weight [OUT, HIDDEN/e], bias [OUT] broadcast from rank 0

    gen = torch.Generator().manual_seed(7)  # same input and upstream grad on every rank
    x = torch.randn(BATCH, SEQ, IN, generator=gen)
    dy = torch.randn(BATCH, SEQ, OUT, generator=gen)
    x_tp = x.clone().requires_grad_()
    y = row(col(x_tp))
    y.backward(dy)

    # Dense float64 reference from the gathered shards.
    w1 = _all_gather_cat(col.weight.detach(), 0, group).double().requires_grad_()
    b1 = _all_gather_cat(col.bias.detach(), 0, group).double().requires_grad_()
    w2 = _all_gather_cat(row.weight.detach(), 1, group).double().requires_grad_()
    b2 = row.bias.detach().double().requires_grad_()
    x_ref = x.double().requires_grad_()
    y_ref = torch.nn.functional.linear(torch.nn.functional.linear(x_ref, w1, b1), w2, b2)
    y_ref.backward(dy.double())

    # fp32 sums of at most HIDDEN*B*S = 48 products of O(1) values: 1e-5 absolute is generous
    # for reassociation and still far below any real error (a wrong shard is O(0.1) off).
    tol = dict(atol=1e-5, rtol=0)
    torch.testing.assert_close(y.double(), y_ref, **tol)
    torch.testing.assert_close(x_tp.grad.double(), x_ref.grad, **tol)
    torch.testing.assert_close(col.weight.grad.double(), w1.grad.chunk(world_size, 0)[rank], **tol)
    torch.testing.assert_close(col.bias.grad.double(), b1.grad.chunk(world_size, 0)[rank], **tol)
    torch.testing.assert_close(row.weight.grad.double(), w2.grad.chunk(world_size, 1)[rank], **tol)
    torch.testing.assert_close(row.bias.grad.double(), b2.grad, **tol)


@pytest.mark.parametrize("world_size", [1, 2])
def test_legacy_linear1d_mlp_matches_dense_reference(world_size: int) -> None:
    run_on_ranks(_mlp_body, world_size, free_ipv6_port(), timeout_s=60)


def _ipv4_body(rank: int, world_size: int, port: int) -> None:
    import colossalai.legacy

    dist.destroy_process_group()
    config = dict(parallel=dict(tensor=dict(size=world_size, mode="1d")))
    with pytest.raises(ValueError, match="IPv4 address cannot be in brackets"):
        colossalai.legacy.launch(config, rank, world_size, "127.0.0.1", port, backend="gloo", verbose=False)


def test_legacy_launch_needs_an_ipv6_host() -> None:
    """Why LEGACY_HOST is "::1": launch builds tcp://[host]:port, which rejects IPv4 hosts."""
    assert LEGACY_HOST == "::1"
    run_on_ranks(_ipv4_body, 1, free_ipv6_port(), timeout_s=30)
