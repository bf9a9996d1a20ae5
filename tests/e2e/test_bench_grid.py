"""``semimig bench --allocation even|poplar``: the 2-D benchmark (tp x dp, Poplar across the DP groups,
SEMI in every TP group) through the same runner, results file and report as the 1-D one."""
import json

import pytest


def _dry(tmp_path, *argv):
    from test_fuzz_cli import run_cli

    return run_cli(["bench", "--allocation", *argv, "--dry-run", "--no-plots", "--json", str(tmp_path / "r.json")])


def test_allocation_picks_its_modes_dp_and_device_time(tmp_path):
    code, out, err = _dry(tmp_path, "poplar", "--compute", "emulated")
    assert code == 0, err
    assert "tp=2 x dp=2" in out and "allocation poplar" in out and "chi per group 1,4 / 2,2" in out
    assert "modes baseline, poplar, semi, poplar+semi x 2 seeds" in out
    assert "emulated device 160 ms/iter" in out  # 4 ranks: at least 150 ms so device time dominates the host work
    code, out, _ = _dry(tmp_path, "even", "--compute", "emulated", "--quick")
    assert code == 0 and "modes baseline, semi x 1 seeds" in out and "time only" in out


@pytest.mark.parametrize("argv,message", [
    (["even", "--modes", "poplar"], "--modes: mode 'poplar' does not go with --allocation even"),
    (["poplar", "--chi", "4"], "--chi applies to the 1-D straggler sweep, not to --allocation"),
    (["poplar", "--pattern", "multi"], "--pattern applies to the 1-D straggler sweep"),
    (["poplar", "--group-chis", "1,4/2"], "--group-chis: group_chis needs dp=2 rows of tp=2 slowdowns"),
    (["poplar", "--group-chis", "1,400/1,1"], "--group-chis: group_chis must be a finite number >= 1 and <= 100"),
    (["poplar", "--zero-stage", "3"], "--zero-stage: zero_stage must be one of (0, 1, 2), got 3"),
    (["poplar", "--device", "cuda"], "--allocation runs on CPU ranks only"),
    (["poplar", "--compute", "emulated", "--device-ms", "5000", "--timeout-s", "10"],
     "timeout_s=10 is shorter than the slowest rank's emulated GEMM time per iteration (20 s)"),
    (["poplar", "--modes", "zero-pri"], "--modes: mode 'zero-pri' does not go with --allocation poplar"),
])
def test_the_2d_flags_are_refused_by_name(tmp_path, argv, message):
    code, _, err = _dry(tmp_path, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_2d_only_flags_need_allocation(tmp_path):
    from test_fuzz_cli import run_cli

    code, _, err = run_cli(["bench", "--group-chis", "1,4/2,2", "--dry-run", "--json", str(tmp_path / "r.json")])
    assert code == 2 and "--group-chis applies to the 2-D benchmark: add --allocation even|poplar" in err


def test_a_2d_results_file_from_before_the_one_run_config_reads_as_today(tmp_path):
    """docs/results/bench_2d.json was written with the 2-D mode's own config, its compute mode under
    ``timing``: ``report`` and ``--resume`` read it as ``compute``, the same experiment as today's
    BenchConfig of its command line (``--tp 2 --dp 2 --allocation poplar``, 160 ms device)."""
    import shutil
    from pathlib import Path

    from semimig.bench import report
    from semimig.bench.config import BenchConfig
    from semimig.bench.results import ResultsFile, as_json, settings_difference
    from semimig.errors import ConfigError

    old = Path(__file__).resolve().parents[2] / "docs" / "results" / "bench_2d.json"
    data = report.load_saved(old)
    assert data["config"]["compute"] == "emulated" and "timing" not in data["config"]
    cfg = BenchConfig(allocation="poplar", seeds=(0, 1), epochs=4, iters_per_epoch=25, device_ms=160.0)
    assert settings_difference(as_json(cfg.settings()), data["config"]) is None
    records, config, _ = report.merge_saved([("old", data)])
    assert config["compute"] == "emulated" and len(records) == len(data["records"])
    shutil.copy(old, tmp_path / "r.json")
    kept = ResultsFile.open(tmp_path / "r.json", cfg.settings(), machine={}, resume=True, overwrite=False)
    assert len(kept.records) == len(data["records"]) and kept.config["compute"] == "emulated"
    both = json.loads(old.read_text())
    both["config"]["compute"] = "measured"
    (tmp_path / "both.json").write_text(json.dumps(both))
    with pytest.raises(ConfigError, match="config has both 'timing' .the old name. and 'compute'"):
        report.load_saved(tmp_path / "both.json")


@pytest.mark.slow
def test_poplar_and_semi_train_on_four_ranks_and_report(tmp_path, capsys):
    from semimig.cli import main

    out = tmp_path / "r.json"
    assert main(["bench", "--allocation", "poplar", "--compute", "emulated", "--quick", "--modes", "baseline,poplar+semi",
                 "--epochs", "1", "--iters-per-epoch", "8", "--json", str(out), "--plots", str(tmp_path)]) == 0
    data = json.loads(out.read_text())
    assert data["config"]["allocation"] == "poplar" and data["status"]["complete"] is True
    by = {r["mode"]: r for r in data["records"]}
    assert by["baseline"]["group_samples"] == [64, 64]  # even split
    fast, slow = by["poplar+semi"]["group_samples_first"]
    assert fast > slow and fast + slow == 128  # group 1 (half speed) gets fewer samples
    assert by["poplar+semi"]["shed_share_by_rank"][1] > 0  # SEMI sheds the chi = 4 rank of group 0
    assert (tmp_path / "grid_modes.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "poplar+semi is" in printed and "as fast as baseline" in printed

    merged = tmp_path / "m.json"
    assert main(["report", str(out), "--no-plots", "--json", str(merged)]) == 0
    assert {row["mode"] for row in json.loads(merged.read_text())["summary"]} == {"baseline", "poplar+semi"}
