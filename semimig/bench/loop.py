"""The bench harness's one training loop: build the ViT, train it with timing, score it dense.

Every case of ``semimig bench`` — the tensor-parallel modes (:mod:`.train`) and the 2-D mode,
Poplar across data-parallel groups with SEMI inside each TP group (:mod:`.train2d`) — goes
through the same three pieces, so a change to how the bench builds, times or scores a run is
made once:

- :func:`boost_vit`: the bench ViT (:func:`semimig.models.tiny_vit`, seeded) boosted by
  ``HybridParallelPlugin(tp_size=t, zero_stage=z, precision=p)``, with AdamW and a one-cycle
  schedule over the whole run (peak ``lr`` after 10 % of the steps: the tiny ViT converges on
  digits within a few hundred iterations, so accuracy deltas compare trained models);
- :func:`timed_epochs`: ``epochs`` passes over a case's batches calling its ``step``; the time
  of iteration ``i`` is the wall time from the end of iteration ``i − 1`` (or the epoch's start)
  to the end of ``i`` on this rank — every step ends in collectives, so the ranks agree — and
  the iteration-time statistic is the median after ``warmup_iters`` (first plans, pretest); an
  epoch's time is its wall time, the run's the mean over epochs without the first when there
  are several;
- :func:`dense_accuracy`: test accuracy with every semimig layer dense (no pruning, migration or
  injected delay: ``controller.dense()``), the model back in training mode afterwards.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

import torch

from semimig.models import VitSize, tiny_vit

__all__ = ["Boosted", "Timed", "boost_vit", "dense_accuracy", "one_cycle", "timed_epochs"]


@dataclass
class Boosted:
    """What :func:`boost_vit` returns: the plugin and booster, and the boosted model, optimizer and schedule."""

    plugin: Any
    booster: Any
    model: Any
    optimizer: Any
    schedule: Any


def boost_vit(size: VitSize, *, tp: int, seed: int, lr: float, total_steps: int, zero_stage: int = 0,
              precision: str = "fp32", policy: Any = None) -> Boosted:
    """The bench ViT from ``seed``, boosted for ``tp``-way tensor parallelism (module docstring).

    ``policy``: a ShardFormer policy (``SemiMigPolicy()`` for semimig's layers), None for
    Colossal-AI's own.  The classifier gets ``ceil(10 / tp) · tp`` labels (its tensor-parallel
    split needs a multiple of ``tp``; the labels from 10 up are never a target, so training pushes
    their logits down).
    """
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    import semimig.nn  # noqa: F401 - the CPU compatibility shim, before any layer is built

    plugin = HybridParallelPlugin(tp_size=tp, pp_size=1, zero_stage=zero_stage, precision=precision,
                                  overlap_communication=False, custom_policy=policy)
    model = tiny_vit(size, seed=seed, num_labels=-(-10 // tp) * tp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    schedule = one_cycle(optimizer, lr, total_steps)
    booster = Booster(plugin=plugin)
    model, optimizer, _, _, schedule = booster.boost(model, optimizer, lr_scheduler=schedule)
    model.train()  # the straggler hooks and the controller time training passes only
    return Boosted(plugin=plugin, booster=booster, model=model, optimizer=optimizer, schedule=schedule)


def one_cycle(optimizer: torch.optim.Optimizer, lr: float, total_steps: int) -> torch.optim.lr_scheduler.OneCycleLR:
    """torch's one-cycle schedule to peak ``lr`` after 10 % of ``total_steps``.

    torch places the warm-up's last step at ``pct_start · T − 1`` and divides by that distance
    from step 0: at ``T = 10`` it is 0 and the first ``step()`` raises ZeroDivisionError (found
    with ``semimig bench --epochs 1 --iters-per-epoch 10``).  There the warm-up is 15 % instead;
    every other run keeps exactly 10 %.
    """
    pct_start = 0.1 if 0.1 * total_steps != 1.0 else 0.15
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, pct_start=pct_start, total_steps=total_steps)


@dataclass
class Timed:
    """Wall times of one run on this rank (module docstring)."""

    warmup_iters: int
    all_iter_times: list = field(default_factory=list)
    """Every iteration's seconds, warm-up included."""
    epoch_times: list = field(default_factory=list)

    @property
    def iter_times(self) -> list:
        """The iterations after the warm-up."""
        return self.all_iter_times[self.warmup_iters:]

    @property
    def iter_time_s(self) -> float:
        """Median of :attr:`iter_times`."""
        return statistics.median(self.iter_times)

    @property
    def epoch_time_s(self) -> float:
        """Mean epoch time, the first epoch left out when there are several."""
        return statistics.fmean(self.epoch_times[1:] or self.epoch_times)


def timed_epochs(epochs: int, warmup_iters: int, batches: Callable[[int], Iterable],
                 step: Callable[[int, int, Any], None], *, on_epoch: Optional[Callable[[int], None]] = None,
                 sync: Optional[Callable[[], None]] = None) -> Timed:
    """Train: for each epoch ``e``, ``on_epoch(e)``, then ``step(e, i, batch)`` for each batch of
    ``batches(e)`` (``i`` counts iterations over the whole run), ``sync()`` before each clock
    reading (a device synchronisation on CUDA).  Returns the wall times (module docstring)."""
    timed = Timed(warmup_iters=warmup_iters)
    iteration = 0
    for epoch in range(epochs):
        if on_epoch is not None:
            on_epoch(epoch)
        epoch_start = last = time.perf_counter()
        for batch in batches(epoch):
            step(epoch, iteration, batch)
            if sync is not None:
                sync()
            now = time.perf_counter()
            timed.all_iter_times.append(now - last)
            last, iteration = now, iteration + 1
        timed.epoch_times.append(time.perf_counter() - epoch_start)
    if len(timed.all_iter_times) <= warmup_iters:
        raise ValueError(f"warmup_iters={warmup_iters} leaves no timed iteration of {len(timed.all_iter_times)}")
    return timed


def dense_accuracy(model: torch.nn.Module, controller: Any, x_test: torch.Tensor, y_test: torch.Tensor,
                   batch: int = 128) -> float:
    """Share of ``x_test`` classified as ``y_test`` with every layer dense (``controller`` None:
    Colossal-AI's layers, nothing to make dense)."""
    model.eval()
    correct = 0
    dense = controller.dense() if controller is not None else contextlib.nullcontext()
    try:
        with torch.no_grad(), dense:
            for lo in range(0, len(y_test), batch):
                logits = model(pixel_values=x_test[lo:lo + batch]).logits
                correct += int((logits.argmax(-1) == y_test[lo:lo + batch]).sum())
    finally:
        model.train()
    return correct / len(y_test)
