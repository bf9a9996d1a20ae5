"""The generated tables of README.md and docs/results.md: identical to what their result files
give, and able to notice when they are not; the results directory holds one current file per
question, each with its provenance (``semimig.bench.readme_tables``, ``make tables``)."""
import copy
import json
from pathlib import Path

import pytest

from semimig.bench.readme_tables import MAX_FILES, PROVENANCE, Index, audit, bench, main, regenerate, render, ttl
from semimig.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "docs" / "results" / "index.json"


@pytest.mark.parametrize("document, least", [("README.md", 3), ("docs/results.md", 20)])
def test_every_generated_table_matches_its_result_file(document, least):
    path = ROOT / document
    text = path.read_text()
    new, changed, marked = regenerate(text, path.parent, Index(INDEX))
    assert marked >= least, f"{document}'s generated tables lost their markers"
    assert changed == [], f"run `make tables`: {changed}"
    assert new == text


def test_the_results_are_one_current_file_per_question_each_with_its_provenance():
    index = Index(INDEX)
    assert audit(index) == []
    files = [p for p in INDEX.parent.rglob("*") if p.is_file()]
    assert len(files) <= MAX_FILES
    for entry in index.entries.values():
        prov = json.loads(index.file(entry).read_text())["provenance"]
        assert all(prov.get(key) for key in PROVENANCE), entry["file"]


def test_every_question_with_a_table_is_shown_in_the_results_page():
    text = (ROOT / "docs" / "results.md").read_text()
    for question, entry in Index(INDEX).entries.items():
        assert f"<!-- result: {question} -->" in text or "table" not in entry, question


def test_the_audit_names_an_unlisted_file_a_missing_one_and_a_file_without_provenance(tmp_path):
    prov = {"command": "python b.py --json a.json", "commit": "0" * 40, "machine": "m", "date": "2026-01-01"}
    (tmp_path / "a.json").write_text(json.dumps({"provenance": prov}))
    (tmp_path / "b.json").write_text(json.dumps({"provenance": {**prov, "commit": ""}}))
    (tmp_path / "old_run.json").write_text("{}")
    entries = [{"id": i, "section": "s", "question": "q", "file": f, "compute": "measured"}
               for i, f in (("a", "a.json"), ("b", "b.json"), ("c", "c.json"))]
    (tmp_path / "index.json").write_text(json.dumps({"questions": entries}))
    problems = audit(Index(tmp_path / "index.json"))
    assert any("old_run.json: not in index.json" in p for p in problems)
    assert any("c.json: listed in index.json but missing" in p for p in problems)
    assert any("b.json: provenance lacks commit" in p for p in problems)
    assert not any("a.json" in p for p in problems)


def test_a_bad_index_entry_or_question_is_named(tmp_path):
    (tmp_path / "index.json").write_text(json.dumps({"questions": [{"id": "x", "section": "s", "question": "q",
                                                                    "file": "x.json", "compute": "guessed"}]}))
    with pytest.raises(ConfigError, match="compute 'guessed'"):
        Index(tmp_path / "index.json")
    with pytest.raises(ConfigError, match="needs the results index"):
        regenerate("<!-- result: x -->\n", tmp_path)
    with pytest.raises(ConfigError, match="no question 'nope'"):
        regenerate("<!-- result: nope -->\n", tmp_path, Index(INDEX))


def test_the_default_documents_are_both_checked_and_a_missing_one_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["--check"]) == 0
    out = capsys.readouterr().out
    assert "README.md: " in out and "docs/results.md: " in out
    with pytest.raises(ConfigError, match="nowhere.md"):
        main([str(tmp_path / "nowhere.md"), "--check"])


def _run(step, val, *, events=(), shed="0.000,0.000", share=(0.8, 0.7)):
    summary = {"shed": shed, "balanced_share_by_rank": list(share)}
    if events is not None:
        summary["reshard"] = {"replans": len(events), "events": [dict(e) for e in events]}
    return {"step_s": [step] * 10, "val_losses": [[10, val]], "summary": summary}


def _result(repeats=3):
    event = {"step": 1, "mlp_units": [29, 3], "kv_units": [7, 1], "bytes_moved": 150994944, "move_s": 1.344}
    modes = {
        "healthy": {"repeats": repeats, "steady_step_s": 0.8, "steady_step_s_range": [0.75, 0.9],
                    "final_val_loss": 3.1, "time_to_target_s": 40.0, "time_to_target_s_each": [38.0, 40.0, 44.0],
                    "train_s": 50.0, "balanced_share": [0.8, 0.8]},
        "zero-pri": {"repeats": repeats, "steady_step_s": 1.6, "steady_step_s_range": [1.5, 1.7],
                     "final_val_loss": 3.47, "time_to_target_s": None, "time_to_target_s_each": [None] * 3,
                     "train_s": 100.0, "balanced_share": [0.8, 0.55]},
        "reshard": {"repeats": repeats, "steady_step_s": 1.344, "steady_step_s_range": [1.3, 1.4],
                    "final_val_loss": 3.1, "time_to_target_s": 70.0, "time_to_target_s_each": [68.0, 70.0, 75.5],
                    "train_s": 90.0, "balanced_share": [0.8, 0.7]},
    }
    raw = {"healthy": [_run(0.8, 3.1, events=None)] * 3,
           "zero-pri": [_run(1.6, 3.47, events=None, shed="0.000,0.866")] * 3,
           "reshard": [_run(1.3, 3.1, events=[event])] * 3}
    return {"repeats": repeats, "pattern": None, "model": {"steps": 60}, "modes": modes, "raw": raw}


def test_the_time_to_loss_table_reads_ratios_ranges_and_actions_from_the_file():
    lines = ttl(_result())
    assert lines[0].startswith("| mode | steady step (range) |") and len(lines) == 5
    healthy, zero, reshard = lines[2:]
    assert healthy == ("| healthy | 0.800 s (0.75–0.90) | 1.00× | 3.1000 | 40.0 s (38.0–44.0) | 1.00× | "
                       "0.80 / 0.80 | — |")
    assert "| never | — |" in zero and "rank 1 shed 87% of its K columns at the end" in zero
    assert "| 1.68× |" in reshard and "| 1.75× |" in reshard
    assert "1 re-plan at step 1 to `29,3:7,1` (151 MB in 1.34 s)" in reshard
    one = _result(repeats=1)
    assert ttl(one)[0].startswith("| mode | steady step | ") and "(0.75–0.90)" not in ttl(one)[2]


def test_a_result_file_that_changed_makes_its_table_out_of_date(tmp_path):
    data = _result()
    (tmp_path / "r.json").write_text(json.dumps(data))
    readme = "intro\n<!-- table: ttl r.json -->\n" + "\n".join(render("ttl", tmp_path / "r.json")) + "\n\nafter\n"
    assert regenerate(readme, tmp_path)[1:] == ([], 1)
    changed = copy.deepcopy(data)
    changed["modes"]["reshard"]["steady_step_s"] = 1.2
    (tmp_path / "r.json").write_text(json.dumps(changed))
    new, stale, marked = regenerate(readme, tmp_path)
    assert stale == ["<!-- table: ttl r.json -->"] and marked == 1
    assert "| 1.200 s (1.30–1.40) | 1.50× |" in new and new.endswith("\n\nafter\n")
    (tmp_path / "README.md").write_text(readme)
    assert main([str(tmp_path / "README.md"), "--check"]) == 1
    assert (tmp_path / "README.md").read_text() == readme  # --check writes nothing
    assert main([str(tmp_path / "README.md")]) == 0
    assert (tmp_path / "README.md").read_text() == new
    assert main([str(tmp_path / "README.md"), "--check"]) == 0


def test_a_bad_marker_is_named(tmp_path):
    with pytest.raises(ConfigError, match="'histogram' is not one of"):
        regenerate("<!-- table: histogram r.json -->\n", tmp_path)
    with pytest.raises(ConfigError, match="missing.json: cannot read"):
        regenerate("<!-- table: ttl missing.json -->\n", tmp_path)
    (tmp_path / "other.json").write_text(json.dumps({"records": []}))
    with pytest.raises(ConfigError, match="other.json: not a ttl result file"):
        regenerate("<!-- table: ttl other.json -->\n", tmp_path)


def test_the_bench_table_reads_each_seeds_delta_and_shed_from_the_records():
    from semimig.bench.results import summarize

    def rec(mode, chi, seed, acc, shed):
        slower = 1.2 if chi == 4.0 else 1.0  # zero-pri's own time at chi 4 against chi 1
        iter_s, epoch_s = (0.1 * chi, 2.5 * chi) if mode == "baseline" else (0.12 * slower, 3.0 * slower)
        return {"mode": mode, "chi": chi, "seed": seed, "lambda": None, "iter_time_s": iter_s, "epoch_time_s": epoch_s,
                "accuracy": acc, "shed_share_by_rank": shed, "migrating_stragglers": 0}

    records = [rec("baseline", c, s, a, [0.0, 0.0]) for c in (1.0, 4.0) for s, a in ((0, 0.90), (1, 0.94))]
    records += [rec("zero-pri", 1.0, s, a, [0.0, 0.0]) for s, a in ((0, 0.90), (1, 0.94))]
    records += [rec("zero-pri", 4.0, 0, 0.85, [0.0, 0.85]), rec("zero-pri", 4.0, 1, 0.90, [0.02, 0.80])]
    data = {"config": {"straggler_rank": 1}, "records": records, "summary": summarize(records)}
    rows = {line.split(" | ")[0] + " " + line.split(" | ")[1]: line for line in bench(data)[2:]}
    assert rows["| baseline 4"] == "| baseline | 4 | 0.400 | 4.00 | 92.0 ± 2.8 | 0 | 0.00 | 0.00 |"
    assert "| 0 on every seed |" in rows["| zero-pri 1"]
    assert rows["| zero-pri 4"].endswith("| -4.5 (-5.0, -4.0) | 0.85, 0.80 | 0.00, 0.02 |")
    assert "| 0.144 | 1.20 |" in rows["| zero-pri 4"]  # RT against its own chi = 1 time


def test_the_optimizer_table_reads_each_implementation_from_the_file(tmp_path):
    rows = [{"impl": "single", "median_ms": 54.93, "vs_fused": 5.333}, {"impl": "fused", "median_ms": 10.3,
                                                                        "vs_fused": 1.0}]
    (tmp_path / "o.json").write_text(json.dumps({"meta": {}, "rows": rows}))
    assert render("optimizer", tmp_path / "o.json")[2:] == ["| single | 54.9 ms | 5.33× |",
                                                             "| fused | 10.3 ms | 1.00× |"]
