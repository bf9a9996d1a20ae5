"""The baseline's straggler hooks on Colossal-AI's own Linear1D_Col/Row, in every injection mode: each
GEMM's delay is proportional to its work and to the rank's chi, measured mode times the column
forward and charges the other GEMMs at that rate, nothing happens in eval mode."""
import time

import pytest

from dist_harness import run_on_ranks

M, IN, HIDDEN = 64, 32, 64  # tokens, model width, MLP width (split over 2 ranks)
RATE = 1e8  # FLOP/s of the deterministic modes: a 131 kFLOP GEMM is 1.3 ms


def _mlp(group):
    import torch
    from colossalai.shardformer.layer import Linear1D_Col, Linear1D_Row

    import semimig.nn  # noqa: F401 - CPU compatibility shim

    torch.manual_seed(0)
    dense = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, IN))
    return torch.nn.Sequential(Linear1D_Col.from_native_module(dense[0], process_group=group), dense[1],
                               Linear1D_Row.from_native_module(dense[2], process_group=group))


def _hooks_body(rank, world, spec):
    import torch
    import torch.distributed as dist

    from semimig.straggler import StragglerConfig, StragglerInjector
    from semimig.straggler.hooks import BaselineInjection

    model = _mlp(dist.group.WORLD)
    injection = BaselineInjection(model, StragglerInjector(StragglerConfig.from_cli(spec), rank, world),
                                  keep_charges=True)
    x = torch.randn(M, IN, requires_grad=True)
    iterations = []
    for _ in range(2):
        start = time.perf_counter()
        model(x).sum().backward()
        iterations.append({"wall_s": time.perf_counter() - start, "charges": list(injection.charges),
                           "busy": injection.snapshot()})
        injection.reset()
    model.eval()
    with torch.no_grad():
        model(x)
    eval_charges = list(injection.charges)
    out = [None] * world
    dist.all_gather_object(out, {"iterations": iterations, "eval": eval_charges})
    return out


@pytest.fixture(scope="module")
def runs():
    """One 2-rank run per mode; rank 1 straggles with chi = 3."""
    specs = {"flops": f"fixed:1:3:mode=flops:flops={RATE:g}",
             "emulated": f"fixed:1:3:mode=emulated:flops={RATE:g}",
             "measured": "fixed:1:3:mode=measured"}
    return {mode: run_on_ranks(_hooks_body, 2, spec, timeout_s=120) for mode, spec in specs.items()}


def _expected_flops():
    fwd = 2.0 * M * (HIDDEN // 2) * IN  # both layers: [M, IN] x [IN, HIDDEN/2] and [M, HIDDEN/2] x [HIDDEN/2, IN]
    return {"col-forward": fwd, "row-forward": fwd, "row-backward": 2 * fwd, "col-backward": 2 * fwd}


@pytest.mark.parametrize("mode", ["flops", "emulated"])
def test_deterministic_modes_charge_each_gemm_its_flops_at_the_rate(runs, mode):
    expected = _expected_flops()
    for rank, chi in ((0, 1.0), (1, 3.0)):
        factor = chi if mode == "emulated" else chi - 1.0  # emulated: every rank is a device of RATE
        for it in runs[mode][rank]["iterations"]:
            assert [c.kind for c in it["charges"]] == list(expected)  # forward in order, backward in reverse
            for c in it["charges"]:
                assert c.flops == expected[c.kind]
                assert c.delay_s == pytest.approx(factor * c.flops / RATE, rel=1e-12)
            total = sum(c.delay_s for c in it["charges"])
            assert it["busy"]["delay_s"] == pytest.approx(total)
            assert it["wall_s"] >= total  # the delays were really slept, inside the iteration


def test_measured_mode_times_the_column_forward_and_charges_the_rest_at_its_rate(runs):
    straggler = runs["measured"][1]["iterations"]
    for it in straggler:
        col = it["charges"][0]
        assert col.kind == "col-forward" and col.seconds > 0
        assert col.delay_s == pytest.approx(2.0 * col.seconds)  # (chi - 1) x its own measured time
        rate = col.flops / col.seconds  # the only timed GEMM of the iteration
        for c in it["charges"][1:]:
            assert c.seconds == pytest.approx(c.flops / rate, rel=1e-9)
            assert c.delay_s == pytest.approx(2.0 * c.flops / rate, rel=1e-9)  # proportional to the work
        assert it["busy"]["busy_s"] == pytest.approx(sum(c.seconds + c.delay_s for c in it["charges"]))
        assert it["wall_s"] >= sum(c.delay_s for c in it["charges"])
    for it in runs["measured"][0]["iterations"]:  # chi = 1: measured, never slowed
        assert it["charges"] and all(c.delay_s == 0.0 for c in it["charges"])


@pytest.mark.parametrize("mode", ["flops", "emulated", "measured"])
def test_eval_mode_is_never_slowed(runs, mode):
    assert runs[mode][0]["eval"] == [] and runs[mode][1]["eval"] == []


def _gathering_body(rank, world):
    import torch
    import torch.distributed as dist
    from colossalai.shardformer.layer import Linear1D_Col

    import semimig.nn  # noqa: F401
    from semimig.errors import ConfigError
    from semimig.straggler import StragglerConfig, StragglerInjector
    from semimig.straggler.hooks import BaselineInjection

    col = Linear1D_Col.from_native_module(torch.nn.Linear(8, 8), process_group=dist.group.WORLD, gather_output=True)
    injector = StragglerInjector(StragglerConfig.from_cli("fixed:1:2:mode=measured"), rank, world)
    try:
        BaselineInjection(torch.nn.Sequential(col), injector)
    except ConfigError as err:
        return str(err)
    return None


def test_measured_mode_refuses_a_model_whose_column_forwards_all_hold_a_collective():
    message = run_on_ranks(_gathering_body, 2, timeout_s=60)
    assert message is not None and "gathers its output" in message


def _gpt2_body(rank, world):
    """GPT-2's fused Conv1D layers (weights stored [K, N]): an MLP c_fc -> c_proj, rank 1 at chi = 3."""
    import torch
    import torch.distributed as dist
    from colossalai.shardformer.layer import GPT2FusedLinearConv1D_Col, GPT2FusedLinearConv1D_Row
    from transformers.pytorch_utils import Conv1D

    import semimig.nn  # noqa: F401
    from semimig.straggler import StragglerConfig, StragglerInjector
    from semimig.straggler.hooks import BaselineInjection

    torch.manual_seed(0)
    group = dist.group.WORLD
    model = torch.nn.Sequential(
        GPT2FusedLinearConv1D_Col.from_native_module(Conv1D(HIDDEN, IN), process_group=group, split_sizes=[HIDDEN]),
        torch.nn.GELU(),
        GPT2FusedLinearConv1D_Row.from_native_module(Conv1D(IN, HIDDEN), process_group=group))
    spec = f"fixed:1:3:mode=flops:flops={RATE:g}"
    injection = BaselineInjection(model, StragglerInjector(StragglerConfig.from_cli(spec), rank, world),
                                  keep_charges=True)
    model(torch.randn(M, IN, requires_grad=True)).sum().backward()
    out = [None] * world
    dist.all_gather_object(out, list(injection.charges))
    return out


def test_gpt2_fused_conv1d_layers_are_slowed_like_the_plain_ones():
    charges = run_on_ranks(_gpt2_body, 2, timeout_s=120)
    expected = _expected_flops()
    assert [c.kind for c in charges[1]] == list(expected)
    for c in charges[1]:
        assert c.flops == expected[c.kind] and c.delay_s == pytest.approx(2.0 * c.flops / RATE, rel=1e-12)
    assert all(c.delay_s == 0.0 for c in charges[0])
