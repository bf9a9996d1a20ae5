"""Time to the same model under a really slow device: a real throttle (or an emulated one) on a real task.

Runs ``benchmarks/llm_run.py`` (tiny Llama, real text, torchrun, by default tp 2 with one core per
rank) once with no straggler (``healthy``) and then in every balancing mode with one rank slowed::

    --straggler real     the straggler's process under a cgroup CPU-bandwidth limit (--fraction of a
                         core, default a quarter of --share; ``semimig throttle``), nothing injected;
                         any layout: --tp N --dp M (world N*M <= 8), --straggler-rank R (default the
                         last rank; R,R,... with --pattern: a straggler that moves, the ranks taking
                         the throttled phases in turn; without it several stragglers, each at its own
                         --fraction F,F,... or all at one), --share S (every rank held to S of a core in a
                         cgroup of its own; default 1 when the world fits the cores, else cores / world:
                         four ranks on two cores at half a core each).  The job's exact limit with k of n
                         ranks chi_i = S / F_i times slower is n / (n - k + sum 1/chi_i) of healthy's step
                         (``limit_vs_healthy``, printed beside every mode's ratio)
    --straggler device   ``--straggler fixed:1:<chi>:scope=device``: every span of rank 1's work
                         between collectives takes chi times as long (default chi 4)
    --straggler gemm     ``--straggler fixed:1:<chi>``: the paper's straggler, only rank 1's linear
                         GEMMs take chi times as long (no exact limit is printed: it depends on
                         the GEMMs' share of the step)
    --straggler neighbour  a noisy neighbour: a busy loop pinned to rank 1's core for the whole
                         run (the kernel's scheduler shares the core, chi about 2); chi is read
                         from ``off``'s steady step against healthy's when ``off`` runs
    (device, gemm and neighbour run tp 2 x dp 1 with rank 1 slowed; another layout is refused)
    --pattern ON:OFF     the throttle (or the device straggler, as bursts) comes and goes; the
                         throttle's pattern starts with the first training step, and the run's
                         exact limit over the phases it spends is printed beside every mode
                         (``pattern_limit_vs_healthy``: :func:`semimig.bench.time_to_loss.pattern_limit`)

(``reshard``: exact uneven shards re-planned during training once the straggler has stayed, the
re-plan's own cost inside the step times and reported: re-plans, bytes moved, seconds moving;
``--modes ...,uneven`` adds a static uneven tensor-parallel layout, ``--shard-plan``: exact, the
slow rank holding fewer MLP blocks and KV groups; ``zero-pri`` / ``semi`` prune each layer's own K
(the training binary's ``--no-paired``, the paper, as every result before the default changed) and
``zero-pri-paired`` / ``semi-paired`` each MLP as a pair, the binary's default) and writes
``{"modes": {"healthy": {...}, "off": {...}, "zero-pri": {...}, "semi": {...}, "reshard": {...}}, ...}``
with ``steady_step_s``, ``final_val_loss``, ``time_to_target_s`` (training wall time to healthy's
final validation loss within 2 %, evaluation excluded; ``null`` if never), ``balanced_share`` and
``step_split`` (own work, collectives, balanced GEMMs, seconds) per rank and the straggler's scope;
``--plot`` draws validation loss against training time, one line per mode, a band over the repeats.  Analysis: :mod:`semimig.bench.time_to_loss`.

    python benchmarks/time_to_loss.py --straggler real --quick --json results/ttl_real.json
    python benchmarks/time_to_loss.py --straggler real --tp 2 --dp 2 --heads 16 --kv-heads 8 \
        --json results/ttl_real_tp2dp2.json       # 4 ranks on 2 cores: each at 0.5, rank 3 at 0.125

The result records the ``layout`` (tp, dp, world, share, fraction, straggler rank, cores).
Every mode's command line is checked (the binary's own checks, at the layout's world) before the
healthy run starts, and a flag that no run given would use (``--fraction`` or ``--period-us``
without the real throttle, ``--share`` or ``--straggler-rank`` without it, ``--chi`` with it,
``--shard-plan`` without ``uneven``, ``--reflex`` or ``--resize-block`` without a resizing mode) is
refused (with a share below 1 a pattern's free phases return to the share).  SIGINT, SIGTERM, SIGHUP and SIGQUIT end
the run in progress (its throttle, torchrun and ranks) and remove the scratch directory (exit
128 + the signal); a run also ends if this script is killed (:mod:`semimig._lifetime`).  A failed
run's log is kept beside ``--json`` (``<json stem>-<mode>-<repeat>.log``).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from bench_output import OutputPath, add_json_flag, write_result

ROOT = Path(__file__).resolve().parent.parent
BINARY = ROOT / "benchmarks" / "llm_run.py"
"""The LLM training binary every mode runs under torchrun (:mod:`semimig.bench.llm`)."""
MODES = ("healthy", "off", "zero-pri", "semi", "reshard", "uneven", "zero-pri-paired", "semi-paired")
"""``*-paired``: the resizing mode with ``--paired`` of the training binary (``benchmarks/llm_run.py``;
each MLP pruned as a pair, the binary's default); ``zero-pri`` / ``semi`` pass ``--no-paired`` (each layer its own K, the paper),
so a mode's name has one meaning in every result file."""
DEFAULT_MODES = ("healthy", "off", "zero-pri", "semi", "reshard")
COLLECTIVE_TIMEOUT_S = 900
"""Every process group's timeout in a run (the binary's ``--timeout-s``): a rank held to a small share
of a core takes minutes to import and reach the first collective."""


def fraction_flag(text: str):
    """``--fraction``: one share of a core (a number), or one per straggler rank (``0.25,0.125``: a tuple)."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a share of a core, or one per straggler rank (e.g. 0.25 or 0.25,0.125), "
                                         f"got {text!r}") from None
    return values[0] if len(values) == 1 else values


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """The flags every run of the binary shares (this script and ``device_vs_throttle.py``)."""
    p.add_argument("--fraction", type=fraction_flag, default=0.25, metavar="F[,F...]",
                   help="real throttle: the straggler's share of a core (absolute, not a part of --share); "
                        "time_to_loss takes one per --straggler-rank for stragglers of different speeds")
    p.add_argument("--period-us", type=int, default=4000,
                   help="real throttle: its CFS period in microseconds (semimig throttle --period-us; default 4000, "
                        "the kernel's tick at HZ=250; 1000 is the shortest the kernel takes)")
    p.add_argument("--chi", type=float, default=None, help="device straggler: rank 1's slowdown (default 4)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8, help="the tiny Llama's attention heads (llm_run.py's --heads)")
    p.add_argument("--kv-heads", type=int, default=4,
                   help="its key/value heads, the attention's re-sharding unit (llm_run.py's --kv-heads)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    add_json_flag(p, required=True, help="write the result (every run's steps and losses included) here")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="wall-clock limit of one run")


def check_run_flags(p: argparse.ArgumentParser, args: argparse.Namespace, counts: tuple[str, ...]) -> None:
    """Bounds of the shared flags and of ``counts`` (each >= 1); ``--json`` and ``--plot`` were
    checked as they were parsed (:class:`bench_output.OutputPath`)."""
    bad = [f for f in (args.fraction if isinstance(args.fraction, tuple) else (args.fraction,)) if not 0 < f <= 1]
    if bad:
        p.error(f"--fraction must be in (0, 1], got {bad[0]}")
    if not 1000 <= args.period_us <= 1_000_000:
        p.error(f"--period-us must be in [1000, 1000000] (the kernel's bounds for a CFS period), got {args.period_us}")
    if not 1 <= args.chi <= 100:
        p.error(f"--chi must be in [1, 100], got {args.chi}")
    if not 0 < args.timeout_s < math.inf:  # NaN fails too
        p.error(f"--timeout-s must be a finite number > 0, got {args.timeout_s}")
    for name in ("hidden", "layers", "heads", "kv_heads", "batch_size", "seq_len") + counts:
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")


def parse_args(argv=None) -> argparse.Namespace:
    from semimig._validate import OneLineParser  # a refusal: one line naming the flag, exit 2

    p = OneLineParser(description=__doc__.split("\n")[0])
    p.add_argument("--straggler", choices=("real", "device", "gemm", "neighbour"), required=True)
    p.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help=f"comma-separated, from {MODES} (healthy always runs; default {','.join(DEFAULT_MODES)})")
    p.add_argument("--shard-plan", default=None, metavar="MLP_UNITS:KV_UNITS",
                   help="mode uneven: the static uneven TP layout (llm_run.py's --shard-plan; default 28,4:3,1, "
                        "the DESIGN §8 plan for rank 1 four times slower at h1024)")
    p.add_argument("--reflex", default=None, choices=("on", "backward", "off"),
                   help="the step reflex of the resizing modes (llm_run.py's --reflex; default on)")
    p.add_argument("--resize-block", type=int, default=None, metavar="G",
                   help="the resizing modes prune whole blocks of G columns (llm_run.py's --resize-block; default 1)")
    p.add_argument("--pattern", default=None, metavar="ON:OFF",
                   help="real: throttled ON s, free OFF s, repeating; device: as bursts of steps")
    p.add_argument("--steps", type=int, default=None, help="training steps per run (default 60; --quick 40)")
    p.add_argument("--repeats", type=int, default=None, help="runs per mode (default 3; --quick 1)")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="one repeat of 40 steps (about 10 minutes on 2 cores)")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size (llm_run.py's --tp; default 2)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas: torchrun starts tp x dp ranks (default 1)")
    p.add_argument("--straggler-rank", default=None, metavar="R[,R...]",
                   help="real throttle: the global rank slowed (default the last one, tp x dp - 1); several with "
                        "--pattern: a straggler that moves, the ranks taking the throttled phases in turn; several "
                        "without it: stragglers slowed together, each at its own --fraction or all at one")
    p.add_argument("--share", type=float, default=None, metavar="S",
                   help="real throttle: every rank's share of a core, each in a cgroup of its own (semimig throttle "
                        "--share; default 1 when tp x dp fits the cores, else cores / (tp x dp))")
    p.add_argument("--batch-split", default=None, choices=("even", "poplar"),
                   help="dp > 1: the re-sharding and resizing modes split the global batch across the replicas "
                        "(llm_run.py's --batch-split; with reshard one joint planner chooses every replica's plan "
                        "and the split); healthy and off keep equal batches")
    p.add_argument("--max-micro-batch", type=int, default=None, metavar="ROWS",
                   help="with --batch-split: the most rows a replica runs in one forward and backward (llm_run.py's "
                        "flag; default --batch-size, the plain run's activation memory, so a replica given more rows "
                        "runs two micro-steps)")
    p.add_argument("--plot", type=Path, default=None, action=OutputPath,
                   help="PNG: validation loss against training time")
    add_run_flags(p)
    p.set_defaults(fraction=None, period_us=None)  # None: not given (a flag no run uses is refused below)
    args = p.parse_args(argv)
    check_flags_apply(p, args)
    check_layout(p, args)
    if args.steps is None:  # `is None`, not `or`: a given 0 is refused below, never replaced by the default
        args.steps = 40 if args.quick else 60
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.chi is None:
        args.chi = 4.0
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        p.error(f"--modes: unknown mode(s) {bad}; expected some of {MODES}")
    args.modes = ["healthy"] + [m for m in modes if m != "healthy"]
    check_run_flags(p, args, ("steps", "repeats", "eval_every"))
    if args.max_micro_batch is not None and not 1 <= args.max_micro_batch <= 65536:
        p.error(f"--max-micro-batch must be in [1, 65536], got {args.max_micro_batch}")
    if args.plot is not None:
        from semimig._io import check_apart, check_figure_path
        from semimig.errors import ConfigError

        try:  # refused now, not after the runs (the JSON would be written, the plot then fail or replace it)
            check_apart((("--json", args.json), ("--plot", args.plot)))
            check_figure_path(args.plot, "--plot")
        except ConfigError as err:
            p.error(str(err))
    if args.pattern is not None and isinstance(args.fraction, tuple):
        from semimig.straggler.throttle_args import fractions_text

        p.error(f"--pattern {args.pattern} with --fraction {fractions_text(args.fraction)}: a pattern's "
                "ranks take one straggler's phases in turn; give one fraction")
    if args.pattern is not None and args.straggler == "real" and args.fraction >= 1:
        p.error(f"--pattern {args.pattern} with --fraction {args.fraction:g}: the throttled phases would be free too")
    if args.pattern is not None and args.straggler == "neighbour":
        p.error("--pattern: a noisy neighbour runs for the whole run (use --straggler real or device for a pattern)")
    if args.pattern is not None:
        from semimig.errors import ConfigError
        from semimig.straggler.throttle import ThrottlePattern

        try:
            pattern = ThrottlePattern.parse(args.pattern, fraction=args.fraction)
        except ConfigError as err:
            p.error(f"--pattern: {err}")
        args.on_off = (pattern.on_s, pattern.off_s)
    if args.resize_block is not None:
        from semimig.resizing.config import BLOCKS  # imported only when asked (it brings torch)

        if args.resize_block not in BLOCKS:
            p.error(f"--resize-block must be one of {BLOCKS}, got {args.resize_block}")
    check_commands(p, args)
    return args


RESIZING = ("zero-pri", "semi", "zero-pri-paired", "semi-paired")


def check_flags_apply(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse a flag that no run of this command would use (never dropped in silence), then fill the defaults."""
    modes = [m for m in args.modes.split(",") if m]
    unused = []
    if args.straggler != "real":
        unused += [(f, v) for f, v in (("--fraction", args.fraction), ("--period-us", args.period_us),
                                       ("--share", args.share), ("--straggler-rank", args.straggler_rank))
                   if v is not None]
    if args.straggler in ("real", "neighbour") and args.chi is not None:
        unused.append(("--chi", args.chi))
    if args.shard_plan is not None and "uneven" not in modes:
        unused.append(("--shard-plan", args.shard_plan))
    if not any(m in RESIZING for m in modes):
        unused += [(f, v) for f, v in (("--reflex", args.reflex), ("--resize-block", args.resize_block)) if v is not None]
    if args.batch_split is not None and args.dp < 2:
        unused.append(("--batch-split", args.batch_split))
    if args.max_micro_batch is not None and (args.batch_split is None or args.dp < 2):
        unused.append(("--max-micro-batch", args.max_micro_batch))
    if unused:
        flag, value = unused[0]
        if isinstance(value, tuple):
            from semimig.straggler.throttle_args import fractions_text

            value = fractions_text(value)
        p.error(f"{flag} {value} applies to no run of --straggler {args.straggler} --modes {','.join(modes)}: "
                "drop it (--fraction/--period-us/--share/--straggler-rank: the real throttle; --chi: device or gemm; "
                "--shard-plan: uneven; "
                "--reflex/--resize-block: the resizing modes; --batch-split: --dp 2 or more; --max-micro-batch: "
                "--batch-split)")
    args.period_us = 4000 if args.period_us is None else args.period_us
    args.shard_plan = "28,4:3,1" if args.shard_plan is None else args.shard_plan
    args.reflex = "on" if args.reflex is None else args.reflex


MAX_WORLD = 8
"""The most ranks a run launches (every rank needs a meaningful share of this machine's cores)."""


def default_share(world: int, cores: int) -> float:
    """Each rank's share of a core when ``--share`` is not given: a whole one while the ranks fit the
    cores, else the cores split evenly (``cores / world``: 0.5 for four ranks on two cores)."""
    return 1.0 if world <= cores else cores / world


def check_layout(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The layout's bounds (``2 <= tp x dp <= MAX_WORLD``; a straggler rank inside the world; a share in
    (0, 1] with the straggler's fraction at most it), then its defaults: ``args.world``, the share, the
    straggler rank and the fraction (a quarter of the share).  Device, gemm and neighbour stragglers
    run tp 2 x dp 1 only (their rank-1 spec and core are the TP group of two's)."""
    for name in ("tp", "dp"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    args.world = args.tp * args.dp
    if not 2 <= args.world <= MAX_WORLD:
        p.error(f"--tp {args.tp} --dp {args.dp} launches {args.world} rank(s): a run needs 2..{MAX_WORLD} "
                "(a straggler and at least one other rank)")
    if args.straggler != "real" and (args.tp, args.dp) != (2, 1):
        p.error(f"--tp {args.tp} --dp {args.dp}: --straggler {args.straggler} runs tp 2 x dp 1 only (its slow "
                "rank is rank 1 of the one TP group); use --straggler real for other layouts")
    if args.straggler_rank is None:
        args.straggler_rank = args.world - 1
    else:
        from semimig.errors import ConfigError
        from semimig.straggler.throttle_args import fractions_text, parse_ranks

        try:
            ranks = parse_ranks(args.straggler_rank, "--straggler-rank")
        except ConfigError as err:
            p.error(str(err))
        outside = [r for r in ranks if r >= args.world]
        if outside:
            p.error(f"--straggler-rank must be a rank of the {args.world} launched (0..{args.world - 1}), "
                    f"got {outside[0]}")
        if isinstance(args.fraction, tuple) and len(args.fraction) != len(ranks):
            p.error(f"--fraction {fractions_text(args.fraction)} gives {len(args.fraction)} fractions for "
                    f"--straggler-rank {args.straggler_rank}'s {len(ranks)} rank(s): give one, or one per rank")
        if len(ranks) >= args.world and args.pattern is None:
            p.error(f"--straggler-rank {args.straggler_rank} slows all {args.world} ranks: a straggler needs a rank "
                    "to be slow against; leave one out")
        args.straggler_rank = ranks[0] if len(ranks) == 1 else list(ranks)
    if isinstance(args.fraction, tuple) and not isinstance(args.straggler_rank, list):
        from semimig.straggler.throttle_args import fractions_text

        p.error(f"--fraction {fractions_text(args.fraction)} gives several fractions for one straggler "
                f"rank ({args.straggler_rank}): give one, or --straggler-rank with one rank per fraction")
    args.cores = len(os.sched_getaffinity(0))
    if args.share is None:
        args.share = default_share(args.world, args.cores)
    elif not 0 < args.share <= 1:
        p.error(f"--share must be in (0, 1], got {args.share}")
    given = args.fraction is not None
    if not given:
        args.fraction = args.share / 4
    if isinstance(args.straggler_rank, list) and args.pattern is None and not isinstance(args.fraction, tuple):
        args.fraction = (args.fraction,) * len(args.straggler_rank)  # stragglers slowed together, all at one
    fractions = args.fraction if isinstance(args.fraction, tuple) else (args.fraction,)
    if given and args.straggler == "real" and (above := [f for f in fractions if 1 >= f > args.share]):
        p.error(f"--fraction {above[0]:g} is above --share {args.share:g}: the straggler would be the "
                "fastest rank; give a fraction <= the share")


def check_commands(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every mode's run of the binary parsed here with the binary's own checks (at the layout's world,
    the flags against the model included), so a run that would be refused is refused before the healthy
    run trains rather than after it."""
    from semimig.bench.llm.flags import parse_args as check_binary  # the binary's own parse and checks

    saved = {k: os.environ.get(k) for k in ("WORLD_SIZE", "RANK")}
    os.environ.update(WORLD_SIZE=str(args.world), RANK="0")
    try:
        with tempfile.TemporaryDirectory(prefix="semimig-ttl-check-") as tmp:
            for mode in args.modes:
                cmd = command(args, mode, Path(tmp) / f"{mode}.json")
                words = cmd[cmd.index(str(BINARY)) + 1:]
                said = io.StringIO()
                try:
                    with contextlib.redirect_stderr(said):
                        check_binary(words)
                except SystemExit as err:
                    if err.code:
                        reason = said.getvalue().strip().splitlines()[-1:] or [f"exit {err.code}"]
                        p.error(f"mode {mode}: its run of llm_run.py would be refused: "
                                f"{reason[0].partition('error: ')[2] or reason[0]}")
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


def command(args: argparse.Namespace, mode: str, out: Path) -> list[str]:
    """The run's command line: the binary under torchrun (``tp x dp`` ranks, ``--tp``), wrapped by
    ``semimig throttle`` (which also pins each rank to core rank mod cores; fraction 1 for the runs
    that are not really throttled, the neighbour's included).  A share below 1 holds every rank at it
    (``--share``), healthy's straggler rank included; the throttled modes' straggler at ``--fraction``."""
    example = [str(BINARY), "--data", "shakespeare",
               "--hidden", str(args.hidden), "--layers", str(args.layers), "--heads", str(args.heads),
               "--kv-heads", str(args.kv_heads), "--tp", str(args.tp), "--batch-size", str(args.batch_size),
               "--seq-len", str(args.seq_len), "--steps", str(args.steps), "--eval-every", str(args.eval_every),
               "--balance", "off" if mode in ("healthy", "off", "uneven") else mode.removesuffix("-paired"),
               "--json", str(out), "--log-every", "10",
               # a rank at an eighth of a core imports and joins the process group eight times slower
               "--timeout-s", str(COLLECTIVE_TIMEOUT_S)]
    if mode.endswith("-paired"):
        example += ["--paired"]
    elif mode in ("zero-pri", "semi"):
        example += ["--no-paired"]
    if mode == "uneven":
        example += ["--shard-plan", args.shard_plan]
    if getattr(args, "batch_split", None) and mode not in ("healthy", "off", "uneven"):
        example += ["--batch-split", args.batch_split]
        if args.max_micro_batch is not None:
            example += ["--max-micro-batch", str(args.max_micro_batch)]
    if args.resize_block is not None and mode.startswith(("zero-pri", "semi")):
        example += ["--resize-block", str(args.resize_block)]
    if args.reflex != "on" and mode in RESIZING:  # the resizing modes' reflex: the others refuse the flag
        example += ["--reflex", args.reflex]
    fraction = 1.0 if args.share >= 1 else args.share
    if mode != "healthy":
        if args.straggler in ("device", "gemm"):
            example += ["--straggler", device_spec(args)]
        elif args.straggler == "real":
            fraction = args.fraction  # one per straggler rank, or one for all (a neighbour runs beside the ranks: run_once)
    from semimig.straggler.throttle_args import fractions_text, ranks_text

    throttle = [sys.executable, "-m", "semimig.cli", "throttle", "--rank", ranks_text(args.straggler_rank),
                "--fraction", fractions_text(fraction),
                "--period-us", str(args.period_us), "--pin"]
    if args.share < 1:
        throttle += ["--share", f"{args.share:g}"]
    if mode != "healthy" and args.straggler == "real" and args.pattern:
        # the pattern starts with the first training step (the example creates the file), not with
        # the start-up: throttled from step 0, as the pattern says
        started = out.with_name(out.stem + "-started")
        throttle += ["--pattern", args.pattern, "--pattern-after", str(started), "--switch-log", str(switch_log(out))]
        example += ["--started-file", str(started)]
    # torchrun's own log directory inside the run's temporary one (its default, /tmp/torchelastic_*, stays behind)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.world),
                "--log-dir", str(out.with_name(out.stem + "-torchrun"))]
    return throttle + ["--"] + torchrun + example


def switch_log(out: Path) -> Path:
    """Where ``semimig throttle --switch-log`` writes a run's pattern switches."""
    return out.with_name(out.stem + "-switches.json")


def device_spec(args: argparse.Namespace) -> str:
    """``fixed:1:chi:scope=device`` (``--straggler gemm``: the default GEMM scope), or bursts of steps
    when a pattern is given (seconds → steps at the healthy step time are not known before the run:
    ON and OFF are read as steps here)."""
    scope = ":scope=device" if args.straggler == "device" else ""
    if args.pattern:
        on, off = (int(round(v)) for v in args.on_off)
        return f"burst:1:{args.chi:g}:every={on + off}:len={on}{scope}"
    return f"fixed:1:{args.chi:g}{scope}"


# The neighbour: spins on one core until stopped, or until its parent (this script) is gone.
_SPIN = ("import os, sys\n"
         "os.sched_setaffinity(0, {int(sys.argv[1])})\n"
         "parent = int(sys.argv[2])\n"
         "while os.getppid() == parent:\n"
         "    for _ in range(200000):\n"
         "        pass\n")


def rank_core(rank: int) -> int:
    """The core ``semimig throttle --pin`` pins LOCAL_RANK ``rank`` to (its rule: rank mod the cores it may use)."""
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[rank % len(cpus)]


@contextlib.contextmanager
def neighbour(core: Optional[int]):
    """A busy loop pinned to ``core`` while the block runs (nothing when ``core`` is None); stopped
    and reaped on every way out of the block, and it stops by itself if this process dies."""
    if core is None:
        yield
        return
    spin = subprocess.Popen([sys.executable, "-c", _SPIN, str(core), str(os.getpid())])
    try:
        yield
    finally:
        spin.kill()
        spin.wait()


def run_once(args: argparse.Namespace, mode: str, workdir: Path, repeat: int) -> dict:
    out = workdir / f"{mode}-{repeat}.json"
    cmd = command(args, mode, out)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    print(f"[{time.strftime('%H:%M:%S')}] {mode} #{repeat}: {' '.join(cmd[cmd.index('--') + 1:])}", flush=True)
    log = workdir / f"{mode}-{repeat}.log"
    busy = rank_core(args.straggler_rank) if args.straggler == "neighbour" and mode != "healthy" else None
    with open(log, "w") as f, neighbour(busy):
        returncode = run_ended(cmd, stdout=f, env=env, timeout_s=args.timeout_s)
    if returncode != 0 or not out.is_file():
        tail = log.read_text().splitlines()[-15:]
        kept = Path(args.json).with_name(f"{Path(args.json).stem}-{mode}-{repeat}.log")
        if not kept.exists():  # the scratch directory goes: the log stays where the user looks
            from semimig._io import write_atomically

            write_atomically(kept, log.read_bytes())
            log = kept
        raise SystemExit(f"time_to_loss: {mode} run {repeat} failed (exit {returncode}); last lines of {log}:\n"
                         + "\n".join(tail))
    data = json.loads(out.read_text())
    if switch_log(out).is_file():  # a throttle pattern: which steps ran throttled
        from semimig.bench.time_to_loss import held_ranks

        held = held_ranks(data["step_start_unix"], data["step_s"], json.loads(switch_log(out).read_text()))
        data["throttled"] = [None if h is None else bool(h) for h in held]
        if isinstance(args.straggler_rank, list):  # a straggler that moves: which rank each step
            data["throttled_ranks"] = [None if h is None else list(h) for h in held]
    return data


SCRATCH_PREFIX = "semimig-ttl-"
"""A run's scratch directory: ``<tmp>/semimig-ttl-<owner pid>-<random>``."""


def reap_stale_scratch() -> list[Path]:
    """Remove the scratch directories of runs whose owner is gone (killed with SIGKILL: nothing could
    clean up then); a live owner's are left alone.  Returns the removed paths."""
    import re
    import shutil

    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*"):
        match = re.fullmatch(rf"{SCRATCH_PREFIX}(\d+)-.+", path.name)
        if match is None or not path.is_dir():
            continue
        try:
            os.kill(int(match.group(1)), 0)
            continue  # its owner lives
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


class Interrupted(BaseException):
    """One of :data:`semimig._lifetime.END_SIGNALS` arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def run_ended(cmd: list[str], *, stdout, env: dict, timeout_s: float, grace_s: float = 15.0) -> int:
    """Run ``cmd`` (the throttle launcher) in a process group of its own, dying with this process; on a
    signal or past ``timeout_s`` it gets SIGTERM (it ends torchrun and the ranks and removes its
    cgroup), then SIGKILL for its whole group after ``grace_s``.  Its exit status (124 past the timeout)."""
    from semimig._lifetime import own_group_dying_with_parent

    proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                            preexec_fn=own_group_dying_with_parent())
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return 124
    except Interrupted:
        from semimig._lifetime import END_SIGNALS

        for s in END_SIGNALS:  # nothing interrupts the cleanup below
            signal.signal(s, signal.SIG_IGN)
        raise
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def run_interruptible(script: str, body, args: argparse.Namespace, argv) -> int:
    """``body(args, argv)`` with every end signal turned into :class:`Interrupted`: the run in progress is
    stopped and its scratch directory removed (``body``'s own cleanup), then ``128 + signum`` is returned."""
    from semimig._lifetime import END_SIGNALS

    previous = {s: signal.signal(s, _interrupt) for s in END_SIGNALS}
    try:
        return body(args, argv)
    except Interrupted as sig:
        for s in END_SIGNALS:  # the cleanup (the run's process group, the scratch directory) finishes undisturbed
            signal.signal(s, signal.SIG_IGN)
        print(f"{script}: {sig}: the run in progress was stopped and the scratch directory removed",
              file=sys.stderr)
        return 128 + sig.signum
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv=None) -> int:
    return run_interruptible("time_to_loss", run, parse_args(argv), argv)


def run(args: argparse.Namespace, argv) -> int:
    from semimig.bench.time_to_loss import TARGET_TOLERANCE, RunResult, exact_limit, run_order, summarize_mode

    started = time.time()
    raw: dict[str, list[dict]] = {mode: [] for mode in args.modes}
    reap_stale_scratch()
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-") as tmp:
        for k, mode in run_order(args.modes, args.repeats):  # interleaved, the order reversed every other repeat
            raw[mode].append(run_once(args, mode, Path(tmp), k))
    runs = {mode: [RunResult.from_json(d, f"{mode} run {k}") for k, d in enumerate(rs)] for mode, rs in raw.items()}
    healthy = summarize_mode(runs["healthy"], None)
    target = None if healthy["final_val_loss"] is None else healthy["final_val_loss"] * (1 + TARGET_TOLERANCE)
    modes = {mode: summarize_mode(rs, target) for mode, rs in runs.items()}
    base_step, base_time = modes["healthy"]["steady_step_s"], modes["healthy"]["time_to_target_s"]
    chi = straggler_chi(args, modes)
    limit = None if chi is None else exact_limit(chi, args.world)
    for m in modes.values():
        m["steady_vs_healthy"] = m["steady_step_s"] / base_step
        m["limit_vs_healthy"] = limit
    result = {
        "straggler": args.straggler, "scope": {"real": "real-throttle"}.get(args.straggler, args.straggler),
        "spec": straggler_spec(args), "chi": chi,
        "period_us": args.period_us if args.straggler == "real" else None,
        "pattern": args.pattern, "reflex": args.reflex, "target_val_loss": target,
        "layout": layout(args), "exact_limit_vs_healthy": limit,
        "pattern_limit_vs_healthy": pattern_limits(args, chi, modes["healthy"]),
        "unigram_entropy_nats": raw["healthy"][0]["summary"].get("unigram_entropy_nats"),
        "model": {k: getattr(args, k)
                  for k in ("hidden", "layers", "heads", "kv_heads", "batch_size", "seq_len", "steps", "eval_every")},
        "repeats": args.repeats, "wall_s": time.time() - started, "modes": modes,
        "raw": {mode: [{"step_s": d["step_s"], "val_losses": d["val_losses"], "shed": d.get("shed", []),
                        "throttled": d.get("throttled"), "step_split_each": d.get("step_split_each"),
                        "reflex_each": d.get("reflex_each"),
                        **({"throttled_ranks": d["throttled_ranks"]} if "throttled_ranks" in d else {}),
                        "summary": d["summary"]} for d in rs]
                for mode, rs in raw.items()},
    }
    write_result(args.json, "time_to_loss", argv, vars(args), **result)
    print(f"\ntime to the same model: {result['spec']}, tiny Llama h{args.hidden} x{args.layers}, "
          f"tp {args.tp} x dp {args.dp}, "
          f"{args.steps} steps x {args.repeats}; target val loss {target if target is None else round(target, 4)} "
          f"(healthy's final + {TARGET_TOLERANCE:.0%}); exact limit "
          + ("n/a" if result["exact_limit_vs_healthy"] is None
             else f"{limit:.2f}x (chi {', '.join(f'{c:.2f}' for c in (chi if isinstance(chi, list) else [chi]))}, "
                  f"{args.world} ranks)"))
    print(f"{'mode':>10} {'steady s':>9} {'vs healthy':>10} {'limit':>6} {'mean step':>9} {'worst':>6} "
          f"{'final val':>9} {'to target s':>11} {'vs healthy':>10}  balanced share by rank; re-plans")
    print(f"{'':>10} {'':>9} {'':>10} {'':>6} {'vs healthy steady step':>16}")
    for mode, m in modes.items():
        ttt = m["time_to_target_s"]
        share = " / ".join("-" if s is None else f"{s:.2f}" for s in (m["balanced_share"] or []))
        worst = "-" if m["worst_step_s"] is None else f"{m['worst_step_s'] / base_step:.2f}x"
        print(f"{mode:>10} {m['steady_step_s']:>9.3f} {m['steady_vs_healthy']:>9.2f}x "
              f"{'-' if limit is None else f'{limit:.2f}x':>6} {m['mean_step_s'] / base_step:>8.2f}x {worst:>6} "
              f"{m['final_val_loss'] if m['final_val_loss'] is not None else float('nan'):>9.4f} "
              f"{'never' if ttt is None else f'{ttt:.1f}':>11} "
              f"{'-' if ttt is None or not base_time else f'{ttt / base_time:.2f}x':>10}  {share}{replans(m)}")
    print_phases(modes)
    for mode, m in modes.items():
        fired = [n for n in m["reflex_steps_each"] if n]
        if fired:  # lossy steps that no plan shows: the rank pruned them on its own evidence
            print(f"{mode:>10} step reflex pruned steps in {len(fired)} of {m['repeats']} runs "
                  f"({', '.join(map(str, m['reflex_steps_each']))} rank-steps per run)")
    print_against_pattern(modes, result["pattern_limit_vs_healthy"])
    print(f"JSON: {args.json}")
    if args.plot:
        plot(result, args.plot)
        print(f"plot: {args.plot}")
    return 0


def layout(args: argparse.Namespace) -> dict:
    """The run's layout as the result file records it."""
    return {"tp": args.tp, "dp": args.dp, "world": args.world, "cores": args.cores, "straggler_rank": args.straggler_rank,
            "share": args.share if args.straggler == "real" else None,
            "fraction": (list(args.fraction) if isinstance(args.fraction, tuple) else args.fraction)
            if args.straggler == "real" else None}


def straggler_chi(args: argparse.Namespace, modes: dict):
    """The straggler's slowdown against the other ranks: the throttle's ``share / fraction`` (a list, one per
    rank, for stragglers of different fractions), the device straggler's ``chi``; a neighbour's from ``off``'s
    steady step against healthy's (``None`` without ``off``); none for GEMMs only."""
    if args.straggler == "real":
        if isinstance(args.fraction, tuple):
            return [args.share / f for f in args.fraction]
        return args.share / args.fraction
    if args.straggler == "device":
        return args.chi
    if args.straggler == "neighbour" and "off" in modes:
        return max(modes["off"]["steady_step_s"] / modes["healthy"]["steady_step_s"], 1.0)
    return None


def pattern_limits(args: argparse.Namespace, chi: Optional[float], healthy: dict) -> Optional[dict]:
    """The exact limit of the real throttle's pattern (:func:`semimig.bench.time_to_loss.pattern_limit`)
    for healthy's 80-step time (what the mean step is compared with) and for its time to target;
    ``None`` without a real throttle's pattern (a device straggler's bursts are counted in steps)."""
    from semimig.bench.time_to_loss import pattern_limit

    if args.straggler != "real" or not args.pattern or chi is None:
        return None
    on, off = args.on_off
    ttt = healthy["time_to_target_s"]
    return {"mean_step": pattern_limit(chi, on, off, healthy["train_s"], args.world),
            "time_to_target": None if ttt is None else pattern_limit(chi, on, off, ttt, args.world)}


def print_against_pattern(modes: dict, limits: Optional[dict]) -> None:
    """Each mode's mean step and time to target as multiples of the pattern's exact limit."""
    if not limits:
        return
    healthy = modes["healthy"]
    print(f"against the pattern's exact limit ({limits['mean_step']:.3f}x healthy's steps"
          + ("" if limits["time_to_target"] is None else f", {limits['time_to_target']:.3f}x its time to target")
          + "):")
    for mode, m in modes.items():
        if mode == "healthy":
            continue
        step = m["mean_step_s"] / healthy["mean_step_s"] / limits["mean_step"]
        ttt = m["time_to_target_s"]
        to = "never" if ttt is None or limits["time_to_target"] is None else \
            f"{ttt / healthy['time_to_target_s'] / limits['time_to_target']:.2f}x"
        print(f"{mode:>10}  mean step {step:.2f}x the limit, time to target {to}")


def straggler_spec(args: argparse.Namespace) -> str:
    """The straggler in words, for the result file and the printed header."""
    if args.straggler == "real":
        from semimig.straggler.throttle_args import ranks_text

        others = "" if args.share >= 1 else f", every other rank at {args.share:g}"
        if isinstance(args.fraction, tuple):
            return (f"ranks {ranks_text(args.straggler_rank)} at {', '.join(f'{f:g}' for f in args.fraction)} of a core"
                    f"{others}")
        if isinstance(args.straggler_rank, list) and args.pattern:
            return (f"ranks {ranks_text(args.straggler_rank)} in turn at {args.fraction:g} of a core (one at a time, "
                    f"moving each {args.pattern} phase){others}")
        return f"rank {args.straggler_rank} at {args.fraction:g} of a core{others}"
    if args.straggler == "neighbour":
        return f"a busy loop on rank {args.straggler_rank}'s core ({rank_core(args.straggler_rank)})"
    return device_spec(args)


def print_phases(modes: dict) -> None:
    """Each mode's mean step in the throttled and the free phases beside off's (when runs have phases)."""
    off = (modes.get("off") or {}).get("phase_mean_step_s")
    rows = [(m, v["phase_mean_step_s"]) for m, v in modes.items() if v.get("phase_mean_step_s")]
    if not rows:
        return
    print("mean step per phase after warm-up (vs off's):")
    for mode, phases in rows:
        cells = []
        for name in ("throttled", "free"):
            value, ref = phases.get(name), (off or {}).get(name)
            ratio = f" ({value / ref:.2f}x off)" if value is not None and ref else ""
            cells.append(f"{name} {'-' if value is None else f'{value:.3f} s'}{ratio}")
        print(f"{mode:>10}  " + ", ".join(cells))


def replans(mode: dict) -> str:
    """``; 1 re-plan(s), 3.1 MB in 0.12 s`` for a mode that re-shards (median over repeats), else ``""``."""
    r = mode.get("reshard")
    if not r:
        return ""
    return f"; {r['replans']:g} re-plan(s), {r['bytes_moved'] / 1e6:.1f} MB in {r['move_s']:.2f} s"


def plot(result: dict, path: Path) -> None:
    """Validation loss against training time (evaluation excluded), one line per mode, a band over repeats."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, runs in result["raw"].items():
        curves = []
        for run in runs:
            cum = [0.0]
            for t in run["step_s"]:
                cum.append(cum[-1] + t)
            curves.append([(cum[s], v) for s, v in run["val_losses"]])
        xs = [min(c[i][0] for c in curves) for i in range(len(curves[0]))]
        lo = [min(c[i][1] for c in curves) for i in range(len(curves[0]))]
        hi = [max(c[i][1] for c in curves) for i in range(len(curves[0]))]
        mid = [sorted(c[i][1] for c in curves)[len(curves) // 2] for i in range(len(curves[0]))]
        line, = ax.plot(xs, mid, marker="o", markersize=3, label=mode)
        if len(curves) > 1:
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2)
    if result["target_val_loss"]:
        ax.axhline(result["target_val_loss"], color="grey", linestyle="--", linewidth=1, label="target")
    ax.set(xlabel="training wall time (s, evaluation excluded)", ylabel="validation loss (nats/byte)",
           title=f"{result['spec']} ({result['scope']}), {result['repeats']} repeat(s), measured compute")
    ax.legend()
    fig.tight_layout()
    from semimig._io import write_figure

    write_figure(fig, path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
