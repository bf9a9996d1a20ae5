"""The first command to run on a machine with one H100/H200: semimig's GPU figures in one JSON.

    python benchmarks/gpu_check.py --json docs/results/gpu_check.json      # one GPU, <= 8 minutes
    python benchmarks/gpu_check.py --device cpu --quick --json out.json    # the same code on CPU (CI)

One process, one rank: a one-rank process group (NCCL on CUDA, gloo on CPU) holds semimig's
layers at the shard shapes a rank of a larger tensor-parallel group holds.  Parts:

``meter``     the γ = 0 cost of semimig's measurement: one step (forward + backward) of a
              Llama-7B block's linear layers at the tp 2 and tp 8 shard shapes (q/k/v -> o and
              gate/up -> down; hidden 4096, intermediate 11008, bf16, M = 8192 tokens), semimig's
              layers alone (``plain``) against the same layers bound by a ``BalanceController``
              in mode ``semi`` with its ``step()`` after every step (``semi``), interleaved;
              host synchronisations per step counted (``torch.cuda.synchronize`` and
              ``Event``/``Stream.synchronize`` are wrapped for counting in this process only).
              The block has no attention core and no optimizer step, so the ratio is an upper
              bound of the overhead on a real step.
``resize``    what resizing buys a rank: the same block's step with the controller pinning the rank's
              pruned share at γ (``force(prune=...)``: the priority keep set, the lineage, the zero-imputed
              gradients, the pruned GEMMs on the path ``auto`` chooses) against γ = 0, beside the share
              of the GEMMs' work left, 1 − γ.
``clock``     event-timed GEMM time (the step clock's ``region("gemm")``) against
              ``torch.profiler``'s kernel time for the same GEMMs.
``kernels``   fused Triton vs the torch gather path vs dense at K' vs dense at K, fwd/dgrad/wgrad,
              random and block keep sets, γ 0.5 and 0.9, and the fused kernels' first-call
              (compile + tune) time.  On CPU the fused kernels are skipped (the Triton
              interpreter is not a performance model).
``stats``     the priority statistics' cost per period and the host bytes they hold.
``graph``     CUDA-graph capture of a layer bound by the controller and of a GEMM inside a clock
              region: ok or the reason it failed (skipped on CPU).
``allreduce`` a 64 MiB all-reduce's enqueue (host) time against its clock time.
``launch``    a rank started by :func:`semimig.launch.run_on_ranks` (the forkserver every multi-rank
              test and ``semimig bench`` start their ranks from) runs a GEMM and an all-reduce on the
              device (NCCL on CUDA, gloo on CPU): a rank forked from a process that has initialised
              CUDA fails at its first CUDA call.

Bars printed beside the figures: meter overhead <= 1 % of a step at both shard shapes, event time
within 5 % of the profiler's kernel time, fused <= 1.10x dense at K'.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_output import add_json_flag, interleaved_ms, refuse, write_result
from semimig.straggler.clock import make_clock
from semimig.straggler.nvml import HealthWatch

PARTS = ("meter", "resize", "clock", "kernels", "stats", "graph", "allreduce", "launch")
BARS = {"meter_overhead": 0.01, "event_vs_profiler": 0.05, "fused_vs_kprime": 1.10}
WIDTH = 80


@dataclass(frozen=True, kw_only=True)
class CheckConfig:
    """Sizes and repetitions of one run."""

    hidden: int = 4096
    intermediate: int = 11008
    tokens: int = 8192
    tps: tuple[int, ...] = (2, 8)
    dtype: str = "bf16"
    reps: int = 10
    """Interleaved repetitions of the step variants; each gives one figure per variant."""
    iters: int = 10
    """Steps of each variant per repetition."""
    gammas: tuple[float, ...] = (0.5, 0.9)
    block: int = 32
    allreduce_mib: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("hidden", "intermediate", "tokens", "reps", "iters", "block", "allreduce_mib"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for tp in self.tps:
            if self.hidden % tp or self.intermediate % tp or (self.intermediate // tp) % self.block:
                raise ValueError(f"tps: hidden {self.hidden} and intermediate {self.intermediate} must split into "
                                 f"{tp} shards of whole {self.block}-column blocks, got tp {tp}")
        if self.dtype not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"dtype must be bf16, fp16 or fp32, got {self.dtype!r}")
        if not self.gammas or any(not 0.0 < g < 1.0 for g in self.gammas):
            raise ValueError(f"gammas must be in (0, 1), got {self.gammas!r}")


QUICK_CPU = dict(hidden=64, intermediate=192, tokens=64, dtype="fp32", reps=3, iters=2, block=8, allreduce_mib=1)
QUICK_CUDA = dict(reps=5, iters=5)


# ----------------------------------------------------------------------------- the step clock
def new_clock(device: torch.device):
    """The library's step clock on ``device`` (host backend on CPU, CUDA events on a GPU)."""
    return make_clock(device)


def drain(clock, kind: str, limit: int) -> list:
    """The measured steps still pending, resolved once the device has finished (the benchmark's own
    wait): boundaries are added until a step without a ``kind`` region (past the measured ones) comes
    back."""
    if clock.backend != "host":
        _ORIGINAL_SYNC()
    out = []
    for _ in range(limit + 2):
        try:
            times = clock.step(wait=True)
        except TypeError:  # a clock whose step() takes no wait
            times = clock.step()
        if times is not None:
            if getattr(times, f"{kind}_s") <= 0.0:
                break
            out.append(times)
    return out


# ----------------------------------------------------------------------------- sync counting
_ORIGINAL_SYNC = torch.cuda.synchronize
_SYNCS = {"count": 0}


@contextlib.contextmanager
def counting_syncs():
    """Count host synchronisations of the device while the block runs (the benchmark's own waits
    call ``_ORIGINAL_SYNC`` and are not counted)."""
    patched = [(torch.cuda, "synchronize"), (torch.cuda.Event, "synchronize"), (torch.cuda.Stream, "synchronize")]
    saved = [(owner, name, getattr(owner, name)) for owner, name in patched]

    def counted(fn):
        def wrapper(*args, **kwargs):
            _SYNCS["count"] += 1
            return fn(*args, **kwargs)
        return wrapper
    for owner, name, fn in saved:
        setattr(owner, name, counted(fn))
    try:
        yield _SYNCS
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def wait(device: torch.device) -> None:
    if device.type == "cuda":
        _ORIGINAL_SYNC()


# ----------------------------------------------------------------------------- part: meter
class LlamaShard(nn.Module):
    """One Llama block's linear layers at a tp shard shape (no attention core, no norms)."""

    def __init__(self, cfg: CheckConfig, tp: int, group, device, dtype) -> None:
        super().__init__()
        import semimig.nn as snn

        h, i = cfg.hidden, cfg.intermediate

        def col(n_in, n_out):
            return snn.Linear1D_Col.from_native_module(nn.Linear(n_in, n_out, bias=False, device=device, dtype=dtype),
                                                       group)

        def row(n_in, n_out):
            return snn.Linear1D_Row.from_native_module(nn.Linear(n_in, n_out, bias=False, device=device, dtype=dtype),
                                                       group, parallel_input=True)
        self.q, self.k, self.v, self.o = col(h, h // tp), col(h, h // tp), col(h, h // tp), row(h // tp, h)
        self.gate, self.up, self.down = col(h, i // tp), col(h, i // tp), row(i // tp, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.o(self.q(x) * self.k(x) + self.v(x))
        return x + self.down(F.silu(self.gate(x)) * self.up(x))


def _steps(cfg: CheckConfig, model, x, dy, device, controller=None) -> Callable[[], None]:
    """``cfg.iters`` training steps of ``model`` (forward, backward of ``dy``, the controller's ``step()``
    when there is one), then the device's work waited for: one timed call."""
    def run() -> None:
        for _ in range(cfg.iters):
            x.grad = None
            for p in model.parameters():
                p.grad = None
            model(x).backward(dy)
            if controller is not None:
                controller.step()
        wait(device)
    return run


def meter_part(cfg: CheckConfig, device, dtype, group) -> list[dict]:
    from semimig.controller import BalanceConfig, BalanceController

    records = []
    for tp in cfg.tps:
        torch.manual_seed(cfg.seed)
        plain, bound = (LlamaShard(cfg, tp, group, device, dtype) for _ in range(2))
        bound.load_state_dict(plain.state_dict())
        controller = BalanceController(bound, BalanceConfig(mode="semi"), process_group=group)
        x = torch.randn(cfg.tokens, cfg.hidden, device=device, dtype=dtype, requires_grad=True)
        dy = torch.randn_like(x)

        fns = {"plain": _steps(cfg, plain, x, dy, device), "semi": _steps(cfg, bound, x, dy, device, controller)}
        syncs = {}
        for name, fn in fns.items():  # warm-up, and the synchronisations of one call
            fn()
            with counting_syncs() as counter:
                before = counter["count"]
                fn()
                syncs[name] = (counter["count"] - before) / cfg.iters
        samples = interleaved_ms(fns, cfg.reps, warmup=0)
        ratios = [s / p for s, p in zip(samples["semi"], samples["plain"])]
        clock_syncs = getattr(getattr(controller, "clock", None), "host_syncs", None)
        controller.close()
        overhead = statistics.median(ratios) - 1.0
        records.append({"tp": tp, "shapes": {"q/k/v": [cfg.hidden, cfg.hidden // tp], "o": [cfg.hidden // tp, cfg.hidden],
                                             "gate/up": [cfg.hidden, cfg.intermediate // tp],
                                             "down": [cfg.intermediate // tp, cfg.hidden]},
                        "step_ms": {n: statistics.median(v) / cfg.iters for n, v in samples.items()},
                        "per_rep_ms": samples, "overhead": overhead, "overhead_range": [min(ratios) - 1, max(ratios) - 1],
                        "host_syncs_per_step": syncs, "clock_host_syncs": clock_syncs,
                        "bar": BARS["meter_overhead"], "ok": overhead <= BARS["meter_overhead"]})
    return records


# ----------------------------------------------------------------------------- part: resize
def resize_part(cfg: CheckConfig, device, dtype, group) -> list[dict]:
    from semimig.controller import BalanceConfig, BalanceController

    records = []
    for tp in cfg.tps:
        step_ms = {}
        for gamma in (0.0, *cfg.gammas):
            torch.manual_seed(cfg.seed)
            model = LlamaShard(cfg, tp, group, device, dtype)
            controller = BalanceController(model, BalanceConfig(mode="semi"), process_group=group)
            if gamma:
                controller.force(prune={0: gamma})
            x = torch.randn(cfg.tokens, cfg.hidden, device=device, dtype=dtype, requires_grad=True)
            run = _steps(cfg, model, x, torch.randn_like(x), device, controller)
            run()  # warm-up: a new key's first pruned launches choose their path (and compile)
            samples = []
            for _ in range(cfg.reps):
                start = time.perf_counter()
                run()
                samples.append((time.perf_counter() - start) * 1e3 / cfg.iters)
            step_ms[gamma] = statistics.median(samples)
            controller.close()
        records.append({"tp": tp, "step_ms": {str(g): v for g, v in step_ms.items()},
                        "vs_dense": {str(g): v / step_ms[0.0] for g, v in step_ms.items()},
                        "gemm_work_left": {str(g): 1.0 - g for g in step_ms}})
    return records


# ----------------------------------------------------------------------------- part: clock
def _profiled_ms(fn: Callable[[], object], n: int, device) -> float:
    """Mean per-call time of ``fn`` as torch.profiler reports it: device kernel time on CUDA, the
    ``aten::mm`` op's CPU time on CPU."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(n):
            fn()
        wait(device)
    from torch.autograd import DeviceType

    cuda = device.type == "cuda"
    total_us = 0.0
    for event in prof.events():  # kernels on CUDA (their own spans, no op counted twice), the op on CPU
        if (event.device_type == DeviceType.CUDA) if cuda else (event.name == "aten::mm"):
            total_us += event.time_range.elapsed_us()
    return total_us / 1e3 / n


def clock_part(cfg: CheckConfig, device, dtype) -> list[dict]:
    tp, h, i = cfg.tps[0], cfg.hidden, cfg.intermediate
    n = max(cfg.reps * cfg.iters, 10)
    records = []
    for name, (k, m) in {"q": (h, h // tp), "gate": (h, i // tp), "down": (i // tp, h)}.items():
        x = torch.randn(cfg.tokens, k, device=device, dtype=dtype)
        w = torch.randn(m, k, device=device, dtype=dtype)
        fn = lambda: torch.mm(x, w.t())  # noqa: E731
        for _ in range(3):
            fn()
        clock = new_clock(device)
        clock.step()  # a boundary before the measured steps, whichever boundary the clock counts from
        times = []
        for _ in range(n):
            with clock.region("gemm"):
                fn()
            resolved = clock.step()
            if resolved is not None:
                times.append(resolved)
        times = [t for t in times + drain(clock, "gemm", n) if t.gemm_s > 0.0]
        event_ms = statistics.median(t.gemm_s for t in times) * 1e3
        profiler_ms = _profiled_ms(fn, n, device)
        error = event_ms / profiler_ms - 1.0 if profiler_ms > 0 else None
        records.append({"gemm": name, "m_n_k": [cfg.tokens, m, k], "clock": clock.backend, "event_ms": event_ms,
                        "profiler_ms": profiler_ms, "error": error, "resolved_steps": len(times), "calls": n,
                        "bar": BARS["event_vs_profiler"], "ok": error is not None and abs(error) <= BARS["event_vs_profiler"]})
    return records


# ----------------------------------------------------------------------------- part: kernels
def kernels_part(cfg: CheckConfig, device, dtype) -> dict:
    from kernel_bench import check_fused, implementations, make_keep

    from semimig.kernels import choice, ops
    from semimig.kernels.backend import resolve_backend
    from semimig.kernels.keep import plan_keep

    cuda = device.type == "cuda"
    tp, h, i = cfg.tps[0], cfg.hidden, cfg.intermediate
    gen = torch.Generator().manual_seed(cfg.seed)
    records, first_calls = [], []
    for shape_name, (n, k) in {"gate": (i // tp, h), "down": (h, i // tp)}.items():
        x = torch.randn(cfg.tokens, k, device=device, dtype=dtype)
        w = torch.randn(n, k, device=device, dtype=dtype)
        dy = torch.randn(cfg.tokens, n, device=device, dtype=dtype)
        for gamma in cfg.gammas:
            for kind in ("random", "block"):
                group = cfg.block if kind == "block" else 1
                keep = make_keep("random" if kind == "random" else "grouped", k, gamma, group, gen).to(device)
                plan = plan_keep(keep, k, device, group=group)
                impls = implementations(x, w, dy, plan, cuda)
                if cuda:  # what the layers run: the faster path per key, chosen at its first launch
                    backend = resolve_backend(device, dtype)
                    impls["auto"] = {"fwd": lambda: ops.fwd(backend, x, w, None, plan),
                                     "dgrad": lambda: ops.dgrad(backend, dy, w, plan),
                                     "wgrad": lambda: ops.wgrad(backend, dy, x, plan)}
                worst = None
                if cuda:
                    for p in ("fwd", "dgrad", "wgrad"):
                        wait(device)
                        start = time.perf_counter()
                        impls["fused"][p]()
                        wait(device)
                        first_calls.append({"shape": shape_name, "gamma": gamma, "keep": kind, "pass": p,
                                            "seconds": time.perf_counter() - start})
                    worst = check_fused(impls, dtype)
                for p in ("fwd", "dgrad", "wgrad"):
                    fns = {impl: passes[p] for impl, passes in impls.items()}
                    if cuda:
                        import triton.testing
                        ms = {impl: float(triton.testing.do_bench(fn, return_mode="median")) for impl, fn in fns.items()}
                    else:
                        ms = {impl: statistics.median(v) for impl, v in interleaved_ms(fns, cfg.reps).items()}
                    ratio = ms["fused"] / ms["dense_kprime"] if "fused" in ms else None
                    records.append({"shape": shape_name, "m_n_k": [cfg.tokens, n, k], "gamma": gamma, "keep": kind,
                                    "block": group, "pass": p, "ms": ms, "fused_vs_kprime": ratio, "fused_max_rel_diff": worst,
                                    "torch_gather_vs_kprime": ms["torch_gather"] / ms["dense_kprime"],
                                    "auto_vs_kprime": ms["auto"] / ms["dense_kprime"] if "auto" in ms else None,
                                    "ok": None if ratio is None else ratio <= BARS["fused_vs_kprime"]})
    skipped = None if cuda else "fused Triton kernels are timed on CUDA only (the interpreter is not a performance model)"
    chosen = [{"key": str(key), "path": path} for key, path in choice.choices().items()]
    return {"records": records, "first_calls": first_calls, "fused_skipped": skipped, "bar": BARS["fused_vs_kprime"],
            "auto_choices": chosen}


# ----------------------------------------------------------------------------- part: stats
def _tensor_bytes(obj) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in vars(obj).values():
        if isinstance(value, torch.Tensor):
            out[value.device.type] = out.get(value.device.type, 0) + value.numel() * value.element_size()
    return out


def stats_part(cfg: CheckConfig, device, dtype) -> list[dict]:
    from semimig.resizing.priority import ColumnVariationTracker

    records = []
    for tp in cfg.tps:
        h, i = cfg.hidden, cfg.intermediate
        shapes = [(h // tp, h)] * 3 + [(h, h // tp)] + [(i // tp, h)] * 2 + [(h, i // tp)]  # [out, in] per layer
        weights = [torch.randn(s, device=device, dtype=dtype) for s in shapes]
        wait(device)
        start = time.perf_counter()
        trackers = [ColumnVariationTracker(w) for w in weights]
        wait(device)
        enable_s = time.perf_counter() - start
        for w in weights:
            w.add_(1e-3)
        periods = []
        for _ in range(3):
            wait(device)
            start = time.perf_counter()
            for t, w in zip(trackers, weights):
                t.observe_step(w)
                t.end_period(w)
            wait(device)
            periods.append(time.perf_counter() - start)
        held: dict[str, int] = {}
        for t in trackers:
            for kind, n in _tensor_bytes(t).items():
                held[kind] = held.get(kind, 0) + n
        records.append({"tp": tp, "layers": len(weights), "enable_s": enable_s,
                        "period_s": statistics.median(periods), "period_s_32_blocks": 32 * statistics.median(periods),
                        "bytes_held": held, "host_bytes_32_blocks": 32 * held.get("cpu", 0)})
    return records


# ----------------------------------------------------------------------------- part: graph
def graph_part(cfg: CheckConfig, device, dtype, group) -> list[dict]:
    if device.type != "cuda":
        return [{"case": "timed layer", "ok": None, "reason": "CUDA graphs need a CUDA device"}]
    from semimig.controller import BalanceConfig, BalanceController

    tp = cfg.tps[-1]
    model = LlamaShard(cfg, tp, group, device, dtype)
    x = torch.randn(cfg.tokens, cfg.hidden, device=device, dtype=dtype)
    controller = BalanceController(model, BalanceConfig(mode="semi"), process_group=group)
    clock = new_clock(device)

    def in_region():
        with clock.region("gemm"):
            return torch.mm(x, model.q.weight.t())
    cases = {"layer bound by the controller": lambda: model.q(x), "GEMM in a clock region": in_region}
    records = []
    for case, fn in cases.items():
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            graph.replay()
            wait(device)
            records.append({"case": case, "ok": True, "reason": None})
        except Exception as err:  # noqa: BLE001 - the failure is the finding
            first = (str(err).strip().splitlines() or [""])[0]
            records.append({"case": case, "ok": False, "reason": f"{type(err).__name__}: {first}"[:300]})
            with contextlib.suppress(Exception):
                wait(device)
    controller.close()
    return records


# ----------------------------------------------------------------------------- part: launch
def _launch_body(rank: int, world_size: int, device_type: str) -> float:
    """One launched rank's device work: a GEMM and an all-reduce of its result (64 on every element)."""
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    x = torch.ones(64, 64, device=device)
    y = x @ x
    dist.all_reduce(y)
    return float(y[0, 0].item()) / world_size


def launch_part(device) -> dict:
    from semimig.launch import run_on_ranks

    backend = "nccl" if device.type == "cuda" else "gloo"
    start = time.perf_counter()
    try:
        value = run_on_ranks(_launch_body, 1, device.type, backend=backend, timeout_s=180)
        ok, reason = value == 64.0, None if value == 64.0 else f"the rank computed {value}, not 64"
    except Exception as err:  # noqa: BLE001 - the failure is the finding
        lines = [line for line in str(err).strip().splitlines() if line.strip()]
        ok, reason = False, f"{type(err).__name__}: {lines[-1] if lines else ''}"[:300]
    return {"backend": backend, "ranks": 1, "ok": ok, "seconds": time.perf_counter() - start, "reason": reason}


# ----------------------------------------------------------------------------- part: allreduce
def allreduce_part(cfg: CheckConfig, device, group) -> dict:
    import torch.distributed as dist

    t = torch.ones(cfg.allreduce_mib * 2**20 // 4, device=device, dtype=torch.float32)
    for _ in range(3):
        dist.all_reduce(t, group=group)
    wait(device)
    clock = new_clock(device)
    clock.step()  # a boundary before the measured steps
    host, times = [], []
    for _ in range(max(cfg.reps, 5)):
        with clock.region("comm"):
            start = time.perf_counter()
            dist.all_reduce(t, group=group)
            host.append(time.perf_counter() - start)
        resolved = clock.step()
        if resolved is not None:
            times.append(resolved)
    times = [x for x in times + drain(clock, "comm", len(host)) if x.comm_s > 0.0]
    return {"mib": cfg.allreduce_mib, "backend": dist.get_backend(group), "clock": clock.backend,
            "enqueue_ms": statistics.median(host) * 1e3, "event_ms": statistics.median(x.comm_s for x in times) * 1e3}


# ----------------------------------------------------------------------------- report
def row(part: str, case: str, figure: str, bar: str = "") -> str:
    """One table line: part 9, case 27, figure 30, bar 10 columns (79 in all)."""
    return f"{part:<9} {case[:27]:<27} {figure[:30]:<30} {bar[:10]:>10}".rstrip()


def table(result: dict) -> str:
    """The short table: one line per figure, at most 80 columns."""
    def ok(flag) -> str:
        return {True: "ok", False: "FAIL", None: "-"}[flag]
    lines = [row("part", "case", "figure", "bar"), "-" * 79]
    for r in result.get("meter", []):
        figure = f"{r['overhead'] * 100:+.2f}% step, {r['host_syncs_per_step']['semi']:.0f} syncs/step"
        lines.append(row("meter", f"tp {r['tp']}: semi vs plain", figure, f"1% {ok(r['ok'])}"))
    for r in result.get("resize", []):
        ratios = " / ".join(f"{v:.2f}" for g, v in r["vs_dense"].items() if g != "0.0")
        gammas = "/".join(g for g in r["vs_dense"] if g != "0.0")
        lines.append(row("resize", f"tp {r['tp']}: g {gammas} vs dense", f"{ratios} of the step"))
    for r in result.get("clock", []):
        err = "n/a" if r["error"] is None else f"{r['error'] * 100:+.1f}%"
        figure = f"{r['event_ms']:.3f}/{r['profiler_ms']:.3f} ms {err}"
        lines.append(row("clock", f"{r['gemm']}: event/profiler", figure, f"5% {ok(r['ok'])}"))
    k = result.get("kernels")
    if k:
        rows: dict = {}
        for r in k["records"]:
            fused = r["fused_vs_kprime"] is not None
            rows.setdefault((r["shape"], r["gamma"], r["keep"], fused), []).append(r)
        for (shape, gamma, keep, fused), recs in rows.items():
            ratios = " ".join(f"{r['fused_vs_kprime' if fused else 'torch_gather_vs_kprime']:.2f}" for r in recs)
            verdict = ok(all(r["ok"] for r in recs)) if fused else "-"
            lines.append(row("kernels", f"{shape} g{gamma} {keep} f/d/w", f"{'fused' if fused else 'torch'}/K' {ratios}",
                             f"1.10x {verdict}" if fused else ""))
            if all(r.get("auto_vs_kprime") is not None for r in recs):
                autos = " ".join(f"{r['auto_vs_kprime']:.2f}" for r in recs)
                lines.append(row("kernels", f"{shape} g{gamma} {keep} f/d/w", f"auto/K' {autos}"))
        if k["first_calls"]:
            first = max(c["seconds"] for c in k["first_calls"])
            lines.append(row("kernels", "first call (compile+tune)", f"max {first:.2f} s"))
        if k["fused_skipped"]:
            lines.append(row("kernels", "fused", "skipped on CPU"))
    for r in result.get("stats", []):
        figure = f"{r['period_s'] * 1e3:.1f} ms, {r['bytes_held'].get('cpu', 0) / 2**20:.1f} MiB host"
        lines.append(row("stats", f"tp {r['tp']}: period, one block", figure))
    for r in result.get("graph", []):
        lines.append(row("graph", r["case"], {True: "capture ok", False: "capture FAILED", None: "skipped"}[r["ok"]]))
        if r["reason"]:
            lines.append(f"{'':<10}{r['reason']}")
    a = result.get("allreduce")
    if a:
        lines.append(row("allreduce", f"{a['mib']} MiB {a['backend']}: enq/event",
                         f"{a['enqueue_ms']:.3f} / {a['event_ms']:.3f} ms"))
    launched = result.get("launch")
    if launched:
        lines.append(row("launch", f"a launched rank, {launched['backend']}",
                         f"GEMM + all-reduce {'ok' if launched['ok'] else 'FAILED'}, {launched['seconds']:.1f} s"))
        if launched["reason"]:
            lines.append(f"{'':<10}{launched['reason']}")
    return "\n".join(line[:WIDTH] for line in lines)


def _git_commit() -> Optional[str]:
    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=40"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _machine(device) -> str:
    if device.type != "cuda":
        return f"cpu: {platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    p = torch.cuda.get_device_properties(device)
    health = HealthWatch(device, rank=0).poll()  # NVML's clocks and reasons, when nvidia-ml-py is installed
    return (f"cuda: {p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}, "
            f"{torch.cuda.device_count()} visible; "
            + (health.describe() if health is not None else "NVML unavailable (pip install nvidia-ml-py)"))


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_json_flag(parser, required=False, help="write the results here (refused if it exists, unless --overwrite)")
    parser.add_argument("--device", default="cuda", help="cuda (default; one GPU) or cpu")
    parser.add_argument("--quick", action="store_true", help="tiny shapes on CPU, fewer repetitions on CUDA")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = _parse_args(argv)
    if args.device not in ("cuda", "cpu"):
        return refuse("gpu_check.py", f"--device must be cuda or cpu, got {args.device!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        return refuse("gpu_check.py", f"--device {args.device}: CUDA is not available here (torch "
                                      f"{torch.__version__}); use --device cpu")
    parts = tuple(p.strip() for p in args.parts.split(","))
    if not parts or any(p not in PARTS for p in parts):
        return refuse("gpu_check.py", f"--parts must be a subset of {','.join(PARTS)}, got {args.parts!r}")
    cuda = args.device == "cuda"
    try:
        cfg = CheckConfig(**(QUICK_CUDA if cuda else QUICK_CPU)) if args.quick else CheckConfig()
    except ValueError as err:
        return refuse("gpu_check.py", err)
    import torch.distributed as dist

    from semimig.launch import free_port

    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[cfg.dtype]
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=120))
    group = dist.group.WORLD
    started, result, seconds, errors = time.perf_counter(), {}, {}, {}
    print(f"gpu_check: {_machine(device)}; parts {','.join(parts)}", flush=True)
    command = " ".join(["python", "benchmarks/gpu_check.py", *(sys.argv[1:] if argv is None else argv)])

    def record(complete: bool) -> None:
        """The file as it stands: rewritten after every part, so a run stopped early keeps what it measured."""
        if args.json is None:
            return
        write_result(args.json, "gpu_check", argv, asdict(cfg), device=_machine(device), command=command,
                     git_commit=_git_commit(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                     versions={"torch": torch.__version__, "cuda": torch.version.cuda,
                               "triton": _triton_version()},
                     clock_source="semimig.straggler.clock", bars=BARS, parts=list(parts), complete=complete,
                     errors=errors, part_seconds=seconds, wall_s=time.perf_counter() - started, **result)
    try:
        runners = {"meter": lambda: meter_part(cfg, device, dtype, group),
                   "resize": lambda: resize_part(cfg, device, dtype, group), "clock": lambda: clock_part(cfg, device, dtype),
                   "kernels": lambda: kernels_part(cfg, device, dtype), "stats": lambda: stats_part(cfg, device, dtype),
                   "allreduce": lambda: allreduce_part(cfg, device, group), "launch": lambda: launch_part(device),
                   "graph": lambda: graph_part(cfg, device, dtype, group)}  # last: a failed capture may upset the device
        for part in sorted(parts, key=lambda p: p == "graph"):
            begin = time.perf_counter()
            try:
                result[part] = runners[part]()
            except Exception as err:  # noqa: BLE001 - one part's failure is its finding; the others still run
                errors[part] = f"{type(err).__name__}: {err}"
                logging.getLogger("gpu_check").exception("part %s failed", part)
            seconds[part] = time.perf_counter() - begin
            print(f"  {part}: {seconds[part]:.1f} s{' FAILED: ' + errors[part] if part in errors else ''}", flush=True)
            record(complete=False)
    finally:
        dist.destroy_process_group()
    print(table(result))
    for part, error in errors.items():
        print(f"{part} FAILED: {error}"[:WIDTH])
    print(f"wall time {time.perf_counter() - started:.0f} s")
    record(complete=True)
    if args.json is not None:
        print(f"wrote {args.json}")
    return 1 if errors else 0


def _triton_version() -> Optional[str]:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


if __name__ == "__main__":
    sys.exit(main())
