"""A directive acts on the fused and GPT-2 ``Conv1D`` layers exactly as on ``Linear1D_Col/Row``.

Each rank prunes its own set of ``K`` columns of the GEMM view ``gemm_weight  # [N_r, K_r]``
(for ``Conv1D``, rows of the stored ``[K, N]`` weight), and with ``migrate`` rank 1 also hands
its last ``L`` columns to the others.  Reference: the unsharded Hugging Face ``Conv1D`` /
``nn.Linear`` from the same seed whose weight is zero wherever some rank prunes (the pruned
inputs then contribute nothing); its output and input gradient must be the layer's, and its
weight gradient, with those entries zeroed, the layer's sharded gradient (``zero`` imputation:
exactly zero there).  Migrated columns are computed by receivers exactly, so they are not
masked.  fp32, atol 1e-5 (sharded vs unsharded association only).
"""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from dist_harness import run_on_ranks
from test_layers_conformance import PACKED, shard

ATOL = 1e-5
STRAGGLER, MIGRATED = 1, 3


def _layer(kind, world):
    """``(dense, make, layout)``: the unsharded module, a factory of fresh semimig layers, and
    ``(conv?, column?, parts)``."""
    import semimig.nn as snn
    from transformers.pytorch_utils import Conv1D

    group = dist.group.WORLD
    torch.manual_seed(0)
    if kind == "conv_col":  # GPT-2 c_attn: Q, K, V packed along N
        dense, cls, extra = Conv1D(3 * 8 * world, 12), snn.GPT2FusedLinearConv1D_Col, {"split_sizes": [8 * world] * 3}
        layout = (True, True, [8 * world] * 3)
    elif kind == "conv_row":  # GPT-2 c_proj
        dense, cls, extra = Conv1D(10, 12 * world), snn.GPT2FusedLinearConv1D_Row, {"parallel_input": False}
        layout = (True, False, None)
    elif kind == "fused_col":
        parts = [p // 2 * world for p in PACKED]
        dense, cls, extra = nn.Linear(12, sum(parts)), snn.FusedLinear1D_Col, {"split_sizes": parts}
        layout = (False, True, parts)
    else:  # fused_row: K packed; its input arrives packed too (parallel_input=False would split it
        # with Colossal-AI's packed gather, whose backward moves tensors to CUDA)
        parts = [6 * world, 6 * world]
        dense, cls, extra = nn.Linear(sum(parts), 10), snn.FusedLinear1D_Row, {"split_sizes": parts}
        layout = (False, False, parts)
    if isinstance(dense, Conv1D):
        nn.init.normal_(dense.weight, std=0.2)
    return dense, (lambda: cls.from_native_module(copy.deepcopy(dense), group, **extra)), layout


def _pruned(rank, k_own):
    """The local columns rank ``rank`` prunes (a different pair on every rank)."""
    return sorted({(2 * rank + 1) % k_own, (2 * rank + 4) % k_own})


def _global_index(n, k, rank, world, column, parts):
    """Global ``(N, K)`` indices of rank ``rank``'s GEMM view."""
    if column:
        return shard(torch.arange(n), 0, rank, world, parts), torch.arange(k)
    return torch.arange(n), shard(torch.arange(k), 0, rank, world, parts)


def _directive(rank, world, k_local, migrate):
    from semimig.migration.exchange import make_exchange
    from semimig.migration.layout import MigrationLayout
    from semimig.nn import LayerDirective

    k_own = k_local - (MIGRATED if migrate and rank == STRAGGLER else 0)
    keep = torch.tensor([c for c in range(k_own) if c not in _pruned(rank, k_own)])
    if not migrate:
        return LayerDirective(iteration=0, keep=keep)
    layout = MigrationLayout.build(world, k_local, {STRAGGLER: MIGRATED})
    return LayerDirective(iteration=0, keep=keep, layout=layout, exchange=make_exchange("broadcast-reduce", dist.group.WORLD))


def _directive_body(rank, world, kind, migrate):
    dense, make, (conv, column, parts) = _layer(kind, world)
    layer = make()
    n_local, k_local = layer.gemm_weight.shape
    assert layer.k_columns == k_local
    if conv:  # the [N, K] view of the stored [K, N] shard, not a copy
        assert layer.gemm_weight.data_ptr() == layer.weight.data_ptr() and layer.weight.shape == (k_local, n_local)
    n_total = n_local * (world if column else 1)
    k_total = k_local * (1 if column else world)

    # where any rank prunes, in global [N, K] coordinates
    mask = torch.ones(n_total, k_total, dtype=torch.bool)
    for r in range(world):
        k_own = k_local - (MIGRATED if migrate and r == STRAGGLER else 0)
        rows, cols = _global_index(n_total, k_total, r, world, column, parts)
        mask[rows[:, None], cols[_pruned(r, k_own)][None, :]] = False
    mask_stored = mask.t() if conv else mask

    masked = copy.deepcopy(dense)
    with torch.no_grad():
        masked.weight.mul_(mask_stored)
    torch.manual_seed(5)
    x = torch.randn(2, 3, k_total)
    xd = x.clone().requires_grad_(True)
    yd = masked(xd)
    (yd * yd).sum().backward()

    layer.directive = _directive(rank, world, k_local, migrate)
    own_input = kind == "fused_row"
    xs = (shard(x, -1, rank, world, parts) if own_input else x).clone().requires_grad_(True)
    y = layer(xs)
    (y * y).sum().backward()  # column: this rank's outputs; the ranks' losses sum to the dense one
    rows, cols = _global_index(n_total, k_total, rank, world, column, parts)
    torch.testing.assert_close(y, yd.detach()[..., rows], atol=ATOL, rtol=0)
    torch.testing.assert_close(xs.grad, xd.grad[..., cols] if own_input else xd.grad, atol=ATOL, rtol=0)

    w_dim = (1 if column else 0) if conv else (0 if column else 1)
    expect_dw = shard(masked.weight.grad * mask_stored, w_dim, rank, world, parts)
    torch.testing.assert_close(layer.weight.grad, expect_dw, atol=ATOL, rtol=0)
    expect_db = shard(masked.bias.grad, 0, rank, world, parts) if column else masked.bias.grad
    torch.testing.assert_close(layer.bias.grad, expect_db, atol=ATOL, rtol=0)
    k_own = k_local - (MIGRATED if migrate and rank == STRAGGLER else 0)
    gemm_grad = layer.weight.grad.t() if conv else layer.weight.grad  # [N_r, K_r]
    assert torch.count_nonzero(gemm_grad[:, _pruned(rank, k_own)]) == 0  # zero imputation: exactly zero


@pytest.mark.parametrize("migrate", [False, True])
@pytest.mark.parametrize("kind", ["conv_col", "conv_row", "fused_col", "fused_row"])
def test_directive_prunes_and_migrates_k_exactly(kind, migrate):
    run_on_ranks(_directive_body, 2, kind, migrate)


@pytest.mark.parametrize("kind", ["conv_col", "conv_row"])
def test_directive_on_gpt2_layers_on_four_ranks(kind):
    run_on_ranks(_directive_body, 4, kind, True)


def _bad_input_body(rank, world):
    from transformers.pytorch_utils import Conv1D

    import semimig.nn as snn
    from semimig.errors import ConfigError

    group = dist.group.WORLD
    with pytest.raises(ConfigError, match=r"GPT2FusedLinearConv1D_Col.from_native_module expects a GPT-2 Conv1D .*got Linear"):
        snn.GPT2FusedLinearConv1D_Col.from_native_module(nn.Linear(8, 24), group, split_sizes=[8] * 3)
    with pytest.raises(ConfigError, match="GPT2FusedLinearConv1D_Row.from_native_module expects .*got Embedding"):
        snn.GPT2FusedLinearConv1D_Row.from_native_module(nn.Embedding(8, 8), group)
    with pytest.raises(ConfigError, match="FusedLinear1D_Col.from_native_module expects a torch.nn.Linear, got Conv1D"):
        snn.FusedLinear1D_Col.from_native_module(Conv1D(24, 8), group, split_sizes=[8] * 3)
    with pytest.raises(ConfigError, match=r"split_sizes\[1\]=7 is not divisible by the tensor-parallel size 2"):
        snn.GPT2FusedLinearConv1D_Col.from_native_module(Conv1D(24, 8), group, split_sizes=[8, 7, 9])
    with pytest.raises(ConfigError, match=r"split_sizes=\[8, 8\] must sum to out_features=24"):
        snn.FusedLinear1D_Col.from_native_module(nn.Linear(8, 24), group, split_sizes=[8, 8])
    with pytest.raises(ConfigError, match="in_features=9 is not divisible"):
        snn.GPT2FusedLinearConv1D_Row.from_native_module(Conv1D(4, 9), group)
    with pytest.raises(ConfigError, match="GPT2FusedLinearConv1D_Row: use_zbv must be False"):
        snn.GPT2FusedLinearConv1D_Row.from_native_module(Conv1D(4, 8), group, use_zbv=True)
    with pytest.raises(ConfigError, match=r"FusedLinear1D_Row: seq_parallel_mode must be one of .*got 'ring'.*"
                                          r"fp8_communication must be False"):
        snn.FusedLinear1D_Row(8, 4, [4, 4], process_group=group, seq_parallel_mode="ring", fp8_communication=True)


def test_bad_inputs_are_config_errors():
    run_on_ranks(_bad_input_body, 2)
