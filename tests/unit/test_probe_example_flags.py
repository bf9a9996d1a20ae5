"""Hypothesis probes of the LLM training binary's (``benchmarks/llm_run.py``) numeric flags, parsed in-process.

``parse_args`` runs every check (``check_flags``) before any process group or model exists, so the
outcome class of a flag value is known without training: **refused** (``SystemExit(2)``, the last
stderr line names the flag and the value, no traceback) or **accepted** (the namespace holds the
value).  The expected class is computed here from the documented bounds and the tiny Llama's shape
(8 attention heads, 4 key/value heads), independently of the example's table.
"""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripts import load_script



def _example():
    return load_script("benchmarks/llm_run.py", "llm_run_probe")


EXAMPLE = _example()
PROBE = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# The documented bounds (the example's help and docs/reliability.md), written out here on purpose.
INT_BOUNDS = {"--hidden": (8, 65536), "--layers": (1, 1024), "--steps": (1, 10**7), "--batch-size": (1, 65536),
              "--seq-len": (2, 1 << 20), "--seed": (0, 2**32 - 1), "--eval-every": (0, 10**7),
              "--eval-batches": (1, 10**5), "--log-every": (1, 10**7), "--shard-block": (1, 1 << 20),
              "--reshard-window": (3, 10**6)}


def _outcome(argv: list, capsys) -> tuple:
    """``("accepted", namespace)`` or ``("refused", the one error line)``; anything else fails the test."""
    try:
        args = EXAMPLE.parse_args(argv)
    except SystemExit as stop:
        err = capsys.readouterr().err.strip().splitlines()
        assert stop.code == 2, (argv, stop.code, err)
        assert err and "Traceback" not in "\n".join(err), err
        return "refused", err[-1]
    return "accepted", args


def _names(line: str, flag: str, text: str) -> bool:
    return flag in line and text in line


def _edge_ints(low: int, high: int):
    return st.one_of(st.integers(low - 3, low + 3), st.integers(high - 3, high + 3),
                     st.integers(-(2**40), 2**40), st.sampled_from([0, -1, low, high, high + 1]))


@pytest.mark.parametrize("flag", sorted(INT_BOUNDS))
@PROBE
@given(data=st.data())
def test_an_integer_flag_is_accepted_exactly_within_its_bounds(flag: str, data, capsys) -> None:
    low, high = INT_BOUNDS[flag]
    value = data.draw(_edge_ints(low, high), label=flag)
    kind, got = _outcome([flag, str(value)], capsys)
    inside = low <= value <= high and (flag != "--hidden" or value % 8 == 0)  # 8 heads divide the width
    if inside:
        assert kind == "accepted" and getattr(got, flag[2:].replace("-", "_")) == value, got
    else:
        assert kind == "refused" and _names(got, flag, str(value)), got


@pytest.mark.parametrize("flag", sorted(INT_BOUNDS) + ["--tp"])
@PROBE
@given(text=st.one_of(st.sampled_from(["", "1.5", "1e3", "inf", "nan", "0x10", "two", "--", "4,2"]),
                      st.text(st.characters(codec="ascii"), min_size=1, max_size=6)))
def test_a_flag_that_is_not_an_integer_is_refused_naming_it(flag: str, text: str, capsys) -> None:
    try:
        int(text)
        return  # a valid literal (e.g. " 7"): covered by the bounds probe
    except ValueError:
        pass
    if text.startswith("-"):
        text_argv = [f"{flag}={text}"]  # argparse would take "-x" for another option
    else:
        text_argv = [flag, text]
    kind, line = _outcome(text_argv, capsys)
    assert kind == "refused" and flag in line, line


FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-1e3, 1e6),
                   st.sampled_from([0.0, -0.0, 1e-300, 100.0, 100.0000001, 1.0, 0.999, 604800.0, 604800.5]))


@PROBE
@given(lr=FLOATS)
def test_lr_is_accepted_exactly_when_finite_in_0_to_100(lr: float, capsys) -> None:
    kind, got = _outcome([f"--lr={lr!r}"], capsys)
    if math.isfinite(lr) and 0 < lr <= 100:
        assert kind == "accepted" and got.lr == lr
    else:
        assert kind == "refused" and _names(got, "--lr", repr(lr)), got


@PROBE
@given(timeout=FLOATS)
def test_timeout_is_accepted_exactly_when_finite_from_1_s_to_a_week(timeout: float, capsys) -> None:
    kind, got = _outcome([f"--timeout-s={timeout!r}"], capsys)
    if math.isfinite(timeout) and 1.0 <= timeout <= 7 * 86400:
        assert kind == "accepted" and got.timeout_s == timeout
    else:
        assert kind == "refused" and _names(got, "--timeout-s", repr(timeout)), got


@PROBE
@given(fraction=FLOATS)
def test_reshard_probe_is_accepted_exactly_when_finite_in_0_to_below_1(fraction: float, capsys) -> None:
    kind, got = _outcome([f"--reshard-probe={fraction!r}"], capsys)
    if math.isfinite(fraction) and 0 <= fraction < 1:
        assert kind == "accepted" and got.reshard_probe == fraction
    else:
        assert kind == "refused" and _names(got, "--reshard-probe", repr(fraction)), got


@PROBE
@given(tp=st.one_of(st.integers(-5, 9), st.integers(-(2**40), 2**40)),
       hidden=st.sampled_from([8, 16, 24, 32, 40, 64, 96, 256, 12, 100]))
def test_tp_and_hidden_are_checked_against_the_tiny_llama_heads(tp: int, hidden: int, capsys) -> None:
    kind, got = _outcome(["--tp", str(tp), "--hidden", str(hidden)], capsys)
    if not 1 <= tp <= 4096:
        assert kind == "refused" and _names(got, "--tp", str(tp)), got
    elif hidden % 8:
        assert kind == "refused" and _names(got, "--hidden", str(hidden)), got
    elif 4 % tp:  # 4 key/value heads
        assert kind == "refused" and _names(got, "--tp", str(tp)), got
    else:
        assert kind == "accepted" and (got.tp, got.hidden) == (tp, hidden)


def test_the_smallest_and_largest_accepted_values_parse_together(capsys) -> None:
    """Every bound at once: accepted (a valid edge configuration is not refused by a neighbour's check)."""
    for pick in (0, 1):
        argv = [arg for flag, bounds in INT_BOUNDS.items() for arg in (flag, str(bounds[pick]))]
        if pick == 1:
            argv[argv.index("--hidden") + 1] = str(65536)  # a multiple of 8 already
        kind, got = _outcome(argv + ["--tp", "1" if pick == 0 else "4"], capsys)
        assert kind == "accepted", got


@PROBE
@given(heads=st.integers(-3, 40), kv=st.integers(-3, 40), tp=st.sampled_from([1, 2, 4]))
def test_heads_and_kv_heads_are_checked_against_hidden_and_tp(heads: int, kv: int, tp: int, capsys) -> None:
    """``--heads`` must divide ``--hidden`` (256 here), ``--kv-heads`` must divide ``--heads`` and be
    divisible by ``--tp``; the refusal names the flag whose value breaks the chain."""
    kind, got = _outcome(["--hidden", "256", "--heads", str(heads), "--kv-heads", str(kv), "--tp", str(tp)], capsys)
    if not 1 <= heads <= 4096:
        assert kind == "refused" and _names(got, "--heads", str(heads)), got
    elif not 1 <= kv <= 4096:
        assert kind == "refused" and _names(got, "--kv-heads", str(kv)), got
    elif 256 % heads:
        assert kind == "refused" and _names(got, "--hidden", "256"), got
    elif heads % kv:
        assert kind == "refused" and _names(got, "--kv-heads", str(kv)), got
    elif kv % tp:
        assert kind == "refused" and _names(got, "--tp", str(tp)), got
    else:
        assert kind == "accepted" and (got.heads, got.kv_heads) == (heads, kv)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("stage", ["0", "1", "2"])
def test_zero_needs_half_precision_and_is_refused_by_name_before_any_rank(stage: str, precision: str, capsys) -> None:
    """Colossal-AI's ZeRO keeps fp32 masters of half-precision weights and asserts so inside
    ``HybridParallelPlugin``; the example refuses the pair before a rank starts, naming both flags."""
    kind, got = _outcome(["--zero-stage", stage, "--precision", precision, "--tp", "1"], capsys)
    if stage != "0" and precision == "fp32":
        assert kind == "refused" and _names(got, "--zero-stage", stage) and "--precision fp32" in got, got
    else:
        assert kind == "accepted" and (got.zero_stage, got.precision) == (int(stage), precision)


# The example's defaults for the flags a checkpoint must share with the run that resumes it.
SAVED_FLAGS = {"model": "tiny-llama", "hidden": 256, "layers": 4, "heads": 8, "kv_heads": 4, "data": "shakespeare",
               "batch_size": 8, "seq_len": 64, "seed": 0, "precision": "fp32", "zero_stage": 0}


def test_save_and_resume_refuse_what_would_overwrite_or_mix_checkpoints(tmp_path, capsys) -> None:
    import json

    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("a user's file")
    kind, line = _outcome(["--save", str(full)], capsys)
    assert kind == "refused" and _names(line, "--save", "not an empty directory"), line
    assert (full / "keep.txt").read_text() == "a user's file"
    (tmp_path / "new.partial").mkdir()
    kind, line = _outcome(["--save", str(tmp_path / "new")], capsys)
    assert kind == "refused" and _names(line, "--save", "new.partial"), line
    kind, line = _outcome(["--save", str(tmp_path / "missing" / "ckpt")], capsys)
    assert kind == "refused" and _names(line, "--save", "does not exist"), line
    (tmp_path / "empty").mkdir()
    assert _outcome(["--save", str(tmp_path / "empty")], capsys)[0] == "accepted"

    kind, line = _outcome(["--resume", str(tmp_path / "empty")], capsys)
    assert kind == "refused" and _names(line, "--resume", "finetune_state.json"), line
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "finetune_state.json").write_text("{not json")
    kind, line = _outcome(["--resume", str(ckpt)], capsys)
    assert kind == "refused" and _names(line, "--resume", "unreadable"), line
    (ckpt / "finetune_state.json").write_text(json.dumps({"step": 5, "flags": {**SAVED_FLAGS, "hidden": 512}}))
    kind, line = _outcome(["--resume", str(ckpt)], capsys)
    assert kind == "refused" and _names(line, "--resume", "--hidden 512 (this run: 256)"), line
    (ckpt / "finetune_state.json").write_text(json.dumps({"step": 5, "flags": SAVED_FLAGS}))
    kind, line = _outcome(["--resume", str(ckpt), "--steps", "5"], capsys)
    assert kind == "refused" and _names(line, "--resume", "--steps (the total) must be larger, got 5"), line
    kind, args = _outcome(["--resume", str(ckpt), "--steps", "8"], capsys)
    assert kind == "accepted" and args.resume_step == 5
