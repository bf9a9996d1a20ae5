"""The re-plan trigger (pure): sustained moves beyond the threshold re-plan, noise and spikes do not.

Expected iterations are worked out from the definition (module docstring of semimig.hybrid.replan):
with window 5 and patience 3, a group whose ratio jumps at iteration k has a median beyond the
threshold from iteration k+2 (three of the last five are new) and fires at k+4.
"""
from __future__ import annotations

import random

import pytest

from semimig.allocation import SpeedCurve, allocate
from semimig.errors import ConfigError
from semimig.hybrid import ReplanConfig, ReplanTrigger, group_maxima, scale_curve

PREDICTED = (0.2, 0.4)


def _feed(trigger: ReplanTrigger, ratios_per_iteration):
    decisions = []
    for ratios in ratios_per_iteration:
        decision = trigger.observe([r * p for r, p in zip(ratios, PREDICTED)], PREDICTED)
        if decision is not None:
            decisions.append(decision)
    return decisions


def test_noise_inside_the_threshold_never_replans() -> None:
    rng = random.Random(0)
    trigger = ReplanTrigger(2, ReplanConfig(threshold=0.15, window=5, patience=3))
    assert _feed(trigger, [(1 + rng.uniform(-0.1, 0.1), 1 + rng.uniform(-0.1, 0.1)) for _ in range(500)]) == []


def test_isolated_spikes_never_replan() -> None:
    trigger = ReplanTrigger(2, ReplanConfig(window=5, patience=3))
    ratios = [(1.0, 1.0)] * 100
    for i in range(0, 100, 3):  # one slow iteration in three: the median of five stays at 1
        ratios[i] = (3.0, 1.0)
    assert _feed(trigger, ratios) == []


@pytest.mark.parametrize("new_ratio", [1.5, 0.6])  # a straggler appears / leaves
def test_a_sustained_change_replans_at_the_predicted_iteration_with_the_median_scale(new_ratio: float) -> None:
    trigger = ReplanTrigger(2, ReplanConfig(threshold=0.15, window=5, patience=3))
    k = 10
    decisions = _feed(trigger, [(1.0, 1.0)] * (k - 1) + [(1.0, new_ratio)] * 30)
    first = decisions[0]
    assert first.iteration == k + 4
    assert first.scales == (1.0, pytest.approx(new_ratio)) and first.changed_groups == (1,)
    # the windows restart: the same ratio (the curve is not rescaled in this pure test) fires again
    # only after a full window plus the patience
    assert decisions[1].iteration == first.iteration + 5 + 2


def test_same_numbers_same_decisions_on_every_rank() -> None:
    rng = random.Random(1)
    ratios = [(rng.uniform(0.5, 2.0), rng.uniform(0.5, 2.0)) for _ in range(200)]
    runs = [_feed(ReplanTrigger(2, ReplanConfig(window=3, patience=2)), ratios) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2] and runs[0]


def test_a_group_without_prediction_keeps_scale_one() -> None:
    trigger = ReplanTrigger(2, ReplanConfig(window=1, patience=1))
    decision = trigger.observe([0.0, 0.8], [0.0, 0.4])
    assert decision is not None and decision.scales == (1.0, 2.0)


def test_rescaled_curves_move_samples_to_the_faster_group() -> None:
    curves = [SpeedCurve.from_points([(1, 0.01), (32, 0.2)], max_batch_size=64, name=f"group{g}") for g in range(2)]
    even = allocate(curves, 64, zero_stage=1).samples
    slowed = [curves[0], scale_curve(curves[1], 2.0)]
    assert slowed[1].times_s == (0.02, 0.4) and slowed[1].batch_sizes == (1, 32)
    after = allocate(slowed, 64, zero_stage=1).samples
    assert even == (32, 32) and after[0] > after[1]


def test_group_maxima_takes_the_slowest_member() -> None:
    assert group_maxima([0.1, 0.4, 0.3, 0.2], [0, 0, 1, 1], 2) == [0.4, 0.3]
    with pytest.raises(ConfigError, match="3 values for 4 ranks"):
        group_maxima([0.1, 0.2, 0.3], [0, 0, 1, 1], 2)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"threshold": 0.0}, "ReplanConfig.threshold must be a finite number > 0 and <= 10"),
    ({"threshold": "0.1"}, "got '0.1'"),
    ({"window": 0}, "ReplanConfig.window must be an int >= 1 and <= 10000, got 0"),
    ({"patience": 1.5}, "ReplanConfig.patience must be an int"),
])
def test_config_refuses_bad_values_by_name(kwargs, message) -> None:
    with pytest.raises(ConfigError) as caught:
        ReplanConfig(**kwargs)
    assert message in str(caught.value)


def test_observe_refuses_the_wrong_number_of_groups() -> None:
    with pytest.raises(ConfigError, match="need 2 measured and predicted times, got 3 and 2"):
        ReplanTrigger(2).observe([1.0, 1.0, 1.0], [1.0, 1.0])


def test_non_finite_group_times_are_not_measurements() -> None:
    """A NaN or inf group time (a NaN loss, a broken clock) neither re-plans nor raises;
    the trigger acts on the finite ratios only (here: none moved, so no re-plan in 100 iterations)."""
    trigger = ReplanTrigger(2, ReplanConfig(window=5, patience=3))
    ratios = [(1.0, 1.0)] * 10 + [(float("inf"), float("nan"))] * 90
    assert _feed(trigger, ratios) == []
    assert trigger.medians() == (1.0, 1.0)


@pytest.mark.parametrize("calibrate", [True, False])
def test_calibration_decides_on_the_first_full_window_even_inside_the_threshold(calibrate: bool) -> None:
    """A common speed guess of 1 s a sample against groups at 0.9 and 1.1 s: both medians sit inside
    θ = 0.15, yet the groups differ by 22 % — calibration must hand them their measured speeds (at
    window + patience − 1), and only once; a profiled trigger keeps such noise-sized offsets."""
    trigger = ReplanTrigger(2, ReplanConfig(threshold=0.15, window=3, patience=2), calibrate=calibrate)
    decisions = _feed(trigger, [(0.9, 1.1)] * 20)
    if not calibrate:
        assert decisions == []
        return
    assert [d.iteration for d in decisions] == [3 + 2 - 1]
    assert decisions[0].scales == (pytest.approx(0.9), pytest.approx(1.1)) and decisions[0].changed_groups == (0, 1)


def _starved_body(rank: int, world: int):
    from colossalai.booster.plugin import HybridParallelPlugin

    from semimig.hybrid import HybridBalancer

    plugin = HybridParallelPlugin(tp_size=1, pp_size=1, zero_stage=0, precision="fp32")
    # group 1 profiled 1000x slower than group 0: Poplar gives it nothing; it has since recovered
    curves = [SpeedCurve.constant(peak_speed=s, max_batch_size=8, name=f"group{g}") for g, s in enumerate((1.0, 1e-3))]
    box = {}

    def busy() -> float:  # 10 ms a row, both groups; a starved group runs a one-row stand-in per micro-step
        device = box["balancer"].plan.device(box["balancer"].layout.dp_rank)
        return 0.01 * max(device.samples, device.accumulation_steps)

    box["balancer"] = balancer = HybridBalancer(plugin, curves=curves, global_batch_size=8,
                                                replan=ReplanConfig(window=3, patience=2), busy_source=busy)
    samples = [balancer.plan.samples]
    for _ in range(12):
        balancer.step()
        samples.append(balancer.plan.samples)
    return samples


def test_a_starved_group_that_recovers_gets_samples_back() -> None:
    """The stand-in's time against the curve's time for one sample is the starved group's measurement:
    without it the group (predicted 0 s) is never measured and keeps nothing for good."""
    from dist_harness import run_on_ranks

    samples = run_on_ranks(_starved_body, 2, timeout_s=120)
    assert samples[0] == (8, 0), samples
    assert samples[-1] == (4, 4), samples
