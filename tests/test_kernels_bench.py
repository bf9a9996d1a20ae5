"""Smoke test of ``benchmarks/kernel_bench.py --quick``: it runs here and writes the promised records."""
import importlib.util
import json
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_bench.py"


def test_kernel_bench_quick_writes_records(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("kernel_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "kernels.json"
    assert bench.main(["--json", str(out), "--quick"]) == 0
    result = json.loads(out.read_text())
    records = result["records"]
    cuda = torch.cuda.is_available()
    impls = {"torch_gather", "dense_kprime", "dense_full"} | ({"fused"} if cuda else set())
    assert {r["impl"] for r in records} == impls
    assert {r["pass"] for r in records} == {"fwd", "dgrad", "wgrad", "total"}
    assert {r["keep"] for r in records} == {"random", "grouped"}
    for r in records:
        assert {"impl", "pass", "gamma", "dtype", "shape", "keep", "time_ms", "tflops"} <= r.keys()
        assert r["time_ms"] > 0 and r["dtype"] in ("fp16", "bf16")
        k_eff = r["shape"]["K"] if r["impl"] == "dense_full" else r["k_kept"]
        if r["keep"] == "random":
            assert r["k_kept"] == round(r["shape"]["K"] * (1 - r["gamma"]))
        else:  # whole groups: |S| = round(K/g (1 - gamma)) g
            assert r["k_kept"] == round(r["shape"]["K"] // r["group"] * (1 - r["gamma"])) * r["group"]
        flops = 2 * r["shape"]["M"] * r["shape"]["N"] * k_eff * (3 if r["pass"] == "total" else 1)
        assert abs(r["tflops"] - flops / (r["time_ms"] * 1e-3) / 1e12) <= 1e-9 * max(1.0, r["tflops"])
    printed = capsys.readouterr().out
    assert ("no CUDA device" in printed) != cuda  # the CPU run says so
    assert "torch_g/dK'" in printed or "fused/dK'" in printed
