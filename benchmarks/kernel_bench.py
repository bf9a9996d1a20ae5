"""Benchmark the gather-pruned GEMMs against their baselines, in one run.

    python benchmarks/kernel_bench.py --json results/kernels.json [--quick] [--groups 8,16,32]
                                      [--shapes llm_4096x4096,...]

Implementations (``impl``), each timed for ``pass`` in fwd, dgrad, wgrad and total (the three
in sequence):

- ``fused``: the Triton kernels (gather through the index tensor, scatter with zero fill);
  called directly, so at gamma = 0 this is the kernel itself, not the dense shortcut that
  ``semimig.kernels`` takes for a dense keep set.
- ``torch_gather``: the pure-torch twins (the CPU path: ``index_select`` + matmul, the scatter as a
  second gather; slices for a contiguous keep set).
- ``dense_kprime``: dense matmuls on operands compacted beforehand to K' = |S| columns (the
  compaction is not timed): the physical limit for this amount of work.
- ``dense_full``: dense matmuls at the full K.

Shapes: ViT-1B-like (hidden 2048, MLP 4·2048, M = 64·65 tokens) and LLM-like (M = 8192;
4096×4096 and 11008×4096 as [out, in]); gamma in {0, .25, .5, .75, .9}; fp16 and bf16; keep
sets ``random`` (single columns) and ``grouped`` (aligned groups of g).  GPU times are medians of
``triton.testing.do_bench``; TFLOP/s count the useful work 2·M·N·K' per pass (K for dense_full).

Without a CUDA device the torch implementations run in fp32 with one torch
thread (as a rank of the measured bench does) on the shapes of the bench model's TP layers and of
the column -> row MLP, gamma in {.25, .5, .75}, keep sets ``random``, ``grouped`` (g = 32) and
``run`` (one contiguous range: the slice path).  Implementations are interleaved repetition by
repetition, so machine load hits them alike.  The report prints, side by side, the pruned path
against dense at K' and at K, and fits the controller's model ``T(gamma) = F + V (1 - gamma)``
to each case's totals: ``F`` is the fixed cost of the pruned path (what does not shrink with the
kept columns).  ``--cpu-costs`` also times the pieces of the pruned path apart (plan building,
the operand gathers, the GEMMs at K', the scatters), so ``F`` can be traced to its source.
The Triton interpreter is not a performance model, so ``fused`` is not timed on CPU.

``--mlp-layout``: the column -> GELU -> row MLP of one rank, one thread, at the ViT
shape (M 1088, 256 -> 1536) and an LLM shape (M 512, 1024 -> 4096), gamma in {.5, .75, .9},
block-granular keep sets (``--block``, default 8) in both layers.  Per layer and pass (fwd,
dgrad, wgrad), interleaved repetition by repetition, medians:

- ``gather``: today's pruned path (``reference``: gathers of x[:, S] / w[:, S], full-size
  zero-filled scatters);
- ``layout``: the keep layout (:mod:`semimig.kernels.layout`), the permutation applied once
  (untimed, as a plan change): the row layer's input arrives laid out (its columns are the
  column layer's rows, permuted with it), so all three GEMMs are narrow slices into persistent
  gradient buffers; the column layer's input comes from outside, so its forward gathers
  ``x[:, S]`` (M K' elements, timed, kept for wgrad) and its dgrad scatters ``|S|`` columns;
- ``layout_fresh``: the same with fresh full-size gradients (only the pruned tail zeroed, plus
  the allocation), what a gradient handed to autograd's AccumulateGrad costs;
- ``dense_kprime``: dense products on operands compacted to K' beforehand (untimed);
- ``paired``: *paired* pruning of the MLP, timed on its own (as the layers run it): the row layer's
  kept columns are the MLP's kept intermediate units, so the column layer computes only those
  output rows (the others feed only pruned columns: unread outputs, exactly-zero gradients)
  and keeps all of its own K; the activation between them is compact, so nothing gathers or
  scatters it; same FLOPs as the other paths (:func:`mlp_paired_impls`);
- ``paired_kprime``: that MLP with only the kept units, dense, weights compacted beforehand.

It prints ``layout / dense_kprime`` per pass (target <= 1.10), the paired path beside the gather
path and both dense references, and the MLP's sums.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from bench_output import add_json_flag, interleaved_ms, write_result
from semimig._fit import line_fit
from semimig.kernels import reference
from semimig.kernels.keep import KeepPlan, _gather_source, plan_keep

GAMMAS = (0.0, 0.25, 0.5, 0.75, 0.9)
CPU_GAMMAS = (0.25, 0.5, 0.75)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
PASSES = ("fwd", "dgrad", "wgrad", "total")
# name -> (M, N, K): y [M, N] = x [M, K] @ w[N, K]^T
GPU_SHAPES = {
    "vit1b_fc1": (64 * 65, 4 * 2048, 2048),
    "vit1b_fc2": (64 * 65, 2048, 4 * 2048),
    "llm_4096x4096": (8192, 4096, 4096),
    "llm_11008x4096": (8192, 11008, 4096),
}
TARGET = {"gamma": 0.5, "dtype": "bf16", "keep": "grouped", "max_vs_kprime": 1.15, "min_vs_torch": 1.3}


def cpu_shapes() -> dict[str, tuple[int, int, int]]:
    """The TP layers of one rank at tp = 2: the measured bench ViT's and the column -> row MLP's."""
    from semimig.bench.config import BenchConfig

    bench = BenchConfig(tp=2, compute="measured")
    m, h, i, tp = bench.tokens, bench.size.hidden, bench.size.intermediate, bench.tp
    return {
        "vit_qkv_col": (m, h // tp, h), "vit_out_row": (m, h, h // tp),
        "vit_fc1_col": (m, i // tp, h), "vit_fc2_row": (m, h, i // tp),
        "mlp_fc1_col": (256, 2048 // tp, 512), "mlp_fc2_row": (256, 512, 2048 // tp),
    }


def make_keep(kind: str, k: int, gamma: float, group: int, gen: torch.Generator) -> torch.Tensor:
    """Kept columns for pruning ratio ``gamma``: |S| = round(K (1 - gamma)) (whole groups if grouped).

    ``run`` keeps the contiguous range ``[K - |S|, K)`` (what a rank keeps when the first
    columns are pruned, or its prefix when it migrates its tail): the slice path.
    """
    if kind == "random":
        n_kept = round(k * (1 - gamma))
        return torch.sort(torch.randperm(k, generator=gen)[:n_kept]).values
    if kind == "run":
        return torch.arange(k - round(k * (1 - gamma)), k)
    n_blocks = round(k // group * (1 - gamma))
    blocks = torch.sort(torch.randperm(k // group, generator=gen)[:n_blocks]).values
    return (blocks[:, None] * group + torch.arange(group)).flatten()


def gpu_timer() -> Callable[[Callable[[], object]], float]:
    """Median milliseconds of a callable with ``triton.testing.do_bench``."""
    import triton.testing

    return lambda fn: float(triton.testing.do_bench(fn, return_mode="median"))


def interleaved_cpu_times(fns: dict, reps: int) -> dict:
    """``{key: (median ms, min ms)}`` of :func:`bench_output.interleaved_ms` (one warm-up call each)."""
    return {key: (statistics.median(v), min(v)) for key, v in interleaved_ms(fns, reps).items()}


def fit_fixed_cost(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``(F, V)`` of ``t = F + V (1 - gamma)`` through ``[(gamma, t), ...]`` (>= 2 gammas)."""
    xs, ys = [1.0 - g for g, _ in points], [t for _, t in points]
    if len(set(xs)) < 2:
        raise ValueError(f"fitting F + V (1 - gamma) needs two different gammas, got {sorted(set(1 - x for x in xs))}")
    return line_fit(xs, ys)


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


def _record(impl, p, gamma, dtype_name, shape_name, m, n, k, keep_kind, group, plan, ms, ms_min=None) -> dict:
    k_eff = k if impl == "dense_full" else plan.n_kept
    flops = 2 * m * n * k_eff * (3 if p == "total" else 1)
    return {
        "impl": impl, "pass": p, "gamma": gamma, "dtype": dtype_name,
        "shape": {"name": shape_name, "M": m, "N": n, "K": k},
        "keep": keep_kind, "group": group, "k_kept": plan.n_kept,
        "time_ms": ms, "time_min_ms": ms_min, "tflops": flops / (ms * 1e-3) / 1e12 if ms > 0 else None,
    }  # fmt: skip


def run(args: argparse.Namespace) -> dict:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    all_shapes = {**GPU_SHAPES, **cpu_shapes()}
    if cuda:
        shapes = {"llm_4096x4096": GPU_SHAPES["llm_4096x4096"]} if args.quick else GPU_SHAPES
        gammas, dtypes = ((0.0, 0.5, 0.9), ["bf16"]) if args.quick else (GAMMAS, ["fp16", "bf16"])
        keeps = [("random", 1)] + [("grouped", g) for g in args.groups]
        device_name = torch.cuda.get_device_name(device)
    else:
        torch.set_num_threads(args.threads)
        shapes = {"vit_qkv_col": all_shapes["vit_qkv_col"]} if args.quick else cpu_shapes()
        gammas, dtypes = ((0.25, 0.75) if args.quick else CPU_GAMMAS), ["fp32"]
        keeps = [("random", 1), ("run", 1)] + [("grouped", g) for g in args.groups]
        device_name = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, {args.threads} torch thread(s))"
        print("NOTE: no CUDA device. Timing the torch implementations (torch_gather, dense_kprime, dense_full) in")
        print("      fp32 on the bench model's and the MLP's TP shapes, interleaved; the Triton 'fused' kernels are")
        print("      not timed (the interpreter is not a performance model).  Nothing here says anything about a GPU.")
    if args.shapes is not None:
        shapes = {name: shape for name, shape in all_shapes.items() if name in args.shapes}
    bench = gpu_timer() if cuda else None
    reps = 7 if args.quick else 15
    gen = torch.Generator().manual_seed(0)
    records, checks = [], []
    for shape_name, (m, n, k) in shapes.items():
        for dtype_name in dtypes:
            dtype = DTYPES[dtype_name]
            x = torch.randn(m, k, generator=gen).to(device=device, dtype=dtype)
            w = torch.randn(n, k, generator=gen).to(device=device, dtype=dtype) / k**0.5
            dy = torch.randn(m, n, generator=gen).to(device=device, dtype=dtype)
            for gamma in gammas:
                for keep_kind, group in keeps:
                    keep = make_keep(keep_kind, k, gamma, group, gen).to(device)
                    plan = plan_keep(keep, k, device, group=group)
                    impls = implementations(x, w, dy, plan, cuda)
                    if cuda:
                        checks.append((shape_name, dtype_name, gamma, keep_kind, group, check_fused(impls, dtype)))
                        times = {(i, p): (bench(fn), None) for i, passes in impls.items() for p, fn in passes.items()}
                    else:
                        times = interleaved_cpu_times({(i, p): fn for i, passes in impls.items()
                                                       for p, fn in passes.items()}, reps)
                    for (impl, p), (ms, ms_min) in times.items():
                        records.append(_record(impl, p, gamma, dtype_name, shape_name, m, n, k, keep_kind, group,
                                               plan, ms, ms_min))
                    print(f"  {shape_name} {dtype_name} gamma={gamma} keep={keep_kind} g={group}: done", flush=True)
    meta = {
        "device": device_name, "cuda": cuda, "quick": args.quick, "torch": torch.__version__,
        "triton": _triton_version(), "python": sys.version.split()[0], "groups": args.groups,
        "threads": None if cuda else args.threads,
        "timing": "triton.testing.do_bench median" if cuda else f"wall-clock median of {reps} interleaved repetitions (CPU)",
        "note": None if cuda else "CPU only: torch paths; fused not timed",
        "max_rel_diff_fused_vs_torch": max((c[-1] for c in checks), default=None),
    }  # fmt: skip
    result = {"meta": meta, "records": records}
    if not cuda:
        result["fixed_cost_fits"] = fixed_cost_fits(records)
        if args.cpu_costs:
            result["cpu_costs"] = cpu_costs({n: all_shapes[n] for n in shapes}, reps)
    return result


def fixed_cost_fits(records: list[dict]) -> list[dict]:
    """Per (shape, keep, impl): ``F`` and ``V`` of ``total(gamma) = F + V (1 - gamma)`` over the gammas run.

    Fitted to the fastest repetition of each case (``time_min_ms`` when measured, else the
    median): on a shared CPU the minimum is the cost of the work, the median also the load.
    """
    points: dict[tuple, list] = {}
    for r in records:
        if r["pass"] == "total" and r["impl"] != "dense_full":
            t = r["time_min_ms"] if r.get("time_min_ms") is not None else r["time_ms"]
            points.setdefault((r["shape"]["name"], r["keep"], r["group"], r["impl"]), []).append((r["gamma"], t))
    fits = []
    for (shape, keep, group, impl), pts in points.items():
        if len({g for g, _ in pts}) >= 2:
            f, v = fit_fixed_cost(pts)
            fits.append({"shape": shape, "keep": keep, "group": group, "impl": impl, "F_ms": f, "V_ms": v,
                         "F_share_at_gamma0": f / (f + v) if f + v > 0 else None})
    return fits


def cpu_costs(shapes: dict, reps: int, gamma: float = 0.5) -> list[dict]:
    """The pieces of the pruned path timed apart (random keep set, fp32), in ms per training step."""
    gen = torch.Generator().manual_seed(1)
    rows = []
    for name, (m, n, k) in shapes.items():
        x, w, dy = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen), torch.randn(m, n, generator=gen)
        keep = make_keep("random", k, gamma, 1, gen)
        plan = plan_keep(keep, k, "cpu", group=1)
        kp, keep64 = plan.n_kept, plan.keep64
        source = _gather_source(plan.keep, k)  # column j's place in [S | one zero column]
        x_kp, w_kp = x.index_select(1, plan.keep), w.index_select(1, plan.keep)
        buf_m, buf_n = torch.zeros(m, kp + 1), torch.zeros(n, kp + 1)
        pieces = {
            "plan_keep (once per iteration)": lambda: plan_keep(keep, k, "cpu", group=1),
            "gather x[:, S] (fwd, wgrad)": lambda: (x.index_select(1, plan.keep), x.index_select(1, plan.keep)),
            "gather w[:, S] (fwd, dgrad)": lambda: (w.index_select(1, plan.keep), w.index_select(1, plan.keep)),
            "GEMMs at K' (fwd, dgrad, wgrad)": lambda: (F.linear(x_kp, w_kp), dy.mm(w_kp), dy.t().mm(x_kp)),
            "scatter dx, dw (zeros + scatter_)": lambda: (
                torch.zeros(m, k).scatter_(1, keep64.expand(m, kp), buf_m[:, :kp]),
                torch.zeros(n, k).scatter_(1, keep64.expand(n, kp), buf_n[:, :kp])),
            "old scatter: gather from [S | 0]": lambda: (buf_m.index_select(1, source),
                                                         buf_n.index_select(1, source)),
            "older scatter: zeros + index_copy_": lambda: (torch.zeros(m, k).index_copy_(1, keep64, buf_m[:, :kp]),
                                                           torch.zeros(n, k).index_copy_(1, keep64, buf_n[:, :kp])),
            "torch_gather total": lambda: (reference.gather_linear_fwd(x, w, None, plan),
                                           reference.gather_linear_dgrad(dy, w, plan),
                                           reference.gather_linear_wgrad(dy, x, plan)),
            "dense at K total": lambda: (F.linear(x, w), dy.mm(w), dy.t().mm(x)),
        }
        times = interleaved_cpu_times(pieces, reps)
        rows.extend({"shape": name, "M": m, "N": n, "K": k, "gamma": gamma, "piece": piece, "time_ms": t[0],
                     "time_min_ms": t[1]} for piece, t in times.items())
    return rows


def _triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None


def report(result: dict) -> None:
    """Print total-pass times and ratios: fused/dense_kprime and torch_gather/fused (GPU), or the CPU table."""
    totals: dict[tuple, dict[str, float]] = {}
    for r in result["records"]:
        if r["pass"] == "total":
            key = (r["shape"]["name"], r["dtype"], r["gamma"], r["keep"], r["group"])
            totals.setdefault(key, {})[r["impl"]] = r["time_ms"]
            if r.get("time_min_ms") is not None:
                totals[key][r["impl"] + "_min"] = r["time_min_ms"]
    cuda = result["meta"]["cuda"]
    print(f"\ndevice: {result['meta']['device']}  torch {result['meta']['torch']}  triton {result['meta']['triton']}")
    print(f"total pass (fwd + dgrad + wgrad), {result['meta']['timing']}, ms")
    if not cuda:
        _report_cpu(result, totals)
        return
    print(f"{'shape':16s} {'dtype':5s} {'gamma':>5s} {'keep':8s} {'g':>3s} {'fused':>9s} {'torch_g':>9s} "
          f"{'dense_K`':>9s} {'dense_K':>9s}  fused/dK'  torch_g/fused")
    for (shape, dtype, gamma, keep, group), t in totals.items():
        fused = t["fused"]
        print(f"{shape:16s} {dtype:5s} {gamma:5.2f} {keep:8s} {group:3d} {fused:9.3f} {t['torch_gather']:9.3f} "
              f"{t['dense_kprime']:9.3f} {t['dense_full']:9.3f}  {fused / t['dense_kprime']:9.2f}  "
              f"{t['torch_gather'] / fused:13.2f}")
    for (shape, dtype, gamma, keep, group), t in totals.items():
        if (gamma, dtype, keep) == (TARGET["gamma"], TARGET["dtype"], TARGET["keep"]):
            vs_kprime, vs_torch = t["fused"] / t["dense_kprime"], t["torch_gather"] / t["fused"]
            ok = vs_kprime <= TARGET["max_vs_kprime"] and vs_torch >= TARGET["min_vs_torch"]
            print(
                f"target {shape} g={group}: fused/dense_kprime = {vs_kprime:.2f} (<= {TARGET['max_vs_kprime']}), "
                f"torch_gather/fused = {vs_torch:.2f} (>= {TARGET['min_vs_torch']}): {'MET' if ok else 'NOT MET'}"
            )
    print(f"max relative difference fused vs torch_gather: {result['meta']['max_rel_diff_fused_vs_torch']:.2e}")


def _report_cpu(result: dict, totals: dict) -> None:
    print("medians; ratios of medians, then [ratios of the fastest repetitions]")
    print(f"{'shape':12s} {'gamma':>5s} {'keep':8s} {'g':>3s} {'torch_g':>9s} {'dense_K`':>9s} {'dense_K':>9s}"
          f"  {'torch_g/dK`':>18s} {'torch_g/dK':>18s} {'dK`/dK':>14s} {'1-gamma':>7s}")
    for (shape, _, gamma, keep, group), t in totals.items():
        tg, kp, full = t["torch_gather"], t["dense_kprime"], t["dense_full"]
        tg_min, kp_min, full_min = t["torch_gather_min"], t["dense_kprime_min"], t["dense_full_min"]
        print(f"{shape:12s} {gamma:5.2f} {keep:8s} {group:3d} {tg:9.3f} {kp:9.3f} {full:9.3f}"
              f"  {tg / kp:9.2f} [{tg_min / kp_min:5.2f}] {tg / full:9.2f} [{tg_min / full_min:5.2f}]"
              f" {kp / full:6.2f} [{kp_min / full_min:4.2f}] {1 - gamma:7.2f}")
    print("\nfit of the fastest repetitions, total(gamma) = F + V (1 - gamma) (F: fixed cost of the path, ms)")
    print(f"{'shape':12s} {'keep':8s} {'g':>3s} {'impl':13s} {'F':>8s} {'V':>8s} {'F/(F+V)':>8s}")
    for fit in result["fixed_cost_fits"]:
        share = fit["F_share_at_gamma0"]
        print(f"{fit['shape']:12s} {fit['keep']:8s} {fit['group']:3d} {fit['impl']:13s} {fit['F_ms']:8.3f} "
              f"{fit['V_ms']:8.3f} {share if share is not None else float('nan'):8.2f}")
    if result.get("cpu_costs"):
        print("\npieces of the pruned path (random keep set), ms per training step: median (fastest)")
        for row in result["cpu_costs"]:
            print(f"{row['shape']:12s} gamma {row['gamma']:.2f}  {row['piece']:40s} {row['time_ms']:8.3f} "
                  f"({row['time_min_ms']:.3f})")


MLP_SHAPES = {"vit_mlp": (1088, 256, 1536), "llm_mlp": (512, 1024, 4096)}  # M, H, I
MLP_GAMMAS = (0.5, 0.75, 0.9)
MLP_TARGET = 1.10


def mlp_layout_impls(x, w, dy, keep: torch.Tensor, block: int, paired: bool) -> dict:
    """impl -> pass -> callable for one layer (y = x @ w^T, K pruned to ``keep``); see the module docstring."""
    from semimig.kernels import layout as L

    k = w.shape[1]
    plan = plan_keep(keep, k, x.device)  # the gather path as the layers build it (group detected)
    lay = L.layout_keep(keep, k, x.device, block=block)
    w_l = lay.to_layout(w)  # once per plan change
    x_l = lay.to_layout(x)  # paired: produced laid out by the previous layer's permuted rows
    x_kp, w_kp = x[:, keep].contiguous(), w[:, keep].contiguous()
    dx_buf, dw_buf = L.GradBuffer(), L.GradBuffer()
    saved = {}
    if paired:
        layout = {"fwd": lambda: L.layout_fwd(x_l, w_l, None, lay),
                  "dgrad": lambda: L.layout_dgrad(dy, w_l, lay, dx_buf),
                  "wgrad": lambda: L.layout_wgrad(dy, x_l, lay, dw_buf)}
        fresh = {"fwd": layout["fwd"], "dgrad": lambda: L.layout_dgrad(dy, w_l, lay),
                 "wgrad": lambda: L.layout_wgrad(dy, x_l, lay)}
    else:
        def fwd():
            saved["xs"] = xs = x.index_select(1, lay.perm[: lay.n_kept])  # kept for wgrad
            return F.linear(xs, lay.kept(w_l))

        def wgrad(buffer):
            out = buffer.get(dy.shape[1], lay, dy) if buffer is not None else dy.new_empty(dy.shape[1], k)
            if buffer is None:
                out[:, lay.n_kept:].zero_()
            torch.mm(dy.t(), saved["xs"], out=lay.kept(out))
            if buffer is not None:
                buffer.written()
            return out

        layout = {"fwd": fwd, "dgrad": lambda: L.scatter_dgrad(dy, w_l, lay, dx_buf), "wgrad": lambda: wgrad(dw_buf)}
        fresh = {"fwd": fwd, "dgrad": lambda: L.scatter_dgrad(dy, w_l, lay), "wgrad": lambda: wgrad(None)}
    return {
        "gather": {"fwd": lambda: reference.gather_linear_fwd(x, w, None, plan),
                   "dgrad": lambda: reference.gather_linear_dgrad(dy, w, plan),
                   "wgrad": lambda: reference.gather_linear_wgrad(dy, x, plan)},
        "layout": layout,
        "layout_fresh": fresh,
        "dense_kprime": {"fwd": lambda: F.linear(x_kp, w_kp), "dgrad": lambda: dy.mm(w_kp),
                         "wgrad": lambda: dy.t().mm(x_kp)},
    }


def mlp_paired_impls(x1, w1, dy1, x2, w2, dy2, keep: torch.Tensor) -> dict:
    """``{"col": impls, "row": impls}`` of the *paired* pruning of one MLP (module docstring).

    The row layer's kept columns ``S`` are the MLP's kept intermediate units; the column layer
    then computes only its output rows ``S`` (rows ``P`` feed only the row layer's pruned
    columns: their outputs are never read and their gradients are exact zeros), so the
    activation between the layers is compact ``[M, |S|]`` and neither layer gathers or scatters
    it.  ``paired`` calls what the layers call (``reference.rows_linear_*`` and
    ``compact_linear_*``, as ``semimig.nn.functional`` does): the weight slices ``w1[S, :]`` (rows)
    and ``w2[:, S]`` (columns) are gathered in forward and reused by the dgrad; ``dw1`` / ``dw2``
    are fresh full-size gradients (autograd owns them), the compact products scattered into them.
    Untimed: the compact activation ``x2[:, S]`` and its gradient ``dy1[:, S]``, which the other
    layer's compact products hand over.  ``paired_kprime``: the same MLP with ``|S|`` units,
    dense, on weights compacted beforehand (the physical limit of the paired form).  The results
    are checked against the dense products of the kept units before anything is timed.
    """
    s = keep.long()
    i, h = w1.shape
    plan = plan_keep(keep, i, keep.device)
    x2c, dy1c = x2.index_select(1, s).contiguous(), dy1.index_select(1, s).contiguous()
    w1c, w2c = w1.index_select(0, s).contiguous(), w2.index_select(1, s).contiguous()
    saved: dict[str, torch.Tensor] = {}

    def col_fwd():
        saved["w1s"], y = reference.rows_linear_fwd(x1, w1, None, s)
        return y

    def row_fwd():
        saved["w2s"], y = reference.compact_linear_fwd(x2c, w2, plan)
        return y

    impls = {
        "col": {"paired": {"fwd": col_fwd, "dgrad": lambda: dy1c.mm(saved["w1s"]),
                           "wgrad": lambda: reference.rows_linear_wgrad(dy1c, x1, s, i)},
                "paired_kprime": {"fwd": lambda: F.linear(x1, w1c), "dgrad": lambda: dy1c.mm(w1c),
                                  "wgrad": lambda: dy1c.t().mm(x1)}},
        "row": {"paired": {"fwd": row_fwd, "dgrad": lambda: dy2.mm(saved["w2s"]),
                           "wgrad": lambda: reference.compact_linear_wgrad(dy2, x2c, plan)},
                "paired_kprime": {"fwd": lambda: F.linear(x2c, w2c), "dgrad": lambda: dy2.mm(w2c),
                                  "wgrad": lambda: dy2.t().mm(x2c)}},
    }
    _check_paired(impls, x1, w1, dy1, x2, w2, dy2, s)
    return impls


def _check_paired(impls: dict, x1, w1, dy1, x2, w2, dy2, s: torch.Tensor) -> None:
    """The paired products equal the dense MLP's restricted to the kept units (fp32 tolerance)."""
    col, row = impls["col"]["paired"], impls["row"]["paired"]
    dw1, dw2 = torch.zeros_like(w1), torch.zeros_like(w2)
    dw1[s], dw2[:, s] = dy1[:, s].t().mm(x1), dy2.t().mm(x2[:, s])
    expected = {
        ("col", "fwd"): F.linear(x1, w1)[:, s], ("col", "dgrad"): dy1[:, s].mm(w1[s]), ("col", "wgrad"): dw1,
        ("row", "fwd"): F.linear(x2[:, s], w2[:, s]), ("row", "dgrad"): dy2.mm(w2)[:, s], ("row", "wgrad"): dw2,
    }
    for (layer, p), want in expected.items():
        got = (col if layer == "col" else row)[p]()
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            raise AssertionError(f"paired {layer} {p} differs from the dense product of the kept units "
                                 f"(max |diff| {float((got - want).abs().max()):.3g})")


def block_keep(k: int, gamma: float, block: int, gen: torch.Generator) -> torch.Tensor:
    """Random whole aligned blocks of ``block`` columns, |S| = round(K/g (1 - gamma)) blocks."""
    n_blocks = round(k // block * (1 - gamma))
    blocks = torch.sort(torch.randperm(k // block, generator=gen)[:n_blocks]).values
    return (blocks[:, None] * block + torch.arange(block)).flatten()


def paired_cpu_samples(layers: dict, reps: int) -> dict:
    """``{(layer, impl, pass): [ms per repetition]}`` (:func:`bench_output.interleaved_ms`): in each
    repetition every (layer, pass, implementation) runs once, in a rotating order in which the
    implementations of one layer and pass stand next to each other, so a burst of load from a
    neighbour hits the ones compared with each other alike (ratios are taken per repetition)."""
    for impls in layers.values():
        for passes in impls.values():
            for fn in passes.values():
                fn()  # warm-up (also leaves the column layer's saved x[:, S] for its wgrad)
    return interleaved_ms({(layer, impl, p): impls[impl][p]
                           for layer, impls in layers.items() for p in ("fwd", "dgrad", "wgrad") for impl in impls},
                          reps, warmup=0)


def run_mlp_layout(args: argparse.Namespace) -> dict:
    """The ``--mlp-layout`` measurement (CPU, ``args.threads`` torch threads)."""
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    shapes = MLP_SHAPES if args.shapes is None else {n: s for n, s in MLP_SHAPES.items() if n in args.shapes}
    records = []
    for name, (m, h, i) in shapes.items():
        x1, w1 = torch.randn(m, h, generator=gen), torch.randn(i, h, generator=gen) / h**0.5
        x2, w2 = torch.randn(m, i, generator=gen), torch.randn(h, i, generator=gen) / i**0.5
        dy1, dy2 = torch.randn(m, i, generator=gen), torch.randn(m, h, generator=gen)
        for gamma in MLP_GAMMAS:
            keep1, keep2 = block_keep(h, gamma, args.block, gen), block_keep(i, gamma, args.block, gen)
            layers = {"col": mlp_layout_impls(x1, w1, dy1, keep1, args.block, paired=False),
                      "row": mlp_layout_impls(x2, w2, dy2, keep2, args.block, paired=True)}
            for layer, impls in mlp_paired_impls(x1, w1, dy1, x2, w2, dy2, keep2).items():
                layers[layer].update(impls)
            samples = paired_cpu_samples(layers, args.reps)
            for (layer, impl, p), times in samples.items():
                n, k, kept = (i, h, keep1.numel()) if layer == "col" else (h, i, keep2.numel())
                rows = n
                if impl.startswith("paired") and layer == "col":  # the row layer's kept units prune its rows
                    kept, rows = h, keep2.numel()
                records.append({"shape": name, "M": m, "H": h, "I": i, "layer": layer, "N": n, "K": k,
                                "k_kept": kept, "n_kept": rows, "gamma": gamma, "block": args.block, "impl": impl, "pass": p,
                                "time_ms": statistics.median(times), "time_min_ms": min(times), "samples_ms": times})
            print(f"  {name} gamma={gamma}: done", flush=True)
    meta = {"device": f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                      f"{args.threads} torch thread(s))", "torch": torch.__version__, "reps": args.reps,
            "timing": f"wall-clock median of {args.reps} interleaved repetitions", "block": args.block,
            "load_avg_at_end": os.getloadavg()}
    return {"meta": meta, "mlp_layout": records}


def mlp_ratios(records: list[dict]) -> list[dict]:
    """Per (shape, gamma, pass): each impl's MLP time (col + row, median over repetitions) and its
    ratio to dense_kprime: the median over repetitions of the per-repetition ratio of the MLP sums
    (``*_vs_kprime``), the same for each layer alone (``col_*``, ``row_*``), and the ratio of the
    fastest repetitions (``*_vs_kprime_min``)."""
    cells: dict[tuple, dict[str, list[float]]] = {}
    for r in records:
        cell = cells.setdefault((r["shape"], r["gamma"], r["pass"]), {})
        cell[f"{r['layer']}:{r['impl']}"] = r["samples_ms"]
    rows = []
    for (shape, gamma, p), c in cells.items():
        impls = sorted({key.split(":")[1] for key in c})
        mlp = {impl: [a + b for a, b in zip(c[f"col:{impl}"], c[f"row:{impl}"])] for impl in impls}
        row = {"shape": shape, "gamma": gamma, "pass": p}
        for impl in impls:
            row[impl] = statistics.median(mlp[impl])
            if impl == "dense_kprime":
                continue
            row[f"{impl}_vs_kprime"] = statistics.median(a / b for a, b in zip(mlp[impl], mlp["dense_kprime"]))
            row[f"{impl}_vs_kprime_min"] = min(mlp[impl]) / min(mlp["dense_kprime"])
            for layer in ("col", "row"):
                row[f"{layer}_{impl}_vs_kprime"] = statistics.median(
                    a / b for a, b in zip(c[f"{layer}:{impl}"], c[f"{layer}:dense_kprime"]))
        rows.append(row)
    return rows


def report_mlp(result: dict) -> None:
    meta = result["meta"]
    print(f"\n{meta['device']}, torch {meta['torch']}, {meta['timing']}, block {meta['block']}, "
          f"load average at the end {tuple(round(v, 2) for v in meta['load_avg_at_end'])}")
    print("column -> row MLP (GEMMs only): medians in ms; ratios to dense on pre-compacted operands (dense_kprime):")
    print("median of the per-repetition ratios [ratio of the fastest repetitions]; col / row: the layout, each layer alone")
    print(f"{'shape':8s} {'gamma':>5s} {'pass':6s} {'gather':>8s} {'layout':>8s} {'fresh':>8s} {'dense_K`':>8s}"
          f"  {'gather/dK`':>13s} {'layout/dK`':>13s} {'fresh/dK`':>13s} {'col':>5s} {'row':>5s}")
    worst = 0.0
    for r in result["mlp_ratios"]:
        worst = max(worst, r["layout_vs_kprime"])
        print(f"{r['shape']:8s} {r['gamma']:5.2f} {r['pass']:6s} {r['gather']:8.3f} {r['layout']:8.3f} "
              f"{r['layout_fresh']:8.3f} {r['dense_kprime']:8.3f}  "
              + "  ".join(f"{r[f'{i}_vs_kprime']:5.2f} [{r[f'{i}_vs_kprime_min']:5.2f}]"
                          for i in ("gather", "layout", "layout_fresh"))
              + f" {r['col_layout_vs_kprime']:5.2f} {r['row_layout_vs_kprime']:5.2f}")
    verdict = "MET" if worst <= MLP_TARGET else "NOT MET"
    print(f"target: layout / dense_kprime <= {MLP_TARGET} for every shape, gamma and pass: worst {worst:.2f}, {verdict}")
    if not any("paired" in r for r in result["mlp_ratios"]):
        return
    print("\npaired pruning (the row layer's kept units also prune the column layer's rows; same FLOPs):")
    print("paired: the layers' own calls; col / row: paired / dense at K', each layer alone")
    print(f"{'shape':8s} {'gamma':>5s} {'pass':6s} {'paired':>8s} {'p_dK`':>8s}  {'paired/dK`':>13s} "
          f"{'paired/p_dK`':>13s} {'paired/gather':>13s} {'col':>5s} {'row':>5s}")
    totals: dict[tuple, dict[str, float]] = {}
    worst = 0.0
    for r in result["mlp_ratios"]:
        worst = max(worst, r["paired_vs_kprime"])
        print(f"{r['shape']:8s} {r['gamma']:5.2f} {r['pass']:6s} {r['paired']:8.3f} {r['paired_kprime']:8.3f}  "
              f"{r['paired_vs_kprime']:5.2f} [{r['paired_vs_kprime_min']:5.2f}]  "
              f"{r['paired'] / r['paired_kprime']:13.2f} {r['paired'] / r['gather']:13.2f} "
              f"{r['col_paired_vs_kprime']:5.2f} {r['row_paired_vs_kprime']:5.2f}")
        cell = totals.setdefault((r["shape"], r["gamma"]), {})
        for impl in ("gather", "layout", "paired", "paired_kprime", "dense_kprime"):
            cell[impl] = cell.get(impl, 0.0) + r[impl]
    verdict = "MET" if worst <= MLP_TARGET else "NOT MET"
    print(f"target: paired / dense_kprime <= {MLP_TARGET} for every shape, gamma and pass: worst {worst:.2f}, {verdict}")
    print("MLP fwd + dgrad + wgrad (sums of medians, ms): gather / layout / paired / paired at K' / dense at K'")
    for (shape, gamma), c in totals.items():
        print(f"{shape:8s} {gamma:5.2f}  {c['gather']:8.2f} {c['layout']:8.2f} {c['paired']:8.2f} "
              f"{c['paired_kprime']:8.2f} {c['dense_kprime']:8.2f}   paired/gather {c['paired'] / c['gather']:.2f}, "
              f"paired/dK` {c['paired'] / c['dense_kprime']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_json_flag(parser, required=True, help="where to write {meta, records}")
    parser.add_argument("--quick", action="store_true", help="one shape, few gammas (a smoke run)")
    parser.add_argument(
        "--groups", type=lambda s: [int(g) for g in s.split(",")], default=None,
        help="group sizes for the grouped keep sets (default 8,16,32 on GPU, 32 on CPU and with --quick)",
    )  # fmt: skip
    parser.add_argument(
        "--shapes", type=lambda s: s.split(","), default=None,
        help=f"subset of shapes to run (to split a long run), from {', '.join([*GPU_SHAPES, *cpu_shapes()])}",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU (default 1, as a bench rank)")
    parser.add_argument("--cpu-costs", action="store_true", help="CPU: also time the pieces of the pruned path apart")
    parser.add_argument("--mlp-layout", action="store_true",
                        help="the column -> row MLP, gather path vs keep layout vs dense at K' (CPU)")
    parser.add_argument("--block", type=int, default=8, help="--mlp-layout: keep-set block size (default 8)")
    parser.add_argument("--reps", type=int, default=7, help="--mlp-layout: interleaved repetitions (default 7)")
    args = parser.parse_args(argv)
    known = [*GPU_SHAPES, *cpu_shapes(), *MLP_SHAPES]
    if args.shapes is not None and set(args.shapes) - set(known):
        parser.error(f"--shapes: unknown {sorted(set(args.shapes) - set(known))}; known {sorted(known)}")
    if args.groups is None:
        args.groups = [32] if args.quick or not torch.cuda.is_available() else [8, 16, 32]
    if any(g not in (8, 16, 32) for g in args.groups):
        parser.error(f"--groups must be drawn from 8, 16, 32, got {args.groups}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.mlp_layout:
        if args.block < 1 or any(k % args.block for _, h, i in MLP_SHAPES.values() for k in (h, i)):
            parser.error(f"--block must divide every MLP dimension, got {args.block}")
        if args.reps < 1:
            parser.error(f"--reps must be >= 1, got {args.reps}")
        result = run_mlp_layout(args)
        result["mlp_ratios"] = mlp_ratios(result["mlp_layout"])
        write_result(args.json, "kernel_bench", argv, vars(args), indent=1, **result)
        report_mlp(result)
        print(f"\nwrote {len(result['mlp_layout'])} records to {args.json}")
        return 0
    result = run(args)
    device = "cuda" if result["meta"]["cuda"] else "cpu"
    write_result(args.json, "kernel_bench", argv, vars(args), device=device, indent=1, **result)
    report(result)
    print(f"\nwrote {len(result['records'])} records to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
