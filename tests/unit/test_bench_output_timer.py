"""``benchmarks/bench_output``: what the benchmark scripts share.

The one interleaved timer (``interleaved_ms``): every repetition calls every callable once,
starting one later than the repetition before; the warm-up calls are not timed; a slept callable
reads its sleep in milliseconds; no repetitions is refused by name.

The ``--json`` flag (``add_json_flag``): a path that cannot be written is refused by name with exit
2 as it is parsed, in every script that writes a result file, before any work; ``refuse`` says a
config's error as argparse does; ``write_result`` adds the provenance keys beside the result's own
top-level fields and refuses a field that would overwrite one.
"""
from __future__ import annotations

import argparse
import importlib
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import pytest

from scripts import REPO, load_script

output = load_script("benchmarks/bench_output.py", "bench_output_under_test")
timer = output.interleaved_ms

# every script that writes a result file, with the least else its command line needs
WRITERS = {"block_accuracy": [], "device_vs_throttle": [], "kernel_bench": [], "migration_bench": [],
           "optimizer_bench": [], "overhead_bench": [], "poplar_bench": [],
           "time_to_loss": ["--straggler", "real"]}


def test_each_repetition_calls_all_in_a_rotated_order_after_the_warmup():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    samples = timer(fns, 4, warmup=2)
    assert calls[:6] == list("abcabc")  # the warm-up, untimed
    assert calls[6:] == list("abc" "bca" "cab" "abc")
    assert {k: len(v) for k, v in samples.items()} == {"a": 4, "b": 4, "c": 4}


def test_a_slept_callable_reads_its_sleep_in_milliseconds_and_no_repetition_is_refused():
    samples = timer({"short": lambda: time.sleep(0.01), "long": lambda: time.sleep(0.03)}, 3, warmup=0)
    # at least the sleep, in milliseconds (seconds would read 0.01); the upper bound only catches
    # a unit off by 1000, since a loaded machine overshoots sleeps
    assert all(10 <= ms < 1000 for ms in samples["short"]) and all(30 <= ms < 1000 for ms in samples["long"])
    with pytest.raises(ValueError, match="reps must be >= 1, got 0"):
        timer({"a": lambda: None}, 0)


def _parser(*, required: bool) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="b.py")
    output.add_json_flag(parser, required=required, help="write it here")
    parser.add_argument("--plot", type=Path, action=output.OutputPath)
    return parser


def test_json_flag_gives_a_path_or_none_and_refuses_an_unwritable_one_by_name(tmp_path, capsys):
    assert _parser(required=False).parse_args([]).json is None
    assert _parser(required=True).parse_args(["--json", str(tmp_path / "r.json")]).json == tmp_path / "r.json"
    missing = tmp_path / "no" / "r.json"
    cases = {("--json", str(tmp_path)): f"b.py: error: --json {tmp_path} is a directory; give a file name",
             ("--json", str(missing)): f"b.py: error: cannot write --json {missing}: directory {tmp_path / 'no'} "
                                       "does not exist",
             ("--plot", str(tmp_path)): f"b.py: error: --plot {tmp_path} is a directory; give a file name"}
    for argv, message in cases.items():
        with pytest.raises(SystemExit) as stop:
            _parser(required=False).parse_args(list(argv))
        assert stop.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == message
    assert not missing.parent.exists()  # refusing creates nothing
    with pytest.raises(SystemExit):
        _parser(required=True).parse_args([])
    assert "the following arguments are required: --json" in capsys.readouterr().err


@pytest.mark.parametrize("script", sorted(WRITERS))
def test_every_script_refuses_a_bad_json_path_by_name_before_any_work(script, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    monkeypatch.delitem(sys.modules, script, raising=False)  # imported by name: its dataclasses resolve
    main = importlib.import_module(script).main
    with pytest.raises(SystemExit) as stop:
        main([*WRITERS[script], "--json", str(tmp_path)])  # the defaults would measure for minutes
    captured = capsys.readouterr()
    assert stop.value.code == 2
    assert captured.err.strip().splitlines()[-1].endswith(f"error: --json {tmp_path} is a directory; give a file name")
    assert captured.out == "" and list(tmp_path.iterdir()) == []


def test_refuse_says_the_error_as_argparse_does_and_returns_2(capsys):
    assert output.refuse("x_bench.py", ValueError("reps must be an int >= 1, got 0")) == 2
    assert capsys.readouterr().err == "x_bench.py: error: reps must be an int >= 1, got 0\n"


def test_write_result_adds_the_provenance_beside_the_result_fields(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "r.json"
    assert output.write_result(path, "b", ["--quick"], {"reps": 3}, indent=1, rows=[{"x": 1}], meta={"m": 2}) == path
    text = path.read_text()
    record = json.loads(text)
    prov = record.pop("provenance")
    assert record == {
        "benchmark": "b", "argv": ["--quick"], "config": {"reps": 3}, "rows": [{"x": 1}], "meta": {"m": 2},
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "device": "cpu"}}
    # what docs/results/ requires of every file (make tables checks it): the command ends with this
    # run's arguments, the commit is the checkout's (hex, +dirty when changed), the date is today's
    assert set(prov) == {"command", "commit", "machine", "date"} and prov["command"].endswith(" --quick")
    assert prov["commit"] == "unknown" or all(c in "0123456789abcdef" for c in prov["commit"].split("+")[0])
    assert prov["date"] == datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    assert text.startswith('{\n "benchmark"')  # indent 1, as the large record files are written
    monkeypatch.setattr(sys, "argv", ["b.py", "--json", str(path)])
    output.write_result(path, "b", None, {"where": tmp_path}, device="cuda")
    written = json.loads(path.read_text())
    assert written["argv"] == ["--json", str(path)] and written["machine"]["device"] == "cuda"
    assert written["config"] == {"where": str(tmp_path)}  # paths as text


def test_write_result_refuses_a_field_named_like_a_provenance_key(tmp_path):
    with pytest.raises(ValueError, match=r"result fields \['machine'\] would overwrite the provenance keys"):
        output.write_result(tmp_path / "r.json", "b", [], {}, machine="mine")
    assert list(tmp_path.iterdir()) == []
