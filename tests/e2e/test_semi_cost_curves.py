"""Smoke test of ``benchmarks/semi_cost_curves.py``: the real pretest on 2 ranks, then Eq. 2."""
import importlib
import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("compute", ["emulated", "measured"])
def test_cost_curves_script_reports_curves_and_beta(compute, monkeypatch, capsys):
    """The script's ``main`` in this process (its ranks are real: ``run_on_ranks``); the script as a
    program is run once, by :func:`test_cost_curves_script_runs_as_a_program`."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # importable: the ranks unpickle its _body by name
    script = importlib.import_module("semi_cost_curves")
    monkeypatch.setattr(sys, "argv", ["semi_cost_curves.py", "--tp", "2", "--compute", compute, "--device-ms", "20",
                                      "--chi", "4"])
    script.main()
    stdout = capsys.readouterr().out
    out = json.loads(stdout[stdout.index("{"):])
    assert out["tp"] == 2 and out["compute"] == compute and set(out["at_chi"]) == {"4"}
    row = out["at_chi"]["4"]
    assert row["shed_columns"] == 1000 * (1 - 1 / 4)
    assert 0.0 <= row["eq2_beta"] <= 1.0
    assert row["phi1_s"] > 0 and row["phi2_s"] > 0  # real collectives, receiver GEMMs
    if compute == "emulated":
        assert row["omega1_plus_omega2_s"] == pytest.approx(0.0, abs=1e-9)  # the emulated device charges FLOPs only
    else:
        assert row["omega1_plus_omega2_s"] >= 0.0


def test_cost_curves_script_runs_as_a_program():
    """``python benchmarks/semi_cost_curves.py --help`` from the repository root: the entry point
    imports, parses and exits 0 (the curves themselves are checked in process above)."""
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "semi_cost_curves.py"), "--help"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0 and "--compute" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.parametrize("argv,message", [
    (["--tp", "1"], "--tp must be >= 2 (migration needs a receiver), got 1"),
    (["--tp", "3"], "divisible by tp=3"),
    (["--compute", "emulated", "--device-ms", "-1"], "device_ms must be"),
    (["--chi", "0.5"], "chis[1] must be"),
])
def test_cost_curves_script_refuses_bad_values_before_starting_ranks(argv, message, monkeypatch, capsys):
    """In process (the script's ``main`` under its own argv): a start of the ranks would fail the
    test, as ``run_on_ranks`` is replaced by one that raises."""
    script = runpy.run_path(str(REPO / "benchmarks" / "semi_cost_curves.py"), run_name="semi_cost_curves")

    def no_ranks(*args, **kwargs):
        raise AssertionError("ranks started before the bad value was refused")

    script["main"].__globals__["run_on_ranks"] = no_ranks
    monkeypatch.setattr(sys, "argv", ["semi_cost_curves.py", *argv])
    with pytest.raises(SystemExit) as exit_:
        script["main"]()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err, err
