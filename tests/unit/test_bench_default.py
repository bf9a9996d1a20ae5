"""``semimig bench`` with no arguments (``make bench``): the slow-device experiment, and a table that
reads in an 80-column pipe; the paper's GEMM-only sweep one flag away."""
import io
import logging

import pytest

from semimig.errors import ConfigError


def _config(monkeypatch, argv, cores=2):
    from semimig.bench import runner
    from semimig.bench.cli import config_from_args
    from semimig.cli import build_parser

    monkeypatch.setattr(runner, "usable_cores", lambda: cores)
    return config_from_args(build_parser().parse_args(["bench", *argv]))


def test_no_arguments_select_the_whole_device_sweep_against_colossalai_alone(monkeypatch, tmp_path, capsys):
    """Healthy (chi 1) and a whole slow device (chi 4), Colossal-AI alone (baseline) beside reshard and semi."""
    from semimig.bench import runner
    from semimig.cli import main

    cfg = _config(monkeypatch, [])
    assert cfg.modes == ("baseline", "reshard", "semi") and cfg.chis == (1.0, 4.0)
    assert cfg.scope == "device" and cfg.compute == "measured" and cfg.pattern == "fixed"
    assert cfg.seeds == (0, 1, 2) and cfg.evaluate  # accuracy after training, a noise estimate
    assert len(cfg.all_cases()) == 18

    monkeypatch.setattr(runner, "usable_cores", lambda: 2)
    assert main(["bench", "--dry-run", "--no-plots", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "a whole slow device" in out and "not a real throttle" in out
    assert "modes baseline, reshard, semi x chi 1, 4: 18 of 18 cases" in out
    assert all(len(line) <= 80 for line in out.splitlines()), out
    assert not (tmp_path / "r.json").exists()


def test_the_papers_gemm_only_sweep_is_one_flag_away(monkeypatch):
    from semimig.bench.choices import MODES

    cfg = _config(monkeypatch, ["--experiment", "paper"])
    assert cfg.modes == MODES and "reshard" not in cfg.modes
    assert cfg.scope == "gemm" and cfg.chis == (1.0, 4.0) and cfg.seeds == (0, 1)
    quick = _config(monkeypatch, ["--experiment", "paper", "--quick"])
    assert quick.seeds == (0,) and not quick.evaluate
    overridden = _config(monkeypatch, ["--modes", "baseline,semi", "--chi", "1,8", "--seeds", "4"])
    assert overridden.modes == ("baseline", "semi") and overridden.chis == (1.0, 8.0) and overridden.seeds == (4,)


def test_without_a_core_per_rank_the_slow_device_is_gemm_slow_and_it_says_so(monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, logger="semimig.bench.cli"):
        cfg = _config(monkeypatch, [], cores=1)
    assert cfg.compute == "emulated" and cfg.scope == "gemm" and cfg.modes == ("baseline", "reshard", "semi")
    assert "only the straggler's GEMMs are slowed" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="semimig.bench.cli"):
        _config(monkeypatch, ["--compute", "emulated"], cores=1)  # asked for: nothing to warn about
    assert caplog.text == ""


def test_experiment_is_refused_with_the_2d_benchmark(monkeypatch):
    with pytest.raises(ConfigError, match="--experiment applies to the 1-D straggler sweep"):
        _config(monkeypatch, ["--experiment", "paper", "--allocation", "even"])


def _record(mode, chi, seed, acc, t, lam=None):
    return {"mode": mode, "chi": chi, "seed": seed, "lambda": lam, "iter_time_s": t / 25, "epoch_time_s": t,
            "accuracy": acc, "migrating_stragglers": 0, "busy_share_by_rank": [0.5, 0.6],
            "balanced_share_by_rank": [0.7, 0.75]}


@pytest.mark.parametrize("width", [80, 200])
def test_table_lines_fit_80_columns_with_every_header_whole(width):
    """The widest labels the sweeps produce (the paper's longest mode, a λ row, two-digit chi, large times)."""
    from rich.console import Console

    from semimig.bench import report
    from semimig.bench.choices import MODES

    records = [_record(mode, chi, seed, 0.9 + seed / 100 - (i / 1000 if chi > 1 else 0), 5.0 * chi if mode == "baseline"
                       else 1234.5) for seed in (0, 1) for chi in (1.0, 16.0) for i, mode in enumerate(MODES + ("reshard",))]
    records += [_record("semi", 16.0, seed, 0.5, 3.0, lam=lam) for seed in (0, 1) for lam in (0, 12)]
    buffer = io.StringIO()
    title = ("semimig bench results, ViT 256x1536x1 tp=2, measured compute (245 s)\nstraggler rank 1, a whole slow "
             "device: all its work between collectives takes chi times as long (emulated: sleeps on measured "
             "compute, not a real throttle); chi 1 is the healthy run")
    report.print_table(report.summarize(records), title, console=Console(file=buffer, width=width))
    lines = buffer.getvalue().splitlines()
    assert lines and all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert "…" not in buffer.getvalue()
    header = next(line for line in lines if line.startswith("mode"))
    assert header.split() == " ".join(report.COLUMNS).split()
    assert any(line.startswith("zero-pridiff-e ") for line in lines) and any("semi λ=12" in line for line in lines)
    assert any(line.startswith("at chi 16, against Colossal-AI alone: ") for line in lines)


def test_the_table_says_what_reshard_and_semi_did_against_colossalai_alone():
    from rich.console import Console

    from semimig.bench import report

    records = []
    for seed, base in ((0, 0.90), (1, 0.95), (2, 0.93)):
        records += [_record("baseline", 1.0, seed, base, 1.6), _record("baseline", 4.0, seed, base, 5.6),
                    _record("reshard", 1.0, seed, base, 1.6), _record("reshard", 4.0, seed, base, 2.8),
                    _record("semi", 1.0, seed, base, 1.6), _record("semi", 4.0, seed, base - 0.02 - seed / 100, 2.0)]
    buffer = io.StringIO()
    report.print_table(report.summarize(records), "t", console=Console(file=buffer, width=80))
    text = buffer.getvalue()
    rows = {tuple(line.split()[:2]): line.split() for line in text.splitlines() if line.split()[:1] in
            (["baseline"], ["reshard"], ["semi"])}
    assert rows["reshard", "4"][4] == "2.00x" and rows["reshard", "4"][6] == "same"  # exact: every seed equal
    assert rows["semi", "4"][4] == "2.80x" and rows["semi", "4"][6] == "-3.0±1.0"
    assert rows["baseline", "4"][3] == "3.50x" and rows["baseline", "4"][4] == "-"
    assert "reshard 2.00x as fast, the same accuracy; semi 2.80x as fast, accuracy -3.0 points" in " ".join(
        text.split())


def test_rank_warnings_are_held_and_explained_not_printed_bare(capsys):
    from semimig.bench import sweeps
    from semimig.bench.config import BenchConfig

    with sweeps._held_warnings() as held:
        logging.getLogger("semimig.controller.shedding").warning("iteration %d: rank 1: does not pay", 7)
    assert held == ["iteration 7: rank 1: does not pay"] and capsys.readouterr().err == ""

    decisions = [None, {"backed_off": []}, {"backed_off": [1]}, {"backed_off": [1]}, {"shed": [0.0, 0.2]}]
    assert sweeps._backed_off(decisions) == [0, 2]
    assert sweeps._backed_off([None, {"shed": [0.0]}]) is None  # modes without a shedding decision
    cfg = BenchConfig(compute="emulated", modes=("baseline", "semi"), chis=(1.0, 4.0), seeds=(0, 1))
    records = [{"mode": "semi", "chi": 4.0, "seed": s, "backed_off_iterations_by_rank": [0, n],
                "warnings": ["rank 1: shedding work does not pay"]} for s, n in ((0, 40), (1, 60))]
    records.append({"mode": "semi", "chi": 1.0, "seed": 0, "backed_off_iterations_by_rank": [0, 0],
                    "warnings": ["something else"]})
    notes = sweeps.notes(cfg, [], records)
    assert notes == ["note: semi at chi 4 trained rank 1 unpruned for 50 iterations on average (seeds 0, 1): "
                     "shedding GEMM columns did not shorten that rank's step enough, as too much of its time does "
                     "not shrink with them",
                     "note: semimig logged warnings while training semi chi=1 seed=0: the JSON keeps them "
                     "(warnings); semimig -v bench prints them"]
