"""SEMI's migration trial: migration must pay in wall time (semimig.controller.trial).

The state machine on synthetic wall times (pure), then through the runtime on real gloo ranks:
every rank reaches the same verdict at the same step, and the plans follow it.
"""
import pytest
import torch
import torch.distributed as dist

from dist_harness import run_on_ranks
from semimig.controller.trial import MigrationTrial


def feed(trial, walls, migrating, resizing):
    """Observe ``walls`` under one applied plan; returns the verdicts that said something."""
    out = []
    for wall in walls:
        verdict = trial.observe(wall, migrating, resizing)
        if verdict.message or verdict.probe or verdict.restore or verdict.resize_only:
            out.append(verdict)
    return out


def run_trial(mig_wall, res_wall, samples=5, margin=0.05):
    trial = MigrationTrial(samples, margin)
    started = feed(trial, [mig_wall] * (samples + 1), {1}, {1})  # first iteration of an arm is not sampled
    assert [v.probe for v in started] == [frozenset({1})]
    assert trial.probing == {1}
    ended = feed(trial, [res_wall] * (samples + 1), set(), {1})
    assert len(ended) == 1 and trial.probing == frozenset()
    return trial, ended[0]


def test_migration_that_costs_wall_time_is_replaced_by_resizing():
    trial, verdict = run_trial(mig_wall=0.17, res_wall=0.12)
    assert verdict.resize_only == {1} and verdict.restore == frozenset()
    assert "does not pay" in verdict.message and "170.0 ms" in verdict.message and "120.0 ms" in verdict.message
    assert trial.verdict_for({1}) == "resize"


def test_migration_that_pays_resumes():
    trial, verdict = run_trial(mig_wall=0.10, res_wall=0.14)
    assert verdict.restore == {1} and verdict.resize_only == frozenset()
    assert "migration pays" in verdict.message
    assert trial.verdict_for({1}) == "migrate"
    # a settled set is not tried again
    assert feed(trial, [0.2] * 30, {1}, {1}) == []


@pytest.mark.parametrize("res_wall", [0.099, 0.0955])
def test_a_tie_within_the_margin_keeps_migration(res_wall):
    """Resizing only must be more than 5 % faster: migration is loss-free, pruning is not."""
    _, verdict = run_trial(mig_wall=0.100, res_wall=res_wall)
    assert verdict.restore == {1}


def test_the_first_iteration_of_each_arm_is_not_sampled():
    """A plan change costs its first iteration (keep sets, weight blocks): an outlier there does
    not decide the trial."""
    trial = MigrationTrial(3)
    feed(trial, [5.0, 0.10, 0.10, 0.10], {1}, {1})
    assert trial.probing == {1}
    verdicts = feed(trial, [9.0, 0.2, 0.2, 0.2], set(), {1})
    assert verdicts[-1].restore == {1}  # 0.2 resizing vs 0.1 migrating: the 5.0 and 9.0 did not count


def test_the_median_ignores_a_descheduled_iteration():
    trial = MigrationTrial(5)
    feed(trial, [0.17, 0.17, 3.0, 0.17, 0.17, 0.17], {1}, {1})
    (verdict,) = feed(trial, [0.1, 0.12, 0.12, 0.12, 2.0, 0.12], set(), {1})
    assert verdict.resize_only == {1}


def test_iterations_outside_the_probe_arm_are_not_counted_and_a_stalled_probe_is_abandoned():
    trial = MigrationTrial(3)
    feed(trial, [0.2] * 4, {1}, {1})
    assert trial.probing == {1}
    assert feed(trial, [0.01] * 5, {1}, {1}) == []  # the probe's plan has not reached the layers
    verdicts = feed(trial, [0.01] * 20, set(), set())  # the straggler recovered: nobody sheds
    assert len(verdicts) == 1 and verdicts[0].restore == {1} and "abandoned" in verdicts[0].message
    assert trial.verdict_for({1}) is None


def test_a_new_set_of_migrating_stragglers_is_tried_afresh():
    trial, _ = run_trial(mig_wall=0.17, res_wall=0.12)
    started = feed(trial, [0.3] * 6, {1, 2}, {1, 2})
    assert [v.probe for v in started] == [frozenset({1, 2})]


def test_every_rank_decides_alike_from_the_same_numbers():
    a, b = MigrationTrial(4), MigrationTrial(4)
    walls = [0.1 + 0.01 * ((7 * i) % 5) for i in range(40)]
    plans = [({1}, {1}) if i < 10 else (set(), {1}) for i in range(40)]
    assert [a.observe(w, *p) for w, p in zip(walls, plans)] == [b.observe(w, *p) for w, p in zip(walls, plans)]


@pytest.mark.parametrize("kwargs,match", [
    (dict(samples=0), "samples must be an int >= 1, got 0"),
    (dict(samples=True), "samples must be an int >= 1, got True"),
    (dict(samples=3, margin=1.0), "margin must be a finite number >= 0 and < 1, got 1.0"),
    (dict(samples=3, margin="0.1"), "margin must be a finite number >= 0 and < 1, got '0.1'"),
])
def test_bad_settings_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MigrationTrial(**kwargs)


@pytest.mark.parametrize("wall", [0.0, -1.0, float("nan"), "0.1"])
def test_a_bad_wall_time_is_refused_by_name(wall):
    with pytest.raises(ValueError, match=f"wall_s must be a finite number > 0, got {wall!r}"):
        MigrationTrial(3).observe(wall, {1}, {1})


def _lambda_body(rank, world):
    import torch.nn as nn

    import semimig.nn as snn
    from semimig.controller import BalanceConfig, BalanceController
    from semimig.controller.config import ControllerConfig

    model = nn.Sequential(snn.Linear1D_Col(8, 8 * world, process_group=dist.group.WORLD))
    on = BalanceController(model, BalanceConfig(mode="semi"))
    off = BalanceController(model, BalanceConfig(mode="semi", controller=ControllerConfig(migrators=1)))
    zero = BalanceController(model, BalanceConfig(mode="zero-pri"))
    return on.trial is not None, off.trial is None, zero.trial is None


def test_the_trial_runs_only_where_semi_chooses_who_migrates():
    """An explicit λ (``migrators``, the Fig. 11 sweep) is an instruction, not a guess to check."""
    assert run_on_ranks(_lambda_body, 2, timeout_s=60) == (True, True, True)


def test_controller_config_validates_the_trial_length():
    from semimig.controller.config import ControllerConfig
    from semimig.errors import ConfigError

    with pytest.raises(ConfigError, match="migration_trial"):
        ControllerConfig(migration_trial=-1)


# ---------------------------------------------------------------------------------- on real ranks
def _trial_body(rank, world):
    from semimig.controller import BalanceConfig, BalanceController, CostCurves, Curve
    from semimig.controller.config import ControllerConfig
    from semimig.straggler import StragglerConfig
    from tiny_models import semimig_pair

    torch.manual_seed(0)
    model = semimig_pair(64, 64 * world, 64)
    rate = 2 * 32 * 64 * 64 * 3 * 2 / 0.02  # emulated device: ~20 ms of GEMMs per iteration
    # Curves that make Eq. 2 migrate (resizing dear, traffic free): the receiver cap then sets 0.15.
    curves = CostCurves(omega1=1.0, omega2=Curve.constant(1.0), phi1=Curve.constant(0.0), phi2=Curve.constant(0.0))
    config = BalanceConfig(mode="semi", curves=curves, controller=ControllerConfig(migration_trial=3),
                           straggler=StragglerConfig.from_cli(f"fixed:1:4:mode=emulated:flops={rate}"))
    ctl = BalanceController(model, config)
    x = torch.randn(32, 64)
    rows = []
    for _ in range(45):
        model(x).sum().backward()
        report = ctl.step()
        events = tuple(e for e in (report.decision.events if report.decision else ()) if "SEMI trial" in e)
        rows.append((dict(report.migrate), events, tuple(sorted(ctl.resize_only)), tuple(sorted(ctl.trial_probing))))
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    return gathered


def test_the_trial_on_real_ranks_agrees_everywhere_and_the_plans_follow_its_verdict():
    gathered = run_on_ranks(_trial_body, 2, timeout_s=120)
    assert gathered[0] == gathered[1]  # events, plans and verdicts identical on both ranks
    rows = gathered[0]
    events = [(i, e) for i, (_, evs, _, _) in enumerate(rows) for e in evs]
    started = [i for i, e in events if "trying resizing only" in e]
    ended = [(i, e) for i, e in events if "does not pay" in e or "migration pays" in e]
    assert started and ended, events
    assert any(rows[i][0].get(1, 0.0) > 0.0 for i in range(started[0]))  # it migrated before the probe
    end, verdict = ended[0]
    probe_rows = rows[started[0] + 3:end]  # the probe's plan reaches the layers two steps after its decision
    assert probe_rows and all(1 not in migrate for migrate, _, _, _ in probe_rows)
    later = rows[end + 3:]
    assert later
    if "does not pay" in verdict:
        assert all(r[2] == (1,) and 1 not in r[0] for r in later)
    else:
        assert all(r[2] == () and r[0].get(1, 0.0) > 0.0 for r in later)
