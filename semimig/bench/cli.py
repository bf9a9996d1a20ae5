"""``semimig bench``: the end-to-end straggler benchmark (ViT on digits, HybridParallelPlugin).

By default (the slow-device experiment) rank 1 of a tp 2 group is a whole slow device, chi = 4
times slower at all its work (emulated on measured compute, not a real throttle), and the same
model is trained by Colossal-AI alone (baseline), with re-sharding (reshard) and with semi, and
healthy (chi = 1): the time per epoch and the test accuracy each reached (about 5 minutes on 2
CPU cores).  On fewer cores than ranks only the GEMMs can be slowed (emulated device).

    semimig bench                                   # the slow-device experiment
    semimig bench --experiment paper                # the paper's GEMM-only straggler, its seven modes
    semimig bench --quick                           # 40 iterations, one seed, time only
    semimig bench --compute emulated --tp 4         # 4 ranks on 2 cores: an emulated device
    torchrun --nproc_per_node 2 -m semimig bench    # the launcher's ranks (several nodes: its rendezvous flags)
    semimig bench --modes baseline,semi --chi 1,4,8 --tp 4 --seeds 0,1,2 --json r.json
    semimig bench --tp 4 --pattern multi --modes baseline,semi --chi 1,8 --lambdas 0,1,2,3   # Fig. 11
    semimig bench --tp 2 --dp 2 --allocation poplar # 2-D: Poplar across DP groups + SEMI in each TP group
    semimig bench ... --resume                      # an interrupted run: train only the missing cases
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from pathlib import Path
from typing import Optional

# not their owners: those import torch (--help quick)
from semimig.bench.choices import COMPUTES, EXPERIMENTS, MODES, MODES_2D, RESHARD_MODES
from semimig.bench.schema import is_grid
from semimig.errors import ConfigError

logger = logging.getLogger(__name__)


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
    known = MODES + RESHARD_MODES + tuple(m for m in MODES_2D if m not in MODES)
    modes = tuple(t for t in text.split(",") if t)
    for mode in modes:
        if mode not in known:
            raise argparse.ArgumentTypeError(f"unknown mode {mode!r}; choose from {', '.join(known)}")
    return modes


def _group_chis(text: str) -> tuple[tuple[float, ...], ...]:
    """``1,4/2,2``: DP groups separated by ``/``, the TP ranks' slowdowns of a group by ``,``."""
    try:
        return tuple(tuple(float(t) for t in group.split(",")) for group in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected per-group slowdowns like 1,4/2,2, got {text!r}") from None


def _size(text: str):
    from semimig.models import VitSize

    try:
        return VitSize.parse(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_bench_subcommand(subparsers) -> None:
    p = subparsers.add_parser("bench", help="end-to-end straggler benchmark (RT and ACC per mode)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", choices=EXPERIMENTS, default=None,
                   help="slow-device (default): rank 1 a whole slow device, Colossal-AI alone (baseline) beside "
                        "reshard and semi, 3 seeds; paper: the paper's GEMM-only straggler and its seven modes, "
                        "2 seeds. Other flags override either")
    p.add_argument("--modes", type=_modes, default=None,
                   help=f"comma-separated, from {','.join(MODES + RESHARD_MODES)}; with --allocation from "
                        f"{','.join(MODES_2D)} (default: slow-device baseline,reshard,semi; paper all but "
                        "reshard; --allocation even: baseline,semi)")
    p.add_argument("--chi", type=_floats, default=None, help="straggler slowdowns in [1, 100], e.g. 1,4,8 (default 1,4)")
    p.add_argument("--seeds", type=_ints, default=None,
                   help="e.g. 0,1,2 (default: slow-device 0,1,2; paper 0,1; --quick: 0)")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dp", type=int, default=None, help="data-parallel groups (default 1; with --allocation 2)")
    p.add_argument("--pattern", choices=("fixed", "round-robin", "multi"), default=None, help="default fixed")
    p.add_argument("--straggler-rank", type=int, default=None, help="pattern fixed: the straggler (default 1)")
    p.add_argument("--scope", choices=("gemm", "device"), default=None,
                   help="what of the straggler is slow: all of its work between collectives (device; measured "
                        "compute only; the slow-device default) or its linear GEMMs (gemm, the paper's method; "
                        "the default of paper and of emulated compute)")
    p.add_argument("--multi-chi", type=_floats, default=None,
                   help="per-rank factors of the multi pattern at chi = 8 (scaled by chi/8; default 8,6,4,2)")
    p.add_argument("--lambdas", type=_ints, default=None,
                   help="with --pattern multi: also train semi with exactly λ migrating stragglers, e.g. 0,1,2,3 "
                        "(paper Fig. 11; plot lambda_sweep.png)")
    p.add_argument("--allocation", choices=("even", "poplar"), default=None,
                   help="the 2-D benchmark (tp x dp): even batches, or Poplar's plan across the DP groups; "
                        "modes baseline, poplar (allocation only), semi (TP balancing only), poplar+semi")
    p.add_argument("--group-chis", type=_group_chis, default=None, metavar="C,C/C,C",
                   help="with --allocation: slowdown of every TP rank of every DP group, groups separated by '/' "
                        "(default: rank 1 of group 0 at 4, group 1 at half speed: 1,4/2,2)")
    p.add_argument("--zero-stage", type=int, default=None,
                   help="with --allocation: ZeRO stage 0, 1 or 2 (1 and 2 train in bf16, as Colossal-AI requires)")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--iters-per-epoch", type=int, default=None)
    p.add_argument("--compute", choices=COMPUTES, default=None,
                   help="measured: real GEMMs, one thread per rank, the straggler sleeps (chi-1) x its measured "
                        "time (default when every rank has a core); emulated: every GEMM sleeps chi x flops / "
                        "rate of a nominal device (default otherwise; ranks may share cores)")
    p.add_argument("--model", type=_size, default=None, metavar="HxIxL",
                   help="ViT hidden x intermediate x layers (default 256x1536x1 measured, 64x256x2 emulated)")
    p.add_argument("--device-ms", type=float, default=None,
                   help="emulated compute: GEMM time of one rank per iteration at chi = 1 (default 20 ms per rank "
                        "sharing this machine, at least 40: device time must dominate the host work)")
    p.add_argument("--theta-iter", type=float, default=None,
                   help="zero-pridiff-* modes: the paper's absolute micro-threshold, e.g. 1e-3 (default: a "
                        "threshold relative to each layer's median column change)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: gloo ranks; cuda: one NCCL rank per GPU, real device time (measured compute)")
    p.add_argument("--timeout-s", type=float, default=None,
                   help="collective timeout: a frozen or dead rank ends the run within it (default: sized to the "
                        "work, 120-300 s)")
    p.add_argument("--quick", action="store_true",
                   help="40 iterations, one seed, time only: too few iterations for accuracy to mean anything, "
                        "so none is measured (a few minutes)")
    p.add_argument("--json", type=Path, default=Path("results/bench.json"),
                   help="results file, rewritten atomically after every finished case")
    p.add_argument("--resume", action="store_true",
                   help="keep the cases already in --json (same settings) and train only the missing ones")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --json file and its finished cases (without it, or --resume, an existing "
                        "results file is refused before any training)")
    p.add_argument("--full-trace", action="store_true",
                   help="also keep every rank's per-iteration trace and the per-iteration decisions in --json "
                        "(~0.5 MB per case at tp 4; by default: summaries and the per-iteration iteration time)")
    p.add_argument("--plots", type=Path, default=Path("results"), help="directory for the PNG plots")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="check every setting and list the cases; start no rank")
    p.set_defaults(func=run_bench_command)


def _given(value, default):
    """The flag's value when it was given (even 0 or empty, which BenchConfig then refuses), else ``default``."""
    return default if value is None else value


_FLAGS = {"modes": "--modes", "chis": "--chi", "seeds": "--seeds", "tp": "--tp", "dp": "--dp",
          "straggler_rank": "--straggler-rank", "scope": "--scope", "multi_chis": "--multi-chi", "lambdas": "--lambdas",
          "epochs": "--epochs", "iters_per_epoch": "--iters-per-epoch", "device_ms": "--device-ms",
          "theta_iter": "--theta-iter", "timeout_s": "--timeout-s", "compute": "--compute",
          "group_chis": "--group-chis", "zero_stage": "--zero-stage"}


def _flag_of(message: str) -> str:
    """``--chi: `` when the message starts with a BenchConfig field a flag sets, else nothing."""
    field = message.split(" ", 1)[0].split("[", 1)[0].split("=", 1)[0]
    return f"{_FLAGS[field]}: " if field in _FLAGS else ""


def default_compute(device: str, local_ranks: int) -> str:
    """Measured wherever each local rank gets a core of its own (or a GPU), emulated otherwise."""
    from semimig.bench.runner import usable_cores

    return "measured" if device == "cuda" or local_ranks <= usable_cores() else "emulated"


_ONE_D_ONLY = {"experiment": "--experiment", "chi": "--chi", "pattern": "--pattern", "straggler_rank": "--straggler-rank", "scope": "--scope",
               "multi_chi": "--multi-chi", "lambdas": "--lambdas", "theta_iter": "--theta-iter"}
_TWO_D_ONLY = {"group_chis": "--group-chis", "zero_stage": "--zero-stage"}


def _refuse_given(args: argparse.Namespace, flags: dict, why: str) -> None:
    given = [flag for name, flag in flags.items() if getattr(args, name) is not None]
    if given:
        raise ConfigError(f"{', '.join(given)} {why}")


def config_from_args(args: argparse.Namespace, *, local_ranks: Optional[int] = None):
    """The run's :class:`~semimig.bench.config.BenchConfig` from the flags: the 1-D straggler sweep, or the
    2-D mode with ``--allocation`` (``local_ranks``: ranks on this machine, default tp*dp).

    The command line has defaults of its own: 4x25 iterations (``--quick``: 2x20, one seed); 1-D, those of
    ``--experiment`` (:func:`semimig.bench.sweeps.experiment_defaults`; slow-device unless given); 2-D, two
    seeds; and it sizes the emulated device to the ranks sharing this machine: 20 ms per rank (at least
    40), 2-D 40 ms per rank (at least 150)."""
    from semimig.bench.config import MODES_BY_ALLOCATION, BenchConfig

    grid = args.allocation is not None
    if grid:
        _refuse_given(args, _ONE_D_ONLY, "applies to the 1-D straggler sweep, not to --allocation (give the 2-D "
                                         "slowdowns with --group-chis)")
        if args.device != "cpu":
            raise ConfigError(f"--allocation runs on CPU ranks only, got --device {args.device}")
        allowed = MODES_BY_ALLOCATION[args.allocation]
        for mode in args.modes or ():
            if mode not in allowed:
                raise ConfigError(f"--modes: mode {mode!r} does not go with --allocation {args.allocation} (it "
                                  f"compares {', '.join(allowed)})")
    else:
        _refuse_given(args, _TWO_D_ONLY, "applies to the 2-D benchmark: add --allocation even|poplar")
    quick = args.quick
    args.dp = _given(args.dp, 2 if grid else 1)
    world = args.tp * args.dp
    compute = _compute(args, local_ranks)
    common = dict(
        allocation=args.allocation, tp=args.tp, dp=args.dp, device=args.device, compute=compute,
        epochs=_given(args.epochs, 2 if quick else 4),
        iters_per_epoch=_given(args.iters_per_epoch, 20 if quick else 25),
        device_ms=_given(args.device_ms, max(150.0, 40.0 * world) if grid else 20.0 * max(2, world)),
        evaluate=not quick, timeout_s=args.timeout_s, size=args.model,
    )
    if grid:
        zero = _given(args.zero_stage, 0)
        return BenchConfig(**common, modes=args.modes, seeds=_given(args.seeds, (0,) if quick else (0, 1)),
                           zero_stage=zero, precision="bf16" if zero else "fp32", group_chis=_given(args.group_chis, ()))
    experiment = _experiment(args, compute)
    return BenchConfig(
        **common, modes=_given(args.modes, experiment["modes"]), seeds=_given(args.seeds, experiment["seeds"]),
        chis=_given(args.chi, experiment["chis"]), pattern=_given(args.pattern, "fixed"),
        straggler_rank=_given(args.straggler_rank, 1), scope=_given(args.scope, experiment["scope"]),
        multi_chis=_given(args.multi_chi, (8.0, 6.0, 4.0, 2.0)), lambdas=_given(args.lambdas, ()),
        theta_iter=args.theta_iter,
    )


def _experiment(args: argparse.Namespace, compute: str) -> dict:
    """The defaults of ``--experiment`` (slow-device unless given); warns when this machine leaves the slow
    device only GEMM-slow (no core or GPU per rank) without a ``--compute`` or ``--scope`` that chose so."""
    from semimig.bench.sweeps import experiment_defaults

    name = args.experiment or "slow-device"
    defaults = experiment_defaults(name, measured=compute == "measured", quick=args.quick)
    if name == "slow-device" and compute != "measured" and args.compute is None and args.scope is None:
        logger.warning("fewer cores than ranks: only the straggler's GEMMs are slowed, not its whole device")
    return defaults


def _compute(args: argparse.Namespace, local_ranks: Optional[int]) -> str:
    compute = args.compute or default_compute(args.device, local_ranks or args.tp * args.dp)
    if compute == "measured" and args.device_ms is not None:
        raise ConfigError(f"--device-ms {args.device_ms:g} sets the emulated device; measured compute times the real "
                          "GEMMs: drop it or add --compute emulated")
    return compute


def sweep_from_args(args: argparse.Namespace, *, local_ranks: Optional[int] = None):
    """The :class:`~semimig.bench.runner.Sweep` the flags ask for: 1-D, or 2-D with ``--allocation``."""
    from semimig.bench import sweeps

    return sweeps.sweep_of(config_from_args(args, local_ranks=local_ranks))


@contextlib.contextmanager
def _quit_terminates():
    """SIGQUIT ends a spawned run as SIGTERM and SIGHUP do (the ranks stopped and reaped, the finished cases
    kept, exit 128 + 3), not by killing this process alone and leaving the ranks to notice."""
    import signal

    from semimig.launch import Terminated

    def handler(signum, _frame):
        raise Terminated(signum)

    import threading

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    previous = signal.signal(signal.SIGQUIT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGQUIT, previous)


def run_bench_command(args: argparse.Namespace) -> int:
    """Check every flag before any rank starts; then train on spawned or launcher-given ranks."""
    from semimig.bench import runner
    from semimig.launch import TorchrunEnv

    env = None
    try:
        env = TorchrunEnv.from_environ()
        if not (args.no_plots or args.resume or args.overwrite):  # a resumed run redraws its own plots
            check_plots_new(args.plots)
        sweep = sweep_from_args(args, local_ranks=env.local_world_size if env else None)
        out = runner.Outputs(json=args.json, plots=None if args.no_plots else args.plots, resume=args.resume,
                             overwrite=args.overwrite, dry_run=args.dry_run, argv=getattr(args, "argv", None),
                             full_trace=args.full_trace)
        if env is None:
            with _quit_terminates():
                return runner.run_spawned(sweep, out)
        return runner.run_launched(sweep, out, env)
    except (ConfigError, runner.Refused) as err:  # refused before training: say which, no traceback
        if env is None or env.local_rank == 0:
            message = str(err)
            print(f"semimig bench: error: {_flag_of(message)}{message}", file=sys.stderr, flush=True)
        else:
            _let_local_rank_zero_speak()
        return getattr(err, "code", 2)
    except runner.Stopped as err:
        if env is None or env.rank == 0:
            print(f"semimig bench: {err}", file=sys.stderr)
        return err.code


REFUSAL_GRACE_S = 10.0
"""How long a launcher's other local ranks wait before they exit on a refusal that every rank reached."""


def _let_local_rank_zero_speak() -> None:
    """Wait (at most :data:`REFUSAL_GRACE_S`) before a silent rank exits on a refusal.

    Every rank reaches the same refusal; local rank 0 alone prints it.  torchrun stops every rank
    as soon as the first one exits, so a silent rank that exited first would have local rank 0
    killed before it printed: the user would see a failed launch and no reason.  Waiting lets local
    rank 0 exit first (the launcher then stops this rank); the wait is bounded so that a launcher
    which does not stop the others still ends."""
    import time

    time.sleep(REFUSAL_GRACE_S)


PLOT_FILES = ("rt_vs_chi.png", "acc_delta.png", "lambda_sweep.png", "grid_modes.png")
"""The files ``bench`` and ``report`` draw in ``--plots DIR`` (:func:`semimig.bench.report.write_plots`,
:func:`semimig.bench.grid.write_plot`)."""


def check_plots_new(directory: Path) -> None:
    """Refuse a ``--plots`` directory that holds one of :data:`PLOT_FILES` already (``--overwrite`` replaces them)."""
    there = [name for name in PLOT_FILES if (Path(directory) / name).exists()]
    if there:
        raise ConfigError(f"--plots {directory} holds {', '.join(there)} already: pass --overwrite to replace "
                          "them, or choose another --plots directory (or --no-plots)")


def _check_outputs(args: argparse.Namespace) -> None:
    """``--json`` (never one of the saved runs it reads) and (unless ``--no-plots``) ``--plots`` of ``report``:
    an existing file is replaced only with ``--overwrite``."""
    from semimig._io import check_new_file
    from semimig.bench.results import check_outputs

    check_outputs(args.json, None if args.no_plots else args.plots, inputs=args.saved)
    if not args.no_plots and not args.overwrite:
        check_plots_new(args.plots)
    if _is_bench_run(args.json):
        raise ConfigError(f"--json {args.json} holds a semimig bench run (its records are not among the inputs); "
                          "a report would replace it: choose another --json, or pass it as an input to merge it")
    check_new_file(args.json, "--json", overwrite=args.overwrite)


def _is_bench_run(path: Path) -> bool:
    """Whether ``path`` is a results file written by ``semimig bench`` (a report has ``sources``, no ``status``)."""
    import json

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and "status" in data and "records" in data


def _write_results(args: argparse.Namespace, records: list, config: dict, title: str, **json_extra) -> None:
    """The table, the JSON and (unless ``--no-plots``) the plots of ``report`` (1-D or 2-D runs)."""
    from semimig.bench import grid, report

    if is_grid(config):
        rows = grid.summarize(records)
        grid.print_table(rows, title)
        plots = [] if args.no_plots else [grid.write_plot(args.plots, rows, title)]
    else:
        rows = report.summarize(records)
        report.print_table(rows, title)
        plots = [] if args.no_plots else report.write_plots(args.plots, rows, title)
    report.write_json(args.json, records, rows, config, **json_extra)
    print(f"JSON: {args.json}")
    for path in plots:
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
    p.add_argument("--overwrite", action="store_true", help="replace an existing --json file and plots")
    p.set_defaults(func=run_report_command)


def run_report_command(args: argparse.Namespace) -> int:
    from semimig.bench import report

    try:
        _check_outputs(args)
        saved = [(str(path), report.load_saved(path)) for path in args.saved]
        records, config, machine_info = report.merge_saved(saved)
    except ConfigError as err:
        print(f"semimig report: error: {err}", file=sys.stderr)
        return 2
    if is_grid(config):
        title = (f"semimig report 2-D tp={config.get('tp')} dp={config.get('dp')}, {config.get('allocation')} "
                 f"allocation ({len(saved)} runs)")
    else:
        title = (f"semimig report tp={config.get('tp')} {config.get('pattern')}, straggler scope="
                 f"{config.get('scope', 'gemm')}, {config.get('compute')} compute "
                 f"(from {len(saved)} file{'' if len(saved) == 1 else 's'})")
    _write_results(args, records, config, title, machine_info=machine_info, sources=[n for n, _ in saved])
    return 0
