"""The runtime on real process groups: identical plans on every rank, pretest, forced migration."""
import copy
import json

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from dist_harness import run_on_ranks
from tiny_models import TwoLayerMLP as _MLP


def _model(world, width=64):
    import semimig.nn as snn

    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(width, width * world), nn.Linear(width * world, width)
    group = dist.group.WORLD
    return lambda: _MLP(snn.Linear1D_Col.from_native_module(copy.deepcopy(fc1), group),  # noqa: E731
                        snn.Linear1D_Row.from_native_module(copy.deepcopy(fc2), group))


def _plans_body(rank, world, spec):
    from semimig.controller import BalanceConfig, BalanceController
    from semimig.straggler import StragglerConfig

    model = _model(world)()
    rate = 2 * 32 * 64 * 64 * 3 * 2 / 0.02  # emulated device: ~20 ms of GEMMs per iteration
    config = BalanceConfig(mode="semi", straggler=StragglerConfig.from_cli(f"{spec}:mode=emulated:flops={rate}"))
    ctl = BalanceController(model, config)
    x = torch.randn(32, 64)
    summaries = []
    for _ in range(6):
        model(x).sum().backward()
        report = ctl.step()
        summaries.append(None if report.plan is None else report.plan.summary())
    gathered = [None] * world
    dist.all_gather_object(gathered, (summaries, ctl.curves.to_dict()))
    return gathered


@pytest.mark.parametrize("world,spec", [(2, "fixed:1:4"), (4, "multi:1=8,3=3")])
def test_every_rank_computes_the_same_plan(world, spec):
    gathered = run_on_ranks(_plans_body, world, spec, timeout_s=120)
    first = gathered[0]
    assert all(g == first for g in gathered[1:])
    summaries, curves = first
    assert all(s is not None for s in summaries)
    assert "r1:" in summaries[-1]  # the injected straggler acts
    json.dumps(curves)  # the pretest result is JSON-serialisable (save/load)


def _forced_migration_body(rank, world):
    from semimig.controller import BalanceConfig, BalanceController

    make = _model(world, width=12)
    plain, balanced = make(), make()
    ctl = BalanceController(balanced, BalanceConfig(mode="mig"))
    ctl.force(migrate={1: 0.5})
    x = torch.randn(5, 12)
    for model in (plain, balanced):
        model(x).pow(2).sum().backward()
    for a, b in zip(plain.parameters(), balanced.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=0)  # migration is exact
    assert balanced.fc1.directive.layout.migrated_count(1) == 6


@pytest.mark.parametrize("world", [2, 3])
def test_forced_migration_through_the_runtime_is_exact(world):
    run_on_ranks(_forced_migration_body, world)


def test_a_model_without_semimig_layers_is_rejected():
    from semimig.controller import BalanceController

    with pytest.raises(ValueError, match="Sequential has no semimig layers"):
        BalanceController(nn.Sequential(nn.Linear(2, 2)))


def test_curves_round_trip_through_json():
    from semimig.controller import CostCurves, Curve

    curves = CostCurves(omega1=0.001, omega2=Curve.affine(0.0, 1e-6), phi1=Curve.affine(0.002, 3e-6),
                        phi2=Curve.affine(0.0, 2e-6))
    assert CostCurves.from_dict(json.loads(json.dumps(curves.to_dict()))) == curves


def _dense_head_body(rank, world):
    """fc2 named as an output head stays dense under a forced plan; fc1 prunes and migrates."""
    from semimig.controller import BalanceConfig, BalanceController

    make = _model(world, width=12)
    plain, balanced = make(), make()
    ctl = BalanceController(balanced, BalanceConfig(mode="mig", dense_layers=("fc2",)))
    ctl.force(prune={1: 0.25}, migrate={0: 0.5})
    x = torch.randn(5, 12)
    for model in (plain, balanced):
        model(x).pow(2).sum().backward()
    head = balanced.fc2.directive
    assert head.keep is None and head.layout is None and head.timer is ctl.meter  # dense but timed
    assert balanced.fc1.directive.layout.migrated_count(0) == 6
    assert (balanced.fc1.directive.keep is not None) == (rank == 1)
    # fc2's weight gradient is complete on every rank: nothing of the head was pruned
    torch.testing.assert_close(balanced.fc2.weight.grad.count_nonzero(), plain.fc2.weight.grad.count_nonzero())
    return True


def test_output_head_stays_dense():
    assert run_on_ranks(_dense_head_body, 2)


@pytest.mark.parametrize("bad", ["classifier", ("",), (3,)])
def test_dense_layers_must_be_a_tuple_of_names(bad):
    from semimig.controller import BalanceConfig

    with pytest.raises(ValueError, match="dense_layers must be a tuple of non-empty module-name suffixes"):
        BalanceConfig(dense_layers=bad)


def _pridiff_body(rank, world, theta_iter):
    """zero-pridiff-e with weights that barely move (SGD at lr 1e-6): the per-layer ratios and the
    threshold warning, as the straggler (rank 1) sees them."""
    import logging

    from semimig.controller import BalanceConfig, BalanceController
    from semimig.resizing import ResizingConfig
    from semimig.straggler import StragglerConfig

    model = _model(world)()
    rate = 2 * 32 * 64 * 64 * 3 * 2 / 0.02
    config = BalanceConfig(mode="zero-pridiff-e", dense_layers=(),
                           straggler=StragglerConfig.from_cli(f"fixed:1:4:mode=emulated:flops={rate}"),
                           resizing=ResizingConfig(period=2, theta_iter=theta_iter))
    ctl = BalanceController(model, config)
    caught = []
    handler = logging.Handler()
    handler.emit = lambda record: caught.append(record.getMessage())
    logging.getLogger("semimig.controller.runtime").addHandler(handler)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(32, 64)
    for _ in range(8):
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        report = ctl.step()
    return report.gamma_per_layer, caught



def _gathered_pridiff(rank, world, theta_iter):
    gathered = [None] * world
    dist.all_gather_object(gathered, _pridiff_body(rank, world, theta_iter))
    return gathered


@pytest.mark.parametrize("theta_iter,expected,warns", [(1e-3, 0.9, True), (0.0, 0.4, False)])
def test_pridiff_ratios_and_the_threshold_warning(theta_iter, expected, warns):
    """theta above every column's variation: gamma_max in every layer, and the log says so once;
    theta = 0: no candidate, so each layer prunes the floor alpha * gamma = 0.8 * 1/2."""
    _, (slow, slow_log) = run_on_ranks(_gathered_pridiff, 2, theta_iter, timeout_s=120)  # rank 1 straggles
    assert slow == pytest.approx((expected, expected))
    warnings = [m for m in slow_log if "PriDiff: every column's weight variation is below theta" in m]
    assert len(warnings) == (1 if warns else 0)
    if warns:
        assert "theta=0.002 (theta_iter=0.001 x 2 iterations" in warnings[0]
