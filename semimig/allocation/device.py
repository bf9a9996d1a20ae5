"""A profilable device: one forward/backward of a real model at a given batch size.

:class:`ModelStepDevice` is the ``step(b) -> ProbeResult`` that :func:`~.profiler.profile_device`
probes.  Per call it builds a batch (untimed), runs ``loss_fn(model, batch).backward()`` and
reports the wall time, the time inside collectives (:func:`~.collectives.timed_collectives`) and
the peak memory:

- CUDA (the model's parameters on a CUDA device): ``torch.cuda.max_memory_allocated`` after
  ``reset_peak_memory_stats``; ``before`` = ``memory_allocated`` before the step.
- CPU: :mod:`.memory`'s deterministic model, ``peak = parameters + gradients + optimizer state +
  activations saved for backward``; ``before`` = what is allocated before the step (parameters,
  existing gradients, optimizer state); after the forward, ``before + activations``.

With ``memory_cap_bytes`` set, a step whose peak exceeds it raises
:class:`~.simulate.SimulatedOutOfMemoryError` (on CUDA, on top of real OOM).  Gradients are
cleared after every step; the optimizer never steps, so profiling leaves the model unchanged.

Under hybrid parallelism the device is a whole TP group: pass ``group`` (the TP group); all its
ranks construct the device together (the capacity becomes the group's smallest, a collective) and
call every step together with the same ``b``.  Each step max-reduces the memory figures and times
over the group and raises the simulated OOM on every rank if any rank exceeded its own cap, so
:func:`~.profiler.profile_device` sees identical results on all of them and takes the same path.
(A real CUDA OOM on one rank mid-step cannot be agreed on this way; use a cap below the real
memory when profiling TP groups.)
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from semimig._validate import check_int
from semimig.allocation.collectives import timed_collectives
from semimig.allocation.memory import SavedActivationMeter, model_state_bytes, optimizer_state_bytes, tensor_bytes
from semimig.allocation.profiler import ProbeResult
from semimig.allocation.simulate import SimulatedOutOfMemoryError

logger = logging.getLogger(__name__)


class ModelStepDevice:
    """``step(b)``: one forward/backward of ``model`` on ``make_batch(b)``.

    Args:
        model: the (possibly :class:`~.simulate.SlowedModule`-wrapped) model.
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``.
        make_batch: ``make_batch(b) -> batch`` of ``b`` samples (not timed).
        optimizer: counted in the CPU memory model (its state tensors), never stepped.
        memory_cap_bytes: simulated capacity; None for none (CUDA: the real one still applies).
        group: the TP group when the device is a TP group (see the module docstring).
        name: label for the profile.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[nn.Module, Any], torch.Tensor],
        make_batch: Callable[[int], Any],
        *,
        optimizer: Optional[torch.optim.Optimizer] = None,
        memory_cap_bytes: Optional[int] = None,
        group: Optional[dist.ProcessGroup] = None,
        name: str = "device",
    ) -> None:
        check_int("memory_cap_bytes", memory_cap_bytes, minimum=1, allow_none=True)
        self.model = model
        self.loss_fn = loss_fn
        self.make_batch = make_batch
        self.optimizer = optimizer
        self.memory_cap_bytes = memory_cap_bytes
        self.group = group
        self.name = name
        first = next(model.parameters(), None)
        self._cuda = first is not None and first.device.type == "cuda"
        self._group_cap = memory_cap_bytes
        if memory_cap_bytes is not None and self._grouped:
            cap = torch.tensor([memory_cap_bytes], dtype=torch.int64, device=self._stats_device)
            dist.all_reduce(cap, op=dist.ReduceOp.MIN, group=group)
            self._group_cap = int(cap.item())

    @property
    def _grouped(self) -> bool:
        return self.group is not None and dist.get_world_size(self.group) > 1

    @property
    def _stats_device(self) -> torch.device:
        return torch.device("cuda") if self._cuda else torch.device("cpu")

    @property
    def memory_capacity_bytes(self) -> Optional[int]:
        """The capacity the profiler's estimates use: the cap (the group's smallest), else the CUDA total."""
        if self._group_cap is not None:
            return self._group_cap
        if self._cuda:
            device = next(self.model.parameters()).device
            return int(torch.cuda.get_device_properties(device).total_memory)
        return None

    def _before_bytes(self) -> int:
        if self._cuda:
            return int(torch.cuda.memory_allocated())
        params = list(self.model.parameters())
        grads = [p.grad for p in params if p.grad is not None]
        total = tensor_bytes(params) + tensor_bytes(grads)
        return total + optimizer_state_bytes(self.optimizer)

    def __call__(self, batch_size: int) -> ProbeResult:
        batch = self.make_batch(batch_size)
        before = self._before_bytes()
        meter = SavedActivationMeter(exclude=list(self.model.parameters()))
        if self._cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        try:
            with timed_collectives() as clock:
                with meter.measure():
                    loss = self.loss_fn(self.model, batch)
                after_forward = int(torch.cuda.memory_allocated()) if self._cuda else before + meter.bytes
                loss.backward()
            if self._cuda:
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - started
        finally:
            self.model.zero_grad(set_to_none=True)
        if self._cuda:
            peak = int(torch.cuda.max_memory_allocated())
        else:
            peak = model_state_bytes(self.model, self.optimizer) + meter.bytes
        collective = clock.seconds
        over_cap = self.memory_cap_bytes is not None and peak > self.memory_cap_bytes
        if self._grouped:
            figures = torch.tensor([peak, before, after_forward, int(over_cap)], dtype=torch.int64, device=self._stats_device)
            # the group's compute is its slowest rank's own compute: max of (wall - collectives)
            times = torch.tensor([elapsed, elapsed - collective], dtype=torch.float64, device=self._stats_device)
            dist.all_reduce(figures, op=dist.ReduceOp.MAX, group=self.group)
            dist.all_reduce(times, op=dist.ReduceOp.MAX, group=self.group)
            peak, before, after_forward, over = (int(v) for v in figures.tolist())
            over_cap = bool(over)
            elapsed, compute = (float(v) for v in times.tolist())
            collective = elapsed - compute
        if over_cap:
            raise SimulatedOutOfMemoryError(
                f"device {self.name!r}: batch {batch_size} needs {peak} bytes at peak, over the cap "
                f"({self.memory_cap_bytes} bytes on this rank)"
            )
        return ProbeResult(
            batch_size=batch_size,
            time_s=elapsed,
            collective_s=min(max(collective, 0.0), elapsed),
            peak_bytes=peak,
            before_bytes=before,
            after_forward_bytes=after_forward,
        )
