"""Check the whole-device straggler against a real throttle, side by side on one machine.

Runs the LLM example unbalanced (``--balance off``) three ways, interleaved so that drift in the
machine's speed hits all three alike::

    healthy   no straggler
    real      TP rank 1's process under a cgroup CPU-bandwidth limit (``--fraction`` of its core)
    device    ``--straggler fixed:1:<chi>:scope=device`` (every span of rank 1's work between
              collectives takes chi times as long; chi = 1 / fraction by default)

and prints each one's steady step (median of the last half) over healthy's, and device / real:
the emulation is good where that ratio is near 1 (issue: within 15 % at chi = 4).

    python benchmarks/device_vs_throttle.py --repeats 3 --json results/device_vs_throttle.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_output import write_result  # noqa: E402
from time_to_loss import (  # noqa: E402  (the headline benchmark's runner and its signal handling)
    add_run_flags,
    check_run_flags,
    reap_stale_scratch,
    run_interruptible,
    run_once,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3)
    add_run_flags(p)
    args = p.parse_args(argv)
    if isinstance(args.fraction, tuple):
        from semimig.straggler.throttle_args import fractions_text

        p.error(f"--fraction {fractions_text(args.fraction)}: this comparison throttles rank 1 alone; "
                "give one fraction")
    if args.chi is None:  # default: the throttle's own slowdown (a bad --fraction is refused just below)
        args.chi = 1.0 / args.fraction if 0 < args.fraction <= 1 else 1.0
    check_run_flags(p, args, ("steps", "repeats"))
    # what time_to_loss.command reads (the reflex's and the keep-set block's defaults: these runs are unbalanced)
    args.straggler, args.pattern, args.eval_every, args.reflex, args.resize_block = "real", None, 0, "on", None
    args.tp, args.dp, args.world, args.straggler_rank, args.share = 2, 1, 2, 1, 1.0  # rank 1 of tp 2, own cores
    return args


def main(argv=None) -> int:
    """Every end signal stops the run in progress and removes the scratch directory (as time_to_loss.py)."""
    return run_interruptible("device_vs_throttle", run, parse_args(argv), argv)


def run(args: argparse.Namespace, argv) -> int:
    from semimig.bench.time_to_loss import steady_step_s

    config = dict(vars(args))  # as parsed: the runs below set args.straggler in turn
    started = time.time()
    kinds = {"healthy": ("real", "healthy"), "real": ("real", "off"), "device": ("device", "off")}
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    reap_stale_scratch()
    with tempfile.TemporaryDirectory(prefix=f"semimig-ttl-{os.getpid()}-dvt-") as tmp:
        for repeat in range(args.repeats):
            for kind, (straggler, mode) in kinds.items():
                args.straggler = straggler
                data = run_once(args, mode, Path(tmp), repeat * 10 + len(runs[kind]))
                runs[kind].append({"steady_step_s": steady_step_s(data["step_s"]),
                                   "balanced_share_by_rank": data["summary"].get("balanced_share_by_rank"),
                                   "step_s": data["step_s"], "final_loss": data["summary"]["final_loss"]})
    steady = {k: [r["steady_step_s"] for r in rs] for k, rs in runs.items()}
    healthy = statistics.median(steady["healthy"])
    slowdown = {k: [s / healthy for s in v] for k, v in steady.items()}
    ratios = [d / r for d, r in zip(steady["device"], steady["real"])]
    result = {
        "fraction": args.fraction, "chi": args.chi, "repeats": args.repeats, "wall_s": time.time() - started,
        "model": {k: getattr(args, k) for k in ("hidden", "layers", "batch_size", "seq_len", "steps")},
        "slowdown_vs_healthy": {k: {"median": statistics.median(v), "range": [min(v), max(v)]}
                                for k, v in slowdown.items()},
        "device_over_real": {"median": statistics.median(ratios), "range": [min(ratios), max(ratios)]},
        "runs": runs,
    }
    write_result(args.json, "device_vs_throttle", argv, config, **result)
    print(f"\nunbalanced tiny Llama h{args.hidden} x{args.layers}, tp=2, {args.steps} steps x {args.repeats} "
          f"(interleaved); rank 1 real: {args.fraction:g} of its core, device: chi {args.chi:g}")
    print(f"{'run':>8} {'steady s':>9} {'vs healthy (median, range)':>28}  balanced share by rank (first repeat)")
    for kind in kinds:
        s = result["slowdown_vs_healthy"][kind]
        shares = runs[kind][0]["balanced_share_by_rank"] or []
        print(f"{kind:>8} {statistics.median(steady[kind]):>9.3f} {s['median']:>12.2f}x "
              f"({s['range'][0]:.2f}-{s['range'][1]:.2f})  "
              + " / ".join("-" if b is None else f"{b:.2f}" for b in shares))
    d = result["device_over_real"]
    print(f"device / real: {d['median']:.3f} (range {d['range'][0]:.3f}-{d['range'][1]:.3f})")
    print(f"JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
