"""What block-granular priority pruning costs in accuracy: digits, tiny ViT, one process.

    python benchmarks/block_accuracy.py [--steps 300] [--seeds 0,1] [--own-share 0.5] [--json out.json]

Every linear layer of the encoder (query, key, value, attention output, MLP in and out) runs
``pruned_linear`` with its reduction columns pruned on *every* step: of the first
``own-share · K`` columns (the straggler's shard; 0.5 = one rank of two, 1 = the whole model is
the straggler) a share gamma is pruned, chosen by Algorithm 1's priority list (smallest weight
change first, revisiting, period 10 steps) at granularity g = 1 (single columns, the paper),
8 or 16.  The pruned count is the same for every g, ``round(gamma own / G) G`` with G the
largest g asked for, so only the granularity differs.  Prints the test accuracy (the dense
model) after ``--steps`` AdamW steps per (gamma, g) and seed, and the never-pruned model's.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from bench_output import add_json_flag, write_result
from semimig.bench.models import VitSize, digits_split, tiny_vit
from semimig.kernels import pruned_linear
from semimig.resizing.priority import PriorityList

NAMES = ("query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense")


class _Pruned:
    """Wraps one nn.Linear: its forward prunes by the priority list; statistics per period."""

    def __init__(self, linear: torch.nn.Linear, gamma: float, block: int, own_share: float, unit: int) -> None:
        self.linear, self.block = linear, block
        k = linear.weight.shape[1]
        self.own = round(k * own_share / unit) * unit
        self.n_prune = round(gamma * self.own / unit) * unit
        self.priority = PriorityList(linear.weight)
        self.counts = torch.zeros(k, dtype=torch.int64)
        self.keep = torch.arange(k)
        linear.forward = self.forward

    def choose(self) -> None:
        k = self.counts.numel()
        pruned = self.priority.select(self.own, self.n_prune, block=self.block)
        mask = torch.ones(k, dtype=torch.bool)
        mask[pruned] = False
        self.keep = mask.nonzero().flatten()
        self.counts[pruned] += 1

    def end_period(self) -> None:
        self.priority.end_period(self.linear.weight.detach(), self.counts)
        self.counts.zero_()

    def forward(self, x):
        return pruned_linear(x, self.linear.weight, self.linear.bias, self.keep)


def train(gamma: float, block: int, seed: int, steps: int, data, own_share: float = 1.0, unit: int = 16) -> float:
    x_tr, y_tr, x_te, y_te = data
    model = tiny_vit(VitSize(), seed=seed)
    wrapped = []
    if gamma > 0:
        wrapped = [_Pruned(m, gamma, block, own_share, unit) for name, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and name.endswith(NAMES) and "encoder" in name]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        if step % 10 == 0:
            for p in wrapped:
                if step:
                    p.end_period()
        for p in wrapped:
            p.choose()
        idx = torch.randint(len(y_tr), (64,), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(pixel_values=x_tr[idx]).logits, y_tr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        for p in wrapped:
            p.keep = torch.arange(p.counts.numel())  # evaluate the whole model
        return (model(pixel_values=x_te).logits.argmax(1) == y_te).float().mean().item()


def check_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every value in range before the dense baseline trains (not after it, minutes later)."""
    from semimig.resizing.config import BLOCKS

    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if not args.seeds or min(args.seeds) < 0:
        parser.error(f"--seeds must be one or more integers >= 0, got {args.seeds}")
    bad = [g for g in args.gammas if not 0.0 <= g < 1.0]
    if not args.gammas or bad:
        parser.error(f"--gammas must be shares in [0, 1), got {args.gammas}")
    bad = [b for b in args.blocks if b not in BLOCKS]
    if not args.blocks or bad:
        parser.error(f"--blocks must be some of {BLOCKS}, got {args.blocks}")
    if not 0.0 < args.own_share <= 1.0:
        parser.error(f"--own-share must be in (0, 1], got {args.own_share}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",")], default=[0, 1])
    parser.add_argument("--gammas", type=lambda s: [float(v) for v in s.split(",")], default=[0.5, 0.75, 0.9])
    parser.add_argument("--blocks", type=lambda s: [int(v) for v in s.split(",")], default=[1, 8, 16])
    parser.add_argument("--own-share", type=float, default=0.5, help="share of each layer's K the straggler owns")
    add_json_flag(parser, required=False, help="write {steps, own_share, rows} here")
    args = parser.parse_args(argv)
    check_flags(parser, args)
    torch.set_num_threads(1)
    data = digits_split()
    rows = [{"gamma": 0.0, "block": 1, "seed": s, "accuracy": train(0.0, 1, s, args.steps, data)} for s in args.seeds]
    for gamma in args.gammas:
        for block in args.blocks:
            rows += [{"gamma": gamma, "block": block, "seed": s,
                      "accuracy": train(gamma, block, s, args.steps, data, args.own_share, max(args.blocks))}
                     for s in args.seeds]
            print(f"  gamma {gamma} block {block}: done", flush=True)
    print(f"test accuracy after {args.steps} steps, own share {args.own_share}, mean over seeds {args.seeds} (per seed)")
    cells: dict = {}
    for r in rows:
        cells.setdefault((r["gamma"], r["block"]), []).append(r["accuracy"])
    for (gamma, block), accs in cells.items():
        print(f"gamma {gamma:4.2f} block {block:3d}: {statistics.fmean(accs):.4f}  ({', '.join(f'{a:.4f}' for a in accs)})")
    if args.json is not None:
        write_result(args.json, "block_accuracy", argv, vars(args), indent=1, steps=args.steps,
                     own_share=args.own_share, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
