"""The data path of a plan: each data-parallel rank's own micro-batches, and the loss scaling.

Samples.  Iteration ``k`` of an epoch takes the global batch ``order[k·gbs : (k+1)·gbs]`` of one
permutation ``order`` of the dataset (the identity, or a shuffle seeded by ``seed + epoch``, the
same on every rank).  Device ``i`` takes the contiguous slice starting at ``Σ_{j<i} samples_j``,
cut into its micro-batches in order.  Slices are disjoint and cover the global batch; an epoch
drops the ``len(dataset) mod gbs`` samples that do not fill a global batch.

Loss scaling.  Colossal-AI averages gradients over the ``D`` data-parallel ranks:
``LowLevelZeroOptimizer._run_reduction`` (ZeRO-1 and ZeRO-2, also under
``HybridParallelPlugin``) divides each gradient bucket by the DP world size before its all-reduce
or reduce-scatter, and torch DDP (``HybridParallelPlugin`` with ``zero_stage=0``) averages too.
The reduced gradient is therefore ``(1/D)·Σ_r g_r``, ``g_r`` the gradient rank ``r`` accumulated
over its micro-steps.  For it to equal the gradient of the global-batch mean loss
``(1/G)·Σ_s ∇ℓ_s`` (``G = gbs``) with uneven batches, rank ``r`` must accumulate
``(D/G)·Σ_{s∈r} ∇ℓ_s``, so each micro-step's loss is scaled:

    mean-reduced loss over its m samples:  × m·D/G
    sum-reduced loss:                      × D/G

An empty micro-batch (a device with nothing left for a ZeRO-2/3 last micro-step, or no samples at
all) must still run forward/backward to join the gradient collectives; its scaled loss is
``0·loss`` with NaN (the mean of nothing) replaced by 0, which gives zero gradients.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Sequence

import torch
from torch.utils._pytree import tree_map
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data._utils.collate import default_collate

from semimig._validate import check_choice, check_int, is_int
from semimig.allocation.plan import AllocationPlan
from semimig.errors import ConfigError

Reduction = Literal["mean", "sum"]


def loss_scale(micro_batch_size: int, *, global_batch_size: int, dp_world_size: int, reduction: Reduction = "mean") -> float:
    """Factor for one micro-step's loss (module docstring): ``m·D/G`` (mean) or ``D/G`` (sum)."""
    check_int("micro_batch_size", micro_batch_size, minimum=0)
    check_int("global_batch_size", global_batch_size, minimum=1)
    check_int("dp_world_size", dp_world_size, minimum=1)
    if check_choice("reduction", reduction, ("mean", "sum")) == "mean":
        return micro_batch_size * dp_world_size / global_batch_size
    return dp_world_size / global_batch_size


def evaluation_share(count: int, samples: Sequence[int], group: int) -> range:
    """Group ``group``'s items of ``count`` evaluation items (the rows of an evaluation batch) when the
    data-parallel groups train ``samples[g]`` rows of each global batch: the contiguous range
    ``[b_g, b_{g+1})`` with ``b_g = round(count·Σ_{j<g} samples_j / Σ_j samples_j)`` (halves up).

    Every group's evaluation then takes the share of the items its training takes of the batch, so a
    slow group evaluates less, as it trains less, and no group waits at the next step's gradient
    reduction for another's evaluation.  The ranges are disjoint and cover ``range(count)``; a group
    with no samples gets none.  Rows of every batch rather than whole batches: each group then runs one
    forward per batch, as a forward that is a collective over the data-parallel group needs (torch DDP
    broadcasts its buffers in each one).  Each group sums its rows' losses, and the sum and the count
    are summed over the data-parallel group for the mean over all rows."""
    check_int("count", count, minimum=0)
    samples = [check_int(f"samples[{g}]", s, minimum=0) for g, s in enumerate(samples)]
    total = sum(samples)
    if total == 0:
        raise ConfigError(f"evaluation_share: samples {samples} give no group any rows")
    check_int("group", group, minimum=0, maximum=len(samples) - 1)
    before = sum(samples[:group])

    def bound(cumulative: int) -> int:
        return (2 * count * cumulative + total) // (2 * total)

    return range(bound(before), bound(before + samples[group]))


def partition_global_batch(plan: AllocationPlan, indices: Sequence[int]) -> list[list[list[int]]]:
    """``[device][micro_step] -> sample indices`` for one global batch ``indices`` (len ``gbs``)."""
    if len(indices) != plan.global_batch_size:
        raise ConfigError(f"a global batch has {plan.global_batch_size} samples, got {len(indices)} indices")
    out, start = [], 0
    for device in plan.devices:
        steps = []
        for size in device.micro_batch_sizes:
            steps.append([int(i) for i in indices[start : start + size]])
            start += size
        out.append(steps)
    return out


class HeteroBatchSampler(Sampler[list[int]]):
    """Yields device ``device``'s micro-batches (index lists, possibly empty), iteration after iteration."""

    def __init__(self, plan: AllocationPlan, device: int, *, dataset_size: int, shuffle: bool = False, seed: int = 0) -> None:
        plan.device(device)  # validates the index
        if not is_int(dataset_size) or dataset_size < plan.global_batch_size:
            raise ConfigError(
                f"dataset_size must be an int >= global_batch_size={plan.global_batch_size}, got {dataset_size!r}"
            )
        self.plan = plan
        self.device = device
        self.dataset_size = dataset_size
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (the shuffle is seeded by ``seed + epoch``)."""
        self.epoch = epoch

    @property
    def iterations_per_epoch(self) -> int:
        return self.dataset_size // self.plan.global_batch_size

    def __len__(self) -> int:
        return self.iterations_per_epoch * self.plan.device(self.device).accumulation_steps

    def __iter__(self) -> Iterator[list[int]]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.dataset_size, generator=generator).tolist()
        else:
            order = list(range(self.dataset_size))
        gbs = self.plan.global_batch_size
        start = self.plan.offset(self.device)
        sizes = self.plan.device(self.device).micro_batch_sizes
        for k in range(self.iterations_per_epoch):
            position = k * gbs + start
            for size in sizes:
                yield order[position : position + size]
                position += size


@dataclass(frozen=True, kw_only=True)
class MicroBatch:
    """One micro-step's data and where it sits in the iteration."""

    data: Any
    size: int
    """Samples this micro-step counts: the rows of ``data``, or 0 for an empty micro-step, whose
    ``data`` may be a one-row stand-in (:meth:`semimig.hybrid.HybridBalancer.micro_batches`: a model
    must run something to join the gradient collectives) that :meth:`scale_loss` weights by 0 —
    count samples or tokens with ``size``, not with ``data``'s rows."""
    step: int
    """Index of this micro-step in the iteration, ``0 … accumulation_steps - 1``."""
    is_last: bool
    """The iteration's last micro-step (gradients are reduced after it)."""
    global_batch_size: int
    dp_world_size: int

    def scale_loss(self, loss: torch.Tensor, reduction: Reduction = "mean") -> torch.Tensor:
        """``loss`` scaled so that the DP-averaged gradient is the global-batch mean (module docs)."""
        factor = loss_scale(
            self.size, global_batch_size=self.global_batch_size, dp_world_size=self.dp_world_size, reduction=reduction
        )
        if self.size == 0:
            return torch.nan_to_num(loss, nan=0.0) * 0.0
        return loss * factor


def _empty_like(batch: Any) -> Any:
    return tree_map(lambda x: x[:0] if isinstance(x, torch.Tensor) and x.dim() > 0 else x, batch)


class _CollateWithEmpty:
    """``collate_fn`` that turns an empty list of samples into a zero-length batch of the right shapes."""

    def __init__(self, collate_fn: Callable[[list[Any]], Any], template: Any) -> None:
        self.collate_fn = collate_fn
        self.empty = _empty_like(template)

    def __call__(self, samples: list[Any]) -> Any:
        return self.empty if len(samples) == 0 else self.collate_fn(samples)


class HeteroDataLoader:
    """Device ``device``'s :class:`MicroBatch` stream for ``plan``, over a map-style ``dataset``.

    Iterating yields micro-batches flat, ``accumulation_steps`` per iteration, the last one
    flagged ``is_last``; :func:`~.colossal.run_iteration` consumes one iteration's worth.
    """

    def __init__(
        self,
        dataset: Dataset,
        plan: AllocationPlan,
        device: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        collate_fn: Callable[[list[Any]], Any] = default_collate,
        num_workers: int = 0,
    ) -> None:
        self.plan = plan
        self.device = device
        self.sampler = HeteroBatchSampler(plan, device, dataset_size=len(dataset), shuffle=shuffle, seed=seed)
        collate = _CollateWithEmpty(collate_fn, collate_fn([dataset[0]]))
        self._loader = DataLoader(dataset, batch_sampler=self.sampler, collate_fn=collate, num_workers=num_workers)

    @property
    def iterations_per_epoch(self) -> int:
        return self.sampler.iterations_per_epoch

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[MicroBatch]:
        sizes = self.plan.device(self.device).micro_batch_sizes
        for n, data in enumerate(self._loader):
            step = n % len(sizes)
            yield MicroBatch(
                data=data,
                size=sizes[step],
                step=step,
                is_last=step == len(sizes) - 1,
                global_batch_size=self.plan.global_batch_size,
                dp_world_size=self.plan.num_devices,
            )
