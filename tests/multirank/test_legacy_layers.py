"""The import swap in a legacy program: ``from colossalai.legacy.nn import Linear1D_Col`` ->
``from semimig.nn import Linear1D_Col`` computes exactly what Colossal-AI's legacy layers do."""
import pytest
import torch

from dist_harness import run_on_ranks
from legacy_helpers import free_ipv6_port, launch_legacy_1d


def _swap_body(rank, world, port):
    launch_legacy_1d(rank, world, port)
    from colossalai.legacy import nn as cai
    from semimig import nn as ours
    from semimig.nn.balanced import BalancedLinearMixin

    layers = {}
    for name, lib in (("cai", cai), ("ours", ours)):
        col = lib.Linear1D_Col(8, 12)  # the same constructor call, no process group
        row = lib.Linear1D_Row(12, 6)
        layers[name] = (col, row)
    for src, dst in zip(layers["cai"], layers["ours"]):
        assert isinstance(dst, BalancedLinearMixin) and isinstance(dst, type(src))
        with torch.no_grad():
            dst.weight.copy_(src.weight)
            dst.bias.copy_(src.bias)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 8, generator=gen)
    results = {}
    for name, (col, row) in layers.items():
        xi = x.clone().requires_grad_(True)
        y = row(torch.relu(col(xi)))
        y.pow(2).sum().backward()
        results[name] = [y.detach(), xi.grad, col.weight.grad, col.bias.grad, row.weight.grad, row.bias.grad]
    for a, b in zip(results["ours"], results["cai"]):
        assert torch.equal(a, b), (a - b).abs().max()
    # legacy Linear1D picks column then row from the parallel-input flag, like Colossal-AI's
    first = ours.Linear1D(8, 12)
    second = ours.Linear1D(12, 6)
    assert first.matrix_kind == "column" and second.matrix_kind == "row"


@pytest.mark.parametrize("world", [1, 2])
def test_import_swap_in_a_legacy_program(world):
    run_on_ranks(_swap_body, world, free_ipv6_port(), timeout_s=90)


def _lazy_body(rank, world, port):
    """Under LazyInitContext the legacy layers materialise to Colossal-AI's values, and
    from_native_module (with no group) builds the ShardFormer flavour, as Colossal-AI's does."""
    import copy

    from colossalai.lazy import LazyInitContext
    from colossalai.tensor.d_tensor import is_distributed_tensor

    launch_legacy_1d(rank, world, port)
    from colossalai.legacy import nn as cai
    from semimig import nn as ours
    from semimig.nn.layers import Linear1D_Col as ShardFormerCol

    built = {}
    for name, lib in (("cai", cai), ("ours", ours)):
        torch.manual_seed(5)
        with LazyInitContext():
            col = lib.Linear1D_Col(8, 12)
        LazyInitContext.materialize(col)
        built[name] = col
    assert type(built["ours"]).__module__ == "semimig.nn.legacy"
    for a, b in zip(built["cai"].parameters(), built["ours"].parameters()):
        assert type(b) is torch.nn.Parameter and torch.equal(a, b)
    x = torch.randn(3, 8)
    assert torch.equal(built["cai"](x), built["ours"](x))

    with LazyInitContext():
        native = torch.nn.Linear(8, 4 * world)
    reference = copy.deepcopy(native)
    LazyInitContext.materialize(reference)
    layer = ours.Linear1D_Col.from_native_module(native, process_group=None)
    assert type(layer) is ShardFormerCol and layer.weight is native.weight and is_distributed_tensor(layer.weight)
    assert torch.equal(layer.weight.detach(), reference.weight.detach().chunk(world, 0)[rank])


@pytest.mark.parametrize("world", [1, 2])
def test_lazy_init_in_a_legacy_program(world):
    run_on_ranks(_lazy_body, world, free_ipv6_port(), timeout_s=90)
