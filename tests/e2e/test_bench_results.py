"""Results that survive: every finished case is in the file (written atomically), an interrupted run
says how to resume, ``--resume`` trains only the missing cases, another run's file is not
overwritten without ``--overwrite``."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dist_harness import sigint_as_from_a_terminal

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--compute", "emulated", "--quick", "--epochs", "1", "--iters-per-epoch", "8", "--no-plots"]


def _saved_run(path: Path, argv: list, cases: list) -> None:
    """A results file as ``semimig bench argv`` leaves it after training ``cases`` (hand-made records)."""
    from semimig.bench.cli import config_from_args
    from semimig.bench.results import ResultsFile
    from semimig.cli import build_parser

    cfg = config_from_args(build_parser().parse_args(["bench", *argv]))
    results = ResultsFile(path, cfg.settings(), machine={"platform": "test"})  # what the bench saves
    for mode, chi, seed in cases:
        results.add({"mode": mode, "chi": chi, "seed": seed, "lambda": None, "iter_time_s": 0.1,
                     "epoch_time_s": 1.0, "accuracy": None}, cases_total=len(cases))


def test_resume_trains_only_the_missing_cases_and_other_settings_need_overwrite(tmp_path, capsys):
    from semimig.cli import main

    out = tmp_path / "r.json"
    argv = [*FAST, "--modes", "baseline,semi", "--chi", "1,4", "--json", str(out)]
    _saved_run(out, argv, [("baseline", 1.0, 0)])
    assert main(["bench", *argv, "--resume", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "3 of 4 cases to train" in printed and "would train baseline chi=1" not in printed
    assert main(["bench", *argv, "--dry-run"]) == 2  # same settings, no --resume: its cases would be lost
    err = capsys.readouterr().err
    assert f"--json {out} already holds 1 finished case of this experiment" in err
    assert "--resume" in err and "--overwrite" in err

    other = [a if a != "8" else "9" for a in argv]  # --iters-per-epoch 9
    assert main(["bench", *other, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"--json {out} holds a run with other settings ('iters_per_epoch' is 8 in the file but 9 in this run)" in err
    assert "pass --overwrite" in err
    assert main(["bench", *other, "--dry-run", "--resume"]) == 2
    capsys.readouterr()
    assert main(["bench", *other, "--dry-run", "--overwrite"]) == 0
    assert main(["bench", *other, "--dry-run", "--overwrite", "--resume"]) == 2
    assert "give one of them" in capsys.readouterr().err
    assert json.loads(out.read_text())["records"][0]["mode"] == "baseline"  # dry runs write nothing

    out.write_text('{"not": "a bench file"}')
    assert main(["bench", *argv, "--dry-run"]) == 2
    assert "exists and is not a semimig bench result" in capsys.readouterr().err


def test_a_different_timeout_is_the_same_experiment(tmp_path, capsys):
    from semimig.cli import main

    out = tmp_path / "r.json"
    argv = [*FAST, "--modes", "baseline", "--chi", "1", "--json", str(out)]
    _saved_run(out, argv, [("baseline", 1.0, 0)])
    assert main(["bench", *argv, "--timeout-s", "600", "--resume", "--dry-run"]) == 0
    assert "0 of 1 cases to train" in capsys.readouterr().out


def test_the_file_is_replaced_atomically(tmp_path, monkeypatch):
    """A failure while writing leaves the previous complete file and no temporary behind."""
    from semimig import _io

    path = tmp_path / "r.json"
    _io.write_json(path, {"records": [1]})

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(_io.os, "fsync", broken_fsync)  # fails after the bytes went to the temporary
    with pytest.raises(OSError, match="disk full"):
        _io.write_json(path, {"records": [1, 2]})
    assert json.loads(path.read_text()) == {"records": [1]}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


@pytest.mark.slow
def test_an_interrupted_run_keeps_its_finished_case_and_resume_completes_it(tmp_path):
    from semimig.cli import main

    out = tmp_path / "r.json"
    argv = ["bench", *FAST, "--modes", "baseline,zero-pri,semi", "--chi", "1", "--json", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "semimig", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"},
                            preexec_fn=sigint_as_from_a_terminal)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and len(json.loads(out.read_text())["records"]) >= 1:
            break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail(f"no case finished within 240 s: {proc.communicate()}")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted (SIGINT)" in err and "1 of 3 cases of this run finished" in err
    assert f"every finished case is in {out}" in err
    assert "resume with: semimig bench" in err and err.rstrip().endswith("--resume")
    saved = json.loads(out.read_text())
    assert [r["mode"] for r in saved["records"]] == ["baseline"]
    assert saved["status"] == {"complete": False, "cases_done": 1, "cases_total": 3}

    assert main([*argv, "--resume"]) == 0
    final = json.loads(out.read_text())
    assert [r["mode"] for r in final["records"]] == ["baseline", "zero-pri", "semi"]
    assert final["records"][0] == saved["records"][0]  # kept, not retrained
    assert final["status"]["complete"] is True


@pytest.mark.parametrize("after_rename", [True, False])
def test_a_stop_while_a_case_is_saved_counts_it_exactly_when_the_file_holds_it(tmp_path, monkeypatch, after_rename):
    """SIGINT lands while the second case is written: after the file's rename the case is in the file, so the
    stop counts two finished cases and the resume hint stands on them; before it the file holds one and the
    stop says one.  The message and the file never disagree."""
    from semimig import _io
    from semimig.bench import results as results_module
    from semimig.bench.runner import Outputs, Stopped, _train_all

    out = tmp_path / "r.json"
    results = results_module.ResultsFile(out, {"modes": ["baseline", "semi"]}, machine={"platform": "test"})
    real, calls = _io.write_json, []

    def interrupted(path, data):
        calls.append(len(data["records"]))
        if len(calls) == 2 and after_rename:
            real(path, data)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(path, data)

    monkeypatch.setattr(results_module, "write_json", interrupted)
    record = {"mode": "baseline", "chi": 1.0, "seed": 0, "lambda": None, "iter_time_s": 0.1, "epoch_time_s": 1.0,
              "accuracy": None}
    with pytest.raises(Stopped) as stop:
        _train_all(results, [("baseline", 1.0, 0, None), ("semi", 1.0, 0, None)], lambda case: dict(record, mode=case[0]),
                   total=2, out=Outputs(json=out, plots=None), launched=True)
    on_disk = len(json.loads(out.read_text())["records"])
    assert on_disk == (2 if after_rename else 1) == len(results.records)
    assert f"{on_disk} of 2 cases of this run finished" in str(stop.value) and stop.value.code == 130


def test_a_stop_before_the_first_write_over_another_runs_file_counts_nothing(tmp_path, monkeypatch):
    """``--overwrite`` of a file holding one case of another run: the first write of this run is interrupted
    before its rename, so the file still holds the other run's case, which this run must not count as its own."""
    from semimig.bench import results as results_module

    out = tmp_path / "r.json"
    record = {"mode": "baseline", "chi": 1.0, "seed": 0, "lambda": None, "iter_time_s": 0.1, "epoch_time_s": 1.0,
              "accuracy": None}
    old = results_module.ResultsFile(out, {"modes": ["baseline"]}, machine={"platform": "test"})
    old.add(dict(record, iter_time_s=0.2), cases_total=1)

    def interrupted(path, data):
        raise KeyboardInterrupt

    monkeypatch.setattr(results_module, "write_json", interrupted)
    results = results_module.ResultsFile(out, {"modes": ["baseline"]}, machine={"platform": "test"})
    with pytest.raises(KeyboardInterrupt):
        results.add(record, cases_total=1)
    assert results.records == [] and json.loads(out.read_text())["records"][0]["iter_time_s"] == 0.2
