"""Smoke test of ``benchmarks/migration_bench.py``: its core runs at tiny sizes and writes sane records.

The communication counts are checked against the payload each policy must move, worked out
from DESIGN §2 by hand (not from the benchmark): per MLP block and migrating rank, with ``M``
tokens, ``R = e - nu`` receivers, column layer ``N = 4H/e, L = round(gamma H)`` and row layer
``N = H, L = round(gamma 4H/e)`` (fp32, 4 bytes)::

    broadcast-reduce  broadcast  col: N L (W_k) + M N (dY_k)   row: M L (X_k) + N L (W_k)
                      reduce     col: M N (Y)   + N L (dW_k)   row: M L (dX_k) + N L (dW_k)
    scatter-gather    send       col: N L + R M N + R M N + M L + N L
                                 row: M L + N L + R M N + M L + N L

plus, for every case, the two all-reduces of ``[M, H]`` per block that 1D TP always issues.
The bytes through the migrating rank's own link, counted at the calls, must equal what
``migration_report.straggler_traffic`` works out from the same formulas.
"""
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "migration_bench.py"
TINY = {"hidden": 16, "tokens": 8, "blocks": 2}


@pytest.fixture
def bench(monkeypatch):
    """The benchmark as module ``migration_bench``; the rank processes import it by that name."""
    monkeypatch.syspath_prepend(str(BENCH.parent))
    monkeypatch.delitem(sys.modules, "migration_bench", raising=False)
    monkeypatch.delitem(sys.modules, "migration_report", raising=False)
    return importlib.import_module("migration_bench")


def _expected_bytes(policy, nu, gamma, hidden, tokens, blocks, world=4):
    m, h, k_row = tokens, hidden, 4 * hidden // world
    col_n, col_l, row_n, row_l = k_row, round(gamma * h), h, round(gamma * k_row)
    expected = {"all_reduce": 2 * blocks * m * h}
    if col_l == 0:
        return {op: 4 * v for op, v in expected.items()}
    per = blocks * nu
    if policy == "broadcast-reduce":
        expected["broadcast"] = per * (col_n * col_l + m * col_n + m * row_l + row_n * row_l)
        expected["reduce"] = per * (m * col_n + col_n * col_l + m * row_l + row_n * row_l)
    else:
        r = world - nu
        col = col_n * col_l + 2 * r * m * col_n + m * col_l + col_n * col_l
        row = m * row_l + row_n * row_l + r * m * row_n + m * row_l + row_n * row_l
        expected["send"] = per * (col + row)
    return {op: 4 * v for op, v in expected.items()}


def test_tiny_run_writes_sane_records(bench, tmp_path, capsys):
    out = tmp_path / "migration.json"
    argv = ["--json", str(out), "--compute", "emulated", "--hidden", str(TINY["hidden"]), "--tokens",
            str(TINY["tokens"]), "--blocks", str(TINY["blocks"]), "--rounds", "2", "--iters", "1", "--warmup", "0",
            "--device-ms", "1", "--movement-iters", "1", "--link-iters", "1", "--link", "10,12.5", "--timeout", "120"]
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    records = result["records"]
    report = sys.modules["migration_report"]

    cases = {(r["policy"], r["nu"], r["gamma"]) for r in records}
    assert cases == {(p, nu, g) for p in bench.POLICIES for nu in (1, 2) for g in bench.GAMMAS}
    assert len(records) == len(cases)
    for r in records:
        assert {"policy", "nu", "gamma", "iter_time_s", "iterations", "comm", "comm_bytes", "l_mig"} <= r.keys()
        assert 0 < r["iter_time_p25_s"] <= r["iter_time_s"] <= r["iter_time_p75_s"] < 60
        assert r["iterations"] == 2 and len(r["busy_s_per_rank"]) == 4 and len(r["round_medians_s"]) == 2
        assert r["l_mig"] == {"column": round(r["gamma"] * 16), "row": round(r["gamma"] * 16)}
        assert r["migrating_ranks"] == (list(range(1, r["nu"] + 1)) if r["gamma"] > 0 else [])
        got = {op: v["bytes"] for op, v in r["comm"].items() if v["bytes"] and op != "recv"}
        assert got == _expected_bytes(r["policy"], r["nu"], r["gamma"], **TINY), r
        assert r["comm"]["recv"]["bytes"] == r["comm"]["send"]["bytes"]  # every send was received
        link = report.straggler_traffic(r["policy"], r["nu"], r["gamma"], world=4, **TINY,
                                        algorithm=result["config"]["br_algorithm"])
        counted = r["straggler_link"]
        assert (counted["out_bytes"], counted["in_bytes"], counted["calls"]) == \
            (link["out_bytes"], link["in_bytes"], link["calls"]), (r["policy"], r["nu"], r["gamma"])

    by = {(r["policy"], r["nu"], r["gamma"]): r["iter_time_s"] for r in records}
    for entry in result["ratios"]:
        key = (entry["nu"], entry["gamma"])
        assert entry["sg_over_br"] == pytest.approx(by[("scatter-gather",) + key] / by[("broadcast-reduce",) + key])
        assert entry["rounds"] == 2 and entry["rounds_min"] <= entry["rounds_max"]
    paper = {(e["nu"], e["gamma"]): e.get("paper_sg_over_br") for e in result["ratios"]}
    assert paper[1, 1.0] == pytest.approx(963 / 500) and paper[2, 1.0] is None  # the paper has nu = 1, 4
    t = result["target"]
    assert t["checked_gammas"] == [0.25, 0.5, 0.75, 1.0]
    assert t["holds"] == all(e["sg_over_br"] > 1 for e in result["ratios"] if e["nu"] == 1 and e["gamma"] > 0)

    movements = result["movements"]
    assert len(movements) == 2 * len(bench.MOVEMENTS)
    assert all(m["time_s"] > 0 for m in movements)
    assert set(result["link_fits"]) == {"ping-pong", "broadcast"}
    assert len(result["alpha_beta_estimates"]) == 2  # measured constants and the named link
    for rows in result["alpha_beta_estimates"].values():
        assert [row["gamma"] for row in rows] == list(bench.GAMMAS) and rows[0]["world"] == 8
    printed = capsys.readouterr().out
    for label in ("EMULATED device", "broadcast-reduce(1)", "scatter-gather(2)", "SG/BR(1)", "paper SG/BR(1)",
                  "target", "merge_sum", "straggler's link", "alpha-beta estimate", "not a NIC-bound cluster"):
        assert label in printed


def test_measured_run_uses_two_ranks_and_real_gemms(bench, tmp_path, capsys):
    out = tmp_path / "measured.json"
    argv = ["--json", str(out), "--hidden", "16", "--tokens", "8", "--blocks", "1", "--rounds", "1", "--iters", "1",
            "--warmup", "0", "--movement-iters", "0", "--link-iters", "0", "--timeout", "120"]
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["config"]["compute"] == "measured" and result["config"]["world"] == 2
    assert result["config"]["device_ms"] == 0 and result["config"]["nus"] == [1]
    assert all(busy == 0.0 for r in result["records"] for busy in r["busy_s_per_rank"])  # no emulated meter
    assert "measured: real GEMMs" in capsys.readouterr().out
    with pytest.raises(ValueError, match="compute 'measured' runs real GEMMs only"):
        bench.BenchConfig(device_ms=40.0)


def test_straggler_traffic_by_hand(bench):
    """H = 16, 8 tokens, e = 4, gamma = 1, one block: col N = 16, L = 16; row N = 16, L = 16; R = 3."""
    report = sys.modules["migration_report"]

    br = report.straggler_traffic("broadcast-reduce", 1, 1.0, hidden=16, tokens=8, blocks=1, world=4)
    assert br == {"calls": 7, "tree_calls": 7, "out_bytes": 4 * (16 * 16 + 8 * 16 + 8 * 16 + 16 * 16),
                  "in_bytes": 4 * (8 * 16 + 16 * 16 + 24 * 16)}
    sg = report.straggler_traffic("scatter-gather", 1, 1.0, hidden=16, tokens=8, blocks=1, world=4)
    assert sg["calls"] == 27 and sg["tree_calls"] == 0
    assert sg["out_bytes"] == 4 * (16 * 16 + 3 * 8 * 16 + 8 * 16 + 16 * 16)
    assert sg["in_bytes"] == 4 * (3 * 8 * 16 + 8 * 16 + 16 * 16 + 3 * 8 * 16 + 24 * 16)
    fit = report.fit_link([1000, 2000, 4000], [1e-5 + 1e-9 * b for b in (1000, 2000, 4000)])
    assert fit["alpha_s"] == pytest.approx(1e-5) and fit["beta_s_per_byte"] == pytest.approx(1e-9)
    rows = report.alpha_beta_estimate(fit, hidden=16, tokens=8, blocks=1, world=4, gammas=(0.0, 1.0))
    assert rows[0]["broadcast-reduce"]["time_s"] == 0 and rows[0]["sg_over_br"] is None
    expected_br = 7 * 2 * 1e-5 + 1e-9 * (br["out_bytes"] + br["in_bytes"])  # tree depth ceil(log2 4) = 2
    assert rows[1]["broadcast-reduce"]["time_s"] == pytest.approx(expected_br)
    assert rows[1]["scatter-gather"]["time_s"] == pytest.approx(27 * 1e-5 + 1e-9 * (sg["out_bytes"] + sg["in_bytes"]))


def test_config_rejects_bad_values(bench):
    with pytest.raises(ValueError, match=r"nus must be .* got \(4,\)"):
        bench.BenchConfig(compute="emulated", nus=(4,))
    with pytest.raises(ValueError, match="compute must be one of"):
        bench.BenchConfig(compute="fast")
    with pytest.raises(ValueError, match=r"gammas must be .* got \(1.5,\)"):
        bench.BenchConfig(gammas=(1.5,))
    with pytest.raises(ValueError, match="hidden must be an int >= 1, got 0"):
        bench.BenchConfig(hidden=0)
    with pytest.raises(ValueError, match="4 \\* hidden = 12 is not divisible by world = 8"):
        bench.BenchConfig(hidden=3, world=8, nus=(1,))


def test_main_refuses_bad_sizes_before_starting_ranks(bench, tmp_path, capsys):
    assert bench.main(["--json", str(tmp_path / "m.json"), "--hidden", "0"]) == 2
    assert "hidden must be an int >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


def test_help_runs_from_the_repo_root_without_torch():
    done = subprocess.run([sys.executable, str(BENCH.relative_to(REPO)), "--help"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--quick" in done.stdout and "--json" in done.stdout
    done = subprocess.run([sys.executable, "-c", f"import runpy, sys; sys.path.insert(0, {str(BENCH.parent)!r}); "
                           f"runpy.run_path({str(BENCH)!r}); "
                           "assert 'torch' not in sys.modules and 'kernels' not in sys.modules"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_report_reads_saved_records_without_torch(bench):
    """The report is a pure function of records: hand-made times give hand-computed ratios and verdicts."""
    report = sys.modules["migration_report"]
    times = {("broadcast-reduce", 0.0): 0.100, ("scatter-gather", 0.0): 0.100,
             ("broadcast-reduce", 0.5): 0.120, ("scatter-gather", 0.5): 0.150,
             ("broadcast-reduce", 1.0): 0.200, ("scatter-gather", 1.0): 0.180}
    records = [{"policy": p, "nu": 1, "gamma": g, "iter_time_s": t, "iterations": 3} for (p, g), t in times.items()]
    got = {e["gamma"]: e["sg_over_br"] for e in report.ratios(records)}
    assert got == pytest.approx({0.0: 1.0, 0.5: 1.25, 1.0: 0.9})
    t = report.target(records)
    assert t["checked_gammas"] == [0.5, 1.0] and t["failing_gammas"] == [1.0] and not t["holds"]
    assert t["sg_over_br_at_gamma_1"] == pytest.approx(0.9)
    assert report.paper_ratio(4, 0.25) == pytest.approx(779 / 737) and report.paper_ratio(2, 0.25) is None
    cfg = bench.BenchConfig(compute="emulated", nus=(1,), gammas=(0.0, 0.5, 1.0))
    table = report.format_table(records, cfg)
    assert "does NOT hold at gamma [1.0]" in table and "0.90x" in table and "1.25x" in table
