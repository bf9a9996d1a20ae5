"""The time-to-loss benchmark's ``reshard`` mode: its command line and its re-plan reporting (pure)."""

from pathlib import Path

import pytest

from semimig.bench.time_to_loss import RunResult, summarize_mode
from semimig.errors import ConfigError
from scripts import load_script



def _script():
    return load_script("benchmarks/time_to_loss.py", "ttl_script")


def _run(step_s, replans=None):
    summary = {"balanced_share_by_rank": [0.5, 0.2]}
    if replans is not None:
        summary["reshard"] = {"replans": replans, "plan": "UnevenPlan(mlp=[28, 4] x 128, kv_groups=[3, 1])",
                              "bytes_moved": 1_000_000 * replans, "move_s": 0.25 * replans, "events": []}
    return {"step_s": step_s, "val_losses": [[2, 3.0], [4, 2.5]], "summary": summary}


def test_reshard_runs_report_replans_bytes_and_seconds():
    runs = [RunResult.from_json(_run([1.0, 1.2, 1.0, 1.0], replans=k), f"run {k}") for k in (1, 1, 2)]
    assert runs[0].reshard == {"replans": 1, "plan": "UnevenPlan(mlp=[28, 4] x 128, kv_groups=[3, 1])",
                               "bytes_moved": 1_000_000, "move_s": 0.25}
    out = summarize_mode(runs, target=2.6)
    assert out["reshard"]["replans"] == 1 and out["reshard"]["bytes_moved"] == 1_000_000
    assert out["reshard"]["move_s"] == 0.25 and len(out["reshard"]["each"]) == 3
    # the move's time is inside step_s: time to target counts it
    assert out["time_to_target_s"] == pytest.approx(4.2)
    plain = summarize_mode([RunResult.from_json(_run([1.0] * 4))], target=2.6)
    assert plain["reshard"] is None


def test_a_broken_reshard_summary_is_refused_by_name():
    data = _run([1.0] * 4, replans=1)
    del data["summary"]["reshard"]["bytes_moved"]
    with pytest.raises(ConfigError, match="reshard run 0"):
        RunResult.from_json(data, "reshard run 0")


def test_reshard_mode_runs_the_example_with_balance_reshard(tmp_path):
    script = _script()
    assert "reshard" in script.MODES and "reshard" in script.DEFAULT_MODES
    args = script.parse_args(["--straggler", "device", "--modes", "reshard", "--json", str(tmp_path / "r.json")])
    assert args.modes == ["healthy", "reshard"]
    cmd = script.command(args, "reshard", tmp_path / "out.json")
    assert cmd[cmd.index("--balance") + 1] == "reshard"
    assert cmd[cmd.index("--straggler") + 1] == "fixed:1:4:scope=device"
    # torchrun's log directory lies inside the run's temporary directory, removed with it
    assert Path(cmd[cmd.index("--log-dir") + 1]).parent == tmp_path
    assert script.replans({"reshard": {"replans": 1, "bytes_moved": 2.5e6, "move_s": 0.5}}) == \
        "; 1 re-plan(s), 2.5 MB in 0.50 s"
    assert script.replans({"reshard": None}) == ""


def test_the_reflex_flag_reaches_the_example_only_when_it_is_not_the_default(tmp_path):
    script = _script()
    out = tmp_path / "r.json"
    for value, expected in (("on", None), ("backward", "backward"), ("off", "off")):
        args = script.parse_args(["--straggler", "real", "--modes", "zero-pri", "--reflex", value, "--json", str(out)])
        cmd = script.command(args, "zero-pri", tmp_path / "out.json")
        assert (cmd[cmd.index("--reflex") + 1] if "--reflex" in cmd else None) == expected
    with pytest.raises(SystemExit):
        script.parse_args(["--straggler", "real", "--reflex", "sometimes", "--json", str(out)])


def test_a_paired_mode_runs_its_resizing_mode_with_the_examples_paired_flag(tmp_path):
    """``*-paired`` passes ``--paired``; the plain resizing modes ``--no-paired`` (pairing is the
    example's default, and a mode's name keeps the meaning of the earlier results); the others neither."""
    script = _script()
    args = script.parse_args(["--straggler", "gemm", "--modes", "zero-pri,semi,zero-pri-paired,semi-paired,reshard",
                              "--json", str(tmp_path / "r.json")])
    assert args.modes == ["healthy", "zero-pri", "semi", "zero-pri-paired", "semi-paired", "reshard"]
    for mode, balance, flag in (("zero-pri", "zero-pri", "--no-paired"), ("semi", "semi", "--no-paired"),
                                ("zero-pri-paired", "zero-pri", "--paired"), ("semi-paired", "semi", "--paired"),
                                ("healthy", "off", None), ("reshard", "reshard", None)):
        cmd = script.command(args, mode, tmp_path / "out.json")
        flags = [c for c in cmd if c in ("--paired", "--no-paired")]
        assert cmd[cmd.index("--balance") + 1] == balance and flags == ([flag] if flag else []), (mode, cmd)


def test_the_resize_block_reaches_the_resizing_modes_only(tmp_path):
    """``--resize-block G`` is the example's flag for the resizing modes; the exact modes, whose
    example refuses it, never get it, and no flag means the example's default (single columns)."""
    script = _script()
    out = tmp_path / "r.json"
    args = script.parse_args(["--straggler", "real", "--modes", "zero-pri-paired,semi,reshard", "--resize-block", "32",
                              "--json", str(out)])
    for mode, expected in (("zero-pri-paired", "32"), ("semi", "32"), ("reshard", None), ("healthy", None), ("off", None)):
        cmd = script.command(args, mode, tmp_path / "out.json")
        assert (cmd[cmd.index("--resize-block") + 1] if "--resize-block" in cmd else None) == expected, mode
    plain = script.parse_args(["--straggler", "real", "--modes", "semi", "--json", str(out)])
    assert "--resize-block" not in script.command(plain, "semi", tmp_path / "out.json")
    with pytest.raises(SystemExit):
        script.parse_args(["--straggler", "real", "--resize-block", "4", "--json", str(out)])


def test_the_gemm_straggler_is_the_papers_spec_without_a_scope(tmp_path):
    script = _script()
    out = tmp_path / "r.json"
    args = script.parse_args(["--straggler", "gemm", "--modes", "zero-pri", "--json", str(out)])
    cmd = script.command(args, "zero-pri", tmp_path / "out.json")
    assert cmd[cmd.index("--straggler") + 1] == "fixed:1:4"
    assert cmd[cmd.index("--fraction") + 1] == "1"  # nothing throttled
    args = script.parse_args(["--straggler", "gemm", "--pattern", "5:10", "--chi", "3", "--json", str(out)])
    cmd = script.command(args, "semi", tmp_path / "out.json")
    assert cmd[cmd.index("--straggler") + 1] == "burst:1:3:every=15:len=5"
    assert "--straggler" not in script.command(args, "healthy", tmp_path / "out.json")


def test_a_throttle_pattern_logs_its_switches_beside_the_run(tmp_path):
    script = _script()
    out = tmp_path / "r.json"
    args = script.parse_args(["--straggler", "real", "--pattern", "20:40", "--json", str(out)])
    run_out = tmp_path / "semi-0.json"
    cmd = script.command(args, "semi", run_out)
    assert cmd[cmd.index("--switch-log") + 1] == str(tmp_path / "semi-0-switches.json")
    assert cmd.index("--switch-log") < cmd.index("--")  # the throttle's flag, not the example's
    # the pattern starts with the example's first training step, not with its start-up
    started = cmd[cmd.index("--pattern-after") + 1]
    assert cmd.index("--pattern-after") < cmd.index("--") < cmd.index("--started-file")
    assert cmd[cmd.index("--started-file") + 1] == started == str(tmp_path / "semi-0-started")
    assert "--switch-log" not in script.command(args, "healthy", run_out)
    steady = script.parse_args(["--straggler", "real", "--json", str(out)])
    assert "--switch-log" not in script.command(steady, "semi", run_out)


def test_the_noisy_neighbour_throttles_nothing_and_its_chi_comes_from_off(tmp_path):
    script = _script()
    out = tmp_path / "r.json"
    args = script.parse_args(["--straggler", "neighbour", "--modes", "off,reshard", "--json", str(out)])
    for mode in ("healthy", "off", "reshard"):
        cmd = script.command(args, mode, tmp_path / "out.json")
        assert cmd[cmd.index("--fraction") + 1] == "1" and "--straggler" not in cmd, cmd
    modes = {"healthy": {"steady_step_s": 0.8}, "off": {"steady_step_s": 1.4}}
    assert script.straggler_chi(args, modes) == pytest.approx(1.75)
    assert script.straggler_chi(args, {"healthy": modes["healthy"]}) is None  # no off run: no chi to read
    with pytest.raises(SystemExit):
        script.parse_args(["--straggler", "neighbour", "--pattern", "20:40", "--json", str(out)])


def _spinners(core):
    """Pids of this user's processes running the neighbour's loop pinned to ``core`` alone."""
    import os

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"getppid" in cmdline and os.sched_getaffinity(int(pid)) == {core}:
                found.append(int(pid))
        except OSError:
            continue
    return found


def _started(core):
    import time

    deadline = time.monotonic() + 10
    while not _spinners(core) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _spinners(core)


def test_the_neighbour_spins_on_its_core_and_is_gone_on_every_way_out():
    script = _script()
    core = script.rank_core(1)
    with script.neighbour(core):
        assert len(_started(core)) == 1
    assert _spinners(core) == []
    with pytest.raises(RuntimeError, match="the run failed"):
        with script.neighbour(core):
            assert len(_started(core)) == 1
            raise RuntimeError("the run failed")
    assert _spinners(core) == []
    with script.neighbour(None):  # healthy runs: no neighbour
        assert _spinners(core) == []


def test_the_throttle_period_reaches_the_throttle_and_a_bad_one_is_refused(tmp_path, capsys):
    script = _script()
    out = tmp_path / "r.json"
    for flags, expected in (([], "4000"), (["--period-us", "1000"], "1000")):
        args = script.parse_args(["--straggler", "real", "--json", str(out), *flags])
        cmd = script.command(args, "reshard", tmp_path / "out.json")
        assert cmd[cmd.index("--period-us") + 1] == expected and cmd.index("--period-us") < cmd.index("--")
    for bad in ("999", "2000000"):
        with pytest.raises(SystemExit):
            script.parse_args(["--straggler", "real", "--period-us", bad, "--json", str(out)])
        assert "--period-us must be in [1000, 1000000]" in capsys.readouterr().err
