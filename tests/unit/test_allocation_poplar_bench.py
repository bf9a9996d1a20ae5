"""``benchmarks/poplar_bench.py``'s accounting: the breakdown adds up, the fixed costs are the waits' floor.

Hand-made timings, two ranks and two iterations; every expected number is worked out by hand in
the comments (no run of the benchmark).
"""
import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.delitem(sys.modules, "poplar_bench", raising=False)
    return importlib.import_module("poplar_bench")


def _timing(*, wall, run, fetch, forward, run_coll, step_coll, asked=0.0, taken=0.0):
    return {"wall_s": wall, "run_s": run, "step_s": wall - run, "fetch_s": fetch, "forward_s": forward,
            "run_collectives_s": run_coll, "step_collectives_s": step_coll,
            "sleep_asked_s": asked, "sleep_taken_s": taken}


def test_breakdown_splits_the_critical_ranks_wall_exactly(bench) -> None:
    # rank 1 computes longer (own work 0.9 - 0.05 - 0.02 = 0.83 vs rank 0's 0.9 - 0.3 - 0.02 = 0.58)
    rank0 = [_timing(wall=0.9, run=0.85, fetch=0.01, forward=0.3, run_coll=0.3, step_coll=0.02)] * 2
    rank1 = [_timing(wall=0.9, run=0.85, fetch=0.02, forward=0.6, run_coll=0.05, step_coll=0.02, asked=0.5,
                     taken=0.503)] * 2
    out = bench.breakdown([rank0, rank1], ideal_s=0.7, integer_s=0.75, predicted_s=0.8, model_compute_s=0.72,
                          collectives_s=0.06, optimizer_s=0.02)
    # rank 1: backward own = 0.85 - 0.02 - 0.6 - 0.05 = 0.18; compute 0.78 - model 0.72 = 0.06
    assert out["compute_error"] == pytest.approx(0.06)
    assert out["collectives"] == pytest.approx(0.05 + 0.02 - 0.06)
    assert out["optimizer"] == pytest.approx(0.9 - 0.85 - 0.02 - 0.02)  # step 0.05 outside its 0.02 collectives
    assert out["data"] == pytest.approx(0.02)
    assert out["sleep_overshoot_s"] == pytest.approx(0.003)
    assert (out["granularity"], out["allocator"]) == (pytest.approx(0.05), pytest.approx(0.05))
    assert out["ideal_s"] + sum(out[t] for t in bench.TERMS) == pytest.approx(out["wall_s"]) == pytest.approx(0.9)


def test_fixed_costs_take_the_least_wait_and_the_longest_step(bench) -> None:
    iteration = [  # rank 0 arrives first and waits 40 ms in the reduce; rank 1 arrives last
        [_timing(wall=0.1, run=0.09, fetch=0, forward=0.02, run_coll=0.05, step_coll=0.004)],
        [_timing(wall=0.1, run=0.095, fetch=0, forward=0.08, run_coll=0.01, step_coll=0.003)],
    ]
    fixed = bench.measure_fixed_costs(iteration)
    assert fixed.reduce_s == pytest.approx(0.01)
    assert fixed.step_collectives_s == pytest.approx(0.003)
    assert fixed.optimizer_s == pytest.approx(max(0.01 - 0.004, 0.005 - 0.003))
    assert fixed.comm_time_s(1) == pytest.approx(0.013) and fixed.beyond_comm_s(1) == pytest.approx(0.006)
    assert fixed.comm_time_s(2) == pytest.approx(0.01) and fixed.beyond_comm_s(2) == pytest.approx(0.009)
