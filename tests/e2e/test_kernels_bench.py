"""Smoke test of ``benchmarks/kernel_bench.py --quick``: it runs here and writes the promised records."""
import json

import pytest
import torch
from scripts import load_script



def _bench_module():
    return load_script("benchmarks/kernel_bench.py", "kernel_bench")


def test_kernel_bench_quick_writes_records(tmp_path, capsys):
    bench = _bench_module()
    out = tmp_path / "kernels.json"
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--json", str(out), "--quick", "--cpu-costs"]) == 0
    finally:
        torch.set_num_threads(threads)
    result = json.loads(out.read_text())
    records = result["records"]
    cuda = torch.cuda.is_available()
    impls = {"torch_gather", "dense_kprime", "dense_full"} | ({"fused"} if cuda else set())
    assert {r["impl"] for r in records} == impls
    assert {r["pass"] for r in records} == {"fwd", "dgrad", "wgrad", "total"}
    assert {r["keep"] for r in records} == ({"random", "grouped"} if cuda else {"random", "run", "grouped"})
    for r in records:
        assert {"impl", "pass", "gamma", "dtype", "shape", "keep", "time_ms", "tflops"} <= r.keys()
        assert r["time_ms"] > 0 and r["dtype"] in (("fp16", "bf16") if cuda else ("fp32",))
        k_eff = r["shape"]["K"] if r["impl"] == "dense_full" else r["k_kept"]
        if r["keep"] in ("random", "run"):
            assert r["k_kept"] == round(r["shape"]["K"] * (1 - r["gamma"]))
        else:  # whole groups: |S| = round(K/g (1 - gamma)) g
            assert r["k_kept"] == round(r["shape"]["K"] // r["group"] * (1 - r["gamma"])) * r["group"]
        flops = 2 * r["shape"]["M"] * r["shape"]["N"] * k_eff * (3 if r["pass"] == "total" else 1)
        assert abs(r["tflops"] - flops / (r["time_ms"] * 1e-3) / 1e12) <= 1e-9 * max(1.0, r["tflops"])
    printed = capsys.readouterr().out
    assert ("no CUDA device" in printed) != cuda  # the CPU run says so
    if not cuda:
        assert "torch_g/dK`" in printed and "F/(F+V)" in printed
        assert {(f["keep"], f["impl"]) for f in result["fixed_cost_fits"]} >= {("random", "torch_gather")}
        assert {row["piece"] for row in result["cpu_costs"]} >= {"plan_keep (once per iteration)", "torch_gather total"}


def test_fixed_cost_fit_recovers_f_and_v():
    bench = _bench_module()
    f, v = bench.fit_fixed_cost([(g, 0.3 + 2.0 * (1 - g)) for g in (0.25, 0.5, 0.75)])
    assert f == pytest.approx(0.3) and v == pytest.approx(2.0)
    with pytest.raises(ValueError, match="two different gammas"):
        bench.fit_fixed_cost([(0.5, 1.0), (0.5, 1.1)])


def test_kernel_bench_mlp_layout_writes_ratios(tmp_path, capsys):
    """``--mlp-layout`` on the ViT shape, one repetition: every layer, impl and pass recorded."""
    bench = _bench_module()
    out = tmp_path / "mlp.json"
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--json", str(out), "--mlp-layout", "--shapes", "vit_mlp", "--reps", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    result = json.loads(out.read_text())
    records = result["mlp_layout"]
    assert {(r["layer"], r["impl"], r["pass"], r["gamma"]) for r in records} == {
        (layer, impl, p, g) for layer in ("col", "row")
        for impl in ("gather", "layout", "layout_fresh", "dense_kprime", "paired", "paired_kprime")
        for p in ("fwd", "dgrad", "wgrad") for g in (0.5, 0.75, 0.9)}
    for r in records:
        kept = round(r["I"] // 8 * (1 - r["gamma"])) * 8
        if r["impl"].startswith("paired") and r["layer"] == "col":  # its own K whole, its rows pruned
            assert r["k_kept"] == r["K"] and r["n_kept"] == kept
        else:
            assert r["k_kept"] == round(r["K"] // 8 * (1 - r["gamma"])) * 8 and r["n_kept"] == r["N"]
        assert len(r["samples_ms"]) == 1
    assert len(result["mlp_ratios"]) == 9
    assert all(r["layout_vs_kprime"] > 0 and r["paired_vs_kprime"] > 0 for r in result["mlp_ratios"])
    printed = capsys.readouterr().out
    assert "layout / dense_kprime <= 1.1" in printed and "paired/gather" in printed


def test_paired_products_equal_the_dense_mlp_of_the_kept_units_and_a_wrong_one_is_caught():
    """The bench's paired path is checked before timing (``_check_paired``); the check can fail."""
    bench = _bench_module()
    gen = torch.Generator().manual_seed(3)
    m, h, i = 12, 16, 32
    x1, w1, dy1 = torch.randn(m, h, generator=gen), torch.randn(i, h, generator=gen), torch.randn(m, i, generator=gen)
    x2, w2, dy2 = torch.randn(m, i, generator=gen), torch.randn(h, i, generator=gen), torch.randn(m, h, generator=gen)
    keep = bench.block_keep(i, 0.5, 8, gen)
    impls = bench.mlp_paired_impls(x1, w1, dy1, x2, w2, dy2, keep)  # raises if a product were wrong
    dw1 = impls["col"]["paired"]["wgrad"]()
    pruned = sorted(set(range(i)) - set(keep.tolist()))
    assert dw1[pruned].abs().sum() == 0 and dw1[keep].abs().sum() > 0
    impls["row"]["paired"]["dgrad"] = lambda: dy2.mm(w2)[:, keep.flip(0)]  # the kept units out of order
    with pytest.raises(AssertionError, match="paired row dgrad differs"):
        bench._check_paired(impls, x1, w1, dy1, x2, w2, dy2, keep.long())
