"""Nothing a user already had is lost: results and specs survive careless commands.

Each test runs the real command (``semimig.cli.main``) or the one writer (``semimig._io``) on real
files in a temporary directory and checks the outcome class: refused before any work with a
message naming the value (exit 2, the file untouched), or accepted and written correctly.
"""
import json
import os
import stat
import threading
from pathlib import Path

import pytest

FAST = ["--compute", "emulated", "--quick", "--epochs", "1", "--iters-per-epoch", "8", "--no-plots"]
SPEC = [{"name": "a", "max_batch_size": 4, "peak_speed": 10.0}, {"name": "b", "max_batch_size": 4, "peak_speed": 5.0}]


def _saved_run(path: Path, argv: list, cases: list) -> None:
    """A results file as ``semimig bench argv`` leaves it after training ``cases`` (records made here)."""
    from semimig.bench.cli import config_from_args
    from semimig.bench.results import ResultsFile
    from semimig.cli import build_parser

    cfg = config_from_args(build_parser().parse_args(["bench", *argv]))
    results = ResultsFile(path, cfg.settings(), machine={"platform": "test"})  # what the bench saves
    results.write(complete=False, cases_total=max(1, len(cases)))
    for mode, chi, seed in cases:
        results.add({"mode": mode, "chi": chi, "seed": seed, "lambda": None, "iter_time_s": 0.1,
                     "epoch_time_s": 1.0, "accuracy": None}, cases_total=len(cases))


def _no_hang(fn, *args, seconds: float = 20.0):
    """``fn(*args)`` in a thread; fails (instead of blocking the suite) if it does not return in time."""
    box: dict = {}

    def call():
        try:
            box["value"] = fn(*args)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn.__name__}{args} blocked for {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


# ---------------------------------------------------------------------------- semimig bench --json
def test_bench_on_a_file_of_other_chis_is_refused_before_training_and_keeps_it(tmp_path, capsys):
    """bench --chi 1 then --chi 4 on one --json must not replace the first run's records: refused before training."""
    from semimig.cli import main

    out = tmp_path / "r.json"
    first = [*FAST, "--modes", "baseline", "--chi", "1", "--json", str(out)]
    _saved_run(out, first, [("baseline", 1.0, 0)])
    before = out.read_bytes()
    second = [*FAST, "--modes", "baseline", "--chi", "4", "--json", str(out)]
    assert main(["bench", *second]) == 2  # not a dry run: refused before any rank starts
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume" in err and "--overwrite" in err and str(out) in err
    assert out.read_bytes() == before


def test_bench_resume_merges_and_only_overwrite_replaces(tmp_path, capsys):
    from semimig.cli import main

    out = tmp_path / "r.json"
    first = [*FAST, "--modes", "baseline", "--chi", "1", "--json", str(out)]
    _saved_run(out, first, [("baseline", 1.0, 0)])
    second = [*FAST, "--modes", "baseline", "--chi", "4", "--json", str(out)]
    assert main(["bench", *second, "--resume", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "1 of 2 cases to train" in printed and "would train baseline chi=4 seed=0" in printed
    assert main(["bench", *second, "--overwrite", "--dry-run"]) == 0
    assert "1 of 1 cases to train" in capsys.readouterr().out


def test_bench_same_command_twice_is_refused_but_an_empty_file_is_reused(tmp_path, capsys):
    from semimig.cli import main

    out = tmp_path / "r.json"
    argv = [*FAST, "--modes", "baseline", "--chi", "1", "--json", str(out)]
    _saved_run(out, argv, [("baseline", 1.0, 0)])
    assert main(["bench", *argv, "--dry-run"]) == 2
    assert "already holds 1 finished case" in capsys.readouterr().err
    _saved_run(out, argv, [])  # a run stopped before its first case: nothing there to lose
    assert main(["bench", *argv, "--dry-run"]) == 0


@pytest.mark.parametrize("kind", ["fifo", "dir"])
def test_bench_json_that_is_not_a_regular_file_is_refused_without_hanging(tmp_path, capsys, kind):
    from semimig.cli import main

    out = tmp_path / "r.json"
    os.mkfifo(out) if kind == "fifo" else out.mkdir()
    assert _no_hang(main, ["bench", *FAST, "--json", str(out), "--dry-run"]) == 2
    assert f"--json {out} is {'a FIFO' if kind == 'fifo' else 'a directory'}" in capsys.readouterr().err


def test_report_refuses_to_write_over_a_saved_run_it_reads(tmp_path, capsys):
    from semimig.cli import main

    saved = tmp_path / "r.json"
    _saved_run(saved, [*FAST, "--modes", "baseline", "--chi", "1", "--json", str(saved)], [("baseline", 1.0, 0)])
    before = saved.read_bytes()
    alias = tmp_path / "sub" / ".." / "r.json"
    (tmp_path / "sub").mkdir()
    assert main(["report", str(saved), "--json", str(alias), "--no-plots"]) == 2
    assert "would destroy it" in capsys.readouterr().err
    assert saved.read_bytes() == before


def test_report_never_replaces_a_bench_run_it_does_not_read(tmp_path, capsys):
    from semimig.cli import main

    argv = [*FAST, "--modes", "baseline", "--chi", "1"]
    one, other = tmp_path / "one.json", tmp_path / "other.json"
    _saved_run(one, [*argv, "--json", str(one)], [("baseline", 1.0, 0)])
    _saved_run(other, [*argv, "--json", str(other)], [("baseline", 1.0, 1)])
    before = other.read_bytes()
    assert main(["report", str(one), "--json", str(other), "--no-plots"]) == 2
    assert f"--json {other} holds a semimig bench run" in capsys.readouterr().err
    assert other.read_bytes() == before
    report = tmp_path / "report.json"
    assert main(["report", str(one), "--json", str(report), "--no-plots"]) == 0
    assert main(["report", str(one), str(other), "--json", str(report), "--no-plots"]) == 2  # kept
    assert main(["report", str(one), str(other), "--json", str(report), "--no-plots", "--overwrite"]) == 0
    assert len(json.loads(report.read_text())["records"]) == 2


def test_report_input_fifo_is_refused_without_hanging(tmp_path, capsys):
    from semimig.cli import main

    fifo = tmp_path / "in.json"
    os.mkfifo(fifo)
    assert _no_hang(main, ["report", str(fifo), "--json", str(tmp_path / "o.json"), "--no-plots"]) == 2
    assert f"saved run {fifo} is a FIFO" in capsys.readouterr().err


# ---------------------------------------------------------------------------- semimig plan --json
def _spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(SPEC))
    return path


@pytest.mark.parametrize("spelling", ["same", "dotdot", "symlink"])
def test_plan_refuses_to_write_over_its_own_spec(tmp_path, capsys, spelling):
    """``semimig plan SPEC --json SPEC`` (however spelled) must not overwrite the spec with the plan."""
    from semimig.cli import main

    spec = _spec(tmp_path)
    before = spec.read_bytes()
    (tmp_path / "d").mkdir()
    out = {"same": spec, "dotdot": tmp_path / "d" / ".." / "spec.json", "symlink": tmp_path / "link.json"}[spelling]
    if spelling == "symlink":
        out.symlink_to(spec)
    assert main(["plan", str(spec), "--global-batch-size", "4", "--json", str(out)]) == 2
    captured = capsys.readouterr()
    assert "would destroy it" in captured.err and captured.out == ""  # refused before any planning
    assert spec.read_bytes() == before


def test_plan_json_missing_directory_fifo_and_spec_fifo(tmp_path, capsys):
    from semimig.cli import main

    spec = _spec(tmp_path)
    missing = tmp_path / "no" / "plan.json"
    assert main(["plan", str(spec), "--global-batch-size", "4", "--json", str(missing)]) == 2
    captured = capsys.readouterr()
    assert f"directory {missing.parent} does not exist" in captured.err and captured.out == ""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert _no_hang(main, ["plan", str(spec), "--global-batch-size", "4", "--json", str(fifo)]) == 2
    assert f"--json {fifo} is a FIFO" in capsys.readouterr().err
    assert _no_hang(main, ["plan", str(fifo), "--global-batch-size", "4"]) == 2
    assert f"spec {fifo} is a FIFO" in capsys.readouterr().err


def test_plan_json_written_atomically_with_the_mode_kept(tmp_path, capsys):
    from semimig.cli import main

    spec, out = _spec(tmp_path), tmp_path / "plan.json"
    out.write_text("old")
    out.chmod(0o640)
    assert main(["plan", str(spec), "--global-batch-size", "4", "--json", str(out)]) == 2  # needs --overwrite
    assert out.read_text() == "old"
    assert main(["plan", str(spec), "--global-batch-size", "4", "--json", str(out), "--overwrite"]) == 0
    assert json.loads(out.read_text())["global_batch_size"] == 4
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "spec.json"]  # no temporary left


# ---------------------------------------------------------------------------- the one writer
def test_new_file_mode_follows_the_umask(tmp_path):
    from semimig import _io

    old = os.umask(0o027)
    try:
        _io.write_json(tmp_path / "a.json", {"x": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o640  # 0o666 & ~0o027, not mkstemp's 0o600


def test_a_symlink_keeps_pointing_at_the_rewritten_file(tmp_path):
    from semimig import _io

    real, link = tmp_path / "real.json", tmp_path / "link.json"
    real.write_text("{}")
    link.symlink_to(real)
    _io.write_json(link, {"x": 2})
    assert link.is_symlink() and json.loads(real.read_text()) == {"x": 2}


def test_write_atomically_never_replaces_a_fifo_or_directory(tmp_path):
    from semimig import _io

    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="FIFO"):
        _no_hang(_io.write_atomically, fifo, "x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    with pytest.raises(OSError, match="directory"):
        _io.write_atomically(tmp_path, "x")


def test_check_output_file_refusals_name_the_flag_and_path(tmp_path):
    from semimig import _io
    from semimig.errors import ConfigError

    blocker = tmp_path / "file"
    blocker.write_text("")
    cases = {tmp_path: "is a directory", blocker / "x.json": "cannot create", tmp_path / "a" / "b.json": "does not exist"}
    for path, why in cases.items():
        with pytest.raises(ConfigError, match=why) as info:
            _io.check_output_file(path, "--out")
        assert "--out" in str(info.value) and str(path) in str(info.value)
    assert not (tmp_path / "a").exists()  # refusing creates nothing
    _io.check_output_file(tmp_path / "a" / "b.json", "--out", make_parents=True)
    assert (tmp_path / "a").is_dir()


def test_benchmark_scripts_check_json_before_work(tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        from bench_output import output_problem, write_result
    finally:
        sys.path.pop(0)
    assert "is a directory" in output_problem(tmp_path)
    assert output_problem(tmp_path / "r.json") is None
    write_result(tmp_path / "r.json", "b", [], {"k": 1}, records=[1])
    assert json.loads((tmp_path / "r.json").read_text())["records"] == [1]
