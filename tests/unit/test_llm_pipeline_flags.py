"""The training binary's pipeline and batch-split flags (``--pp``, ``--microbatches``, ``--straggler-stage``,
``--max-micro-batch``): checked
against the launch before any process group, one line naming the flag, exit 2; what a pipeline
cannot take is refused rather than dropped."""
from __future__ import annotations

import contextlib
import io

import pytest

from scripts import load_script


@pytest.fixture(scope="module")
def binary():
    return load_script("benchmarks/llm_run.py", "llm_run_pipeline_flags")


@pytest.fixture
def world(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")


def _refusal(binary, *argv) -> tuple[int, list[str]]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            binary.parse_args(list(argv))
            code = 0
        except SystemExit as stop:
            code = stop.code
    return code, [line for line in err.getvalue().splitlines() if line.strip()]


@pytest.mark.parametrize(("argv", "flag"), [
    (["--pp", "3"], "--pp 3"),                                                   # does not divide 4 ranks
    (["--pp", "2", "--tp", "4"], "--tp 4 x --pp 2"),
    (["--pp", "0"], "--pp"),
    (["--pp", "2", "--microbatches", "3"], "--microbatches 3"),                  # does not divide --batch-size 8
    (["--microbatches", "2"], "--microbatches 2"),                               # no pipeline
    (["--straggler", "fixed:1:4", "--straggler-stage", "1"], "--straggler-stage 1"),
    (["--pp", "2", "--straggler", "fixed:1:4", "--straggler-stage", "2"], "--straggler-stage"),
    (["--pp", "2", "--straggler-stage", "1"], "--straggler-stage 1"),            # no --straggler
    (["--pp", "2", "--tp", "1", "--batch-split", "even"], "--batch-split even"),
    (["--pp", "2", "--tp", "1", "--balance", "reshard"], "--balance reshard"),   # dp 2 per stage
    (["--tp", "2", "--max-micro-batch", "8"], "--max-micro-batch 8"),            # no --batch-split
    (["--tp", "2", "--batch-split", "poplar", "--max-micro-batch", "0"], "--max-micro-batch"),
])
def test_pipeline_flags_that_do_not_fit_are_refused_in_one_line(binary, world, argv, flag):
    code, err = _refusal(binary, *argv)
    assert code == 2 and len(err) == 1 and flag in err[0], err


def test_a_pipeline_takes_the_ranks_over_pp_as_tp_and_pp_micro_batches(binary, world):
    args = binary.parse_args(["--pp", "2", "--straggler", "fixed:1:4", "--straggler-stage", "1"])
    assert (args.pp, args.tp, args.microbatches, args.straggler_stage) == (2, None, 2, 1)
    args = binary.parse_args(["--pp", "4", "--microbatches", "8"])  # tp 1: four stages of one rank
    assert (args.pp, args.microbatches) == (4, 8)
