"""The two benchmarks ``semimig bench`` runs, as :class:`~semimig.bench.runner.Sweep` descriptions.

    straggler_sweep(BenchConfig)           1-D: every mode x chi x seed on one TP group (paper Figs. 9-11)
    grid_sweep(Hybrid2DConfig, ...)        2-D: tp x dp with Poplar across the DP groups and SEMI in
                                           every TP group (``--allocation even|poplar``, issue 18)

Each gives the settings saved with the results, the cases, the module-level body a rank runs
for one case, the banner, and how to show the finished records.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Optional

from semimig.bench.config import BenchConfig
from semimig.bench.results import describe_case
from semimig.bench.runner import Sweep
from semimig.launch import TorchrunEnv, report_activity

MODES_BY_ALLOCATION = {"even": ("baseline", "semi"), "poplar": ("baseline", "poplar", "semi", "poplar+semi")}
"""The 2-D modes each ``--allocation`` compares (``even`` has no Poplar plan to show)."""


# ------------------------------------------------------------------------------------------- 1-D
def _where(device: str, env: Optional[TorchrunEnv]) -> str:
    where = "GPUs/NCCL" if device == "cuda" else "CPU/gloo"
    return where + (f", the launcher's {env.world_size} ranks" if env is not None else "")


def straggler_sweep(cfg: BenchConfig) -> Sweep:
    """The 1-D benchmark of :class:`BenchConfig`."""
    from semimig.bench.train import run_case

    def banner(todo: int, total: int, env: Optional[TorchrunEnv]) -> str:
        compute = (f"emulated device {cfg.device_ms:g} ms/iter" if cfg.compute == "emulated"
                   else "measured compute (real GEMMs, one thread per rank)")
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

    return Sweep(config=dataclasses.asdict(cfg), cases=tuple(cfg.all_cases()), world=cfg.world, device=cfg.device,
                 compute=cfg.compute, timeout_s=cfg.timeout_s, body=run_case, body_args=(cfg,), banner=banner,
                 finish=finish)


# ------------------------------------------------------------------------------------------- 2-D
def run_grid_case(rank: int, world: int, cfg, evaluate: bool, case: tuple) -> dict:
    """One 2-D case ``(mode, None, seed, None)`` on every rank (the body run_on_ranks runs);
    ``evaluate=False`` (``--quick``) drops the accuracy of a run too short for it to mean anything."""
    from semimig.bench.train2d import train_2d_case

    report_activity(f"training {describe_case(case)}")
    mode, _, seed, _ = case
    record = train_2d_case(cfg, mode, seed)
    return record if evaluate else {**record, "accuracy": None}


def grid_longest_wait_s(cfg) -> float:
    """Emulated: the slowest rank's GEMM time of one even iteration (0 when measured)."""
    if cfg.timing == "measured":
        return 0.0
    return max(max(row) for row in cfg.chis()) * cfg.device_ms / 1000.0


def grid_timeout_s(cfg, timeout_s: Optional[float]) -> float:
    """The collective timeout: given, or minutes sized to the work (ten of the slowest rank's
    emulated GEMM time per iteration, at least 120 s; measured: 300 s)."""
    if timeout_s is not None:
        return timeout_s
    if cfg.timing == "measured":
        return 300.0
    return float(max(120.0, math.ceil(10 * grid_longest_wait_s(cfg))))


def grid_sweep(cfg, *, allocation: str, timeout_s: float, evaluate: bool = True, device: str = "cpu") -> Sweep:
    """The 2-D benchmark of a :class:`semimig.hybrid.Hybrid2DConfig` (``allocation``: even or poplar)."""
    config = {**dataclasses.asdict(cfg), "allocation": allocation, "timeout_s": timeout_s, "device": device,
              "evaluate": evaluate}

    def banner(todo: int, total: int, env: Optional[TorchrunEnv]) -> str:
        compute = (f"emulated device {cfg.device_ms:g} ms/iter" if cfg.timing == "emulated"
                   else "measured compute (real GEMMs, one thread per rank)")
        pattern = " / ".join(",".join(f"{c:g}" for c in row) for row in cfg.chis())
        return (f"semimig bench 2-D: ViT {cfg.size} on digits, tp={cfg.tp} x dp={cfg.dp}, zero {cfg.zero_stage} "
                f"{cfg.precision}, allocation {allocation}, chi per group {pattern}, {cfg.epochs}x{cfg.iters_per_epoch} "
                f"iterations of {cfg.global_batch_size} samples, {compute}, modes {', '.join(cfg.modes)} x "
                f"{len(cfg.seeds)} seeds on {_where(device, env)}; {todo} of {total} cases to train; collective "
                f"timeout {timeout_s:g} s" + ("" if evaluate else "; time only (accuracy not measured)"))

    def finish(records: list, seconds: float, plots: Optional[Path]) -> None:
        from semimig.bench import grid

        pattern = " / ".join(",".join(f"{c:g}" for c in row) for row in cfg.chis())
        grid.show(records, f"semimig bench 2-D tp={cfg.tp} dp={cfg.dp}, {allocation} allocation, chi {pattern}, "
                           f"{cfg.timing} compute ({seconds:.0f} s)", plots)

    cases = tuple((mode, None, seed, None) for mode, seed in cfg.cases())
    return Sweep(config=config, cases=cases, world=cfg.world, device=device, compute=cfg.timing, timeout_s=timeout_s,
                 body=run_grid_case, body_args=(cfg, evaluate), banner=banner, finish=finish)
