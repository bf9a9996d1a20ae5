"""Benchmark the gather-pruned GEMMs against their baselines, in one run.

    python benchmarks/kernel_bench.py --json results/kernels.json [--quick] [--groups 8,16,32]
                                      [--shapes llm_4096x4096,...]

Implementations (``impl``), each timed for ``pass`` in fwd, dgrad, wgrad and total (the three
in sequence):

- ``fused``: the Triton kernels (gather through the index tensor, scatter with zero fill);
  called directly, so at gamma = 0 this is the kernel itself, not the dense shortcut that
  ``semimig.kernels`` takes for a dense keep set.
- ``torch_gather``: the pure-torch twins (``index_select`` + matmul + ``index_copy_`` into zeros).
- ``dense_kprime``: dense matmuls on operands compacted beforehand to K' = |S| columns (the
  compaction is not timed): the physical limit for this amount of work.
- ``dense_full``: dense matmuls at the full K.

Shapes: ViT-1B-like (hidden 2048, MLP 4·2048, M = 64·65 tokens) and LLM-like (M = 8192;
4096×4096 and 11008×4096 as [out, in]); gamma in {0, .25, .5, .75, .9}; fp16 and bf16; keep
sets ``random`` (single columns) and ``grouped`` (aligned groups of g).  GPU times are medians of
``triton.testing.do_bench``; TFLOP/s count the useful work 2·M·N·K' per pass (K for dense_full).

Without a CUDA device the torch implementations run on small shapes and the report says so:
the Triton interpreter is not a performance model, so ``fused`` is not timed on CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from semimig.kernels import reference
from semimig.kernels.keep import KeepPlan, plan_keep

GAMMAS = (0.0, 0.25, 0.5, 0.75, 0.9)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
PASSES = ("fwd", "dgrad", "wgrad", "total")
# name -> (M, N, K): y [M, N] = x [M, K] @ w[N, K]^T
GPU_SHAPES = {
    "vit1b_fc1": (64 * 65, 4 * 2048, 2048),
    "vit1b_fc2": (64 * 65, 2048, 4 * 2048),
    "llm_4096x4096": (8192, 4096, 4096),
    "llm_11008x4096": (8192, 11008, 4096),
}
CPU_SHAPES = {"cpu_small": (128, 256, 512), "cpu_mlp": (128, 1024, 256)}
CPU_QUICK_SHAPES = {"cpu_quick": (64, 256, 256)}
TARGET = {"gamma": 0.5, "dtype": "bf16", "keep": "grouped", "max_vs_kprime": 1.15, "min_vs_torch": 1.3}


def make_keep(kind: str, k: int, gamma: float, group: int, gen: torch.Generator) -> torch.Tensor:
    """Kept columns for pruning ratio ``gamma``: |S| = round(K (1 - gamma)) (whole groups if grouped)."""
    if kind == "random":
        n_kept = round(k * (1 - gamma))
        return torch.sort(torch.randperm(k, generator=gen)[:n_kept]).values
    n_blocks = round(k // group * (1 - gamma))
    blocks = torch.sort(torch.randperm(k // group, generator=gen)[:n_blocks]).values
    return (blocks[:, None] * group + torch.arange(group)).flatten()


def timer(cuda: bool, quick: bool) -> Callable[[Callable[[], object]], float]:
    """Median milliseconds of a callable: ``do_bench`` on GPU, wall clock on CPU."""
    if cuda:
        import triton.testing

        return lambda fn: float(triton.testing.do_bench(fn, return_mode="median"))

    def cpu_median(fn: Callable[[], object]) -> float:
        fn()  # warm-up
        samples = []
        for _ in range(5 if quick else 7):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples)

    return cpu_median


def implementations(x, w, dy, plan: KeepPlan, cuda: bool) -> dict[str, dict[str, Callable[[], object]]]:
    """impl -> pass -> zero-argument callable."""
    keep = plan.keep
    x_kp, w_kp = x[:, keep].contiguous(), w[:, keep].contiguous()  # compacted once, not timed
    impls: dict[str, dict[str, Callable[[], object]]] = {
        "torch_gather": {
            "fwd": lambda: reference.gather_linear_fwd(x, w, None, plan),
            "dgrad": lambda: reference.gather_linear_dgrad(dy, w, plan),
            "wgrad": lambda: reference.gather_linear_wgrad(dy, x, plan),
        },
        "dense_kprime": {
            "fwd": lambda: F.linear(x_kp, w_kp),
            "dgrad": lambda: dy.mm(w_kp),
            "wgrad": lambda: dy.t().mm(x_kp),
        },
        "dense_full": {
            "fwd": lambda: F.linear(x, w),
            "dgrad": lambda: dy.mm(w),
            "wgrad": lambda: dy.t().mm(x),
        },
    }
    if cuda:
        from semimig.kernels import triton_gather as tg

        impls["fused"] = {
            "fwd": lambda: tg.gather_linear_fwd(x, w, None, plan),
            "dgrad": lambda: tg.gather_linear_dgrad(dy, w, plan),
            "wgrad": lambda: tg.gather_linear_wgrad(dy, x, plan),
        }
    for passes in impls.values():
        fwd, dgrad, wgrad = passes["fwd"], passes["dgrad"], passes["wgrad"]
        passes["total"] = lambda fwd=fwd, dgrad=dgrad, wgrad=wgrad: (fwd(), dgrad(), wgrad())
    return impls


def check_fused(impls: dict, dtype: torch.dtype) -> float:
    """Largest relative difference between fused and torch_gather outputs (sanity, GPU only)."""
    worst = 0.0
    for p in ("fwd", "dgrad", "wgrad"):
        a, b = impls["fused"][p]().float(), impls["torch_gather"][p]().float()
        worst = max(worst, ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item())
    return worst


def run(args: argparse.Namespace) -> dict:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        shapes = {"llm_4096x4096": GPU_SHAPES["llm_4096x4096"]} if args.quick else GPU_SHAPES
        gammas, dtypes = ((0.0, 0.5, 0.9), ["bf16"]) if args.quick else (GAMMAS, list(DTYPES))
        device_name = torch.cuda.get_device_name(device)
    else:
        shapes = CPU_QUICK_SHAPES if args.quick else CPU_SHAPES
        gammas, dtypes = ((0.0, 0.5, 0.9) if args.quick else GAMMAS), list(DTYPES)
        device_name = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
        print("NOTE: no CUDA device. Timing the torch implementations only (torch_gather, dense_kprime,")
        print("      dense_full) on small CPU shapes; the Triton 'fused' kernels are not timed (the")
        print("      interpreter is not a performance model). These numbers say nothing about the GPU target.")
    if args.shapes is not None:
        shapes = {name: shape for name, shape in {**GPU_SHAPES, **CPU_SHAPES}.items() if name in args.shapes}
    bench = timer(cuda, args.quick)
    gen = torch.Generator().manual_seed(0)
    records, checks = [], []
    for shape_name, (m, n, k) in shapes.items():
        for dtype_name in dtypes:
            dtype = DTYPES[dtype_name]
            x = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
            w = torch.randn(n, k, generator=gen).to(device=device, dtype=dtype) / k**0.5
            dy = torch.randn(m, n, generator=gen).to(device=device, dtype=dtype)
            for gamma in gammas:
                for keep_kind, group in [("random", 1)] + [("grouped", g) for g in args.groups]:
                    keep = make_keep(keep_kind, k, gamma, group, gen).to(device)
                    plan = plan_keep(keep, k, device, group=group)
                    impls = implementations(x, w, dy, plan, cuda)
                    if cuda:
                        checks.append((shape_name, dtype_name, gamma, keep_kind, group, check_fused(impls, dtype)))
                    for impl, passes in impls.items():
                        k_eff = k if impl == "dense_full" else plan.n_kept
                        for p in PASSES:
                            ms = bench(passes[p])
                            flops = 2 * m * n * k_eff * (3 if p == "total" else 1)
                            records.append({
                                "impl": impl, "pass": p, "gamma": gamma, "dtype": dtype_name,
                                "shape": {"name": shape_name, "M": m, "N": n, "K": k},
                                "keep": keep_kind, "group": group, "k_kept": plan.n_kept,
                                "time_ms": ms, "tflops": flops / (ms * 1e-3) / 1e12 if ms > 0 else None,
                            })  # fmt: skip
                    print(f"  {shape_name} {dtype_name} gamma={gamma} keep={keep_kind} g={group}: done", flush=True)
    meta = {
        "device": device_name, "cuda": cuda, "quick": args.quick, "torch": torch.__version__,
        "triton": _triton_version(), "python": sys.version.split()[0], "groups": args.groups,
        "timing": "triton.testing.do_bench median" if cuda else "wall-clock median (CPU)",
        "note": None if cuda else "CPU only: torch paths on small shapes; fused not timed",
        "max_rel_diff_fused_vs_torch": max((c[-1] for c in checks), default=None),
    }  # fmt: skip
    return {"meta": meta, "records": records}


def _triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None


def report(result: dict) -> None:
    """Print total-pass times and the ratios fused/dense_kprime and torch_gather/fused."""
    totals: dict[tuple, dict[str, float]] = {}
    for r in result["records"]:
        if r["pass"] == "total":
            key = (r["shape"]["name"], r["dtype"], r["gamma"], r["keep"], r["group"])
            totals.setdefault(key, {})[r["impl"]] = r["time_ms"]
    cuda = result["meta"]["cuda"]
    print(f"\ndevice: {result['meta']['device']}  torch {result['meta']['torch']}  triton {result['meta']['triton']}")
    print("total pass (fwd + dgrad + wgrad), median ms")
    header = f"{'shape':16s} {'dtype':5s} {'gamma':>5s} {'keep':8s} {'g':>3s} {'fused':>9s} {'torch_g':>9s} {'dense_K`':>9s} {'dense_K':>9s}"
    ratio_head = "  fused/dK'  torch_g/fused" if cuda else "  torch_g/dK'"
    print(header + ratio_head)
    for (shape, dtype, gamma, keep, group), t in totals.items():
        fused = t.get("fused", float("nan"))
        fused_text = f"{fused:9.3f}" if cuda else f"{'n/a':>9s}"
        line = (
            f"{shape:16s} {dtype:5s} {gamma:5.2f} {keep:8s} {group:3d} {fused_text} {t['torch_gather']:9.3f} "
            f"{t['dense_kprime']:9.3f} {t['dense_full']:9.3f}"
        )
        if cuda:
            line += f"  {fused / t['dense_kprime']:9.2f}  {t['torch_gather'] / fused:13.2f}"
        else:
            line += f"  {t['torch_gather'] / t['dense_kprime']:11.2f}"
        print(line)
    if not cuda:
        print("\nTarget (GPU only) not evaluated: no CUDA device in this run.")
        return
    for (shape, dtype, gamma, keep, group), t in totals.items():
        if (gamma, dtype, keep) == (TARGET["gamma"], TARGET["dtype"], TARGET["keep"]):
            vs_kprime, vs_torch = t["fused"] / t["dense_kprime"], t["torch_gather"] / t["fused"]
            ok = vs_kprime <= TARGET["max_vs_kprime"] and vs_torch >= TARGET["min_vs_torch"]
            print(
                f"target {shape} g={group}: fused/dense_kprime = {vs_kprime:.2f} (<= {TARGET['max_vs_kprime']}), "
                f"torch_gather/fused = {vs_torch:.2f} (>= {TARGET['min_vs_torch']}): {'MET' if ok else 'NOT MET'}"
            )
    print(f"max relative difference fused vs torch_gather: {result['meta']['max_rel_diff_fused_vs_torch']:.2e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="where to write {meta, records}")
    parser.add_argument("--quick", action="store_true", help="one shape, three gammas (a smoke run)")
    parser.add_argument(
        "--groups", type=lambda s: [int(g) for g in s.split(",")], default=None,
        help="group sizes for the grouped keep sets (default 8,16,32; --quick: 32)",
    )  # fmt: skip
    parser.add_argument(
        "--shapes", type=lambda s: s.split(","), default=None,
        help=f"subset of shapes to run (to split a long GPU run), from {', '.join(GPU_SHAPES)}",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.shapes is not None:
        unknown = set(args.shapes) - set(GPU_SHAPES) - set(CPU_SHAPES)
        if unknown:
            parser.error(f"--shapes: unknown {sorted(unknown)}; known {sorted(GPU_SHAPES) + sorted(CPU_SHAPES)}")
    if args.groups is None:
        args.groups = [32] if args.quick else [8, 16, 32]
    if any(g not in (8, 16, 32) for g in args.groups):
        parser.error(f"--groups must be drawn from 8, 16, 32, got {args.groups}")
    result = run(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    report(result)
    print(f"\nwrote {len(result['records'])} records to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
