"""The two benchmarks ``semimig bench`` runs, as :class:`~semimig.bench.runner.Sweep` descriptions.

    sweep_of(BenchConfig)           the one the config asks for: ``allocation`` None or set
    straggler_sweep(BenchConfig)    1-D: every mode x chi x seed on one TP group (paper Figs. 9-11)
    grid_sweep(BenchConfig)         2-D: tp x dp with Poplar across the DP groups and SEMI in
                                    every TP group (``allocation`` even|poplar, issue 18)

Both read one run config (:class:`~semimig.bench.config.BenchConfig`); each gives the settings saved
with the results (:meth:`~semimig.bench.config.BenchConfig.settings`), the cases, the module-level
body a rank runs for one case, the banner, and how to show the finished records.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from semimig.bench.config import BenchConfig
from semimig.bench.results import describe_case
from semimig.bench.runner import Sweep
from semimig.launch import TorchrunEnv, report_activity


def sweep_of(cfg: BenchConfig) -> Sweep:
    """The benchmark of ``cfg``: the 1-D straggler sweep, or the 2-D one when ``cfg.allocation`` is set."""
    return straggler_sweep(cfg) if cfg.allocation is None else grid_sweep(cfg)


# ------------------------------------------------------------------------------------------- 1-D
def _where(device: str, env: Optional[TorchrunEnv]) -> str:
    where = "GPUs/NCCL" if device == "cuda" else "CPU/gloo"
    return where + (f", the launcher's {env.world_size} ranks" if env is not None else "")


def _compute_words(cfg: BenchConfig) -> str:
    """How a sweep's compute is obtained, for its banner."""
    return (f"emulated device {cfg.device_ms:g} ms/iter" if cfg.compute == "emulated"
            else "measured compute (real GEMMs, one thread per rank)")


def straggler_sweep(cfg: BenchConfig) -> Sweep:
    """The 1-D benchmark of a :class:`BenchConfig` (``allocation`` None)."""
    from semimig.bench.train import run_case

    if cfg.allocation is not None:
        raise ValueError(f"straggler_sweep needs a TP config (allocation None), got allocation {cfg.allocation!r}: "
                         "grid_sweep runs this one")

    def banner(todo: int, total: int, env: Optional[TorchrunEnv]) -> str:
        compute = _compute_words(cfg)
        return (f"semimig bench: ViT {cfg.size} on digits, tp={cfg.tp} dp={cfg.dp}, pattern {cfg.pattern}, "
                f"{cfg.epochs}x{cfg.iters_per_epoch} iterations, {compute}, straggler scope {cfg.scope}, {len(cfg.modes)} modes x "
                f"{len(cfg.chis)} chi x {len(cfg.seeds)} seeds on {_where(cfg.device, env)}; {todo} of {total} "
                f"cases to train; collective timeout {cfg.timeout_s:g} s"
                + ("" if cfg.evaluate else "; time only (accuracy not measured)"))

    def finish(records: list, seconds: float, plots: Optional[Path]) -> None:
        from semimig.bench.report import print_table, summarize, write_plots

        title = (f"semimig bench tp={cfg.tp} {cfg.pattern}, straggler scope={cfg.scope}, {cfg.compute} compute"
                 + ("" if cfg.evaluate else ", time only") + f" ({seconds:.0f} s)")
        rows = summarize(records)
        print_table(rows, title)
        shares = [row["busy_share"] for row in rows if row["chi"] == 1.0 and row.get("busy_share") is not None]
        if shares and cfg.compute == "measured":
            print(f"TP linear GEMMs took {100 * sum(shares) / len(shares):.0f} % of an iteration at chi = 1 (mean "
                  "over ranks and modes; busy_share_by_rank in the JSON)")
        if plots is not None:
            for path in write_plots(plots, rows, title):
                print(f"plot: {path}")

    return Sweep(config=cfg.settings(), cases=tuple(cfg.all_cases()), world=cfg.world, device=cfg.device,
                 compute=cfg.compute, timeout_s=cfg.timeout_s, body=run_case, body_args=(cfg,), banner=banner,
                 finish=finish)


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
