"""The time-to-the-same-model analysis: steady step, time to target, summaries over repeats."""
import pytest

from semimig.bench.time_to_loss import (RunResult, exact_limit, pattern_limit, steady_step_s, summarize_mode,
                                        time_to_target_s)
from semimig.errors import ConfigError


def test_steady_step_is_the_median_of_the_last_half():
    assert steady_step_s([9.0, 9.0, 9.0, 1.0, 2.0, 3.0]) == 2.0
    assert steady_step_s([5.0]) == 5.0
    with pytest.raises(ConfigError, match="at least one"):
        steady_step_s([])


def test_time_to_target_sums_the_steps_before_the_first_evaluation_at_or_below_it():
    steps = [1.0, 2.0, 3.0, 4.0]
    val = [(0, 5.0), (2, 3.0), (4, 2.0)]
    assert time_to_target_s(steps, val, 3.0) == 3.0  # after 2 steps: 1 + 2
    assert time_to_target_s(steps, val, 2.5) == 10.0
    assert time_to_target_s(steps, val, 1.0) is None
    assert time_to_target_s(steps, [(0, float("nan")), (4, 2.0)], 3.0) == 10.0  # NaN never counts as reached
    with pytest.raises(ConfigError, match="5 steps"):
        time_to_target_s(steps, [(5, 1.0)], 3.0)


def test_summary_takes_median_and_range_over_repeats():
    runs = [RunResult(step_s=(1.0, 1.0, 1.0, 1.0), val_losses=((2, 3.0), (4, 2.0)), balanced_share=(0.5, 0.7)),
            RunResult(step_s=(2.0, 2.0, 2.0, 2.0), val_losses=((2, 2.9), (4, 2.2)), balanced_share=(0.4, None)),
            RunResult(step_s=(3.0, 3.0, 3.0, 3.0), val_losses=((2, 3.1), (4, 2.6)), balanced_share=(0.6, 0.9))]
    s = summarize_mode(runs, target=2.3)
    assert s["steady_step_s"] == 2.0 and s["steady_step_s_range"] == [1.0, 3.0]
    assert s["final_val_loss"] == 2.2 and s["final_val_loss_range"] == [2.0, 2.6]
    assert s["time_to_target_s_each"] == [4.0, 8.0, None]
    assert s["time_to_target_s"] == 6.0  # median of the repeats that reached it (a majority did)
    assert s["balanced_share"] == [0.5, 0.8]
    assert s["step_split"] is None  # no run recorded one


def test_step_splits_are_read_and_their_fields_taken_as_medians_per_rank():
    def split(c, m):
        return {"compute_s": c, "comm_s": m, "gemm_s": c / 2}

    files = [{"step_s": [1.0], "val_losses": [], "summary": {"step_split_by_rank": [split(c, 0.1), None]}}
             for c in (0.3, 0.5, 0.4)]
    runs = [RunResult.from_json(f) for f in files] + [RunResult(step_s=(1.0,), val_losses=())]
    s = summarize_mode(runs, target=None)
    assert s["step_split"] == [{"compute_s": 0.4, "comm_s": 0.1, "gemm_s": 0.2}, None]


def test_reflex_steps_are_counted_per_run_and_unknown_where_a_file_lacks_them():
    fired = {"step_s": [1.0], "val_losses": [], "summary": {}, "reflex_each": [[], [[3, 0.5], [7, 0.25]]]}
    clean = dict(fired, reflex_each=[[], []])
    older = {"step_s": [1.0], "val_losses": [], "summary": {}}
    runs = [RunResult.from_json(f) for f in (fired, clean, older)]
    assert runs[0].reflex_steps == (0, 2) and runs[2].reflex_steps is None
    assert summarize_mode(runs, target=None)["reflex_steps_each"] == [2, 0, None]
    with pytest.raises(ConfigError, match="semi run 0"):
        RunResult.from_json(dict(fired, reflex_each=[3]), "semi run 0")


def test_a_mode_most_of_whose_repeats_never_reach_the_target_has_no_time():
    runs = [RunResult(step_s=(1.0,), val_losses=((1, 3.0),)), RunResult(step_s=(1.0,), val_losses=((1, 1.0),))]
    assert summarize_mode(runs, target=2.0)["time_to_target_s"] is None


def test_example_json_is_read_and_a_broken_one_refused_by_name():
    data = {"step_s": [0.5, 0.6], "val_losses": [[2, 2.5]], "summary": {"balanced_share_by_rank": [0.6, 0.7]}}
    run = RunResult.from_json(data)
    assert run.final_val_loss == 2.5 and run.balanced_share == (0.6, 0.7)
    with pytest.raises(ConfigError, match="semi run 1"):
        RunResult.from_json({"step_s": [1.0]}, "semi run 1")


@pytest.mark.parametrize("chi, ranks, limit", [(4, 2, 1.6), (2, 2, 4 / 3), (1, 2, 1.0), (4, 4, 16 / 13)])
def test_exact_limit_of_a_group_with_one_slow_rank(chi, ranks, limit):
    # e ranks, one chi times slower, work split in proportion to speed: t = S / (e - 1 + 1/chi), healthy S / e
    assert exact_limit(chi, ranks) == pytest.approx(limit)


def test_worst_step_leaves_out_the_warm_up_and_needs_steps_after_it():
    from semimig.bench.time_to_loss import WARMUP_STEPS, worst_step_s

    steps = [9.0] * WARMUP_STEPS + [1.0, 3.5, 1.0]
    assert worst_step_s(steps) == 3.5  # the slow start-up steps do not count
    with pytest.raises(ConfigError, match="more than"):
        worst_step_s([1.0] * WARMUP_STEPS)
    runs = [RunResult(step_s=tuple(steps), val_losses=((8, 2.0),), balanced_share=None)]
    out = summarize_mode(runs, target=2.5)
    assert out["worst_step_s"] == 3.5 and out["mean_step_s"] == pytest.approx(sum(steps) / len(steps))


def test_each_step_is_throttled_or_free_by_the_switch_in_force_at_its_midpoint():
    from semimig.bench.time_to_loss import throttled_steps

    switches = [{"unix_s": 100.0, "fraction": 0.25}, {"unix_s": 120.0, "fraction": 1.0},
                {"unix_s": 160.0, "fraction": 0.25}]
    starts = [95.0, 99.5, 110.0, 119.0, 119.9, 140.0, 159.0, 170.0]
    steps = [2.0, 2.0, 1.0, 3.0, 0.1, 1.0, 0.5, 1.0]
    # mids:   96,  100.5, 110.5, 120.5, 119.95, 140.5, 159.25, 170.5
    assert throttled_steps(starts, steps, switches) == (None, True, True, False, True, False, False, True)
    assert throttled_steps(starts, steps, []) == (None,) * 8  # never attached
    with pytest.raises(ConfigError, match="7 step start times for 8 steps"):
        throttled_steps(starts[:7], steps, switches)


def test_a_straggler_that_moves_throttles_every_step_it_holds_some_rank():
    """Two ranks in turn (``--rank 0,1 --pattern 10:5``): a step is throttled while either rank is held, free
    in the pauses between them, whichever rank's switch came last."""
    from semimig.bench.time_to_loss import throttled_steps

    switches = [{"unix_s": 100.0, "fraction": 0.25, "rank": 0}, {"unix_s": 100.0, "fraction": 1.0, "rank": 1},
                {"unix_s": 110.0, "fraction": 1.0, "rank": 0}, {"unix_s": 115.0, "fraction": 0.25, "rank": 1},
                {"unix_s": 125.0, "fraction": 1.0, "rank": 1}, {"unix_s": 130.0, "fraction": 0.25, "rank": 0}]
    starts = [101.0, 111.0, 116.0, 124.0, 126.0, 131.0]
    steps = [1.0] * 6
    assert throttled_steps(starts, steps, switches) == (True, False, True, True, False, True)
    from semimig.bench.time_to_loss import held_ranks

    assert held_ranks(starts, steps, switches) == ((0,), (), (1,), (1,), (), (0,))
    assert held_ranks([99.0], [1.0], switches) == (None,)  # before the throttle attached
    with pytest.raises(ConfigError, match="time order"):
        throttled_steps(starts, steps, switches[::-1])


def test_phase_means_leave_out_the_warm_up_and_summaries_take_their_median():
    from semimig.bench.time_to_loss import WARMUP_STEPS, phase_mean_step_s

    warm = (9.0,) * WARMUP_STEPS
    flags = (True,) * WARMUP_STEPS
    runs = [RunResult(step_s=warm + (4.0, 1.0, 2.0, 1.0), val_losses=((9, 2.0),),
                      throttled=flags + (True, False, True, None)),
            RunResult(step_s=warm + (6.0, 3.0, 6.0, 1.0), val_losses=((9, 2.0),),
                      throttled=flags + (True, False, True, False))]
    assert phase_mean_step_s(runs[0]) == {"throttled": 3.0, "free": 1.0}
    assert phase_mean_step_s(runs[1]) == {"throttled": 6.0, "free": 2.0}
    assert summarize_mode(runs, target=None)["phase_mean_step_s"] == {"throttled": 4.5, "free": 1.5}
    plain = RunResult(step_s=(1.0,) * 9, val_losses=((9, 2.0),))
    assert phase_mean_step_s(plain) is None and summarize_mode([plain], None)["phase_mean_step_s"] is None
    free_only = RunResult(step_s=(1.0,) * 9, val_losses=((9, 2.0),), throttled=(False,) * 9)
    assert phase_mean_step_s(free_only) == {"throttled": None, "free": 1.0}


def test_step_phases_in_an_example_json_must_match_its_steps():
    data = {"step_s": [1.0, 1.0], "val_losses": [[2, 3.0]], "summary": {}, "throttled": [True]}
    with pytest.raises(ConfigError, match="1 step phases for 2 steps"):
        RunResult.from_json(data, "off run 0")
    data["throttled"] = [True, None]
    assert RunResult.from_json(data).throttled == (True, None)


def test_pattern_limit_weighs_the_phases_a_run_spends_its_time_in():
    """20:40 at χ = 4 (2 ranks: 1.6x within a throttled phase).  Over whole cycles a 60 s cycle does
    20/1.6 + 40 = 52.5 s of healthy work: 60/52.5 = 1.143x; a run of 46.3 healthy seconds ends within
    its first cycle, 20 s throttled (12.5 s of work) then 33.8 s free: 53.8/46.3 = 1.162x; one that ends
    within the first phase is at the phase's limit; no throttle (on 0) is healthy; always on is the
    phase's limit."""
    assert pattern_limit(4.0, 20.0, 40.0, 52.5 * 10) == pytest.approx(60.0 / 52.5)
    assert pattern_limit(4.0, 20.0, 40.0, 46.3) == pytest.approx((20.0 + 46.3 - 12.5) / 46.3)
    assert pattern_limit(4.0, 20.0, 40.0, 10.0) == pytest.approx(1.6)
    assert pattern_limit(4.0, 0.0, 40.0, 100.0) == pytest.approx(1.0)
    assert pattern_limit(4.0, 20.0, 0.0, 100.0) == pytest.approx(1.6)
    # a run that ends within the second cycle's throttled phase
    assert pattern_limit(4.0, 20.0, 40.0, 52.5 + 5.0) == pytest.approx((60.0 + 5.0 * 1.6) / 57.5)
    for bad, match in (((4.0, 0.0, 0.0, 10.0), "on_s=0"), ((4.0, -1.0, 40.0, 10.0), "on_s"),
                       ((4.0, 20.0, 40.0, 0.0), "healthy_s"), ((0.5, 20.0, 40.0, 10.0), "chi")):
        with pytest.raises(ConfigError, match=match):
            pattern_limit(*bad)


def test_the_runs_are_interleaved_and_every_other_repeat_reversed():
    """A drift linear in time cancels over a pair of repeats: each mode's mean position is the same."""
    from semimig.bench.time_to_loss import run_order

    order = run_order(["healthy", "off", "semi"], 4)
    assert order[:6] == [(0, "healthy"), (0, "off"), (0, "semi"), (1, "semi"), (1, "off"), (1, "healthy")]
    positions = {m: [i for i, (_, mode) in enumerate(order) if mode == m] for m in ("healthy", "off", "semi")}
    assert len({sum(p) for p in positions.values()}) == 1
    assert [k for k, mode in order if mode == "off"] == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match=r"repeats must be an int >= 1, got 0"):
        run_order(["healthy"], 0)
