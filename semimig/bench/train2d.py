"""The bench's 2-D mode: one rank's side of every case of a :class:`~semimig.bench.config.BenchConfig`
with ``allocation`` set (the one run config of ``semimig bench``).

    records = run_2d_cases(rank, world, cfg, cfg.all_cases())     # on every rank (e.g. run_on_ranks)

Each case builds a fresh ``HybridParallelPlugin(tp_size=tp, zero_stage=z)`` and the bench ViT
from the case's seed (:func:`semimig.bench.loop.boost_vit`, the harness's one builder and
training loop, shared with the tensor-parallel modes of :mod:`.train`), and trains it on digits with the
same sequence of global batches in every mode (so ``baseline`` and ``poplar`` apply the same
updates, up to floating-point order).  Stragglers: rank ``t`` of DP group ``g`` is slowed by
``cfg.grid_chis()[g][t]``.  With emulated compute every GEMM sleeps ``χ · flops / rate``, the rate
chosen so that one rank's GEMMs take ``device_ms`` per iteration at the even batch; the
``baseline`` and ``poplar`` modes use Colossal-AI's layers slowed by the baseline hooks
(:class:`semimig.straggler.hooks.BaselineInjection`, which also reports their busy time), the
SEMI modes semimig's layers under the controller; with measured compute a straggler sleeps
``(χ - 1)`` times its measured GEMM time in both.

Poplar modes first profile every group (:func:`~.balancer.profile_group_curves`: forward/backward
without optimizer step at ``cfg.profile_sizes()``, after ``settle_iters`` passes when SEMI must
balance first), then train under :class:`~semimig.hybrid.HybridBalancer`, which re-plans when a
group's speed moves.  Iteration and epoch times: :func:`semimig.bench.loop.timed_epochs` (an
iteration ends with ``balancer.step()``, whose collectives synchronise the ranks).  ``losses``: the
global-batch mean training loss of every iteration (each rank's scaled micro-step losses summed over
its DP group once, after training).  Rank 0's record
is returned; group batches, shed shares and re-plans are identical on or gathered from every rank.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Optional, Sequence

import torch

from semimig.allocation.colossal import run_iteration
from semimig.allocation.data import MicroBatch
from semimig.allocation.speed import SpeedCurve
from semimig.bench.config import BenchConfig
from semimig.bench.loop import boost_vit, dense_accuracy, timed_epochs
from semimig.comm import primitives as P
from semimig.hybrid import GridLayout, HybridBalancer, profile_group_curves
from semimig.models import digits_split

__all__ = ["run_2d_cases", "train_2d_case"]


def run_2d_cases(rank: int, world: int, cfg: BenchConfig, cases: Sequence[tuple]) -> list[dict]:
    """Train every case ``(mode, None, seed, None)`` of ``cases`` (:meth:`BenchConfig.all_cases`) one after
    another on this rank; rank 0's records."""
    if cfg.allocation is None:
        raise ValueError("cfg is the TP benchmark's (allocation None): the 2-D mode needs allocation even or poplar")
    if world != cfg.world:
        raise ValueError(f"cfg needs tp*dp = {cfg.world} ranks, running on {world}")
    return [train_2d_case(cfg, mode, seed) for mode, _, seed, _ in cases]


def _vit_loss(model: torch.nn.Module, data: Any) -> torch.Tensor:
    x, y = data
    return model(pixel_values=x, labels=y).loss


def _emulated_rate(model: torch.nn.Module, cfg: BenchConfig) -> float:
    """FLOP/s that make one rank's tensor-parallel GEMMs (fwd + 2 bwd) take ``device_ms`` at the even batch."""
    from colossalai.shardformer.layer import Linear1D_Col, Linear1D_Row

    flops = sum(3 * 2 * cfg.tokens * m.weight.shape[0] * m.weight.shape[1]
                for m in model.modules() if isinstance(m, (Linear1D_Col, Linear1D_Row)))
    return flops / (cfg.device_ms / 1000.0)


def _straggler(cfg: BenchConfig, group: int, rate: Optional[float]):
    """This group's :class:`StragglerConfig` (``rate`` None: measured compute)."""
    from semimig.straggler import StragglerConfig

    chis = cfg.grid_chis()[group]
    timing = {"mode": "measured"} if rate is None else {"mode": "emulated", "flops_per_second": rate}
    slowed = tuple(t for t, chi in enumerate(chis) if chi != 1.0)
    if not slowed:
        return StragglerConfig(pattern="none", **timing)
    if cfg.straggler_until is not None:  # a burst that never repeats: the stragglers leave
        return StragglerConfig(pattern="burst", ranks=slowed, chi=(chis[slowed[0]],), burst_every=2**62,
                               burst_length=cfg.straggler_until, **timing)
    return StragglerConfig(pattern="multi", ranks=slowed, chi=tuple(chis[t] for t in slowed), **timing)


class _Case:
    """One case on one rank: the boosted model, its balancing and its data."""

    def __init__(self, cfg: BenchConfig, mode: str, seed: int) -> None:
        from semimig.controller import BalanceConfig, BalanceController
        from semimig.shardformer import SemiMigPolicy
        from semimig.straggler import StragglerInjector
        from semimig.straggler.hooks import BaselineInjection

        self.cfg, self.mode, self.seed = cfg, mode, seed
        self.semi = mode.endswith("semi")
        run = boost_vit(cfg.size, tp=cfg.tp, seed=seed, lr=cfg.lr, total_steps=cfg.epochs * cfg.iters_per_epoch,
                        zero_stage=cfg.zero_stage, precision=cfg.precision,
                        policy=SemiMigPolicy() if self.semi else None)
        self.plugin, self.booster, self.model = run.plugin, run.booster, run.model
        self.optimizer, self.schedule = run.optimizer, run.schedule
        self.layout = GridLayout.from_plugin(self.plugin)
        rate = _emulated_rate(self.model, cfg) if cfg.compute == "emulated" else None
        straggler = _straggler(cfg, self.layout.dp_rank, rate)
        self.controller = self.injection = None
        if self.semi:
            self.controller = BalanceController(self.model, BalanceConfig(mode="semi", straggler=straggler),
                                                process_group=self.plugin.tp_group,
                                                iterations_per_epoch=cfg.iters_per_epoch)
        else:
            self.injection = BaselineInjection(self.model, StragglerInjector(straggler, self.layout.tp_rank,
                                                                             self.layout.tp_size))
        self.x_train, self.y_train, self.x_test, self.y_test = digits_split(seed=0)

    # ------------------------------------------------------------------ pieces
    def hook_busy(self) -> float:
        """The baseline hooks' busy seconds of the iteration that ended; starts the next."""
        busy = float(self.injection.snapshot()["busy_s"])
        self.injection.reset()
        return busy

    def busy_of_iteration(self) -> float:
        """Close an iteration (SEMI step or hooks) and return this rank's busy seconds."""
        if self.controller is not None:
            return float(self.controller.step().busy.busy_s)
        return self.hook_busy()

    def probe(self, batch: int) -> float:
        """Forward/backward of ``batch`` samples per group, no optimizer step; this rank's busy seconds."""
        g, dp = self.layout.dp_rank, self.cfg.dp
        rows = slice(g * batch, (g + 1) * batch)
        micro = MicroBatch(data=(self.x_train[rows], self.y_train[rows]), size=batch, step=0, is_last=True,
                           global_batch_size=batch * dp, dp_world_size=dp)
        run_iteration(self.booster, self.model, self.optimizer, iter([micro]), _vit_loss,
                      zero_stage=self.cfg.zero_stage)
        self.optimizer.zero_grad()
        return self.busy_of_iteration()

    def curves(self) -> list[SpeedCurve]:
        """Per-group speed curves: profiled (Poplar modes) or equal constant speeds (even split)."""
        gbs = self.cfg.global_batch_size
        if not self.mode.startswith("poplar"):
            return [SpeedCurve.constant(peak_speed=1.0, max_batch_size=gbs, name=f"group{g}")
                    for g in range(self.cfg.dp)]
        for _ in range(self.cfg.settle_iters if self.semi else 0):
            self.probe(self.cfg.batch)
        return profile_group_curves(self.layout, self.probe, batch_sizes=self.cfg.profile_sizes(),
                                    max_batch_size=gbs, repeats=self.cfg.profile_repeats)

    def global_batches(self, epoch: int):
        """The epoch's global batches: a shuffle seeded by (seed, epoch), the same on every rank."""
        gbs = self.cfg.global_batch_size
        order = torch.randperm(len(self.y_train), generator=torch.Generator().manual_seed(self.seed * 1000 + epoch))
        for it in range(self.cfg.iters_per_epoch):
            start = (it * gbs) % (len(order) - gbs)
            idx = order[start:start + gbs]
            yield self.x_train[idx], self.y_train[idx]

    def accuracy(self) -> float:
        return dense_accuracy(self.model, self.controller, self.x_test, self.y_test)


def train_2d_case(cfg: BenchConfig, mode: str, seed: int) -> dict:
    """Train one case on this rank (collective over all ranks); the record (module docstring)."""
    case = _Case(cfg, mode, seed)
    try:  # the controller's device clock unwraps the collectives whatever happens
        profile_started = time.perf_counter()
        curves = case.curves()
        profile_s = time.perf_counter() - profile_started
        balancer = HybridBalancer(case.plugin, layout=case.layout, curves=curves, global_batch_size=cfg.global_batch_size,
                                  controller=case.controller,
                                  busy_source=case.hook_busy if case.injection is not None else None,
                                  allocation="poplar" if mode.startswith("poplar") else "even", replan=cfg.replan)
        first_samples = balancer.plan.samples
        shed, partial_losses = [], []

        def step(epoch: int, iteration: int, batch) -> None:
            if case.injection is not None:
                case.injection.injector.set_position(epoch, iteration)
            partial_losses.append(run_iteration(case.booster, case.model, case.optimizer,
                                                iter(balancer.micro_batches(batch)), _vit_loss,
                                                zero_stage=balancer.zero_stage))
            case.optimizer.step()
            case.optimizer.zero_grad()
            case.schedule.step()
            report = balancer.step()
            if report.balance is not None:
                shed.append(report.balance.gamma_target)

        timed = timed_epochs(cfg.epochs, cfg.warmup_iters, case.global_batches, step,
                             on_epoch=case.controller.set_epoch if case.controller is not None else None)
    finally:
        if case.controller is not None:
            case.controller.close()
    shed_by_rank = P.all_gather_floats(statistics.fmean(shed) if shed else 0.0, None)
    losses = torch.tensor(partial_losses, dtype=torch.float64)  # this group's share of each iteration's loss
    torch.distributed.all_reduce(losses, group=case.plugin.dp_group)  # once, after training: no step waits on it
    return {
        "mode": mode, "seed": seed, "tp": cfg.tp, "dp": cfg.dp, "zero_stage": cfg.zero_stage, "compute": cfg.compute,
        "chis": [list(row) for row in cfg.grid_chis()],
        "iter_time_s": timed.iter_time_s,
        "epoch_time_s": timed.epoch_time_s,
        "accuracy": case.accuracy(),
        "profile_s": profile_s,
        "group_samples_first": list(first_samples),
        "group_samples": list(balancer.plan.samples),
        "replans": [{"iteration": d.iteration, "scales": list(d.scales), "changed_groups": list(d.changed_groups)}
                    for d in balancer.replans],
        "shed_share_by_rank": shed_by_rank,
        "losses": (losses / cfg.dp).tolist(),
    }

