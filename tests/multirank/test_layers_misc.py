"""Column->row MLP against an unsharded MLP, sharded state-dict round trip, bad inputs."""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from dist_harness import run_on_ranks

ATOL = 1e-5  # sharded vs unsharded fp32: the same sums, associated differently


def _mlp_body(rank, world):
    import semimig.nn as snn

    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(8, 16), nn.Linear(16, 6)
    x = torch.randn(2, 5, 8)
    col = snn.Linear1D_Col.from_native_module(copy.deepcopy(fc1), dist.group.WORLD)
    row = snn.Linear1D_Row.from_native_module(copy.deepcopy(fc2), dist.group.WORLD)
    xi = x.clone().requires_grad_(True)
    y = row(torch.relu(col(xi)))
    y.sum().backward()
    xr = x.clone().requires_grad_(True)
    yr = fc2(torch.relu(fc1(xr)))
    yr.sum().backward()
    torch.testing.assert_close(y, yr, atol=ATOL, rtol=0)
    torch.testing.assert_close(xi.grad, xr.grad, atol=ATOL, rtol=0)
    torch.testing.assert_close(col.weight.grad, fc1.weight.grad.chunk(world, 0)[rank], atol=ATOL, rtol=0)
    torch.testing.assert_close(col.bias.grad, fc1.bias.grad.chunk(world, 0)[rank], atol=ATOL, rtol=0)
    torch.testing.assert_close(row.weight.grad, fc2.weight.grad.chunk(world, 1)[rank], atol=ATOL, rtol=0)
    torch.testing.assert_close(row.bias.grad, fc2.bias.grad, atol=ATOL, rtol=0)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_column_row_mlp_matches_dense(world):
    run_on_ranks(_mlp_body, world)


def _state_dict_body(rank, world):
    import semimig.nn as snn

    torch.manual_seed(0)
    dense, other = nn.Linear(8, 12), nn.Linear(8, 12)
    for cls, dim in ((snn.Linear1D_Col, 0), (snn.Linear1D_Row, 1)):
        layer = cls.from_native_module(copy.deepcopy(dense), dist.group.WORLD)
        state = layer.state_dict()  # gathered: full [12, 8]
        assert torch.equal(state["weight"], dense.weight.detach())
        assert torch.equal(state["bias"], dense.bias.detach())
        layer.load_state_dict(other.state_dict())
        assert torch.equal(layer.weight.detach(), other.weight.detach().chunk(world, dim)[rank])
        expect_bias = other.bias.detach().chunk(world, 0)[rank] if dim == 0 else other.bias.detach()
        assert torch.equal(layer.bias.detach(), expect_bias)


@pytest.mark.parametrize("world", [1, 2])
def test_sharded_state_dict_round_trip(world):
    run_on_ranks(_state_dict_body, world)


def _bad_input_body(rank, world):
    import semimig.nn as snn
    from semimig.errors import ConfigError

    group = dist.group.WORLD
    col = snn.Linear1D_Col(8, 12, process_group=group)
    with pytest.raises(ValueError, match=r"width 8.*got shape \(3, 5\)"):
        col(torch.randn(3, 5))
    row = snn.Linear1D_Row(8, 12, process_group=group)
    with pytest.raises(ValueError, match=r"width 4.*got shape \(3, 8\)"):
        row(torch.randn(3, 8))
    with pytest.raises(ValueError, match="out_features=7 is not divisible by the tensor-parallel size 2"):
        snn.Linear1D_Col(8, 7, process_group=group)
    with pytest.raises(ValueError, match="out_features=7 is not divisible"):
        snn.Linear1D_Col.from_native_module(nn.Linear(8, 7), group)
    with pytest.raises(ValueError, match="in_features=9 is not divisible"):
        snn.Linear1D_Row.from_native_module(nn.Linear(9, 4), group)
    with pytest.raises(TypeError, match="expects a torch.nn.Linear, got Conv1d"):
        snn.Linear1D_Col.from_native_module(nn.Conv1d(2, 2, 1), group)
    with pytest.raises(ConfigError, match=r"Linear1D_Col: seq_parallel_mode must be one of .*got 'ring'"):
        snn.Linear1D_Col(8, 12, process_group=group, seq_parallel_mode="ring")
    with pytest.raises(ConfigError, match="Linear1D_Col: fp8_communication must be False, got True"):
        snn.Linear1D_Col.from_native_module(nn.Linear(8, 12), group, fp8_communication=True)
    with pytest.raises(ConfigError, match="Linear1D_Row: use_zbv must be False"):
        snn.Linear1D_Row.from_native_module(nn.Linear(8, 12), group, use_zbv=True)
    with pytest.raises(ConfigError, match="stream_chunk_num must be 1 .*got 2"):
        snn.Linear1D_Row(8, 12, process_group=group, stream_chunk_num=2)


def test_bad_inputs_are_clear_errors():
    run_on_ranks(_bad_input_body, 2)


def test_linear1d_outside_a_legacy_program_is_a_clear_error():
    import semimig.nn as snn

    from semimig.errors import ConfigError

    with pytest.raises(ConfigError, match="legacy 1D layer"):
        snn.Linear1D(4, 4)


def test_no_top_level_kernels_module():
    import importlib.util

    import semimig.kernels

    assert semimig.kernels.__name__ == "semimig.kernels"
    assert importlib.util.find_spec("kernels") is None
