"""The runtime on real process groups: identical plans on every rank, pretest, forced migration."""
import copy
import json
import time

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


def _emulated_semi(world, spec, **controller):
    """Mode semi on the MLP with ``spec`` on an emulated device (~20 ms of GEMMs per iteration)."""
    from semimig.controller import BalanceConfig, BalanceController, ControllerConfig
    from semimig.straggler import StragglerConfig

    model = _model(world)()
    rate = 2 * 32 * 64 * 64 * 3 * 2 / 0.02
    config = BalanceConfig(mode="semi", straggler=StragglerConfig.from_cli(f"{spec}:mode=emulated:flops={rate}"),
                           controller=ControllerConfig(**controller))
    return model, BalanceController(model, config), torch.randn(32, 64)


def _plans_body(rank, world, spec, tasks_per_step=0, iterations=12):
    model, ctl, x = _emulated_semi(world, spec, pretest_tasks_per_step=tasks_per_step)
    summaries, digests, targets, remaining, others = [], [], [], [], []
    for _ in range(iterations):
        model(x).sum().backward()
        report = ctl.step()
        summaries.append(None if report.plan is None else report.plan.summary())
        digests.append(report.digest)
        targets.append(report.decision.shed if report.decision else None)
        others.append(report.decision.other_s if report.decision else None)
        remaining.append(None if ctl._pretest_run is None else ctl._pretest_run.remaining)
    gathered = [None] * world
    dist.all_gather_object(gathered, (summaries, digests, targets, ctl.curves.to_dict(), remaining, others))
    return gathered


@pytest.mark.parametrize("world,spec", [(2, "fixed:1:4"), (4, "multi:1=8,3=3")])
def test_every_rank_computes_the_same_plan(world, spec):
    gathered = run_on_ranks(_plans_body, world, spec, timeout_s=120)
    first = gathered[0]
    assert all(g == first for g in gathered[1:])  # plans, digests and shares identical on every rank
    summaries, digests, targets, curves, _, others = first
    assert summaries[0] is None  # no evidence yet: nobody sheds in the first iterations
    assert "r1:" in summaries[-1]  # the injected straggler acts once the evidence is in
    assert targets[-1][0] == 0.0  # a fast rank never sheds
    if spec == "fixed:1:4":  # emulated device, no fixed cost: Eq. 1, 1 - 1/chi, with the ranks' other work
        # (shedding.py: T_ref,1 = T + O_0 - O_1; T = 20 ms of emulated GEMMs; the straggler's sleeps overshoot
        # on a loaded host, and that time is its own work outside the GEMMs)
        from semimig.controller.config import ControllerConfig
        from semimig.controller.timing import SAME_WORK

        def eq1(i):
            o_fast, o_slow = others[i] if others[i] else (0.0, 0.0)
            return 1.0 - (0.02 + o_fast - o_slow) / (4 * 0.02)

        shed = [t[1] if t else 0.0 for t in targets]
        last = max(i for i in range(len(shed)) if shed[i] != (shed[i - 1] if i else 0.0))
        assert shed[-1] == pytest.approx(eq1(last), abs=1e-9)  # set to Eq. 1 at the decision that last moved it
        hold = max(ControllerConfig().gamma_step, 0.5 * SAME_WORK)  # the band γ holds within (shedding.py)
        assert all(abs(eq1(i) - shed[-1]) < hold for i in range(last + 1, len(shed)))  # and held since
    json.dumps(curves)  # the pretest result is JSON-serialisable (save/load)


def test_the_pretest_spreads_one_task_per_step_and_the_straggler_resizes_only_meanwhile():
    gathered = run_on_ranks(_plans_body, 2, "fixed:1:4", 1, 50, timeout_s=180)
    assert all(g == gathered[0] for g in gathered[1:])  # same tasks, same curves, same plans on every rank
    summaries, _, targets, curves, remaining, _ = gathered[0]
    started = next(i for i, r in enumerate(remaining) if r is not None)
    running = [r for r in remaining if r is not None]
    assert running == list(range(running[0], 0, -1))  # exactly one task per step, no step runs the whole pretest
    # 12 tasks (4 kinds x 3 shares x pretest_repeats=1 x one distinct layer shape), the first in the step after
    # the one that flagged the straggler (that step ran at its slow pace: no task there)
    assert running[0] == 12
    during = summaries[started:started + len(running)]
    assert any(s and "r1:" in s for s in during)  # the straggler already sheds while the pretest runs...
    assert all("mig=0.000" in s for s in during if s and "r1:" in s)  # ...by resizing only (β = 0) until the curves exist
    assert targets[-1][1] > 0.5 and targets[-1][0] == 0.0  # the straggler sheds throughout, fast rank never
    json.dumps(curves)


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

    from semimig.errors import ConfigError

    with pytest.raises(ConfigError, match="Sequential has no semimig layers"):
        BalanceController(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(ConfigError, match="model must be a torch.nn.Module, got str"):  # a ConfigError, not an AttributeError
        BalanceController("model")


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

    with pytest.raises(ValueError, match="dense_layers must be a tuple of non-empty strings"):
        BalanceConfig(dense_layers=bad)


def _pridiff_body(rank, world, theta_mode):
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
                           resizing=ResizingConfig(period=2, theta_mode=theta_mode))
    ctl = BalanceController(model, config)
    caught = []
    handler = logging.Handler()
    handler.emit = lambda record: caught.append(record.getMessage())
    logging.getLogger("semimig.controller.binding").addHandler(handler)
    logging.getLogger("semimig.controller.binding").setLevel(logging.INFO)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(32, 64)
    reports = []
    for _ in range(12):
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        reports.append(ctl.step())
    return reports[-1].gamma_per_layer, [r.gamma_per_layer for r in reports], caught


def _gathered_pridiff(rank, world, theta_mode):
    gathered = [None] * world
    dist.all_gather_object(gathered, _pridiff_body(rank, world, theta_mode))
    return gathered


@pytest.mark.parametrize("theta_mode,warns", [("absolute", True), ("relative", False)])
def test_pridiff_ratios_and_the_threshold_warning(theta_mode, warns):
    """Absolute theta (1e-3 x 2 iterations) above every column's variation: gamma_max in every layer,
    and the log says so once.  Relative theta (half the layer's median change): some candidates,
    each layer between the floor alpha * 1/2 and gamma_max.  The fast rank never prunes."""
    (fast, fast_history, _), (slow, _, slow_log) = run_on_ranks(_gathered_pridiff, 2, theta_mode, timeout_s=120)
    assert all(g == 0.0 for step in fast_history for g in step)
    warnings = [m for m in slow_log if "PriDiff: every column's weight variation is below theta" in m]
    assert len(warnings) == (1 if warns else 0)
    if warns:
        assert slow == pytest.approx((0.9, 0.9))
        assert "theta=0.002 (theta_iter=0.001 x 2 iterations" in warnings[0]
    else:
        assert all(0.4 - 1e-9 <= g < 0.9 for g in slow)
        assert any("share of columns below theta per layer" in m for m in slow_log)


def _disagreeing_force_body(rank, world):
    from semimig.controller import BalanceConfig, BalanceController
    from semimig.errors import PlanDisagreement

    ctl = BalanceController(_model(world, width=12)(), BalanceConfig(mode="mig"))
    start = time.perf_counter()
    try:
        ctl.force(migrate={1: 0.5 if rank == 0 else 0.25})
    except PlanDisagreement as err:
        return str(err), time.perf_counter() - start
    return None, time.perf_counter() - start


def _every_rank(rank, world, body_name):
    """Run the module's ``body_name`` on every rank and return every rank's result (rank order)."""
    out = [None] * world
    dist.all_gather_object(out, globals()[body_name](rank, world))
    return out


def test_a_force_that_differs_between_ranks_stops_every_rank_at_once():
    """Different forced plans on two ranks would give NaN outputs silently: every rank stops at once."""
    results = run_on_ranks(_every_rank, 2, "_disagreeing_force_body", timeout_s=60)
    for message, seconds in results:
        assert message is not None
        assert "ranks [0] vs ranks [1]" in message and "forced" in message
        assert "0.5" in message and "0.25" in message  # the differing field, both values
        assert seconds < 5


def _one_sided_force_body(rank, world, case):
    """Review: a bad ``force()`` on one rank only, or ranks that differ in the exchange or the dense layers
    (a migration then runs different broadcasts), hung the others in their next collective."""
    from semimig.controller import BalanceConfig, BalanceController
    from semimig.errors import PlanDisagreement

    config = BalanceConfig(mode="mig")
    if rank == 1 and case == "dense":
        config = BalanceConfig(mode="mig", dense_layers=("fc2",))
    if rank == 1 and case == "exchange":
        config = BalanceConfig(mode="mig", exchange="scatter-gather")
    ctl = BalanceController(_model(world, width=12)(), config)
    start, said = time.perf_counter(), None
    try:
        if case == "unforce":
            ctl.force() if rank == 0 else ctl.force(migrate={1: 0.5})
        elif case == "order":  # the same table in another order is the same plan
            ctl.force(prune={0: 0.5, 1: 0.25} if rank == 0 else {1: 0.25, 0: 0.5})
        else:
            ctl.force(migrate={1: 1.5 if rank == 0 and case == "bad" else 0.5})
    except PlanDisagreement as err:
        said = str(err)
    every = [None] * world
    dist.all_gather_object(every, (said, time.perf_counter() - start))
    return every


@pytest.mark.parametrize("case, named", [("bad", "must be a number in [0, 1], got 1.5"), ("dense", "dense"),
                                         ("exchange", "scatter-gather"), ("unforce", "forced"), ("order", None)])
def test_a_force_refused_or_set_up_differently_on_one_rank_stops_every_rank(case, named):
    for said, seconds in run_on_ranks(_one_sided_force_body, 2, case, timeout_s=60, collective_timeout_s=30):
        if case == "order":
            assert said is None, said
            continue
        assert said is not None and named in said and "ranks [0] vs ranks [1]" in said, said
        assert seconds < 10


def _diverging_plan_body(rank, world):
    """A decision that differs on one rank (a bug, a non-deterministic measurement) is caught at the
    next step, before any layer uses it: plans are applied only once their digests agree."""
    from semimig.controller import BalanceConfig, BalanceController
    from semimig.controller.runtime import GroupActions
    from semimig.errors import PlanDisagreement

    model = _model(world, width=12)()
    ctl = BalanceController(model, BalanceConfig(mode="mig"))
    x = torch.randn(5, 12)
    model(x).sum().backward()
    ctl.step()
    if rank == 1:  # a decision that differs on rank 1 alone (a bug, a non-deterministic measurement)
        ctl._decide = lambda previous: GroupActions(prune=(0.0,) * world, migrate={0: 0.25})
    start = time.perf_counter()
    try:
        for _ in range(3):  # decided and posted at a step, checked at the next
            model(x).sum().backward()  # still the agreed plan: no hang, no garbage
            ctl.step()
    except PlanDisagreement as err:
        return str(err), time.perf_counter() - start
    return None, None


def test_a_plan_that_diverges_on_one_rank_is_caught_at_the_next_step():
    results = run_on_ranks(_every_rank, 2, "_diverging_plan_body", timeout_s=60)
    for message, seconds in results:
        assert message is not None and "plan decided at step 2" in message
        assert "migrate" in message and "ranks [0] vs ranks [1]" in message
        assert seconds < 5


def _force_refusal_body(rank, world, bad):
    from semimig.controller import BalanceController
    from semimig.errors import ConfigError

    ctl = BalanceController(_model(world, width=8)())
    try:
        ctl.force(**bad)
    except ConfigError as err:
        return str(err)
    return None


@pytest.mark.parametrize("bad, match", [
    ({"prune": {"0": 0.5}}, "rank '0' must be an int"),
    ({"prune": {0: 1.5}}, "share for rank 0 must be a number in \\[0, 1\\], got 1.5"),
    ({"migrate": [0.5]}, "must be a mapping rank -> share"),
    ({"prune": {5: 0.5}}, "rank 5 must be an int in \\[0, 1\\)"),
])
def test_force_refuses_bad_input_with_the_value_named(bad, match):
    import re

    message = run_on_ranks(_force_refusal_body, 1, bad, timeout_s=60)
    assert message is not None and re.search(match, message), message


@pytest.mark.parametrize("kwargs, match", [
    ({"resizing": "pri"}, "BalanceConfig.resizing must be a ResizingConfig, got 'pri'"),
    ({"controller": {"tol": 0.1}}, "BalanceConfig.controller must be a ControllerConfig"),
    ({"straggler": "fixed:1"}, "straggler spec 'fixed:1'"),
    ({"straggler": 4}, "BalanceConfig.straggler must be a StragglerConfig or a spec"),
    ({"curves": "x"}, "BalanceConfig.curves must be CostCurves or None, got 'x'"),
    ({"mode": "fast"}, "BalanceConfig.mode must be one of"),
    ({"interval": 0}, "BalanceConfig.interval must be an int >= 1"),
])
def test_balance_config_refuses_wrong_types(kwargs, match):
    from semimig.controller import BalanceConfig
    from semimig.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        BalanceConfig(**kwargs)


def test_a_straggler_spec_string_is_parsed():
    from semimig.controller import BalanceConfig
    from semimig.straggler import StragglerConfig

    assert BalanceConfig(straggler="fixed:1:4").straggler == StragglerConfig.from_cli("fixed:1:4")


def _pause_body(rank, world):
    model, ctl, x = _emulated_semi(world, "burst:1:4:every=24:len=8", pretest_tasks_per_step=1)
    rows = []
    for _ in range(40):
        model(x).sum().backward()
        report = ctl.step()
        rows.append((report.flagged, None if ctl._pretest_run is None else ctl._pretest_run.remaining))
    return rows


def test_the_pretest_pauses_while_no_straggler_is_flagged():
    rows = run_on_ranks(_pause_body, 2, timeout_s=180)
    advanced = [i for i in range(1, len(rows)) if rows[i - 1][1] is not None and rows[i][1] is not None
                and rows[i][1] < rows[i - 1][1]]
    paused = [i for i in range(1, len(rows)) if rows[i - 1][1] is not None and rows[i][1] == rows[i - 1][1]]
    assert advanced and paused, rows  # it ran while rank 1 straggled and waited once it no longer did
    # a task ran only at a step whose straggler was flagged at the step before too (the step that
    # flags it ran at its slow pace, its plan not yet in force: no task there)
    assert all(rows[i][0] and rows[i - 1][0] == rows[i][0] for i in advanced)
    assert all(not rows[i][0] or rows[i - 1][0] != rows[i][0] for i in paused)
    assert any(rows[i][0] for i in paused)  # the step that flagged it paid no task


def _hooks_body(rank, world):
    from semimig.controller import BalanceConfig, BalanceController
    from semimig.errors import ConfigError
    from semimig.straggler import StragglerConfig

    model = _model(world, width=16)()
    layers = (model.fc1, model.fc2)

    def hooks():
        return [len(layer._forward_pre_hooks) for layer in layers]

    before = hooks()
    with pytest.raises(ConfigError, match=r"straggler ranks \[5\] do not exist"):
        BalanceController(model, BalanceConfig(straggler=StragglerConfig.from_cli("fixed:5:4")))
    refused = hooks()
    from semimig.controller import runtime

    real, runtime.make_exchange = runtime.make_exchange, None  # a failure after the layers are bound
    try:
        with pytest.raises(TypeError):
            BalanceController(model, BalanceConfig(mode="zero-pri"))
    finally:
        runtime.make_exchange = real
    refused = (refused, hooks(), [layer.directive for layer in layers])
    live = []
    for _ in range(3):  # what every re-plan of mode reshard/semi does: close the old controller, build a new one
        ctl = BalanceController(model, BalanceConfig(mode="zero-pri"))
        live.append(hooks())
        ctl.close()
        ctl.close()  # idempotent
    return before, refused, live, hooks()


def test_a_refused_or_closed_controller_leaves_no_hook_on_the_layers():
    """Found by review: every controller put a forward pre-hook on each layer (holding its priority
    list, a host copy of the weight) and nothing removed it — a refused controller, a closed one and
    the one each re-plan replaces left theirs behind."""
    before, (refused, failed, directives), live, after = run_on_ranks(_hooks_body, 2)
    assert refused == before and failed == before and after == before, (before, refused, failed, after)
    assert directives == [None, None], directives
    assert live == [[n + 1 for n in before]] * 3, live


def _evaluated_body(rank, world, spec):
    """Eight iterations of the MLP under mode semi; between iterations 3 and 4 an evaluation inside
    ``ctl.dense()`` (three forward passes and 0.3 s of local work).  Per iteration: the step's compute as the report carries it; and the
    evaluation's own seconds."""
    from semimig.controller import BalanceConfig, BalanceController
    from semimig.straggler import StragglerConfig

    model = _model(world)()
    straggler = {} if spec is None else {"straggler": StragglerConfig.from_cli(spec)}
    ctl = BalanceController(model, BalanceConfig(mode="semi", **straggler))
    x = torch.randn(32, 64)
    computes, evaluated = [], 0.0
    for i in range(8):
        if i == 4:
            start = time.perf_counter()
            with ctl.dense(), torch.no_grad():
                for _ in range(3):
                    model(x)
                a = torch.randn(256, 256)
                while time.perf_counter() - start < 0.3:  # the rest of an evaluation: this rank's own work
                    a = torch.tanh(a @ a)
            evaluated = time.perf_counter() - start
        model(x).sum().backward()
        report = ctl.step()
        computes.append(report.device.compute_s if report.device is not None else None)
    gathered = [None] * world
    dist.all_gather_object(gathered, (computes, evaluated))
    return gathered


@pytest.mark.parametrize("spec", [None, "fixed:1:4:scope=device"])
def test_an_evaluation_between_steps_is_no_steps_work(spec):
    """Time inside ``dense()`` is left out of the step's clock (the step clock, and the whole-device
    straggler's): the step after an evaluation reads as its neighbours, not as a slowdown of every rank."""
    for computes, evaluated in run_on_ranks(_evaluated_body, 2, spec, timeout_s=120):
        steady = sorted(c for i, c in enumerate(computes) if i >= 1 and i != 4 and c is not None)
        typical = steady[len(steady) // 2]
        assert evaluated > 3 * typical, (evaluated, computes)  # the evaluation alone is several steps' work
        assert computes[4] is not None and computes[4] < typical + 0.25 * evaluated, (computes, evaluated)
