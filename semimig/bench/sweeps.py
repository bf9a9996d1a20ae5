"""The two benchmarks ``semimig bench`` runs, as :class:`~semimig.bench.runner.Sweep` descriptions.

    sweep_of(BenchConfig)           the one the config asks for: ``allocation`` None or set
    straggler_sweep(BenchConfig)    1-D: every mode x chi x seed on one TP group
    grid_sweep(BenchConfig)         2-D: tp x dp with Poplar across the DP groups and SEMI in
                                    every TP group (``allocation`` even|poplar)
    experiment_defaults(name, ...)  what a 1-D experiment sweeps where no flag says otherwise

The 1-D experiments (:data:`~semimig.bench.choices.EXPERIMENTS`):

    slow-device   (the default) one rank a whole slow device (``scope="device"``: all its work between
                  collectives takes chi times as long, emulated by sleeps on measured compute), with
                  Colossal-AI alone (``baseline``), re-sharding (``reshard``) and ``semi`` at chi 1
                  (healthy) and 4, three seeds, test accuracy after training
    paper         the paper's method (Figs. 9-10): the straggler's linear GEMMs slowed, its seven modes

Both read one run config (:class:`~semimig.bench.config.BenchConfig`); each gives the settings saved
with the results (:meth:`~semimig.bench.config.BenchConfig.settings`), the cases, the module-level
body a rank runs for one case, the banner, and how to show the finished records.
"""
from __future__ import annotations

import contextlib
import logging
import statistics
import textwrap
from pathlib import Path
from typing import Iterator, Optional

from semimig.bench.choices import EXPERIMENTS, MODES
from semimig.bench.config import BenchConfig
from semimig.bench.results import describe_case
from semimig.bench.runner import Sweep
from semimig.errors import ConfigError
from semimig.launch import TorchrunEnv, report_activity

logger = logging.getLogger(__name__)

WIDTH = 80
"""Every line the 1-D sweep prints fits a terminal or pipe this wide."""
SLOW_DEVICE_MODES = ("baseline", "reshard", "semi")
"""The slow-device experiment's modes: Colossal-AI alone, then semimig's exact and its lossy answer."""


def experiment_defaults(experiment: str, *, measured: bool, quick: bool) -> dict:
    """The modes, chis, seeds and scope of a 1-D ``experiment`` where no flag gives them.

    ``slow-device`` makes the straggler a whole slow device where the compute is ``measured`` (every
    rank has a core or a GPU); otherwise only its GEMMs can be slowed, on the emulated device, and
    the sweep says so.  ``quick`` keeps one seed (a time-only run)."""
    if experiment not in EXPERIMENTS:
        raise ConfigError(f"experiment must be one of {', '.join(EXPERIMENTS)}, got {experiment!r}")
    if experiment == "paper":
        return {"modes": MODES, "chis": (1.0, 4.0), "seeds": (0,) if quick else (0, 1), "scope": "gemm"}
    return {"modes": SLOW_DEVICE_MODES, "chis": (1.0, 4.0), "seeds": (0,) if quick else (0, 1, 2),
            "scope": "device" if measured else "gemm"}


def sweep_of(cfg: BenchConfig) -> Sweep:
    """The benchmark of ``cfg``: the 1-D straggler sweep, or the 2-D one when ``cfg.allocation`` is set."""
    return straggler_sweep(cfg) if cfg.allocation is None else grid_sweep(cfg)


def _wrap(text: str) -> str:
    return textwrap.fill(text, WIDTH, break_on_hyphens=False)


# ------------------------------------------------------------------------------------------- 1-D
def _where(device: str, env: Optional[TorchrunEnv]) -> str:
    where = "GPUs/NCCL" if device == "cuda" else "CPU/gloo"
    return where + (f", the launcher's {env.world_size} ranks" if env is not None else "")


def _compute_words(cfg: BenchConfig) -> str:
    """How a sweep's compute is obtained, for its banner."""
    return (f"emulated device {cfg.device_ms:g} ms/iter" if cfg.compute == "emulated"
            else "measured compute (real GEMMs, one thread per rank)")


def _who(cfg: BenchConfig) -> str:
    """The straggler(s) of the pattern, in words."""
    if cfg.pattern == "fixed":
        return f"rank {cfg.straggler_rank}"
    if cfg.pattern == "round-robin":
        return "one rank per epoch, in turn"
    factors = ", ".join(f"{c:g}" for c in cfg.multi_chis[: cfg.tp])
    return f"ranks 0-{min(cfg.tp, len(cfg.multi_chis)) - 1} at {factors} x chi/8"


def straggler_words(cfg: BenchConfig) -> str:
    """What is slow in a 1-D run and how the slowness is produced (no real throttle in the bench)."""
    if cfg.scope == "device":
        return (f"straggler {_who(cfg)}, a whole slow device: all its work between collectives takes chi times as "
                "long (emulated: sleeps on measured compute, not a real throttle); chi 1 is the healthy run")
    if cfg.compute == "measured":
        how = "sleeps of (chi - 1) x their measured time, the paper's method"
    else:
        how = f"an emulated device, {cfg.device_ms:g} ms of GEMMs per iteration at chi 1"
    return f"straggler {_who(cfg)}: its linear GEMMs take chi times as long ({how}); chi 1 is the healthy run"


def straggler_sweep(cfg: BenchConfig) -> Sweep:
    """The 1-D benchmark of a :class:`BenchConfig` (``allocation`` None)."""
    if cfg.allocation is not None:
        raise ValueError(f"straggler_sweep needs a TP config (allocation None), got allocation {cfg.allocation!r}: "
                         "grid_sweep runs this one")

    def banner(todo: int, total: int, env: Optional[TorchrunEnv]) -> str:
        lines = [f"semimig bench: ViT {cfg.size} on digits, tp={cfg.tp} dp={cfg.dp}, {cfg.epochs}x"
                 f"{cfg.iters_per_epoch} iterations, {len(cfg.seeds)} seed{'' if len(cfg.seeds) == 1 else 's'}",
                 straggler_words(cfg),
                 f"compute: {_compute_words(cfg)} on {_where(cfg.device, env)}",
                 f"modes {', '.join(cfg.modes)} x chi {', '.join(f'{c:g}' for c in cfg.chis)}: {todo} of {total} "
                 f"cases to train (a frozen rank ends the run after {cfg.timeout_s:g} s)"]
        if not cfg.evaluate:
            lines.append("time only: too few iterations for accuracy to mean anything, so none is measured")
        return "\n".join(_wrap(line) for line in lines)

    def finish(records: list, seconds: float, plots: Optional[Path]) -> None:
        from semimig.bench.report import print_table, summarize, write_plots

        head = (f"semimig bench results, ViT {cfg.size} tp={cfg.tp}, {cfg.compute} compute"
                + ("" if cfg.evaluate else ", time only") + f" ({seconds:.0f} s)")
        rows = summarize(records)
        print_table(rows, f"{head}\n{straggler_words(cfg)}")
        for note in notes(cfg, rows, records):
            print(_wrap(note))
        if plots is not None:
            short = f"semimig bench tp={cfg.tp}, straggler scope={cfg.scope}, {cfg.compute} compute"
            for path in write_plots(plots, rows, short):
                print(f"plot: {path}")

    return Sweep(config=cfg.settings(), cases=tuple(cfg.all_cases()), world=cfg.world, device=cfg.device,
                 compute=cfg.compute, timeout_s=cfg.timeout_s, body=run_straggler_case, body_args=(cfg,),
                 banner=banner, finish=finish)


def notes(cfg: BenchConfig, rows: list, records: list) -> list[str]:
    """What a user should know to read a finished 1-D table beyond its legend: how much of an
    iteration the GEMMs ``semi`` shrinks took (measured compute), where ``semi`` stopped shedding on
    a rank because it did not shorten that rank's step, and which cases semimig warned in otherwise
    (each message logged at INFO, shown by ``semimig -v``)."""
    out = []
    shares = [row["busy_share"] for row in rows if row["chi"] == 1.0 and row.get("busy_share") is not None]
    if shares and cfg.compute == "measured":
        out.append(f"note: the tensor-parallel linear GEMMs (the work semi sheds) took "
                   f"{100 * statistics.mean(shares):.0f} % of an iteration at chi 1 (mean over ranks and modes)")
    dense: dict = {}
    other = []
    for record in records:
        counts = record.get("backed_off_iterations_by_rank")
        for rank, count in enumerate(counts or ()):
            if count:
                dense.setdefault((record["mode"], record["chi"], rank), []).append((record["seed"], count))
        for message in record.get("warnings") or ():
            logger.info("%s: %s", describe_case(_case(record)), message)
        if record.get("warnings") and not any(counts or ()):
            other.append(describe_case(_case(record)))
    for (mode, chi, rank), seen in sorted(dense.items()):
        seeds = ", ".join(str(seed) for seed, _ in seen)
        mean = statistics.mean(count for _, count in seen)
        out.append(f"note: {mode} at chi {chi:g} trained rank {rank} unpruned for {mean:.0f} iterations on average "
                   f"(seed{'s' if len(seen) > 1 else ''} {seeds}): shedding GEMM columns did not shorten that rank's "
                   "step enough, as too much of its time does not shrink with them")
    if other:
        out.append(f"note: semimig logged warnings while training {', '.join(other)}: the JSON keeps them "
                   "(warnings); semimig -v bench prints them")
    return out


def _case(record: dict) -> tuple:
    return (record["mode"], record.get("chi"), record["seed"], record.get("lambda"))


# ------------------------------------------------------------------------------------------- a rank's case
@contextlib.contextmanager
def _held_warnings(name: str = "semimig") -> Iterator[list[str]]:
    """Hold the warnings of ``name``'s loggers in a list instead of letting them reach stderr bare.

    A spawned rank has no logging configured, so a warning would print as one unexplained line per
    rank; the bench keeps them with the record and explains what they mean (:func:`notes`)."""

    held: list[str] = []

    class _Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            held.append(record.getMessage())

    handler, log = _Hold(logging.WARNING), logging.getLogger(name)
    log.addHandler(handler)
    try:
        yield held
    finally:
        log.removeHandler(handler)


def _backed_off(decisions) -> Optional[list[int]]:
    """Per rank, the decisions at which it straggled but did not shed (``backed_off``), or ``None``."""
    found = [d["backed_off"] for d in decisions or () if isinstance(d, dict) and "backed_off" in d]
    if not found:
        return None
    size = 1 + max((r for backed in found for r in backed), default=-1)
    return [sum(r in backed for backed in found) for r in range(size)]


def run_straggler_case(rank: int, world: int, cfg: BenchConfig, case: tuple) -> dict:
    """One 1-D case on every rank (the body the runner runs): :func:`semimig.bench.train.run_case`,
    with every rank's semimig warnings kept in the record (``warnings``) and the
    iterations each rank was left unpruned (``backed_off_iterations_by_rank``)."""
    import torch.distributed as dist

    from semimig.bench.train import run_case

    with _held_warnings() as held:
        record = run_case(rank, world, cfg, case)
    every: list = [None] * world
    dist.all_gather_object(every, held)  # a rank's own warnings (the group's decisions are on every rank)
    decisions = (record.get("trajectory") or {}).get("decisions")
    return {**record, "warnings": list(dict.fromkeys(m for messages in every for m in messages)),
            "backed_off_iterations_by_rank": _backed_off(decisions)}


# ------------------------------------------------------------------------------------------- 2-D
def run_grid_case(rank: int, world: int, cfg: BenchConfig, case: tuple) -> dict:
    """One 2-D case ``(mode, None, seed, None)`` on every rank (the body run_on_ranks runs);
    ``cfg.evaluate=False`` (``--quick``) drops the accuracy of a run too short for it to mean anything."""
    from semimig.bench.train2d import train_2d_case

    report_activity(f"training {describe_case(case)}")
    mode, _, seed, _ = case
    record = train_2d_case(cfg, mode, seed)
    return record if cfg.evaluate else {**record, "accuracy": None}


def grid_sweep(cfg: BenchConfig) -> Sweep:
    """The 2-D benchmark of a :class:`BenchConfig` with ``allocation`` even or poplar."""
    if cfg.allocation is None:
        raise ValueError("grid_sweep needs a 2-D config (allocation 'even' or 'poplar'); straggler_sweep runs this one")
    pattern = " / ".join(",".join(f"{c:g}" for c in row) for row in cfg.grid_chis())

    def banner(todo: int, total: int, env: Optional[TorchrunEnv]) -> str:
        compute = _compute_words(cfg)
        return (f"semimig bench 2-D: ViT {cfg.size} on digits, tp={cfg.tp} x dp={cfg.dp}, zero {cfg.zero_stage} "
                f"{cfg.precision}, allocation {cfg.allocation}, chi per group {pattern}, "
                f"{cfg.epochs}x{cfg.iters_per_epoch} iterations of {cfg.global_batch_size} samples, {compute}, "
                f"modes {', '.join(cfg.modes)} x {len(cfg.seeds)} seeds on {_where(cfg.device, env)}; {todo} of "
                f"{total} cases to train; collective timeout {cfg.timeout_s:g} s"
                + ("" if cfg.evaluate else "; time only (accuracy not measured)"))

    def finish(records: list, seconds: float, plots: Optional[Path]) -> None:
        from semimig.bench import grid

        grid.show(records, f"semimig bench 2-D tp={cfg.tp} dp={cfg.dp}, {cfg.allocation} allocation, chi {pattern}, "
                           f"{cfg.compute} compute ({seconds:.0f} s)", plots)

    return Sweep(config=cfg.settings(), cases=tuple(cfg.all_cases()), world=cfg.world, device=cfg.device,
                 compute=cfg.compute, timeout_s=cfg.timeout_s, body=run_grid_case, body_args=(cfg,), banner=banner,
                 finish=finish)
