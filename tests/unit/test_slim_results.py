"""Small results: a record keeps its summaries and per-iteration iteration time; the per-rank
traces only with ``--full-trace``; ``scripts/slim_results.py`` slims saved files without changing
what ``semimig report`` prints."""
import copy
import json
import runpy
import shutil
from pathlib import Path

import pytest

from semimig.bench.results import TRACE_KEYS, ResultsFile, slim_record

ROOT = Path(__file__).resolve().parents[2]
SAVED = ROOT / "tests" / "data" / "bench_quick_measured_full_trace.json"  # a real 1-D run with full traces (docs/results/ holds it slimmed)


def _saved() -> dict:
    return json.loads(SAVED.read_text())


def test_slim_record_drops_only_the_traces():
    record = _saved()["records"][0]
    assert set(TRACE_KEYS) <= record["trajectory"].keys()  # the reference has them
    original = copy.deepcopy(record)
    slim = slim_record(record)
    assert record == original  # the input is not modified
    rest = {k: v for k, v in record.items() if k != "trajectory"}
    assert {k: v for k, v in slim.items() if k != "trajectory"} == rest
    assert slim["trajectory"] == {k: v for k, v in record["trajectory"].items() if k not in TRACE_KEYS}
    assert slim["trajectory"]["iter_time_s"] == record["trajectory"]["iter_time_s"]
    assert slim_record(slim) is slim  # nothing left to drop


@pytest.mark.parametrize("full_trace", [False, True])
def test_results_file_keeps_traces_only_when_asked(tmp_path, full_trace):
    saved = _saved()
    out = tmp_path / "r.json"
    results = ResultsFile(out, saved["config"], machine=saved["machine"], full_trace=full_trace)
    for record in saved["records"][:2]:
        results.add(record, cases_total=2)
    written = json.loads(out.read_text())["records"]
    for got, record in zip(written, saved["records"][:2]):
        assert got == (record if full_trace else slim_record(record))
    if not full_trace:
        assert len(out.read_bytes()) < len(json.dumps(saved["records"][:2], indent=2)) / 5


def test_slim_script_keeps_the_report(tmp_path, capsys):
    from semimig.cli import main

    full = tmp_path / "full" / SAVED.name
    full.parent.mkdir()
    shutil.copy(SAVED, full)
    slim_dir = tmp_path / "slim"
    script = runpy.run_path(str(ROOT / "scripts" / "slim_results.py"))
    assert script["main"]([str(full), "--out", str(slim_dir)]) == 0
    assert "records slimmed" in capsys.readouterr().out
    slim = slim_dir / SAVED.name
    assert slim.stat().st_size < full.stat().st_size / 5
    before, after = json.loads(full.read_text()), json.loads(slim.read_text())
    assert {k: v for k, v in before.items() if k != "records"} == {k: v for k, v in after.items() if k != "records"}
    assert after["records"] == [slim_record(r) for r in before["records"]]

    tables = []
    for path, name in ((full, "a.json"), (slim, "b.json")):
        assert main(["report", str(path), "--no-plots", "--json", str(tmp_path / name)]) == 0
        tables.append([line for line in capsys.readouterr().out.splitlines() if not line.startswith("JSON:")])
        tables[-1].append(json.loads((tmp_path / name).read_text())["summary"])
    assert tables[0] == tables[1]

    assert script["main"]([str(slim)]) == 0  # in place, already slim: left alone
    assert "no per-rank traces" in capsys.readouterr().out
