"""The replay of recorded runs (semimig.controller.sim.recorded, .replay): every constant read from the file, the
simulated step against a closed form of the step model, and files the model cannot hold skipped with
their reason."""
import json

import pytest

from semimig.controller.sim.recorded import file_constants
from semimig.controller.sim.replay import SPLITS, replay_file, replay_summary

T = 0.5  # seconds of a healthy step


def _run(steps, events=(), throttled=None):
    run = {"step_s": list(steps), "summary": {"reshard": {"events": list(events)}}}
    if throttled is not None:
        run["throttled"] = list(throttled)
    return run


def _event(step, mlp, kv):
    return {"step": step, "mlp_units": list(mlp), "kv_units": list(kv)}


def _file(reshard, *, tp=2, share=0.8, layout=None, model=None, **top):
    data = {"benchmark": "time_to_loss", "straggler": "real", "chi": 4.0, "pattern": None,
            "model": model or {"hidden": 1024, "heads": 16, "kv_heads": 8},
            "modes": {"healthy": {"balanced_share": [share] * tp}},
            "raw": {"healthy": [_run([9.0] + [T] * 10)], "reshard": reshard}}
    if layout is not None:
        data["layout"] = layout
    data.update(top)
    return data


def _attention(h=1024, h_kv=512, units=32):
    return 2 * h * (h + h_kv) / (2 * h * (h + h_kv) + 3 * h * units * 128)


def _closed_form(plan_mlp, plan_kv, speeds, share, units=32, kv=8, h=1024, h_kv=512):
    """DESIGN §8's step with all of a healthy step's non-GEMM seconds replicated (``f = 1``): rank r
    spends ``T·(R + S·p_r)/v_r`` with ``R = 1 − B`` and ``S = e·B``."""
    a, e = _attention(h, h_kv, units), len(speeds)
    return max(T * ((1 - share) + e * share * ((1 - a) * n / units + a * k / kv)) / v
               for n, k, v in zip(plan_mlp, plan_kv, speeds))


def test_a_steady_throttle_replays_to_the_closed_form():
    plan = ([26, 6], [6, 2])
    moved = _closed_form(*plan, (1.0, 0.25), 0.8)
    steps = [9.0] + [4 * T] * 3 + [moved] * 6  # even for steps 0..3, the move decided at step 3
    data = _file([_run(steps, [_event(3, *plan)])])
    out = replay_file(data, "f.json")
    run = out["runs"][0]
    assert run["measured_mean_s"] == pytest.approx((3 * 4 * T + 6 * moved) / 9)
    assert run["simulated_mean_s"] == pytest.approx(run["measured_mean_s"], rel=1e-9)
    assert out["ratio"] == pytest.approx(1.0) and out["error"] == pytest.approx(0.0, abs=1e-9)
    assert out["constants"]["chi"] == 4.0 and out["constants"]["chi_from"] == "nominal"
    lo, hi = run["band_s"]
    assert lo <= run["simulated_mean_s"] <= hi and out["in_band"]


def test_tp4_reads_its_layout_and_the_slow_rank_out_of_every_dimension():
    """tp 4, the last rank at an eighth of a core against half a core (χ = 4), holding nothing: at
    ``f = 1`` the step is its replicated work, χ·(1 − B)·T; at ``f = 0`` (no replicated work) the
    collectives run at healthy pace beside the fast ranks' larger shards."""
    layout = {"tp": 4, "dp": 1, "straggler_rank": 3, "share": 0.5, "fraction": 0.125}
    model = {"hidden": 768, "heads": 16, "kv_heads": 8}
    plan = ([8, 8, 8, 0], [3, 3, 2, 0])
    data = _file([_run([9.0] + [0.7] * 10, [_event(-1, *plan)])], tp=4, share=0.55, layout=layout, model=model,
                 chi=None)
    c = file_constants(data)
    assert (c["tp"], c["straggler_rank"], c["chi"], c["shardable_share"]) == (4, 3, 4.0, 0.55)
    run = replay_file(data)["runs"][0]
    assert run["simulated_mean_s"] == pytest.approx(4 * 0.45 * T)
    a = _attention(768, 384, 24)
    # f = 0: the shards plus the collectives, the paired kinds' at healthy pace, the vocabulary's at rank 3's
    fast = T * (0.55 * 4 * ((1 - a) * 8 / 24 + a * 3 / 8) + 0.45 * (1 + 1 + 4) / 3)
    assert run["band_s"][0] <= min(fast, run["simulated_mean_s"]) * (1 + 1e-3)  # f = 0 is one end of the band


def test_a_recorded_step_split_sets_the_point_estimate():
    """A healthy step split into own work 0.6, collectives 0.4 and balanced GEMMs 0.4 (of a step of 1):
    ``B = 0.4`` and ``f = 0.2/0.6``; with the slow rank holding nothing the step is the larger of its
    replicated work at χ and the fast ranks' shards plus replicated work, then the collectives: the paired
    kinds' at the fast ranks' pace, the vocabulary's at the slow rank's (it does not skip the step)."""
    layout = {"tp": 4, "dp": 1, "straggler_rank": 3, "share": 0.5, "fraction": 0.125}
    model = {"hidden": 768, "heads": 16, "kv_heads": 8}
    plan = ([8, 8, 8, 0], [3, 3, 2, 0])
    data = _file([_run([9.0] + [0.7] * 10, [_event(-1, *plan)])], tp=4, share=0.55, layout=layout, model=model,
                 chi=None)
    data["modes"]["healthy"]["step_split"] = [{"compute_s": 0.6 * T, "comm_s": 0.4 * T, "gemm_s": 0.4 * T}] * 4
    c = file_constants(data)
    assert c["shardable_share"] == pytest.approx(0.4) and c["split"] == pytest.approx(1 / 3)
    assert c["split_from"] == "step_split"
    run = replay_file(data)["runs"][0]
    a = _attention(768, 384, 24)
    fast = T * (0.4 * 4 * ((1 - a) * 8 / 24 + a * 3 / 8) + 0.2)
    assert run["simulated_mean_s"] == pytest.approx(max(4 * 0.2 * T, fast) + 0.4 * T * (1 + 1 + 4) / 3, rel=1e-6)
    best = replay_file(data)["model_best"]  # no plan beats emptying the slow rank: its replicated work stays
    assert best["plan"][0][3] == 0 and best["plan"][1][3] == 0
    assert best["vs_healthy"] == pytest.approx(run["simulated_mean_s"] / T, rel=1e-6)


def _split_file(events, steps=11):
    """tp 4, rank 3 at χ 4 holding nothing; each rank's own non-GEMM seconds are ``R + N·p`` at its pace:
    R = 0.05 T replicated, N = 0.4 T following its share ``p`` of the shardable work."""
    layout = {"tp": 4, "dp": 1, "straggler_rank": 3, "share": 0.5, "fraction": 0.125}
    model = {"hidden": 768, "heads": 16, "kv_heads": 8}
    a, R, N = _attention(768, 384, 24), 0.05 * T, 0.4 * T
    run = _run([9.0] + [0.7] * (steps - 1), events)
    last = events[-1]
    shares = [(1 - a) * n / 24 + a * k / 8 for n, k in zip(last["mlp_units"], last["kv_units"])]
    run["summary"]["step_split_by_rank"] = [
        {"compute_s": (R + N * p + 0.3 * T * 4 * p) * (4.0 if r == 3 else 1.0), "comm_s": 0.3 * T,
         "gemm_s": 0.3 * T * 4 * p * (4.0 if r == 3 else 1.0)} for r, p in enumerate(shares)]
    data = _file([run], tp=4, share=0.55, layout=layout, model=model, chi=None)
    own = R + N / 4  # at even
    data["modes"]["healthy"]["step_split"] = [{"compute_s": own + 0.3 * T, "comm_s": 0.3 * T,
                                               "gemm_s": 0.3 * T}] * 4
    return data, R, own


def test_the_replicated_part_of_the_own_work_is_fitted_over_the_ranks_shares():
    """Where the reshard runs record each rank's split under one plan, ``compute − gemm`` is read as a
    replicated ``R`` plus work that follows the rank's share: the line through the ranks recovers ``R``, and
    the rest of the own work joins the shardable share."""
    data, R, own = _split_file([_event(-1, [8, 8, 8, 0], [3, 3, 2, 0])])
    c = file_constants(data)
    assert c["replicated_s"] == pytest.approx(R, rel=1e-9)
    healthy = own + 0.6 * T  # c + m of the healthy split
    assert c["shardable_share"] == pytest.approx((own + 0.3 * T - R) / healthy, rel=1e-9)
    assert c["split"] == pytest.approx(R / (R + 0.3 * T), rel=1e-9)
    assert "fitted" in c["split_from"]


def test_a_seated_slow_ranks_gemm_pace_and_replicated_pace_are_read_from_its_split():
    """The throttled rank holds units: its GEMMs per share run χ = 3 times a healthy rank's and its replicated
    work at ``χ^φ`` (φ 0.5: a CPU quota lets short bursts through), whatever the nominal 4 says; the replay
    reads both from the split and simulates that rank as it ran."""
    layout = {"tp": 4, "dp": 1, "straggler_rank": 3, "share": 0.5, "fraction": 0.125}
    model = {"hidden": 768, "heads": 16, "kv_heads": 8}
    a, R, N, G, chi, phi = _attention(768, 384, 24), 0.05 * T, 0.4 * T, 0.3 * T * 4, 3.0, 0.5
    plan = ([7, 7, 7, 3], [3, 2, 2, 1])
    run = _run([9.0] + [0.7] * 10, [_event(-1, *plan)])
    shares = [(1 - a) * n / 24 + a * k / 8 for n, k in zip(*plan)]
    pace = [1.0, 1.0, 1.0, chi]
    run["summary"]["step_split_by_rank"] = [
        {"compute_s": R * v ** phi + (N + G) * p * v, "comm_s": 0.3 * T, "gemm_s": G * p * v}
        for p, v in zip(shares, pace)]
    data = _file([run], tp=4, share=0.55, layout=layout, model=model, chi=None)
    own = R + N / 4
    data["modes"]["healthy"]["step_split"] = [{"compute_s": own + G / 4, "comm_s": 0.3 * T, "gemm_s": G / 4}] * 4
    c = file_constants(data)
    assert c["chi"] == pytest.approx(chi, rel=1e-9) and "split" in c["chi_from"]
    assert c["replicated_s"] == pytest.approx(R, rel=1e-9)
    assert c["replicated_pace"] == pytest.approx(phi, rel=1e-9)
    flat = file_constants(_split_file([_event(-1, [8, 8, 8, 0], [3, 3, 2, 0])])[0])
    # an emptied slow rank's own seconds are its replicated work alone (at χ^1 in that file): its GEMMs' pace
    # stays the nominal one
    assert flat["replicated_pace"] == pytest.approx(1.0) and flat["chi"] == 4.0


def test_a_seated_slow_ranks_seats_in_the_collectives_are_read_from_the_lead_ranks_wait():
    """Under a plan that seats the throttled rank (χ 3, holding units of both kinds), the healthy rank that computes
    longest waits least: its collectives' seconds over the healthy step's are the seats' stretch, ``3^ψ`` here (each
    kind's reductions and the vocabulary's at the slow rank's seat), read back as ``ψ`` whatever ``φ`` is; the others'
    seconds hold their waits.  A plan that seats no slow rank, or a pattern, reads none."""
    layout = {"tp": 4, "dp": 1, "straggler_rank": 3, "share": 0.5, "fraction": 0.125}
    model = {"hidden": 768, "heads": 16, "kv_heads": 8}
    a, R, N, G, chi, phi, psi = _attention(768, 384, 24), 0.05 * T, 0.4 * T, 0.3 * T * 4, 3.0, 1.0, 0.4
    plan = ([9, 7, 6, 2], [3, 2, 2, 1])
    run = _run([9.0] + [0.7] * 10, [_event(-1, *plan)])
    shares = [(1 - a) * n / 24 + a * k / 8 for n, k in zip(*plan)]
    pace = [1.0, 1.0, 1.0, chi]
    compute = [R * v ** phi + (N + G) * p * v for p, v in zip(shares, pace)]
    seats = 0.3 * T * chi ** psi
    run["summary"]["step_split_by_rank"] = [
        {"compute_s": c, "comm_s": seats + max(compute[:3]) - c, "gemm_s": G * p * v}
        for c, p, v in zip(compute, shares, pace)]
    data = _file([run], tp=4, share=0.55, layout=layout, model=model, chi=None)
    data["modes"]["healthy"]["step_split"] = [{"compute_s": R + N / 4 + G / 4, "comm_s": 0.3 * T, "gemm_s": G / 4}] * 4
    c = file_constants(data)
    assert c["seat_pace"] == pytest.approx(psi, abs=1e-6) and c["replicated_pace"] == pytest.approx(phi, abs=1e-6)
    assert "seat_pace" not in file_constants(_split_file([_event(-1, [8, 8, 8, 0], [3, 3, 2, 0])])[0])
    data["pattern"] = "1:0"
    assert "seat_pace" not in file_constants(data)


def test_stragglers_slowed_together_each_run_at_their_own_slowdown():
    """Ranks 2 and 3 at a quarter and an eighth of a core against half a core (χ 2 and 4), no pattern: each rank
    is read at its own ``share / fraction``.  Rank 2 holding half of both kinds sets the step,
    ``T·(R + S·½)/½`` with ``R = 1 − B``, ``S = 4·B`` (at χ 4 for both it would be twice that)."""
    layout = {"tp": 4, "dp": 1, "straggler_rank": [2, 3], "share": 0.5, "fraction": [0.25, 0.125]}
    plan = ([8, 8, 16, 0], [2, 2, 4, 0])
    step = T * (0.2 + 4 * 0.8 * 0.5) / 0.5
    data = _file([_run([9.0] + [step] * 10, [_event(-1, *plan)])], tp=4, layout=layout, chi=None)
    c = file_constants(data)
    assert c["chis"] == {2: 2.0, 3: 4.0} and c["chi"] == 4.0
    out = replay_file(data, "two.json")
    assert out["runs"][0]["simulated_mean_s"] == pytest.approx(step, rel=1e-9) and out["error"] == pytest.approx(0.0)
    best = out["model_best"]["plan"]  # the slower straggler never holds more than the milder one
    assert best[0][3] <= best[0][2] and best[1][3] <= best[1][2]
    data["layout"] = dict(layout, fraction=None)
    assert "without a fraction and a share" in replay_file(data)["skipped"]


def test_a_split_read_across_two_plans_is_not_fitted():
    """The per-rank split is a median over the run's steps: a plan that held for less than half of them
    leaves the point estimate to the healthy split alone."""
    data, _, _ = _split_file([_event(-1, [6, 6, 6, 6], [2, 2, 2, 2]), _event(6, [8, 8, 8, 0], [3, 3, 2, 0])])
    c = file_constants(data)
    assert c["split_from"] == "step_split" and "replicated_s" not in c


def test_the_slowdown_is_read_from_an_off_run_when_the_file_has_one():
    data = _file([_run([9.0] + [T] * 4)], chi=None, straggler="device")
    data["raw"]["off"] = [_run([9.0] + [3 * T] * 4)]
    c = file_constants(data)
    assert c["chi"] == pytest.approx(3.0) and c["chi_from"] == "off"


def test_a_pattern_throttles_only_its_flagged_steps():
    flags = [True, True, False, False, True]
    data = _file([_run([9.0, 4 * T, T, T, 4 * T], throttled=flags)], pattern="1:1")
    run = replay_file(data)["runs"][0]
    assert run["simulated_mean_s"] == pytest.approx(2.5 * T)  # even plan: χ·T throttled, T free
    del data["raw"]["reshard"][0]["throttled"]
    assert "throttled flags" in replay_file(data)["skipped"]


def test_a_straggler_that_moves_slows_the_rank_held_on_each_step():
    """Ranks 0 and 1 in turn: a plan that unloads rank 1 is right while rank 1 is held and wrong once rank 0
    is: each step is simulated with the rank its ``throttled_ranks`` names slow (the closed form)."""
    plan = ([26, 6], [6, 2])
    held = [[1], [1], [1], [1], [0], [0], [0], []]
    run = _run([9.0] * 8, [_event(0, *plan)], throttled=[bool(h) for h in held])
    run["throttled_ranks"] = held
    data = _file([run], layout={"tp": 2, "dp": 1, "straggler_rank": [1, 0], "share": 1.0, "fraction": 0.25},
                 pattern="3:0", chi=None)
    expected = [_closed_form(*plan, (1.0, 0.25), 0.8)] * 3 + [_closed_form(*plan, (0.25, 1.0), 0.8)] * 3 \
        + [_closed_form(*plan, (1.0, 1.0), 0.8)]
    out = replay_file(data)["runs"][0]
    assert out["simulated_mean_s"] == pytest.approx(sum(expected) / 7, rel=1e-9)
    assert file_constants(data)["straggler_rank"] == [1, 0]


def test_a_straggler_that_moves_runs_through_the_policy_as_one():
    """Ranks 0 and 1 in turn, 4 s each, no free phase: the even plan steps χ·T whichever rank is held, and the
    policy laid on the same pattern sees the slowdown move (a ``moving`` scenario)."""
    held = [[0]] * 5 + [[1]] * 5 + [[0]] * 5 + [[1]] * 5
    move = dict(_event(2, [28, 4], [8, 0]), bytes_moved=40_000_000, move_s=0.4)
    run = _run([2.0] * 20, [move], throttled=[True] * 20)
    off = _run([4 * T] * 20, throttled=[True] * 20)
    run["throttled_ranks"], off["throttled_ranks"] = held, held
    data = _file([run], layout={"tp": 2, "dp": 1, "straggler_rank": [0, 1], "share": 1.0, "fraction": 0.25},
                 pattern="4:0", chi=None)
    data["raw"]["off"] = [off]
    out = replay_file(data)["pattern_policy"]
    assert out["simulated"]["even_s"] == pytest.approx(4 * T)
    assert out["simulated"]["policy_s"] > 0.0 and out["measured"]["off_s"] == pytest.approx(4 * T)


def test_a_pattern_runs_through_the_policy_on_the_wall_clock():
    """4 s throttled at χ 4, 4 s free, from the start: the even plan steps 2 s twice and 0.5 s eight times
    a cycle, so 20 steps take two cycles, 0.8 s a step; the measured side is the runs' own means."""
    flags = [True] * 3 + [False] * 8 + [True] * 2 + [False] * 7
    steps = [2.0 if f else T for f in flags]
    move = dict(_event(2, [28, 4], [8, 0]), bytes_moved=40_000_000, move_s=0.4)
    data = _file([_run(steps, [move, dict(_event(5, [16, 16], [4, 4]), bytes_moved=40_000_000, move_s=0.2)],
                       throttled=flags)], pattern="4:4")
    data["raw"]["off"] = [_run([4 * T if f else T for f in flags], throttled=flags)]
    out = replay_file(data)["pattern_policy"]
    assert out["simulated"]["even_s"] == pytest.approx(0.8)
    assert out["measured"] == pytest.approx({"reshard_s": sum(steps) / 20, "off_s": (5 * 2.0 + 15 * T) / 20,
                                             "moves": 2})
    assert out["policy_vs_even"]["measured"] == pytest.approx(sum(steps) / (5 * 2.0 + 15 * T))
    assert out["policy_vs_even"]["simulated"] == pytest.approx(out["simulated"]["policy_s"] / 0.8)
    assert 0.0 < out["simulated"]["policy_s"] and out["simulated"]["moves"] >= 0
    del data["raw"]["off"]
    assert "pattern_policy" not in replay_file(data)


@pytest.mark.parametrize("change, reason", [
    (lambda d: d.update(layout={"tp": 2, "dp": 2}), "dp 2"),
    (lambda d: d.update(layout={"pp": 2, "tp": 2, "dp": 1}), "pp 2"),
    (lambda d: (d.update(layout={"tp": 2, "dp": 1, "straggler_rank": [0, 1]}, pattern="1:0"),
                d["raw"]["reshard"][0].update(throttled=[True] * 5)),
     "ranks [0, 1] slowed in turn without the rank held on each step"),
    (lambda d: d.update(chi=None, straggler="neighbour"), "no nominal slowdown"),
    (lambda d: d["modes"]["healthy"].pop("balanced_share"), "balanced_share"),
    (lambda d: d["raw"].pop("reshard"), "no healthy and reshard runs"),
    (lambda d: d["raw"]["reshard"][0]["summary"]["reshard"]["events"].append(_event(1, [10, 10, 12], [2, 2, 4])),
     "not tp 2"),
])
def test_what_the_model_cannot_hold_is_skipped_with_its_reason(change, reason):
    data = _file([_run([9.0] + [T] * 4)])
    change(data)
    out = replay_file(data, "x.json")
    assert reason in out["skipped"] and out["file"] == "x.json"
    assert replay_summary([out])["skipped"] == {"x.json": out["skipped"]}


def test_the_splits_span_all_replicated_to_all_collectives():
    assert SPLITS[0] == 0.0 and SPLITS[-1] == 1.0 and list(SPLITS) == sorted(SPLITS)


def test_the_benchmark_replays_a_folder_and_lists_what_it_skips(tmp_path):
    from scripts import load_script

    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "ttl_a.json").write_text(json.dumps(_file([_run([9.0] + [4 * T] * 4)])))
    (folder / "pp.json").write_text(json.dumps({"benchmark": "pipeline_real", "layout": {"pp": 2, "tp": 2}}))
    (folder / "other.json").write_text(json.dumps({"benchmark": "kernel"}))
    script = load_script("benchmarks/policy_sim.py", "policy_sim_replay_under_test")
    out = tmp_path / "sim.json"
    assert script.main(["--json", str(out), "--quick", "--scenarios", "2", "--replay", str(folder)]) == 0
    replay = json.loads(out.read_text())["replay"]
    assert replay["summary"]["files"] == 1 and replay["summary"]["within_10pct"] == 1
    assert set(replay["summary"]["skipped"]) == {"pp.json"}
    assert replay["files"][1]["runs"][0]["ratio"] == pytest.approx(1.0)


def test_what_the_steps_after_a_move_add_is_read_from_the_runs():
    """A move at step ``s`` is made in that step's optimizer hook: steps ``s + 1`` and ``s + 2`` run over the
    median of the three after them by what the move adds (0.3 and 0.5 s here, median 0.4 over three moves),
    and a move whose five steps after it cross a throttle change measures that change, so it is not read."""
    flags = [True] * 4 + [False] * 36
    steps = [2.0] * 4 + [T] * 36
    events = []
    for s, excess in ((8, 0.3), (18, 0.4), (28, 0.5)):
        steps[s + 1] += excess / 2
        steps[s + 2] += excess / 2
        events.append(dict(_event(s, [16, 16], [4, 4]), bytes_moved=40_000_000, move_s=0.2))
    events.insert(0, dict(_event(1, [28, 4], [8, 0]), bytes_moved=40_000_000, move_s=0.4))  # crosses the change
    data = _file([_run(steps, events, throttled=flags)], pattern="4:16")
    data["raw"]["off"] = [_run([4 * T if f else T for f in flags], throttled=flags)]
    out = replay_file(data)["pattern_policy"]
    assert out["settle_s"] == pytest.approx(0.4)


def test_a_moves_seconds_and_the_steps_after_it_are_in_the_replayed_steps():
    """The step that decided a move holds the move's recorded seconds (the optimizer hook makes it inside the
    timed step), and the two steps after it what the runs' moves added there: the replay adds both, so a run
    whose steady steps match the model replays to its measured mean exactly, and without them it would not."""
    plan = ([26, 6], [6, 2])
    moved = _closed_form(*plan, (1.0, 0.25), 0.8)
    steps = [9.0] + [4 * T] * 3 + [moved] * 8
    steps[3] += 0.7  # the move's own seconds
    steps[4] += 0.25  # the first touches after it
    steps[5] += 0.05
    data = _file([_run(steps, [dict(_event(3, *plan), bytes_moved=10_000_000, move_s=0.7)])])
    run = replay_file(data, "f.json")["runs"][0]
    assert run["measured_mean_s"] == pytest.approx((3 * 4 * T + 8 * moved + 1.0) / 11)
    assert run["simulated_mean_s"] == pytest.approx(run["measured_mean_s"], rel=1e-9)


def test_a_straggler_that_moves_is_fitted_from_every_steps_split_under_each_plan():
    """Ranks 0 and 1 slowed in turn, the plan following them: no plan holds most of the run, so the split's
    medians over the run mix plans, but every step's split names its plan and held rank.  Grouped by plan and
    throttle state, the healthy ranks' points give ``R``, the held ranks' GEMMs per share over the healthy
    ranks' under the same plan give ``χ``, and their own seconds ``φ``; a move's step and the one after it
    (their seconds the move's and its settling) are left out, whatever they hold."""
    R, N, G, chi, phi = 0.05 * T, 0.4 * T, 1.2 * T, 3.0, 0.5
    a = _attention()
    plans = {1: ([26, 6], [6, 2]), 0: ([6, 26], [2, 6])}
    held, events, steps = [], [], 24
    for i in range(steps):  # rank 1 held for steps 0-11, rank 0 after; the plan moves at steps 2 and 14
        held.append([1] if i < 12 else [0])
    events = [_event(2, *plans[1]), _event(14, *plans[0])]
    schedule = [None] * 3 + [plans[1]] * 12 + [plans[0]] * 9

    def split(plan, r, slow):
        v = chi if slow else 1.0
        p = 0.5 if plan is None else (1 - a) * plan[0][r] / 32 + a * plan[1][r] / 8
        return [R * v ** phi + (N + G) * p * v, 0.3 * T, G * p * v, 0.0]

    each = [[split(schedule[i], r, r in held[i]) for i in range(steps)] for r in range(2)]
    for r in range(2):  # a move's step and the next hold its seconds and its settling
        for i in (2, 3, 14, 15):
            each[r][i] = [9.0, 0.3 * T, 0.1, 0.0]
    run = _run([9.0] * steps, events, throttled=[True] * steps)
    run["throttled_ranks"], run["step_split_each"] = held, each
    data = _file([run], layout={"tp": 2, "dp": 1, "straggler_rank": [1, 0], "share": 1.0, "fraction": 0.25},
                 pattern="12:0", chi=None)
    data["modes"]["healthy"]["step_split"] = [{"compute_s": R + (N + G) / 2, "comm_s": 0.3 * T,
                                               "gemm_s": G / 2}] * 2
    c = file_constants(data)
    assert c["replicated_s"] == pytest.approx(R, rel=1e-9)
    assert c["chi"] == pytest.approx(chi, rel=1e-9) and c["replicated_pace"] == pytest.approx(phi, rel=1e-9)
    run["step_split_each"] = [column[:-1] for column in each]  # not one split per step: no points
    assert file_constants(data)["split_from"] == "step_split"


def test_a_patterns_policy_meets_its_first_phase_without_the_probe():
    """The throttle's pattern starts with the first step, after the device probe read every rank at full speed:
    throttled from step 0 on, the simulated policy runs its warm-up step and its first reading on the even
    plan (χ·T each) before any move, where a probe that saw the slow rank would have moved before step 0."""
    flags = [True] * 12
    move = dict(_event(3, [28, 4], [8, 0]), bytes_moved=40_000_000, move_s=0.4)
    data = _file([_run([2.0] * 4 + [0.7] * 8, [move], throttled=flags)], pattern="1000:1")
    data["raw"]["off"] = [_run([4 * T] * 12, throttled=flags)]
    out = replay_file(data)["pattern_policy"]
    assert out["simulated"]["even_s"] == pytest.approx(4 * T)
    limit = 2 * 4.0 / (4.0 + 1.0) * T  # no plan steps faster at χ 4 (tp 2)
    assert out["simulated"]["policy_s"] * 12 >= 4 * (4 * T) + 8 * limit - 1e-9  # steps 0-3 at even
    assert out["simulated"]["moves"] >= 1


def test_a_skipping_ranks_split_is_no_point_of_the_fit():
    """Where idle ranks skip the step, an emptied rank runs no replicated work: its split is the device probe's
    seconds and its wait, whatever they are, and the fit leaves it out; where it runs the step, its own
    non-GEMM seconds are its replicated work and set the pace ``φ``."""
    data, R, _ = _split_file([_event(-1, [8, 8, 8, 0], [3, 3, 2, 0])])
    run = data["raw"]["reshard"][0]
    run["summary"]["step_split_by_rank"][3] = {"compute_s": 0.3 * R, "comm_s": 0.3 * T, "gemm_s": 0.0}
    fitted = file_constants(data)
    assert fitted["replicated_s"] == pytest.approx(R, rel=1e-9) and fitted["replicated_pace"] == 0.0
    run["summary"]["reshard"]["idle_skips"] = True
    skipped = file_constants(data)
    assert skipped["replicated_s"] == pytest.approx(R, rel=1e-9) and skipped["replicated_pace"] == 1.0
