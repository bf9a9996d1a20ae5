"""``benchmarks/bench_output.interleaved_ms``: the one interleaved timer of the benchmark scripts.

Every repetition calls every callable once, starting one later than the repetition before; the
warm-up calls are not timed; a slept callable reads its sleep in milliseconds; no repetitions is
refused by name.
"""
from __future__ import annotations

import time

import pytest

from scripts import load_script

timer = load_script("benchmarks/bench_output.py", "bench_output_under_test").interleaved_ms


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
