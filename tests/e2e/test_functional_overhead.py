"""``benchmarks/overhead_bench.py``: its statistics are right and a tiny run compares the right things.

The figures themselves are measurements (README); here: the per-repetition summaries and paired
ratios on hand-made numbers, and one tiny interleaved run on 2 ranks whose variants all ran.
"""
import importlib
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    monkeypatch.delitem(sys.modules, "overhead_bench", raising=False)
    return importlib.import_module("overhead_bench")


def test_summaries_and_paired_ratios(bench):
    s = bench.summarise([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (s["median"], s["min"], s["max"], s["q1"], s["q3"]) == (3.0, 1.0, 5.0, 2.0, 4.0)
    per_rep = {"wall": {"cai": [1.0, 2.0, 4.0], "semimig": [1.1, 2.0, 4.4]},
               "cpu": {"cai": [1.0, 1.0, 1.0], "semimig": [1.0, 1.02, 0.98]}}
    rec = bench.case_record("layers", "col", per_rep)
    # paired per repetition: 1.1, 1.0, 1.1 -> median 1.1 (a ratio of medians would give 2.0 / 2.0 = 1.0)
    assert rec["wall"]["ratio_to_cai"]["semimig"]["median"] == pytest.approx(1.1)
    assert rec["wall"]["ratio_to_cai"]["semimig"]["min"] == pytest.approx(1.0)
    assert rec["cpu"]["ratio_to_cai"]["semimig"]["max"] == pytest.approx(1.02)
    assert "cai" not in rec["wall"]["ratio_to_cai"]
    table = bench.format_records([rec])
    assert "1.100 [1.000-1.100]" in table and "semimig" in table


def test_config_rejects_bad_values(bench):
    with pytest.raises(ValueError, match="parts must be"):
        bench.OverheadConfig(parts=("gpu",))
    with pytest.raises(ValueError, match="reps must be an int >= 1, got 0"):
        bench.OverheadConfig(reps=0)
    with pytest.raises(ValueError, match="three even ints"):
        bench.OverheadConfig(layer_shapes=((8, 3, 4),))
    with pytest.raises(ValueError, match="llm_hidden must be an int multiple of 16 .16 heads., got 40"):
        bench.OverheadConfig(llm_hidden=40)


def test_tiny_layers_and_llm_runs_interleave_every_variant(bench, tmp_path):
    out = tmp_path / "o.json"
    cfg = bench.OverheadConfig(parts=("layers", "llm"), reps=2, iters=1, warmup=0, layer_shapes=((8, 16, 16),),
                               llm_hidden=32)
    from semimig.launch import run_on_ranks

    records = run_on_ranks(bench._bench_body, 2, cfg, timeout_s=180)
    assert [r["case"] for r in records] == ["col 8x16x16", "row 8x16x16", "llama h32 L2 kv8 b4x128"]
    variants = {"layers": {"cai", "semimig", "directive", "timed"}, "llm": {"cai", "semimig", "off", "semi"}}
    for r in records:
        assert set(r["wall"]["per_rep_s"]) == variants[r["part"]]
        assert all(len(v) == 2 and min(v) > 0 for v in r["wall"]["per_rep_s"].values())
    # the example's modes through semimig.enable, each stepped by its hooked optimizer once per iteration;
    # nobody straggles, so neither plans a pruned column
    llm = records[-1]["controller"]
    assert set(llm) == {"off", "semi"}
    for c in llm.values():
        assert c["iterations"] == 2 and c["pruned_iterations_by_rank"] == [0, 0] and c["max_gamma_by_rank"] == [0.0, 0.0]
    assert bench.main(["--json", str(out), "--parts", "layers", "--reps", "0"]) == 2 and not out.exists()
