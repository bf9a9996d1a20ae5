"""What Colossal-AI's own layer tests assert, for every semimig layer, written here (CI has no GitHub).

``tests/multirank/test_upstream_layers.py`` runs Colossal-AI's ``test_linear_1d.py``,
``test_qkv_fused_linear_1d.py`` and ``test_gpt2_qkv_fused_linear_1d.py`` themselves when their
sources are at hand; this module asserts the same things for the same parametrizations on every
run, against an unsharded ``nn.Linear`` / Hugging Face ``Conv1D`` built from the same seed:

* after ``from_native_module`` the layer holds the very Parameter objects of the native module
  (lazily built or not), sharded to the expected shape, registered as (customised) distributed
  tensors;
* the state dict round-trips: the gathered state dict loads into the dense module, and the dense
  module's state dict loads back into the shard it came from;
* the forward output, the input gradient and every weight/bias gradient equal the dense module's
  (sharded the same way), with ``seq_parallel_mode`` ``None`` and ``"split_gather"`` (the input
  and output then split along the sequence).

Sharding layouts, computed here independently of Colossal-AI: plain layers take chunk ``r`` of
``e`` along the split dimension; packed layers (``split_sizes``) take chunk ``r`` of every part.

Left out, as in ``test_upstream_layers.LEFT_OUT``: Colossal-AI's ``LinearWithGradAccum``,
``GPT2FusedLinearConv`` and ``FusedLinear`` (no tensor parallelism; semimig does not replace them)
and the zero-bubble ``WeightGradStore`` (semimig refuses ``use_zbv``).  Nothing is CUDA-only here:
``split_gather`` runs on gloo.  Tolerance: fp32, the sharded GEMMs reduce the same products in
another association: atol 1e-5 and ``assert_close``'s fp32 rtol 1.3e-6 (Colossal-AI's tests use its
fp32 defaults, atol 1e-5, rtol 1.3e-6).
"""
import copy
from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from dist_harness import run_pooled  # the test run's pool of ranks: many cases per spawn

TOL = dict(atol=1e-5, rtol=1.3e-6)  # fp32: assert_close's default rtol, atol 1e-5 (see the module doc)
BATCH, SEQ = 2, 4
PACKED = [16, 16, 8]  # a Q/K/V-like packing: every part divides by 2 and 4 ranks


def shard(t, dim, rank, world, parts=None):
    """Rank ``rank``'s shard of ``t`` along ``dim``: chunk ``rank`` of the whole, or of each part."""
    if parts is None:
        return t.chunk(world, dim=dim)[rank]
    return torch.cat([p.chunk(world, dim=dim)[rank] for p in t.split(parts, dim=dim)], dim=dim)


def _cuda_free_state_dicts():
    """Colossal-AI's packed-layer state-dict gather moves the shard to CUDA (``qkv.cuda()``);
    on a CPU-only machine that is the identity here.  (Its plain layers need nothing.)"""
    torch.Tensor.cuda = lambda self, *args, **kwargs: self


# ----------------------------------------------------------------------------- layer specs
def _native(kind, in_f, out_f):
    if kind.startswith("conv"):
        from transformers.pytorch_utils import Conv1D

        layer = Conv1D(out_f, in_f)  # weight [in, out]
        nn.init.normal_(layer.weight, std=0.2)
        nn.init.normal_(layer.bias, std=0.2)
        return layer
    return nn.Linear(in_f, out_f)


def _spec(kind, sp, gather_output=True, parallel_input=False):
    """``(class name, kwargs, weight dim, bias sharded?, parts, (in, out))`` of a layer kind."""
    col = {"gather_output": gather_output}
    row = {"parallel_input": parallel_input}
    seq = {"seq_parallel_mode": sp}
    return {
        "col": ("Linear1D_Col", {**col, **seq}, 0, True, None, (16, 32)),
        "row": ("Linear1D_Row", {**row, **seq}, 1, False, None, (32, 16)),
        "fused_col": ("FusedLinear1D_Col", {**col, **seq, "split_sizes": PACKED}, 0, True, PACKED, (8, 40)),
        "fused_row": ("FusedLinear1D_Row", {**row, **seq, "split_sizes": PACKED}, 1, False, PACKED, (40, 8)),
        "conv_col": ("GPT2FusedLinearConv1D_Col", {**col, **seq, "split_sizes": [16] * 3}, 1, True, [16] * 3, (16, 48)),
        "conv_row": ("GPT2FusedLinearConv1D_Row", {**row, **seq}, 0, False, None, (48, 16)),
        # GPT-2's c_fc: one part, so the shard is the plain chunk c_proj (conv_row) expects
        "conv_mlp_col": ("GPT2FusedLinearConv1D_Col", {**col, **seq, "split_sizes": [48]}, 1, True, [48], (16, 48)),
    }[kind]


def _convert(kind, sp, lazy, seed, **layout):
    """``(dense, native, layer)``: dense eager module, its lazily built twin and that twin sharded."""
    import semimig.nn as snn
    from colossalai.lazy import LazyInitContext

    name, kwargs, *_, (in_f, out_f) = _spec(kind, sp, **layout)
    torch.manual_seed(seed)
    dense = _native(kind, in_f, out_f)
    with LazyInitContext() if lazy else nullcontext():
        torch.manual_seed(seed + 1)
        native = _native(kind, in_f, out_f)
    layer = getattr(snn, name).from_native_module(native, process_group=dist.group.WORLD, **kwargs)
    return dense, native, layer


def _check_sharding(kind, sp, native, layer, dense, rank, world, **layout):
    """Identity, shapes, distributed-tensor registration and the state-dict round trip."""
    from colossalai.tensor.d_tensor import is_customized_distributed_tensor, is_distributed_tensor

    _, _, w_dim, bias_sharded, parts, _ = _spec(kind, sp, **layout)
    assert layer.weight is native.weight and layer.bias is native.bias
    registered = is_customized_distributed_tensor if parts else is_distributed_tensor
    assert registered(layer.weight)
    assert registered(layer.bias) == bias_sharded
    full_w = dense.weight.detach()
    assert layer.weight.shape == shard(full_w, w_dim, rank, world, parts).shape
    dense.load_state_dict(layer.state_dict())  # gathered: the lazily built module's values
    assert torch.equal(dense.weight.detach(), _gather(layer.weight.detach(), w_dim, world, parts))
    torch.manual_seed(1234)
    fresh = copy.deepcopy(dense)
    with torch.no_grad():
        fresh.weight.normal_(std=0.2)
        fresh.bias.normal_(std=0.2)
    layer.load_state_dict(fresh.state_dict())
    assert torch.equal(layer.weight.detach(), shard(fresh.weight.detach(), w_dim, rank, world, parts))
    expect_b = shard(fresh.bias.detach(), 0, rank, world, parts) if bias_sharded else fresh.bias.detach()
    assert torch.equal(layer.bias.detach(), expect_b)
    dense.load_state_dict(fresh.state_dict())


def _gather(t, dim, world, parts):
    """Inverse of :func:`shard` over all ranks (all-gather along ``dim``, parts re-interleaved)."""
    pieces = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(pieces, t.contiguous())
    if parts is None:
        return torch.cat(pieces, dim=dim)
    local = [p // world for p in parts]
    per_rank = [piece.split(local, dim=dim) for piece in pieces]
    return torch.cat([per_rank[r][i] for i in range(len(parts)) for r in range(world)], dim=dim)


def _seq(t, sp, rank, world):
    return t.chunk(world, dim=1)[rank] if sp == "split_gather" else t


def _single_body(rank, world, kind, lazy, sp):
    """One layer: gathered output (column) or full output (row) against the dense module."""
    _cuda_free_state_dicts()
    dense, native, layer = _convert(kind, sp, lazy, seed=0)
    _check_sharding(kind, sp, native, layer, dense, rank, world)
    in_f = _spec(kind, sp)[-1][0]
    torch.manual_seed(7)
    x = torch.rand(BATCH, SEQ, in_f)
    column = kind.endswith("col")
    xs = (_seq(x, sp, rank, world) if column else x).clone().requires_grad_(True)
    xd = x.clone().requires_grad_(True)
    y, yd = layer(xs), dense(xd)
    expect = yd if column else _seq(yd, sp, rank, world)  # column: gathered; row: sequence chunk
    torch.testing.assert_close(y, expect, **TOL)
    _backward(y, yd)
    expect_dx = _seq(xd.grad, sp, rank, world) if column else xd.grad
    torch.testing.assert_close(xs.grad, expect_dx, **TOL)
    _check_param_grads(kind, sp, layer, dense, yd, rank, world)


def _backward(y, yd):
    """``sum(y^2)`` on every rank (a non-uniform output gradient); a replicated output counts once,
    a sequence-split output sums to the dense loss over the ranks."""
    yd.retain_grad()
    (y * y).sum().backward()
    (yd * yd).sum().backward()


def _check_param_grads(kind, sp, layer, dense, yd, rank, world, **layout):
    """Weight and bias gradients against the dense module's, sharded.

    A row layer's bias is replicated and added after the sequence is split, so with split_gather
    its gradient covers this rank's sequence chunk only — as Colossal-AI's layer's does; its
    plugin all-reduces such "sequence-parallel partial derived" gradients over the group."""
    _, _, w_dim, bias_sharded, parts, _ = _spec(kind, sp, **layout)
    torch.testing.assert_close(layer.weight.grad, shard(dense.weight.grad, w_dim, rank, world, parts),
                               **TOL)
    if bias_sharded:
        expect_db = shard(dense.bias.grad, 0, rank, world, parts)
    else:
        expect_db = _seq(yd.grad, sp, rank, world).sum(dim=(0, 1))
    torch.testing.assert_close(layer.bias.grad, expect_db, **TOL)


def _pair_body(rank, world, family, lazy, sp):
    """Column then row (a Q/K/V or MLP pair): sharded activations between them, as in a block."""
    _cuda_free_state_dicts()
    col_kind, row_kind = {"plain": ("col", "row"), "fused": ("fused_col", "fused_row"),
                          "conv": ("conv_mlp_col", "conv_row")}[family]
    mid = {"gather_output": False, "parallel_input": True}
    dense1, native1, col = _convert(col_kind, sp, lazy, seed=0, **mid)
    dense2, native2, row = _convert(row_kind, sp, lazy, seed=10, **mid)
    _check_sharding(col_kind, sp, native1, col, dense1, rank, world, **mid)
    _check_sharding(row_kind, sp, native2, row, dense2, rank, world, **mid)
    torch.manual_seed(7)
    x = torch.rand(BATCH, SEQ, _spec(col_kind, sp)[-1][0])
    xs = _seq(x, sp, rank, world).clone().requires_grad_(True)
    xd = x.clone().requires_grad_(True)
    y, yd = row(torch.tanh(col(xs))), dense2(torch.tanh(dense1(xd)))
    torch.testing.assert_close(y, _seq(yd, sp, rank, world), **TOL)
    _backward(y, yd)
    torch.testing.assert_close(xs.grad, _seq(xd.grad, sp, rank, world), **TOL)
    _check_param_grads(col_kind, sp, col, dense1, None, rank, world, **mid)
    _check_param_grads(row_kind, sp, row, dense2, yd, rank, world, **mid)


SP_MODES = [None, "split_gather"]


@pytest.mark.parametrize("sp", SP_MODES)
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("kind", ["col", "row", "fused_col", "fused_row", "conv_col", "conv_row"])
def test_layer_conforms(kind, lazy, sp):
    run_pooled(_single_body, 2, kind, lazy, sp)


@pytest.mark.parametrize("sp", SP_MODES)
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("family", ["plain", "fused", "conv"])
def test_column_row_pair_conforms(family, lazy, sp):
    run_pooled(_pair_body, 2, family, lazy, sp)


@pytest.mark.parametrize("family", ["plain", "fused", "conv"])
def test_column_row_pair_conforms_on_four_ranks(family):
    run_pooled(_pair_body, 4, family, False, "split_gather")
