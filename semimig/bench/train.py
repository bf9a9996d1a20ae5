"""One benchmark case on one rank: train the ViT through ``HybridParallelPlugin`` and time it.

A case is (mode, chi, seed).  ``baseline`` uses Colossal-AI's own policy and layers, slowed by
hooks; every other mode uses :class:`SemiMigPolicy` and a :class:`BalanceController`.  Both see
the same injected device emulation, so the only difference is what semimig does about it.
Iteration time is the wall time from one optimizer step to the next, measured on every rank
after a barrier-free loop (collectives already synchronise the TP group); rank 0 reports.
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch
import torch.distributed as dist

from semimig.bench.config import BenchConfig
from semimig.bench.models import digits_split, tiny_vit


def _tp_group_rank(plugin) -> tuple[int, int]:
    group = plugin.tp_group
    return dist.get_rank(group), dist.get_world_size(group)


def _batches(x, y, cfg: BenchConfig, seed: int, dp_rank: int, epoch: int):
    """The epoch's batches for this DP rank: a seeded shuffle, disjoint slices per DP rank."""
    gen = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = torch.randperm(len(y), generator=gen)
    for it in range(cfg.iters_per_epoch):
        start = ((it * cfg.dp + dp_rank) * cfg.batch) % (len(y) - cfg.batch)
        idx = order[start:start + cfg.batch].to(x.device)
        yield x[idx], y[idx]


def train_case(rank: int, world: int, cfg: BenchConfig, mode: str, chi: float, seed: int,
               lam: int | None = None) -> dict:
    """Train one case; returns timing and accuracy (rank 0's view, identical across TP ranks).

    ``lam`` (mode ``semi`` only) fixes how many stragglers migrate (the paper's λ, Fig. 11).
    """
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    import semimig.nn  # noqa: F401 - CPU compatibility shim
    from semimig.controller import BalanceConfig, BalanceController, ControllerConfig
    from semimig.resizing import ResizingConfig
    from semimig.shardformer import SemiMigPolicy
    from semimig.straggler import BusyMeter, StragglerConfig, StragglerInjector
    from semimig.straggler.hooks import attach_to_colossalai_layers

    cuda = cfg.device == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    timing = "mode=measured" if cuda else f"mode=emulated:flops={cfg.device_flops_per_second():.6g}"
    straggler = StragglerConfig.from_cli(f"{cfg.straggler_spec(chi)}:{timing}")
    plugin = HybridParallelPlugin(tp_size=cfg.tp, pp_size=1, precision="fp32",
                                  custom_policy=None if mode == "baseline" else SemiMigPolicy())
    model = tiny_vit(cfg.size, seed=seed, num_labels=-(-10 // cfg.tp) * cfg.tp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    # one-cycle schedule over the whole run: the tiny ViT converges on digits within a few
    # hundred iterations, so accuracy deltas compare trained models, not half-trained ones
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.lr, pct_start=0.1,
                                                   total_steps=cfg.epochs * cfg.iters_per_epoch)
    booster = Booster(plugin=plugin)
    model, optimizer, _, _, schedule = booster.boost(model, optimizer, lr_scheduler=schedule)
    tp_rank, tp_size = _tp_group_rank(plugin)
    dp_rank = dist.get_rank(plugin.dp_group)

    controller = meter = None
    if mode == "baseline":
        meter = BusyMeter(StragglerInjector(straggler, tp_rank, tp_size), device=device)
        attach_to_colossalai_layers(model, meter)
    else:
        balance = BalanceConfig(mode=mode, straggler=straggler, controller=ControllerConfig(migrators=lam),
                                resizing=ResizingConfig(theta_iter=cfg.theta_iter))
        controller = BalanceController(model, balance,
                                       process_group=plugin.tp_group, iterations_per_epoch=cfg.iters_per_epoch)

    x_train, y_train, x_test, y_test = (t.to(device) for t in digits_split(seed=0))
    iter_times, epoch_times, shed, saved = [], [], [], []
    iteration = 0
    model.train()
    for epoch in range(cfg.epochs):
        if controller is not None:
            controller.set_epoch(epoch)
        epoch_start = last = time.perf_counter()
        for xb, yb in _batches(x_train, y_train, cfg, seed, dp_rank, epoch):
            if meter is not None:
                meter.injector.set_position(epoch, iteration)
            out = model(pixel_values=xb, labels=yb)
            booster.backward(out.loss, optimizer)
            optimizer.step()
            optimizer.zero_grad()
            schedule.step()
            if controller is not None:
                step = controller.step()
                shed.append(step.gamma_target)
                saved.append(step.achieved_savings)
            else:
                meter.reset()
            if cuda:
                torch.cuda.synchronize(device)
            now = time.perf_counter()
            if iteration >= cfg.warmup_iters:
                iter_times.append(now - last)
            last = now
            iteration += 1
        epoch_times.append(time.perf_counter() - epoch_start)

    model.eval()
    correct = 0
    with torch.no_grad(), (controller.dense() if controller is not None else contextlib.nullcontext()):
        for lo in range(0, len(y_test), 128):
            logits = model(pixel_values=x_test[lo:lo + 128]).logits
            correct += int((logits.argmax(-1) == y_test[lo:lo + 128]).sum())
    plan = controller.plan if controller is not None else None
    by_rank = [None] * tp_size  # (mean target, mean achieved GEMM savings) of every TP rank
    dist.all_gather_object(by_rank, tuple(statistics.mean(v) if v else 0.0 for v in (shed, saved)),
                           group=plugin.tp_group)
    shed_by_rank, savings_by_rank = (list(v) for v in zip(*by_rank))
    return {
        "mode": mode, "chi": chi, "seed": seed, "lambda": lam,
        "iter_time_s": statistics.median(iter_times),
        "epoch_time_s": statistics.mean(epoch_times[1:] or epoch_times),
        "accuracy": correct / len(y_test),
        "shed_share_by_rank": shed_by_rank,
        "savings_by_rank": savings_by_rank,
        "plan": plan.summary() if plan is not None else None,
        "migrating_stragglers": plan.x if plan is not None else 0,
    }


def run_cases(rank: int, world: int, cfg: BenchConfig, cases: list) -> list:
    """Train several ``(mode, chi, seed, lam)`` cases one after another in the same ranks."""
    return [train_case(rank, world, cfg, mode, chi, seed, lam) for mode, chi, seed, lam in cases]
