"""``semimig bench`` end to end on a tiny budget: table, JSON with the documented keys, plots."""
import json

import pytest


def test_bench_writes_json_and_plots(tmp_path, capsys):
    from semimig.cli import main

    out = tmp_path / "r.json"
    code = main(["bench", "--quick", "--modes", "baseline,zero-pri,semi", "--chi", "1,4", "--epochs", "1",
                 "--iters-per-epoch", "6", "--json", str(out), "--plots", str(tmp_path)])
    assert code == 0
    data = json.loads(out.read_text())
    assert {"records", "machine", "config"} <= data.keys()
    records = data["records"]
    assert len(records) == 6
    for r in records:
        assert {"mode", "chi", "seed", "iter_time_s", "epoch_time_s", "accuracy"} <= r.keys()
        assert r["iter_time_s"] > 0 and 0.0 <= r["accuracy"] <= 1.0
        assert len(r["savings_by_rank"]) == 2  # achieved GEMM savings next to the target
    by = {(r["mode"], r["chi"]): r for r in records}
    # the straggler (rank 1) sheds work under ZERO at chi = 4, never at chi = 1 on rank 0
    assert by[("zero-pri", 4.0)]["shed_share_by_rank"][1] > 0
    assert by[("zero-pri", 4.0)]["savings_by_rank"][1] > 0 and by[("zero-pri", 1.0)]["savings_by_rank"] == [0.0, 0.0]
    assert data["config"]["theta_iter"] == 1e-3  # the paper's default unless --theta-iter
    assert (tmp_path / "rt_vs_chi.png").stat().st_size > 0
    assert (tmp_path / "acc_delta.png").stat().st_size > 0
    assert "semimig bench" in capsys.readouterr().out


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
    (["--iters-per-epoch", "0"], "iters_per_epoch must be >= 1, got 0"),
    (["--epochs", "0"], "epochs must be >= 1, got 0"),
    (["--device-ms", "0"], "device_ms must be > 0, got 0.0"),
    (["--chi", ","], "seeds and chis must not be empty"),
    (["--seeds", ","], "seeds and chis must not be empty"),
    (["--chi", "0.5"], "chi values must be >= 1, got 0.5"),
    (["--tp", "4", "--straggler-rank", "4"], "straggler_rank=4 is outside the TP group of size 4"),
    (["--seeds", "-1"], "seeds must be ints in [0, 2**32), got -1"),
    (["--tp", "4", "--pattern", "multi", "--multi-chi", "8,0.5"], "each >= 1, got (8.0, 0.5)"),
    (["--theta-iter=-1e-4"], "theta_iter must be a finite number >= 0, got -0.0001"),
    (["--theta-iter", "inf"], "theta_iter must be a finite number >= 0, got inf"),
])
def test_bench_refuses_zero_and_empty_values_instead_of_defaulting(argv, message, capsys):
    """An explicit 0 or empty list is a bad value, not "use the default" (it used to start the full run)."""
    from semimig.cli import main

    assert main(["bench", *argv, "--no-plots"]) == 2
    assert message in capsys.readouterr().err


def test_bench_refuses_unwritable_outputs_before_training(tmp_path, capsys):
    from semimig.cli import main

    assert main(["bench", "--json", str(tmp_path), "--no-plots"]) == 2
    assert f"--json {tmp_path} is a directory" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["bench", "--json", str(blocker / "r.json"), "--no-plots"]) == 2
    assert f"--json {blocker / 'r.json'}: cannot create {blocker}" in capsys.readouterr().err
    assert main(["bench", "--json", str(tmp_path / "r.json"), "--plots", str(blocker)]) == 2
    assert f"--plots {blocker} is a file" in capsys.readouterr().err


def test_bench_reports_a_refused_combination_without_traceback(capsys):
    from semimig.cli import main

    assert main(["bench", "--lambdas", "1", "--no-plots"]) == 2
    assert "a lambda sweep needs several stragglers (pattern 'multi'), got pattern 'fixed'" in capsys.readouterr().err


def test_bench_refuses_cuda_without_enough_gpus(capsys):
    import torch

    from semimig.cli import main

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the GPUs")
    assert main(["bench", "--device", "cuda", "--tp", "2", "--no-plots"]) == 2
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
    ({"lambdas": (4,), "pattern": "multi", "tp": 4}, "ints in \\[0, tp=4\\), got 4"),
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
