"""``semimig report``: merge saved ``semimig bench`` runs into one table, JSON and plots (no training)."""
import json

import pytest

CONFIG = {"modes": ["baseline", "semi"], "chis": [1.0, 8.0], "seeds": [0, 1], "lambdas": [], "tp": 4, "dp": 1,
          "pattern": "fixed", "epochs": 12, "iters_per_epoch": 25, "device_ms": 80.0, "device": "cpu"}
MACHINE = {"platform": "test", "cpus": 2}


def _record(mode, chi, seed, acc, t):
    return {"mode": mode, "chi": chi, "seed": seed, "lambda": None, "iter_time_s": t / 25, "epoch_time_s": t,
            "accuracy": acc, "migrating_stragglers": 0}


def _save(path, records, **config):
    path.write_text(json.dumps({"records": records, "summary": [], "machine": MACHINE,
                                "config": {**CONFIG, **config}}))
    return path


@pytest.fixture
def two_runs(tmp_path):
    """Run A: baseline and semi at chi 1 and 8; run B: zero-rd alone at chi 1 and 8 (same seeds)."""
    a = [_record(m, chi, s, acc, t) for s, base in ((0, 0.96), (1, 0.98))
         for m, chi, acc, t in (("baseline", 1.0, base, 5.0), ("baseline", 8.0, base, 18.0),
                                ("semi", 1.0, base, 5.0), ("semi", 8.0, base - 0.01, 5.2))]
    b = [_record("zero-rd", chi, s, acc, t) for s, base in ((0, 0.96), (1, 0.98))
         for chi, acc, t in ((1.0, base, 4.0), (8.0, base - 0.03, 4.4))]
    return (_save(tmp_path / "a.json", a),
            _save(tmp_path / "b.json", b, modes=["zero-rd"], machine_note="ignored"))


def test_report_merges_runs_against_the_first_runs_baseline(two_runs, tmp_path, capsys):
    from semimig.cli import main

    out, plots = tmp_path / "merged.json", tmp_path / "plots"
    assert main(["report", *map(str, two_runs), "--json", str(out), "--plots", str(plots)]) == 2  # extra key
    assert "config key 'machine_note' is only in" in capsys.readouterr().err

    data = json.loads(two_runs[1].read_text())
    del data["config"]["machine_note"]
    two_runs[1].write_text(json.dumps(data))
    assert main(["report", *map(str, two_runs), "--json", str(out), "--plots", str(plots)]) == 0
    merged = json.loads(out.read_text())
    assert len(merged["records"]) == 12
    assert merged["config"]["modes"] == ["baseline", "semi", "zero-rd"]
    assert merged["sources"] == [str(p) for p in two_runs]
    rows = {(r["mode"], r["chi"]): r for r in merged["summary"]}
    assert rows["zero-rd", 8.0]["acc_delta_vs_baseline"] == pytest.approx(-0.03)
    assert rows["zero-rd", 8.0]["rt_vs_chi1"] == pytest.approx(1.1)  # its own chi = 1 time, from run B
    assert rows["semi", 8.0]["acc_delta_vs_baseline"] == pytest.approx(-0.01)
    assert {p.name for p in plots.iterdir()} == {"rt_vs_chi.png", "acc_delta.png"}
    printed = capsys.readouterr().out
    assert "zero-rd" in printed and "-3.0" in printed


def test_report_refuses_runs_that_do_not_compare(two_runs, capsys):
    from semimig.cli import main

    data = json.loads(two_runs[1].read_text())
    data["config"].pop("machine_note")
    data["config"]["epochs"] = 8
    two_runs[1].write_text(json.dumps(data))
    assert main(["report", *map(str, two_runs), "--no-plots", "--json", str(two_runs[0].parent / "m.json")]) == 2
    assert f"config 'epochs' differs: 12 in {two_runs[0]} but 8 in {two_runs[1]}" in capsys.readouterr().err


def test_a_threshold_only_pridiff_reads_may_differ_from_runs_without_pridiff(tmp_path, capsys):
    """theta_iter is read by the zero-pridiff-* modes only: a run of them at another threshold still
    compares with a baseline saved before the key existed; two PriDiff runs at different ones do not."""
    from semimig.cli import main

    base = [_record("baseline", chi, 0, 0.96, t) for chi, t in ((1.0, 5.0), (8.0, 18.0))]
    pridiff = [_record("zero-pridiff-e", chi, 0, acc, 5.0) for chi, acc in ((1.0, 0.96), (8.0, 0.90))]
    old = _save(tmp_path / "old.json", base, modes=["baseline"])  # no theta_iter key at all
    new = _save(tmp_path / "new.json", pridiff, modes=["zero-pridiff-e"], theta_iter=1e-4)
    out = tmp_path / "m.json"
    assert main(["report", str(old), str(new), "--no-plots", "--json", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert merged["config"]["theta_iter"] == 1e-4
    rows = {(r["mode"], r["chi"]): r for r in merged["summary"]}
    assert rows["zero-pridiff-e", 8.0]["acc_delta_vs_baseline"] == pytest.approx(-0.06)

    other = [dict(r, seed=1) for r in pridiff]
    clash = _save(tmp_path / "clash.json", other, modes=["zero-pridiff-e"])  # saved with the default 1e-3
    assert main(["report", str(old), str(new), str(clash), "--no-plots", "--json", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "config 'theta_iter' differs between runs of zero-pridiff-e, zero-pridiff-r" in err
    assert f"0.0001 in {new} but 0.001 in {clash}" in err


def test_report_refuses_a_case_measured_twice(two_runs, capsys):
    from semimig.cli import main

    a = str(two_runs[0])
    assert main(["report", a, a, "--no-plots", "--json", str(two_runs[0].parent / "m.json")]) == 2
    assert "(mode 'baseline', chi 1, seed 0, lambda None) is in both" in capsys.readouterr().err


@pytest.mark.parametrize("content,message", [
    (None, "No such file"),
    ("not json", "is not JSON"),
    ('{"records": []}', "has no 'config'"),
])
def test_report_names_a_bad_input_file(tmp_path, capsys, content, message):
    from semimig.cli import main

    path = tmp_path / "saved.json"
    if content is not None:
        path.write_text(content)
    assert main(["report", str(path), "--no-plots", "--json", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d["records"][0].pop("mode"), "records[0] has no 'mode'"),
    (lambda d: d.update(records="abc"), "records must be a list, got str 'abc'"),
    (lambda d: d.update(config=[1, 2]), "config must be an object, got list [1, 2]"),
    (lambda d: d["records"][1].update(accuracy="high"),
     "records[1].accuracy must be a finite number >= 0 and <= 1 or None, got 'high'"),
    (lambda d: d["records"][2].update(chi="1"), "records[2].chi must be a finite number >= 1, got '1'"),
    (lambda d: d["records"][0].update(seed=1.5), "records[0].seed must be an int >= 0, got 1.5"),
    (lambda d: d["records"][0].update(iter_time_s=float("nan")), "records[0].iter_time_s must be a finite number > 0"),
    (lambda d: d["records"].append(dict(d["records"][0])), "records[8] measures the case of records[0] again"),
    (lambda d: d["config"].update(chis="1,4"), "config.chis must be a list, got str '1,4'"),
    (lambda d: d.update(records=[[1]]), "records[0] must be an object, got list [1]"),
    (lambda d: d.clear(), "has no 'records'"),
])
def test_report_refuses_a_malformed_saved_run_in_one_line(two_runs, tmp_path, capsys, mutate, message):
    """Each of these would otherwise be a traceback from deep inside the summary."""
    from semimig.cli import main

    data = json.loads(two_runs[0].read_text())
    mutate(data)
    two_runs[0].write_text(json.dumps(data))
    assert main(["report", str(two_runs[0]), "--no-plots", "--json", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and str(two_runs[0]) in err, err


def test_accuracy_deltas_within_the_seed_noise_are_marked_and_single_seed_deltas_are_not_plotted(tmp_path):
    from semimig.bench import report

    records = [_record("baseline", 4.0, s, acc, 10.0) for s, acc in ((0, 0.90), (1, 0.94), (2, 0.92))]
    records += [_record("semi", 4.0, s, acc, 5.0) for s, acc in ((0, 0.91), (1, 0.93), (2, 0.93))]  # +0.0033
    records += [_record("zero-rd", 4.0, s, acc, 5.0) for s, acc in ((0, 0.80), (1, 0.85), (2, 0.82))]  # -0.097
    rows = {r["mode"]: r for r in report.summarize(records)}
    semi, rd = rows["semi"], rows["zero-rd"]
    assert semi["acc_delta_vs_baseline"] == pytest.approx(0.01 / 3)
    assert semi["acc_delta_std"] == pytest.approx(0.02 / 3 ** 0.5)  # stdev of the paired +0.01, -0.01, +0.01
    assert semi["acc_delta_within_noise"] is True
    assert rd["acc_delta_within_noise"] is False
    paths = report.write_plots(tmp_path / "three", list(rows.values()), "t")
    assert {p.name for p in paths} == {"rt_vs_chi.png", "acc_delta.png"}

    single = report.summarize([r for r in records if r["seed"] == 0])
    assert all(row["acc_delta_std"] is None for row in single)
    assert {p.name for p in report.write_plots(tmp_path / "one", single, "t")} == {"rt_vs_chi.png"}


@pytest.mark.filterwarnings("ignore:No artists with labels")  # errorbar is replaced below: no legend entries
def test_the_time_plot_carries_the_spread_over_seeds_and_every_title_their_count(tmp_path, monkeypatch):
    from semimig.bench import report

    records = [_record("baseline", chi, s, 0.9, t) for chi, ts in ((1.0, (5.0, 6.0, 7.0)), (4.0, (9.0, 10.0, 14.0)))
               for s, t in enumerate(ts)]
    rows = report.summarize(records)
    assert [r["epoch_time_range"] for r in rows] == [[5.0, 7.0], [9.0, 14.0]]
    assert report.seeds_note(rows) == "3 seeds per point; bars: spread over seeds"
    single = report.summarize([r for r in records if r["seed"] == 0])
    assert single[0]["epoch_time_range"] is None and report.seeds_note(single) == "1 seed per point"
    assert report.seeds_note(rows + single) == "1–3 seeds per point; bars: spread over seeds"

    drawn = []  # what the time plot hands matplotlib: min-max bars around the mean, and the title
    import matplotlib.axes

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", lambda self, x, y, yerr=None, **kw: drawn.append(
        (list(x), list(y), [list(e) for e in yerr])))
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda self, text, **kw: drawn.append(text))
    report.write_plots(tmp_path, rows, "semimig bench tp=2 fixed, measured compute")
    assert drawn[0] == ([1.0, 4.0], [6.0, 11.0], [[1.0, 2.0], [1.0, 3.0]])
    assert drawn[1] == "semimig bench tp=2 fixed, measured compute\n3 seeds per point; bars: spread over seeds"
