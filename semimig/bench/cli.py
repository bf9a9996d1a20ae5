"""``semimig bench``: the end-to-end straggler benchmark (ViT on digits, HybridParallelPlugin).

    semimig bench                                   # all seven modes, chi 1 and 4, tp 2 (< 10 min on 2 CPU cores)
    semimig bench --quick                           # smaller still
    semimig bench --modes baseline,semi --chi 1,4,8 --tp 4 --seeds 0,1,2 --json r.json
    semimig bench --tp 4 --pattern multi --modes baseline,semi --chi 1,8 --lambdas 0,1,2,3   # Fig. 11
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

from semimig.controller.runtime import MODES


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in text.split(",") if t)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from err


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from err


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(t for t in text.split(",") if t)
    for mode in modes:
        if mode not in MODES:
            raise argparse.ArgumentTypeError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    return modes


def add_bench_subcommand(subparsers) -> None:
    p = subparsers.add_parser("bench", help="end-to-end straggler benchmark (RT and ACC per mode)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", type=_modes, default=MODES, help=f"comma-separated, from {','.join(MODES)}")
    p.add_argument("--chi", type=_floats, default=None, help="straggler slowdowns, e.g. 1,4,8 (default 1,4)")
    p.add_argument("--seeds", type=_ints, default=None, help="e.g. 0,1,2 (default 0,1; --quick: 0)")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--pattern", choices=("fixed", "round-robin", "multi"), default="fixed")
    p.add_argument("--straggler-rank", type=int, default=1)
    p.add_argument("--multi-chi", type=_floats, default=(8.0, 6.0, 4.0, 2.0),
                   help="per-rank factors of the multi pattern at chi = 8 (scaled by chi/8)")
    p.add_argument("--lambdas", type=_ints, default=(),
                   help="with --pattern multi: also train semi with exactly λ migrating stragglers, e.g. 0,1,2,3 "
                        "(paper Fig. 11; plot lambda_sweep.png)")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--iters-per-epoch", type=int, default=None)
    p.add_argument("--device-ms", type=float, default=None,
                   help="emulated GEMM time of one rank per iteration at chi = 1 (default 20 ms per rank "
                        "sharing this machine, at least 40: device time must dominate the host work, "
                        "which grows with the number of ranks)")
    p.add_argument("--theta-iter", type=float, default=None,
                   help="PriDiff micro-threshold of the zero-pridiff-* modes (default 1e-3, the paper's)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: gloo ranks on an emulated device; cuda: one NCCL rank per GPU, real device time")
    p.add_argument("--quick", action="store_true", help="fewer iterations and seeds (a few minutes)")
    p.add_argument("--json", type=Path, default=Path("results/bench.json"))
    p.add_argument("--plots", type=Path, default=Path("results"), help="directory for the PNG plots")
    p.add_argument("--no-plots", action="store_true")
    p.set_defaults(func=run_bench_command)


def _given(value, default):
    """The flag's value when it was given (even 0 or empty, which BenchConfig then refuses), else ``default``."""
    return default if value is None else value


def config_from_args(args: argparse.Namespace):
    from semimig.bench.config import BenchConfig

    quick = args.quick
    return BenchConfig(
        modes=args.modes,
        chis=_given(args.chi, (1.0, 4.0)),
        seeds=_given(args.seeds, (0,) if quick else (0, 1)),
        tp=args.tp, dp=args.dp, pattern=args.pattern, straggler_rank=args.straggler_rank,
        multi_chis=args.multi_chi, lambdas=args.lambdas, device=args.device,
        epochs=_given(args.epochs, 2 if quick else 4),
        iters_per_epoch=_given(args.iters_per_epoch, 15 if quick else 25),
        device_ms=_given(args.device_ms, 20.0 * max(2, args.tp * args.dp)),
        theta_iter=_given(args.theta_iter, BenchConfig.theta_iter),
    )


def _check_output(path: Path, flag: str, *, is_dir: bool) -> None:
    """Refuse an output path that cannot be written before any training starts (not after an hour)."""
    target = path if is_dir else path.parent
    if not is_dir and path.is_dir():
        raise ValueError(f"{flag} {path} is a directory; give a file name")
    if is_dir and path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path} is a file; give a directory")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{flag} {path}: cannot create {target} ({err.strerror})") from err
    if not os.access(target, os.W_OK):
        raise ValueError(f"{flag} {path}: {target} is not writable")


def run_bench_command(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from semimig.bench.train import run_cases
    from semimig.launch import check_backend, run_on_ranks

    try:
        cfg = config_from_args(args)
        check_backend(cfg.backend, cfg.world)
        _check_outputs(args)
    except ValueError as err:  # a flag combination BenchConfig refuses: say which, no traceback
        print(f"semimig bench: error: {err}", file=sys.stderr)
        return 2
    groups = [cfg.cases(chi, seed) for seed in cfg.seeds for chi in cfg.chis]
    records = []
    start = time.perf_counter()
    print(f"semimig bench: ViT {cfg.size} on digits, tp={cfg.tp} dp={cfg.dp}, pattern {cfg.pattern}, "
          f"{cfg.epochs}x{cfg.iters_per_epoch} iterations, "
          + (f"emulated device {cfg.device_ms:g} ms/iter, " if cfg.device == "cpu" else "")
          + f"{len(cfg.modes)} modes x {len(cfg.chis)} chi x {len(cfg.seeds)} seeds on "
          + ("CPU/gloo" if cfg.device == "cpu" else "GPUs/NCCL"))
    with Progress() as progress:
        task = progress.add_task("training", total=sum(len(cases) for cases in groups))
        for cases in groups:
            records += run_on_ranks(run_cases, cfg.world, cfg, cases, timeout_s=3600, backend=cfg.backend)
            progress.advance(task, len(cases))
    title = f"semimig bench tp={cfg.tp} {cfg.pattern} ({time.perf_counter() - start:.0f} s)"
    _write_results(args, records, dataclasses.asdict(cfg), title)
    return 0


def _check_outputs(args: argparse.Namespace) -> None:
    """``--json`` and (unless ``--no-plots``) ``--plots`` of ``bench`` and ``report``."""
    _check_output(args.json, "--json", is_dir=False)
    if not args.no_plots:
        _check_output(args.plots, "--plots", is_dir=True)


def _write_results(args: argparse.Namespace, records: list, config: dict, title: str, **json_extra) -> None:
    """The table, the JSON and (unless ``--no-plots``) the plots of ``bench`` and ``report``."""
    from semimig.bench import report

    rows = report.summarize(records)
    report.print_table(rows, title)
    report.write_json(args.json, records, rows, config, **json_extra)
    print(f"JSON: {args.json}")
    if not args.no_plots:
        for path in report.write_plots(args.plots, rows, title):
            print(f"plot: {path}")


def add_report_subcommand(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="merge saved `semimig bench` JSONs into one table, JSON and plots (no training)",
        description="Re-render saved `semimig bench` runs: e.g. the ZERO variants trained in a second run "
                    "beside the first run's baseline. The runs must share every setting but the modes, chi "
                    "values, seeds and λs, and measure no case twice.")
    p.add_argument("saved", nargs="+", type=Path, help="JSON files written by semimig bench --json")
    p.add_argument("--json", type=Path, default=Path("results/report.json"))
    p.add_argument("--plots", type=Path, default=Path("results"), help="directory for the PNG plots")
    p.add_argument("--no-plots", action="store_true")
    p.set_defaults(func=run_report_command)


def run_report_command(args: argparse.Namespace) -> int:
    from semimig.bench import report

    try:
        saved = [(str(path), report.load_saved(path)) for path in args.saved]
        records, config, machine_info = report.merge_saved(saved)
        _check_outputs(args)
    except ValueError as err:
        print(f"semimig report: error: {err}", file=sys.stderr)
        return 2
    title = f"semimig report tp={config.get('tp')} {config.get('pattern')} ({len(saved)} runs)"
    _write_results(args, records, config, title, machine_info=machine_info, sources=[n for n, _ in saved])
    return 0
