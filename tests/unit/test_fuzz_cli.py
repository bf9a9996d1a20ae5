"""Fuzz the command lines (``semimig bench``, ``report``, ``plan``, ``demo``) and the JSON files that
``report`` and ``plan`` read.

Everything runs in-process through :func:`semimig.cli.main`; no rank is ever started (``bench`` gets
``--dry-run``, and the launcher is replaced by one that fails the test if called; ``demo`` inputs
are only checked).  Each input must exit 0, or 2 with exactly one line on stderr that says what was
refused (argparse's own usage line excepted) — never a traceback, a hang or a silent acceptance:
an accepted ``bench`` command line must give a :class:`BenchConfig` whose fields hold values of
their declared types (the oracle of :mod:`test_fuzz_configs`).
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from test_fuzz_configs import FUZZ, assert_conforms

NUMBERS = ["0", "1", "-1", "2", "4", "8", "0.5", "1e6", "1e300", "inf", "-inf", "nan", "100", "101", "1,1", "0,0",
           "1,4", ",", "", "x", "1e-300", "3", "64", "65", "2**3", " 1"]
FLAGS = {
    "--modes": ["baseline", "semi", "zero-pri,semi", "semi,semi", "zero-foo", "", ",", "poplar", "poplar+semi,baseline"],
    "--chi": NUMBERS, "--seeds": NUMBERS, "--tp": NUMBERS, "--dp": NUMBERS, "--straggler-rank": NUMBERS,
    "--pattern": ["fixed", "round-robin", "multi", "burst", ""],
    "--multi-chi": NUMBERS + ["8,6,4,2", "8,0.5"], "--lambdas": NUMBERS + ["0,1"],
    "--epochs": NUMBERS, "--iters-per-epoch": NUMBERS, "--compute": ["measured", "emulated", "x"],
    "--model": ["256x1536x1", "64x256x2", "130x512x1", "0x0x0", "1x1", "99999x1x1", "x"],
    "--device-ms": NUMBERS, "--theta-iter": NUMBERS, "--device": ["cpu", "cuda", "tpu"], "--timeout-s": NUMBERS,
    "--allocation": ["even", "poplar", "uneven"], "--group-chis": ["1,4/2,2", "1,4", "1,4/2", "1,inf/1,1", "x", "/"],
    "--zero-stage": ["0", "1", "2", "3", "-1", "x"],
}
SWITCHES = ["--quick", "--resume", "--overwrite"]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``semimig argv`` in-process: (exit status, stdout, stderr); argparse's exits become statuses."""
    from semimig.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def assert_clean(code: int, err: str, command: str) -> None:
    """0, or 2 with one line naming the refusal (argparse adds its usage line above it)."""
    assert code in (0, 2), (code, err)
    if code == 2:
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert lines and lines[-1].startswith(f"semimig {command}: error: "), err
        body = [line for line in lines if not line.startswith(("usage:", " "))]
        assert len(body) == 1, err
        assert "Traceback" not in err


@pytest.fixture(autouse=True, scope="module")
def no_ranks():
    """No launcher environment, two cores, and a launcher that must never be called."""
    import os

    from semimig import launch
    from semimig.bench import runner

    saved_env = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE") if k in os.environ}
    saved = launch.run_on_ranks, runner.usable_cores

    def forbidden(*args, **kwargs):
        raise AssertionError("a fuzzed command line started ranks")

    launch.run_on_ranks, runner.usable_cores = forbidden, lambda: 2
    yield
    launch.run_on_ranks, runner.usable_cores = saved
    os.environ.update(saved_env)


BENCH_ARGV = st.lists(st.one_of(
    st.sampled_from(sorted(FLAGS)).flatmap(lambda f: st.tuples(st.just(f), st.sampled_from(FLAGS[f]))).map(list),
    st.sampled_from(SWITCHES).map(lambda s: [s]),
    st.tuples(st.sampled_from(sorted(FLAGS)), st.text(max_size=6)).map(list),
), max_size=5).map(lambda parts: [token for part in parts for token in part])


@FUZZ
@given(BENCH_ARGV)
def test_bench_command_lines(argv):
    from semimig.bench.cli import config_from_args
    from semimig.cli import build_parser

    with tempfile.TemporaryDirectory() as tmp:
        full = ["bench", *argv, "--dry-run", "--no-plots", "--json", str(Path(tmp) / "r.json")]
        code, out, err = run_cli(full)
        assert_clean(code, err, "bench")
        if code == 0:
            assert "dry run: settings checked, no rank started" in out
            args = build_parser().parse_args(full)
            cfg = config_from_args(args)  # the one run config, 1-D or 2-D (--allocation)
            assert_conforms(cfg)
            assert not (Path(tmp) / "r.json").exists()


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["--steps", "--batch", "--seed", "--tp"]), st.sampled_from(NUMBERS)),
                max_size=4))
def test_demo_command_lines_are_checked_before_any_rank(pairs):
    from semimig.cli import _check_demo, build_parser
    from semimig.errors import ConfigError

    argv = ["demo", *[t for pair in pairs for t in pair]]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        return  # argparse's type error: one line after its usage (checked for bench above)
    try:
        _check_demo(args)
    except ConfigError as err:
        assert "\n" not in str(err)
        return
    assert 1 <= args.steps <= 10_000 and 1 <= args.batch <= 1000 and args.tp in (1, 2, 4)


# ------------------------------------------------------------------------------------ JSON files
JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 2**40), st.sampled_from([0.5, 1.0, 4.0, -1.0, 1e300]),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5), st.sampled_from(["1", "high"])),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(st.text(max_size=4), children,
                                                                                  max_size=3)),
    max_leaves=6)


def _record(mode, chi, seed):
    return {"mode": mode, "chi": chi, "seed": seed, "lambda": None, "iter_time_s": 0.1, "epoch_time_s": 2.5,
            "accuracy": 0.9, "migrating_stragglers": 0, "shed_share_by_rank": [0.0, 0.5]}


REPORT_BASE = {"records": [_record(m, c, s) for m in ("baseline", "semi") for c in (1.0, 4.0) for s in (0, 1)],
               "summary": [], "machine": {"cpus": 2},
               "config": {"modes": ["baseline", "semi"], "chis": [1.0, 4.0], "seeds": [0, 1], "lambdas": [],
                          "tp": 2, "pattern": "fixed", "epochs": 4}}


def _paths(doc, prefix=()):
    """Every (container, key) path of a JSON document."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield prefix + (key,)
            yield from _paths(value, prefix + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield prefix + (i,)
            yield from _paths(value, prefix + (i,))


def mutated(base: dict) -> st.SearchStrategy:
    """``base`` with one to three keys replaced by any JSON value or deleted."""
    paths = list(_paths(base))

    def apply(edits):
        doc = json.loads(json.dumps(base))
        for path, value, delete in edits:
            parent = doc
            try:
                for key in path[:-1]:
                    parent = parent[key]
                if delete:
                    del parent[path[-1]]
                else:
                    parent[path[-1]] = value
            except (KeyError, IndexError, TypeError):
                pass  # an earlier edit removed or replaced this path
        return doc

    edit = st.tuples(st.sampled_from(paths), JSON_VALUE, st.booleans())
    return st.lists(edit, min_size=1, max_size=3).map(apply)


def _write(tmp: str, name: str, doc) -> Path:
    path = Path(tmp) / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


@FUZZ
@given(st.one_of(mutated(REPORT_BASE), JSON_VALUE, st.text(max_size=20)))
def test_report_json(doc):
    with tempfile.TemporaryDirectory() as tmp:
        saved = _write(tmp, "saved.json", doc)
        out = Path(tmp) / "merged.json"
        code, _, err = run_cli(["report", str(saved), "--no-plots", "--json", str(out)])
        assert_clean(code, err, "report")
        if code == 0:
            merged = json.loads(out.read_text())
            for row in merged["summary"]:
                assert math.isfinite(row["iter_time_s"]) and row["iter_time_s"] > 0


PLAN_BASE = {"devices": [{"name": "a", "max_batch_size": 64, "peak_speed": 900.0},
                         {"max_batch_size": 32, "points": [[1, 0.01], [16, 0.05], [32, 0.09]],
                          "interpolation": "linear"}],
             "comm_time_s": 0.01}


@FUZZ
@given(doc=st.one_of(mutated(PLAN_BASE), JSON_VALUE, st.text(max_size=20)),
       gbs=st.sampled_from(["96", "1", "0", "-1", "100000", "10**11", "x", "97"]),
       flags=st.lists(st.sampled_from([["--zero-stage", "2"], ["--zero-stage", "5"], ["--comm-time", "inf"],
                                       ["--comm-time", "-1"], ["--max-accumulation-steps", "0"],
                                       ["--max-accumulation-steps", "2"]]), max_size=2))
def test_plan_json_and_flags(doc, gbs, flags):
    with tempfile.TemporaryDirectory() as tmp:
        spec = _write(tmp, "spec.json", doc)
        argv = ["plan", str(spec), "--global-batch-size", gbs, *[t for f in flags for t in f]]
        code, out, err = run_cli(argv)
        assert_clean(code, err, "plan")
