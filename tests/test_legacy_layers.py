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
