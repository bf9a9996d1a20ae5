"""One benchmark case on one rank: train the ViT through ``HybridParallelPlugin`` and time it.

A case is (mode, chi, seed, λ).  ``baseline`` uses Colossal-AI's own policy and layers, slowed by
hooks (:class:`~semimig.straggler.hooks.BaselineInjection`); ``reshard`` builds the ViT with the
even plan in units (:meth:`BenchConfig.reshard_plan`) and runs it through the user's entry point,
``semimig.enable(..., mode="reshard")``, which probes the devices, re-plans the shards and moves
weights and AdamW state (the record's ``reshard``: every re-plan, bytes and seconds); every other
mode uses :class:`SemiMigPolicy` and a :class:`BalanceController`.  Both see the same straggler in the same
compute mode (``BenchConfig.compute``), so the only difference is what semimig does about it.
Iteration time is the wall time from one optimizer step to the next on every rank (collectives
already synchronise the TP group); rank 0 reports.

The record keeps, besides times, accuracy and per rank the shed share, the savings and the
balanced share (GEMM busy time over the rank's own work, wall time minus time in collectives),
the trajectory of every iteration: per rank the busy time, own work, shed target γ, per-layer
γs, achieved GEMM savings and migrated shares, and once per iteration the group's decision
(flagged ranks, unpruned-time estimates, reference).  Results files keep the per-rank trajectory
and the decisions only with ``semimig bench --full-trace`` (:data:`semimig.bench.results.TRACE_KEYS`).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Optional

import torch
import torch.distributed as dist

from semimig.bench.config import BenchConfig
from semimig.bench.loop import boost_vit, dense_accuracy, timed_epochs
from semimig.models import digits_split


def _batches(x, y, cfg: BenchConfig, seed: int, dp_rank: int, epoch: int):
    """The epoch's batches for this DP rank: a seeded shuffle, disjoint slices per DP rank."""
    gen = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = torch.randperm(len(y), generator=gen)
    for it in range(cfg.iters_per_epoch):
        start = ((it * cfg.dp + dp_rank) * cfg.batch) % (len(y) - cfg.batch)
        idx = order[start:start + cfg.batch].to(x.device)
        yield x[idx], y[idx]


def _plain(value: Any, digits: int = 6) -> Any:
    """``value`` as compact JSON-ready data: floats rounded to ``digits`` significant digits, NaN -> None."""
    if isinstance(value, float):
        return None if not math.isfinite(value) else float(f"{value:.{digits}g}")
    if isinstance(value, (list, tuple)):
        return [_plain(v, digits) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, digits) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), digits) for f in dataclasses.fields(value)}
    return value


class _Trajectory:
    """Per-iteration columns of one rank (and the group's decisions, identical on every rank)."""

    def __init__(self) -> None:
        self.rank: dict[str, list] = {"busy_s": [], "compute_s": []}
        self.decisions: list = []

    def add_step(self, step) -> None:
        compute = step.device.compute_s if step.device is not None else math.nan  # CUDA: the first step is unresolved
        row = {"busy_s": step.busy.busy_s, "compute_s": compute, "work_fraction": step.busy.work_fraction,
               "gamma_target": step.gamma_target, "gamma_per_layer": list(step.gamma_per_layer),
               "achieved_savings": step.achieved_savings, "migrate": dict(step.migrate)}
        for key, value in row.items():
            self.rank.setdefault(key, []).append(value)
        decision = getattr(step, "decision", None)
        self.decisions.append(None if decision is None else _plain(decision))

    def add_busy(self, busy_s: float, compute_s: float) -> None:
        self.rank["busy_s"].append(busy_s)
        self.rank["compute_s"].append(compute_s)


def train_case(rank: int, world: int, cfg: BenchConfig, mode: str, chi: float, seed: int,
               lam: Optional[int] = None, *, local_rank: Optional[int] = None) -> dict:
    """Train one case; returns its record (identical on every rank: per-rank parts are gathered).

    ``lam`` (mode ``semi`` only) fixes how many stragglers migrate (the paper's λ, Fig. 11).
    ``local_rank`` picks the GPU under a launcher (default: the current device).
    """
    from semimig.controller import BalanceConfig, BalanceController, ControllerConfig
    from semimig.shardformer import SemiMigPolicy
    from semimig.straggler import StragglerInjector
    from semimig.straggler.device import DeviceClock
    from semimig.straggler.hooks import BaselineInjection

    cuda = cfg.device == "cuda"
    if cuda:
        device = torch.device("cuda", torch.cuda.current_device() if local_rank is None else local_rank)
    else:
        device = torch.device("cpu")
    straggler = cfg.straggler(chi)
    reshard = mode == "reshard"
    policy = None if mode == "baseline" else SemiMigPolicy(shard_plan=cfg.reshard_plan() if reshard else None)
    run = boost_vit(cfg.size, tp=cfg.tp, seed=seed, lr=cfg.lr, total_steps=cfg.epochs * cfg.iters_per_epoch,
                    policy=policy)
    model, plugin = run.model, run.plugin
    tp_rank, tp_size = dist.get_rank(plugin.tp_group), dist.get_world_size(plugin.tp_group)
    dp_rank = dist.get_rank(plugin.dp_group)

    controller = balancer = injection = clock = None
    if mode == "baseline":
        injection = BaselineInjection(model, StragglerInjector(straggler, tp_rank, tp_size), device=device)
        # Colossal-AI's own layers issue no semimig collective: the bench's harness splits their step
        # by wrapping torch.distributed (a benchmark with a test straggler, never a user's run)
        clock = DeviceClock(injection.injector, device=device).attach()
    elif reshard:  # the user's entry point: it hooks optimizer.step (re-plans move the AdamW state too)
        from semimig.balancer import enable

        balancer = enable(model, plugin, optimizer=run.optimizer, mode="reshard",
                          config=BalanceConfig(straggler=straggler, resizing=cfg.resizing()),
                          iterations_per_epoch=cfg.iters_per_epoch)
    else:
        balance = BalanceConfig(mode=mode, straggler=straggler, controller=ControllerConfig(migrators=lam),
                                resizing=cfg.resizing())
        controller = BalanceController(model, balance,
                                       process_group=plugin.tp_group, iterations_per_epoch=cfg.iters_per_epoch)
    handle = balancer or controller  # epochs, dense evaluation and close() go through it

    x_train, y_train, x_test, y_test = (t.to(device) for t in digits_split(seed=0))
    trajectory = _Trajectory()

    def step(epoch: int, iteration: int, batch) -> None:
        xb, yb = batch
        if injection is not None:
            injection.injector.set_position(epoch, iteration)
        out = model(pixel_values=xb, labels=yb)
        run.booster.backward(out.loss, run.optimizer)
        run.optimizer.step()
        run.optimizer.zero_grad()
        run.schedule.step()
        if balancer is not None:
            trajectory.add_step(balancer.report)  # stepped by the hooked optimizer.step()
        elif controller is not None:
            trajectory.add_step(controller.step())
        else:
            trajectory.add_busy(injection.snapshot()["busy_s"], clock.take().compute_s)
            injection.reset()

    try:  # the collectives are unwrapped (the clocks detached) whatever happens
        timed = timed_epochs(cfg.epochs, cfg.warmup_iters, lambda e: _batches(x_train, y_train, cfg, seed, dp_rank, e),
                             step, on_epoch=handle.set_epoch if handle is not None else None,
                             sync=(lambda: torch.cuda.synchronize(device)) if cuda else None)
    finally:
        if clock is not None:
            clock.detach()
        if handle is not None:
            handle.close()
    accuracy = dense_accuracy(model, handle, x_test, y_test) if cfg.evaluate else None
    plan = controller.plan if controller is not None else None
    timed_iters = slice(cfg.warmup_iters, None)
    mine = {
        "shed": statistics.mean(trajectory.rank["gamma_target"][timed_iters]) if handle is not None else 0.0,
        "savings": statistics.mean(trajectory.rank["achieved_savings"][timed_iters]) if handle is not None else 0.0,
        "busy_share": statistics.mean(trajectory.rank["busy_s"][timed_iters]) / statistics.mean(timed.iter_times),
        "balanced_share": _balanced_share(trajectory.rank, timed_iters),
        "trajectory": _plain(trajectory.rank),
    }
    by_rank: list = [None] * tp_size
    dist.all_gather_object(by_rank, mine, group=plugin.tp_group)
    return {
        "mode": mode, "chi": chi, "seed": seed, "lambda": lam, "scope": cfg.scope,
        "iter_time_s": timed.iter_time_s,
        "epoch_time_s": timed.epoch_time_s,
        "accuracy": accuracy,
        "shed_share_by_rank": [r["shed"] for r in by_rank],
        "savings_by_rank": [r["savings"] for r in by_rank],
        "busy_share_by_rank": [r["busy_share"] for r in by_rank],
        "balanced_share_by_rank": [r["balanced_share"] for r in by_rank],
        "plan": plan.summary() if plan is not None else None,
        "migrating_stragglers": plan.x if plan is not None else 0,
        "reshard": _plain(balancer.reshard_summary) if balancer is not None else None,
        "trajectory": {"iter_time_s": _plain(timed.all_iter_times), "by_rank": [r["trajectory"] for r in by_rank],
                       "decisions": trajectory.decisions if handle is not None else None},
    }


def _balanced_share(columns: dict, timed: slice) -> Optional[float]:
    """Share of the rank's own work (wall minus time in collectives) spent in the balanced GEMMs:
    DESIGN §5's ``B``, the ceiling of what shedding can save on this rank."""
    pairs = [(b, c) for b, c in zip(columns["busy_s"][timed], columns["compute_s"][timed]) if math.isfinite(c)]
    total = sum(c for _, c in pairs)
    return min(sum(b for b, _ in pairs) / total, 1.0) if total > 0 else None


def run_case(rank: int, world: int, cfg: BenchConfig, case: tuple) -> dict:
    """One case on spawned ranks (the body :func:`semimig.launch.run_on_ranks` runs)."""
    from semimig.bench.results import describe_case
    from semimig.launch import report_activity

    report_activity(f"training {describe_case(case)}")
    return train_case(rank, world, cfg, *case)
