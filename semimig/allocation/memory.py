"""Peak training memory of one micro-step, and CAPTURE's linear fit of it over the batch size.

What is measured
----------------
CUDA: ``torch.cuda.max_memory_allocated`` over the step (after ``reset_peak_memory_stats``).

CPU (no allocator statistics worth trusting): a deterministic model of the same peak,

    peak(b) = model states + activations(b)
    model states   = Σ bytes of parameters + their gradients + optimizer state tensors
    activations(b) = Σ bytes of distinct tensors autograd saves for backward during forward
                     (``torch.autograd.graph.saved_tensors_hooks``; parameters and storages already
                     counted are skipped)

Saved activations are what a real step holds at its forward/backward boundary, where the peak of a
training step usually sits; they are exact byte counts, identical on every run and linear in ``b``
for the usual layers, which is what the profiler's memory search needs to be testable on CPU.

CAPTURE (linear fit)
--------------------
Peak memory grows linearly with the batch size, ``peak(b) = α + β·b``; two profiled batch sizes
fix ``α`` and ``β`` (:class:`LinearMemoryFit`), and the largest batch that fits a capacity ``C`` is
``⌊(C - α)/β⌋``.  Poplar's first estimate (Algorithm 1, lines 2-7) is the one-point version:
``mbs ≈ (C - before)/((after - before)/b)`` from the memory before and after one batch.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import torch

from semimig._validate import check_number
from semimig.errors import ConfigError


def _storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    return (str(tensor.device), tensor.untyped_storage().data_ptr())


def _tensor_key(tensor: torch.Tensor) -> tuple[str, int, int, torch.dtype]:
    return (str(tensor.device), tensor.data_ptr(), tensor.numel(), tensor.dtype)


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of ``tensors``, each distinct tensor (address, size, dtype) counted once."""
    seen: set[tuple[str, int, int, torch.dtype]] = set()
    total = 0
    for t in tensors:
        key = _tensor_key(t)
        if key not in seen:
            seen.add(key)
            total += _bytes(t)
    return total


def model_state_bytes(model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None) -> int:
    """Bytes of parameters, gradients (one per trainable parameter) and optimizer state tensors.

    Gradients are counted whether or not they exist yet (a step will allocate them).
    """
    params = list(model.parameters())
    grads = sum(_bytes(p) for p in params if p.requires_grad)
    return tensor_bytes(params) + grads + optimizer_state_bytes(optimizer)


def optimizer_state_bytes(optimizer: Optional[torch.optim.Optimizer]) -> int:
    """Bytes of the tensors in ``optimizer.state`` (0 for None or before the first step)."""
    if optimizer is None:
        return 0
    return tensor_bytes(
        value for state in optimizer.state.values() for value in state.values() if isinstance(value, torch.Tensor)
    )


class SavedActivationMeter:
    """Counts the bytes autograd saves for backward while the context is open.

    Tensors sharing storage with anything in ``exclude`` (pass the parameters: weights and their
    transposed views are not activations) are skipped.  A saved tensor counts its own bytes
    (``numel·element_size``, not its storage's: a slice of a big dataset tensor is only the slice),
    once however often it is saved.  ``bytes`` holds the total after (and during) the context.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._excluded: set[tuple[str, int]] = {_storage_key(t) for t in exclude}
        self._seen: set[tuple[str, int, int, torch.dtype]] = set()
        self.bytes = 0

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if _storage_key(tensor) in self._excluded:
            return tensor
        key = _tensor_key(tensor)
        if key not in self._seen:
            self._seen.add(key)
            self.bytes += _bytes(tensor)
        return tensor

    @staticmethod
    def _unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    @contextlib.contextmanager
    def measure(self) -> Iterator["SavedActivationMeter"]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield self


@dataclass(frozen=True, kw_only=True)
class LinearMemoryFit:
    """``peak(b) = intercept_bytes + bytes_per_sample·b`` (CAPTURE's two-point line)."""

    intercept_bytes: float
    bytes_per_sample: float
    """> 0: a step whose memory does not grow with the batch gives no bound on the batch size."""

    def __post_init__(self) -> None:
        check_number("LinearMemoryFit.intercept_bytes", self.intercept_bytes)
        check_number("LinearMemoryFit.bytes_per_sample", self.bytes_per_sample, minimum=0.0, low_open=True)

    @classmethod
    def through(cls, b1: int, peak1: float, b2: int, peak2: float) -> Optional["LinearMemoryFit"]:
        """The line through ``(b1, peak1)`` and ``(b2, peak2)``; ``None`` if it does not rise."""
        if b1 == b2:
            raise ConfigError(f"LinearMemoryFit.through needs two different batch sizes, got {b1} twice")
        slope = (peak2 - peak1) / (b2 - b1)
        if not slope > 0:
            return None
        return cls(intercept_bytes=peak1 - slope * b1, bytes_per_sample=slope)

    def predict(self, batch_size: int) -> float:
        return self.intercept_bytes + self.bytes_per_sample * batch_size

    def max_batch_within(self, capacity_bytes: int) -> int:
        """Largest ``b`` with ``predict(b) <= capacity_bytes`` (0 if not even ``b = 1``)."""
        return max(0, int(math.floor((capacity_bytes - self.intercept_bytes) / self.bytes_per_sample + 1e-9)))


def one_batch_estimate(capacity_bytes: int, before_bytes: int, after_bytes: int, batch_size: int) -> Optional[int]:
    """Poplar Algorithm 1, line 7: ``(memory - bf) / ((af - bf) / batch_size)``; None if ``af <= bf``."""
    grown = after_bytes - before_bytes
    if grown <= 0:
        return None
    return max(0, int(math.floor((capacity_bytes - before_bytes) * batch_size / grown)))
