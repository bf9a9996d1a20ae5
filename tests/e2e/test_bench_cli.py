"""``semimig bench`` end to end on a tiny budget: table, JSON with the documented keys, plots."""
import json

import pytest


def test_bench_writes_json_and_plots(tmp_path, capsys):
    """Emulated compute (deterministic, fast): every record's keys, the per-iteration trajectory of
    every rank, the straggler shedding at chi = 4 and nobody at chi = 1, the plots of a time-only run."""
    from semimig.cli import main

    out = tmp_path / "r.json"
    iterations = 16
    code = main(["bench", "--quick", "--compute", "emulated", "--modes", "baseline,zero-pri", "--chi", "1,4",
                 "--epochs", "1", "--iters-per-epoch", str(iterations), "--json", str(out), "--plots", str(tmp_path),
                 "--full-trace"])
    assert code == 0
    data = json.loads(out.read_text())
    assert {"records", "machine", "config", "status"} <= data.keys()
    assert data["status"] == {"complete": True, "cases_done": 4, "cases_total": 4}
    assert data["config"]["compute"] == "emulated" and data["config"]["evaluate"] is False
    records = data["records"]
    assert len(records) == 4
    for r in records:
        assert {"mode", "chi", "seed", "iter_time_s", "epoch_time_s", "accuracy", "trajectory"} <= r.keys()
        assert r["iter_time_s"] > 0 and r["accuracy"] is None  # --quick: time only
        assert len(r["savings_by_rank"]) == 2 and len(r["busy_share_by_rank"]) == 2
        trajectory = r["trajectory"]
        assert len(trajectory["iter_time_s"]) == iterations and len(trajectory["by_rank"]) == 2
        for rank in trajectory["by_rank"]:
            assert len(rank["busy_s"]) == iterations and all(b > 0 for b in rank["busy_s"])
            if r["mode"] != "baseline":
                assert len(rank["gamma_target"]) == iterations and len(rank["gamma_per_layer"][0]) > 1
    by = {(r["mode"], r["chi"]): r for r in records}
    straggling = by[("zero-pri", 4.0)]["trajectory"]["by_rank"][1]["busy_s"]
    steady = by[("zero-pri", 4.0)]["trajectory"]["by_rank"][0]["busy_s"]
    assert straggling[0] > 3 * steady[0]  # chi = 4 before any shedding
    assert by[("zero-pri", 4.0)]["shed_share_by_rank"][1] > 0 and by[("zero-pri", 4.0)]["shed_share_by_rank"][0] == 0
    assert by[("zero-pri", 1.0)]["savings_by_rank"] == [0.0, 0.0]
    assert data["config"]["theta_iter"] is None  # ResizingConfig's relative threshold unless --theta-iter
    assert (tmp_path / "rt_vs_chi.png").stat().st_size > 0
    assert not (tmp_path / "acc_delta.png").exists()  # no accuracy, no accuracy plot
    printed = capsys.readouterr().out
    assert "emulated compute, time only" in printed and "accuracy not measured" in printed


@pytest.mark.parametrize("argv,message", [
    (["bench", "--modes", "zero-foo"], "unknown mode 'zero-foo'"),
    (["bench", "--chi", "1,x"], "comma-separated numbers"),
])
def test_bench_rejects_bad_flags(argv, message, capsys):
    from semimig.cli import main

    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--iters-per-epoch", "0"], "--iters-per-epoch: iters_per_epoch must be an int >= 1 and <= 100000, got 0"),
    (["--epochs", "0"], "--epochs: epochs must be an int >= 1 and <= 10000, got 0"),
    (["--compute", "emulated", "--device-ms", "0"], "--device-ms: device_ms must be a finite number > 0"),
    (["--chi", ","], "--chi: chis must be a non-empty tuple, got ()"),
    (["--seeds", ","], "--seeds: seeds must be a non-empty tuple, got ()"),
    (["--chi", "0.5"], "--chi: chis[0] must be a finite number >= 1 and <= 100, got 0.5"),
    (["--tp", "4", "--straggler-rank", "4"], "straggler_rank=4 is outside the TP group of size 4"),
    (["--seeds", "-1"], "--seeds: seeds[0] must be an int >= 0 and <= 4294967295, got -1"),
    (["--tp", "4", "--pattern", "multi", "--multi-chi", "8,0.5"], "--multi-chi: multi_chis[1] must be a finite number >= 1"),
    (["--theta-iter=-1e-4"], "--theta-iter: theta_iter must be a finite number >= 0 or None, got -0.0001"),
    (["--theta-iter", "inf"], "--theta-iter: theta_iter must be a finite number >= 0 or None, got inf"),
    # out of range: accepted, these would sleep for ever or fail inside the ranks
    (["--chi", "1e6"], "--chi: chis[0] must be a finite number >= 1 and <= 100, got 1000000.0"),
    (["--chi", "inf"], "--chi: chis[0] must be a finite number >= 1 and <= 100, got inf"),
    (["--chi", "1e300"], "--chi: chis[0] must be a finite number >= 1 and <= 100, got 1e+300"),
    (["--chi", "nan"], "--chi: chis[0] must be a finite number >= 1 and <= 100, got nan"),
    (["--compute", "emulated", "--device-ms", "inf"], "--device-ms: device_ms must be a finite number > 0 and <= 10000"),
    (["--chi", "1,1", "--seeds", "0,0"], "--chi: chis lists 1.0 twice"),
    (["--seeds", "0,0"], "--seeds: seeds lists 0 twice"),
    (["--modes", "semi,semi"], "--modes: modes lists 'semi' twice"),
    (["--timeout-s", "0"], "--timeout-s: timeout_s must be a finite number >= 1 and <= 86400, got 0.0"),
    (["--compute", "emulated", "--chi", "1,100", "--device-ms", "5000", "--timeout-s", "100"],
     "timeout_s=100 is shorter than the straggler's emulated GEMM time per iteration (chi 100 x device_ms 5000"),
    (["--compute", "measured", "--device-ms", "40"], "--device-ms 40 sets the emulated device"),
    (["--device", "cuda", "--compute", "emulated"], "device 'cuda' measures real device time"),
])
def test_bench_refuses_zero_and_empty_values_instead_of_defaulting(argv, message, capsys, tmp_path):
    """An explicit 0 or empty list is a bad value, not "use the default" (which would start the full run)."""
    from semimig.cli import main

    assert main(["bench", *argv, "--no-plots", "--dry-run", "--json", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_measured_compute_needs_a_core_per_rank_and_is_the_default_where_there_are_enough(monkeypatch, capsys,
                                                                                         tmp_path):
    from semimig.bench import runner
    from semimig.cli import main

    monkeypatch.setattr(runner, "usable_cores", lambda: 2)
    argv = ["bench", "--no-plots", "--dry-run", "--json", str(tmp_path / "r.json")]
    assert main([*argv, "--compute", "measured", "--tp", "4"]) == 2
    assert ("--compute measured runs each rank's real GEMMs on one core: 4 ranks on this machine need 4 cores, "
            "it has 2; use --compute emulated") in capsys.readouterr().err
    assert main([*argv, "--tp", "4"]) == 0
    assert "emulated device 80 ms/iter" in capsys.readouterr().out  # 4 ranks > 2 cores: emulated
    assert main([*argv, "--tp", "2"]) == 0
    assert "measured compute" in capsys.readouterr().out
    assert not (tmp_path / "r.json").exists()  # a dry run writes nothing


def test_bench_refuses_unwritable_outputs_before_training(tmp_path, capsys):
    from semimig.cli import main

    assert main(["bench", "--json", str(tmp_path), "--no-plots", "--dry-run"]) == 2
    assert f"--json {tmp_path} is a directory" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["bench", "--json", str(blocker / "r.json"), "--no-plots", "--dry-run"]) == 2
    assert f"--json {blocker / 'r.json'}: cannot create {blocker}" in capsys.readouterr().err
    assert main(["bench", "--json", str(tmp_path / "r.json"), "--plots", str(blocker), "--dry-run"]) == 2
    assert f"--plots {blocker} is a file" in capsys.readouterr().err
    same = tmp_path / "out"  # review: --plots made the directory at --json's path, then advised --overwrite
    assert main(["bench", "--json", str(same), "--plots", str(same), "--dry-run"]) == 2
    assert f"--plots {same} and --json {same} are one path" in capsys.readouterr().err
    assert not same.exists()
    assert main(["bench", "--json", str(same / "r.json"), "--plots", str(same), "--dry-run"]) == 0  # inside: fine


def test_bench_reports_a_refused_combination_without_traceback(capsys):
    from semimig.cli import main

    assert main(["bench", "--lambdas", "1", "--no-plots", "--dry-run"]) == 2
    assert "a lambda sweep needs several stragglers (pattern 'multi'), got pattern 'fixed'" in capsys.readouterr().err


def test_bench_refuses_cuda_without_enough_gpus(capsys):
    import torch

    from semimig.cli import main

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the GPUs")
    assert main(["bench", "--device", "cuda", "--tp", "2", "--no-plots", "--dry-run"]) == 2
    assert "backend 'nccl' runs one rank per GPU: 2 ranks need 2 GPUs" in capsys.readouterr().err


def _record(mode, chi, seed, acc, lam=None, x=0, t=1.0):
    return {"mode": mode, "chi": chi, "seed": seed, "lambda": lam, "iter_time_s": t / 10, "epoch_time_s": t,
            "accuracy": acc, "migrating_stragglers": x}


def test_summary_keeps_lambda_rows_apart_and_plots_the_sweep(tmp_path):
    from semimig.bench import report

    records = [_record("baseline", 1.0, s, 0.9 + s / 100) for s in (0, 1)]
    records += [_record("baseline", 8.0, s, 0.9 + s / 100, t=8.0) for s in (0, 1)]
    records += [_record("semi", 1.0, s, 0.9 + s / 100) for s in (0, 1)]
    records += [_record("semi", 8.0, s, 0.85, x=2, t=2.0) for s in (0, 1)]
    records += [_record("semi", 8.0, s, 0.8 + lam / 100, lam=lam, x=lam, t=3.0 - lam / 2) for s in (0, 1) for lam in (0, 1, 2)]
    rows = report.summarize(records)
    by = {(r["label"], r["chi"]): r for r in rows}
    assert set(by) == {("baseline", 1.0), ("baseline", 8.0), ("semi", 1.0), ("semi", 8.0),
                       ("semi λ=0", 8.0), ("semi λ=1", 8.0), ("semi λ=2", 8.0)}
    assert by[("semi λ=1", 8.0)]["acc_delta_vs_baseline"] == pytest.approx(0.81 - 0.905)
    assert by[("semi λ=2", 8.0)]["rt_vs_chi1"] == pytest.approx(2.0)  # relative to plain semi at chi = 1
    assert by[("baseline", 8.0)]["accuracy_std"] == pytest.approx(0.01 / 2 ** 0.5)
    paths = report.write_plots(tmp_path, rows, "t")
    assert {p.name for p in paths} == {"rt_vs_chi.png", "acc_delta.png", "lambda_sweep.png"}
    assert all(p.stat().st_size > 0 for p in paths)


@pytest.mark.parametrize("kwargs,message", [
    ({"lambdas": (1,)}, "needs several stragglers"),
    ({"lambdas": (4,), "pattern": "multi", "tp": 4}, "lambdas\\[0\\] must be an int >= 0 and <= 3, got 4"),
])
def test_bench_config_rejects_bad_lambdas(kwargs, message):
    from semimig.bench.config import BenchConfig

    with pytest.raises(ValueError, match=message):
        BenchConfig(**kwargs)


def test_lambda_cases_only_where_a_straggler_exists():
    from semimig.bench.config import BenchConfig

    cfg = BenchConfig(modes=("baseline", "semi"), tp=4, pattern="multi", lambdas=(0, 2))
    assert cfg.cases(1.0, 0) == [("baseline", 1.0, 0, None), ("semi", 1.0, 0, None)]
    assert cfg.cases(8.0, 1)[2:] == [("semi", 8.0, 1, 0), ("semi", 8.0, 1, 2)]


@pytest.mark.slow
def test_measured_compute_slows_the_straggler_by_its_own_measured_time(tmp_path):
    """Real GEMMs on one thread per rank; the chi = 4 straggler's busy time (its GEMMs plus (chi - 1) x
    their measured time) is several times its peer's, in the baseline (hooks) and semi (controller)."""
    from semimig.bench.runner import usable_cores
    from semimig.cli import main

    if usable_cores() < 2:
        pytest.skip("measured compute needs a core per rank")
    out = tmp_path / "r.json"
    assert main(["bench", "--compute", "measured", "--model", "128x512x1", "--quick", "--modes", "baseline,semi",
                 "--chi", "4", "--epochs", "1", "--iters-per-epoch", "8", "--no-plots", "--json", str(out),
                 "--full-trace"]) == 0
    data = json.loads(out.read_text())
    assert data["config"]["compute"] == "measured" and data["config"]["size"]["hidden"] == 128
    for record in data["records"]:
        assert all(0.0 < share < 1.5 for share in record["busy_share_by_rank"])
        busy = record["trajectory"]["by_rank"]
        first = [rank["busy_s"][0] for rank in busy]  # before any balancing decision
        assert first[1] > 2.0 * first[0], (record["mode"], first)


@pytest.mark.parametrize("compute", ["measured", "emulated"])
def test_the_bench_straggler_is_typed_from_the_config_not_a_spec_string(compute):
    """``BenchConfig.straggler(chi)`` builds the StragglerConfig itself (it was formatted into the
    CLI grammar and parsed again): each pattern's ranks and factors, the compute mode's timing."""
    from semimig.bench.config import BenchConfig
    from semimig.straggler import StragglerConfig

    base = BenchConfig(tp=4, compute=compute, scope="device" if compute == "measured" else "gemm")
    timing = ({"mode": "measured", "scope": "device"} if compute == "measured"
              else {"mode": "emulated", "flops_per_second": base.device_flops_per_second()})
    assert base.straggler(1.0) == StragglerConfig(pattern="none", **timing)
    assert base.straggler(4.0) == StragglerConfig(pattern="fixed", ranks=(1,), chi=(4.0,), **timing)
    rr = BenchConfig(tp=4, compute=compute, pattern="round-robin", scope=base.scope)
    assert rr.straggler(2.5) == StragglerConfig(pattern="round-robin", chi=(2.5,), **timing)
    multi = BenchConfig(tp=4, compute=compute, pattern="multi", scope=base.scope, multi_chis=(8.0, 6.0, 4.0, 2.0))
    assert multi.straggler(8.0).chi == (8.0, 6.0, 4.0, 2.0) and multi.straggler(8.0).ranks == (0, 1, 2, 3)
    assert multi.straggler(4.0).chi == (4.0, 3.0, 2.0, 1.0)  # scaled by chi / 8, at least 1
    assert isinstance(base.straggler(4.0).chi[0], float)
