"""What the straggler's optimizer step costs, dense and lazy: AdamW over every column against AdamW on the kept columns only.

    python benchmarks/optimizer_bench.py [--hidden 1024] [--layers 2] [--kv-heads 8] [--reps 7]
                                         [--json out.json]

The parameters are one rank's linear weights of the example's tiny Llama at tp 2 (per decoder
layer q ``[H/2, H]``, k and v ``[kv·d/2, H]``, o ``[H, H/2]``, gate and up ``[2H, H]``, down
``[H, 2H]``), fp32, one torch thread (as a rank of the benchmarks).  Per repetition, interleaved:

- ``single``, ``foreach``, ``fused``: ``torch.optim.AdamW`` with that implementation, every
  column updated (``single`` is torch's CPU default);
- ``lazy γ (g)``: AdamW on the kept columns only, a share ``γ`` of each weight's K columns
  skipped (parameter, ``exp_avg`` and ``exp_avg_sq`` untouched), kept in aligned blocks of ``g``
  columns (1: single columns): the kept columns of ``p``, ``grad``, ``exp_avg``, ``exp_avg_sq``
  gathered, updated with the same arithmetic as ``single``, and scattered back.  Without the keep
  layout wired into the layers the kept columns are scattered over each row, so the gathers read
  every cache line of a weight whatever ``γ`` is.

Prints each median and its ratio to ``fused``.  The lazy update pays only where it beats the
fastest dense update the device has.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys

import torch

from bench_output import add_json_flag, interleaved_ms, write_result

LAZY = ((0.5, 16), (0.75, 16), (0.9, 1), (0.9, 16))


def rank_shapes(hidden: int, layers: int, heads: int, kv_heads: int) -> list[tuple[int, int]]:
    """``[N, K]`` of one tp-2 rank's linear weights, as its GEMMs see them."""
    head_dim, inter = hidden // heads, 4 * hidden
    per_layer = [(hidden // 2, hidden), (kv_heads * head_dim // 2, hidden), (kv_heads * head_dim // 2, hidden),
                 (hidden, hidden // 2), (inter // 2, hidden), (inter // 2, hidden), (hidden, inter // 2)]
    return per_layer * layers


def lazy_adamw_(opt: torch.optim.AdamW, params: list[torch.nn.Parameter], keeps: list[torch.Tensor]) -> None:
    """One AdamW step of the kept columns ``keeps[i]`` of ``params[i]`` (dimension 1); the rest untouched.

    Kept columns: ``m ← β1 m + (1 − β1) g``, ``v ← β2 v + (1 − β2) g²``,
    ``p ← p (1 − lr·λ) − lr · m̂ / (sqrt(v̂) + ε)`` with the bias corrections of the parameter's step."""
    group = opt.param_groups[0]
    (b1, b2), lr, eps, wd = group["betas"], group["lr"], group["eps"], group["weight_decay"]
    for p, keep in zip(params, keeps):
        state = opt.state[p]
        state["step"] += 1
        step = float(state["step"])
        pk, gk, m, v = (t.index_select(1, keep) for t in (p.data, p.grad, state["exp_avg"], state["exp_avg_sq"]))
        pk.mul_(1 - lr * wd)
        m.lerp_(gk, 1 - b1)
        v.mul_(b2).addcmul_(gk, gk, value=1 - b2)
        denom = (v.sqrt() / (1 - b2**step) ** 0.5).add_(eps)
        pk.addcdiv_(m, denom, value=-lr / (1 - b1**step))
        for dst, src in ((p.data, pk), (state["exp_avg"], m), (state["exp_avg_sq"], v)):
            dst.index_copy_(1, keep, src)


def block_keep(k: int, gamma: float, block: int, gen: torch.Generator) -> torch.Tensor:
    """Sorted kept columns: ``round((1 − γ) K / g)`` random aligned blocks of ``g`` columns."""
    blocks = k // block
    kept = torch.randperm(blocks, generator=gen)[:max(1, round((1 - gamma) * blocks))].sort().values
    return (kept[:, None] * block + torch.arange(block)).flatten()


def measure(args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    shapes = rank_shapes(args.hidden, args.layers, args.heads, args.kv_heads)
    params = [torch.nn.Parameter(torch.randn(*s, generator=gen)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    impls = {}
    for name, kwargs in (("single", {"foreach": False}), ("foreach", {"foreach": True}), ("fused", {"fused": True})):
        opt = torch.optim.AdamW(params, lr=1e-6, **kwargs)
        impls[name] = opt.step
    lazy_opt = torch.optim.AdamW(params, lr=1e-6, foreach=False)
    lazy_opt.step()  # its state exists before the first lazy step
    for gamma, block in LAZY:
        keeps = [block_keep(p.shape[1], gamma, block, gen) for p in params]
        impls[f"lazy {gamma} ({block})"] = lambda keeps=keeps: lazy_adamw_(lazy_opt, params, keeps)
    samples = interleaved_ms(impls, args.reps)  # the warm-up call allocates every optimizer's state
    fused = statistics.median(samples["fused"])
    rows = [{"impl": name, "median_ms": statistics.median(t), "vs_fused": statistics.median(t) / fused,
             "samples_ms": t} for name, t in samples.items()]
    meta = {"device": f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, 1 torch thread)",
            "torch": torch.__version__, "reps": args.reps, "params": sum(p.numel() for p in params),
            "shapes": shapes, "command": " ".join(sys.argv), "load_avg_at_end": os.getloadavg()}
    return {"meta": meta, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--reps", type=int, default=7, help="interleaved repetitions (default 7)")
    add_json_flag(parser, required=False, help="write {meta, rows} here")
    args = parser.parse_args(argv)
    for flag in ("hidden", "layers", "heads", "kv_heads", "reps"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.hidden % (2 * args.heads) or args.heads % args.kv_heads or args.kv_heads % 2:
        parser.error(f"--hidden {args.hidden} must split into --heads {args.heads} and 2 ranks, and 2 must divide "
                     f"--kv-heads {args.kv_heads} which divides the heads")
    result = measure(args)
    meta = result["meta"]
    print(f"{meta['device']}, torch {meta['torch']}, {meta['params'] / 1e6:.1f} M parameters of one rank, "
          f"median of {meta['reps']} interleaved repetitions")
    for row in result["rows"]:
        print(f"  {row['impl']:16s} {row['median_ms']:8.1f} ms  {row['vs_fused']:5.2f}x fused")
    if args.json is not None:
        write_result(args.json, "optimizer_bench", argv, vars(args), indent=1, **result)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
