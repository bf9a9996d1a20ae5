"""benchmarks/gpu_check.py: its CPU run (what CI runs) writes the whole record and a table that fits
80 columns; a bad command line is refused by name before any work."""
import importlib
import json
import subprocess
import sys

import pytest
import torch

from example_ranks import quiet_env
from scripts import REPO

PROVENANCE = ("benchmark", "argv", "machine", "config", "command", "git_commit", "date", "versions", "bars")
PARTS = ("meter", "resize", "clock", "kernels", "stats", "graph", "allreduce", "launch")


def _script():
    """The script as a module (its dataclasses need it in ``sys.modules``: imported, not executed apart)."""
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    return importlib.import_module("gpu_check")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "check.json"
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--quick", "--json", str(out)],
                          cwd=REPO, env=quiet_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


def test_the_quick_cpu_run_records_every_part_with_its_provenance(quick_run):
    record, _ = quick_run
    assert all(key in record for key in PROVENANCE + PARTS), sorted(record)
    assert record["benchmark"] == "gpu_check" and record["machine"]["device"].startswith("cpu")
    assert record["command"].startswith("python benchmarks/gpu_check.py --device cpu --quick")
    assert record["bars"] == {"meter_overhead": 0.01, "event_vs_profiler": 0.05, "fused_vs_kprime": 1.10}
    assert [r["tp"] for r in record["meter"]] == [2, 8]
    for r in record["meter"]:
        assert set(r["step_ms"]) == {"plain", "semi"} and all(v > 0 for v in r["step_ms"].values())
        assert set(r["host_syncs_per_step"]) == {"plain", "semi"} and r["host_syncs_per_step"]["plain"] == 0
        assert isinstance(r["ok"], bool) and r["bar"] == 0.01
    assert [r["tp"] for r in record["resize"]] == [2, 8]
    for r in record["resize"]:  # γ = 0 and each pruned share, every step timed
        assert list(r["step_ms"]) == ["0.0", "0.5", "0.9"] and all(v > 0 for v in r["step_ms"].values())
        assert r["vs_dense"]["0.0"] == 1.0 and r["gemm_work_left"] == pytest.approx({"0.0": 1.0, "0.5": 0.5, "0.9": 0.1})
    for r in record["clock"]:  # every measured step resolved, none invented
        assert r["clock"] == "host" and r["resolved_steps"] == r["calls"] and r["event_ms"] > 0 and r["profiler_ms"] > 0
    kernels = record["kernels"]
    cases = {(r["shape"], r["gamma"], r["keep"], r["pass"]) for r in kernels["records"]}
    assert cases == {(s, g, k, p) for s in ("gate", "down") for g in (0.5, 0.9) for k in ("random", "block")
                     for p in ("fwd", "dgrad", "wgrad")}
    for r in kernels["records"]:
        assert set(r["ms"]) == {"torch_gather", "dense_kprime", "dense_full"} and r["fused_vs_kprime"] is None
    assert "CUDA only" in kernels["fused_skipped"] and kernels["first_calls"] == []
    assert [r["tp"] for r in record["stats"]] == [2, 8] and all(r["period_s"] > 0 for r in record["stats"])
    assert record["graph"] == [{"case": "timed layer", "ok": None, "reason": "CUDA graphs need a CUDA device"}]
    allreduce = record["allreduce"]
    assert allreduce["backend"] == "gloo" and allreduce["enqueue_ms"] > 0 and allreduce["event_ms"] > 0
    launched = record["launch"]  # a rank of semimig.launch ran its GEMM and all-reduce
    assert launched == {"backend": "gloo", "ranks": 1, "ok": True, "seconds": launched["seconds"], "reason": None}


def test_the_table_fits_80_columns(quick_run):
    _, stdout = quick_run
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("part "))
    table = lines[start:next(i for i, line in enumerate(lines) if line.startswith("wall time"))]
    assert len(table) > 10 and max(len(line) for line in table) <= 80, table
    assert any(line.startswith("meter     tp 2") for line in table) and any("skipped on CPU" in line for line in table)


def test_an_existing_json_is_refused_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "check.json"
    out.write_text("earlier")
    with pytest.raises(SystemExit) as exit_info:
        _script().main(["--device", "cpu", "--quick", "--json", str(out)])
    assert exit_info.value.code == 2 and f"--json {out} exists" in capsys.readouterr().err
    assert out.read_text() == "earlier"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")
def test_device_cuda_without_cuda_is_refused_in_one_line(capsys):
    assert _script().main(["--device", "cuda", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device cuda" in err and "CUDA is not available" in err


@pytest.mark.parametrize("flags, said", [(["--device", "tpu"], "--device must be cuda or cpu, got 'tpu'"),
                                          (["--device", "cpu", "--parts", "meter,nope"], "--parts must be a subset")])
def test_bad_values_are_refused_by_name(flags, said, capsys):
    assert _script().main(flags) == 2 and said in capsys.readouterr().err
