"""Heterogeneous devices on one CPU: configurable speed (sleeps) and memory caps (simulated OOM).

Speed.  A device ``f`` times slower than this CPU spends ``f`` times as long on every micro-step.
:class:`SlowedModule` wraps a model; each forward of a batch of ``b`` samples, measured at
``t_real`` seconds, is followed by a sleep of

    delay(b) = (f - 1)·t_real + f·(base_time_s + per_sample_time_s·b)

The first term is the straggler injection of DESIGN §5 applied to the real forward work
(``(χ - 1)·t``).  The second is optional synthetic "kernel time" standing for a model much larger
than the toy one being run: on an oversubscribed CPU (several ranks per core) the real compute
time of a toy model is small and noisy, so benchmarks make the deterministic synthetic term
dominate (sleeping ranks do not compete for cores).  ``base_time_s`` is a fixed per-micro-step
cost (launch overhead: it is what makes large micro-batches faster per sample, the shape of
Poplar's speed curves); ``per_sample_time_s`` the cost per sample.  The backward's real compute
is not scaled: the delay is charged in the forward, before the backward's collectives, so that a
slow device reaches them late, as a real one would.

Memory.  A configured byte cap: a step whose peak memory (see :mod:`.memory`) exceeds it raises
:class:`SimulatedOutOfMemoryError`, a ``torch.OutOfMemoryError``, so the profiler catches real
and simulated OOM alike.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from semimig._validate import check_number
from semimig.errors import ConfigError

MAX_SPEED_FACTOR = 1e3
"""Slowest simulated device accepted, relative to the host: beyond it a benchmark sleeps for hours."""
MAX_SYNTHETIC_TIME_S = 60.0
"""Longest synthetic ``base_time_s`` / ``per_sample_time_s`` accepted (seconds at ``f = 1``)."""


class SimulatedOutOfMemoryError(torch.OutOfMemoryError):
    """A step's peak memory exceeded the simulated device's byte cap."""


@dataclass(frozen=True, kw_only=True)
class SimulatedSpeed:
    """How much slower than the host a simulated device is (see the module docstring)."""

    speed_factor: float = 1.0
    """``f >= 1``: every micro-step takes ``f`` times as long as on the host."""
    base_time_s: float = 0.0
    """Synthetic compute per micro-step at ``f = 1``, seconds (>= 0)."""
    per_sample_time_s: float = 0.0
    """Synthetic compute per sample at ``f = 1``, seconds (>= 0)."""

    def __post_init__(self) -> None:
        check_number("SimulatedSpeed.speed_factor", self.speed_factor, minimum=1.0, maximum=MAX_SPEED_FACTOR)
        for name in ("base_time_s", "per_sample_time_s"):
            check_number(f"SimulatedSpeed.{name}", getattr(self, name), minimum=0.0, maximum=MAX_SYNTHETIC_TIME_S)

    def synthetic_time(self, batch_size: int) -> float:
        """Synthetic compute of one micro-step at host speed: ``base + per_sample·b`` (0 for b = 0)."""
        return 0.0 if batch_size == 0 else self.base_time_s + self.per_sample_time_s * batch_size

    def delay(self, batch_size: int, measured_s: float) -> float:
        """Seconds to sleep after real work of ``measured_s`` on ``batch_size`` samples."""
        return (self.speed_factor - 1.0) * measured_s + self.speed_factor * self.synthetic_time(batch_size)


_SPIN_S = 1e-3
"""The last part of a simulated sleep is spun: ``time.sleep`` overshoots by ~0.1 ms on an idle
machine and by milliseconds when the cores are oversubscribed (the process waits to be scheduled
after it wakes); waking 1 ms early absorbs most of that (the Poplar benchmark's ``overshoot``
column reports what is left)."""


def _sleep(seconds: float) -> None:
    """``time.sleep`` with its last :data:`_SPIN_S` spun."""
    if seconds <= 0:
        return
    deadline = time.perf_counter() + seconds
    if seconds > _SPIN_S:
        time.sleep(seconds - _SPIN_S)
    while time.perf_counter() < deadline:
        pass


class SlowedModule(nn.Module):
    """``module`` on a simulated device: each forward is followed by ``speed.delay(b, t_forward)``.

    ``b`` is the leading dimension of the first positional argument (the batch).  The sleep asked
    for and the sleep taken accumulate in ``requested_sleep_s`` and ``slept_s``.
    """

    def __init__(self, module: nn.Module, speed: SimulatedSpeed) -> None:
        super().__init__()
        if not isinstance(speed, SimulatedSpeed):
            raise ConfigError(f"speed must be a SimulatedSpeed, got {type(speed).__name__}")
        self.module = module
        self.speed = speed
        self.requested_sleep_s = 0.0
        """Sleep asked for since construction (benchmarks read and reset it)."""
        self.slept_s = 0.0
        """Sleep actually taken: ``slept_s - requested_sleep_s`` is the overshoot."""

    def forward(self, batch: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        out = self.module(batch, *args, **kwargs)
        delay = self.speed.delay(int(batch.shape[0]), time.perf_counter() - started)
        slept_from = time.perf_counter()
        _sleep(delay)
        self.requested_sleep_s += delay
        self.slept_s += time.perf_counter() - slept_from
        return out

    def extra_repr(self) -> str:
        s = self.speed
        return f"speed_factor={s.speed_factor}, base_time_s={s.base_time_s}, per_sample_time_s={s.per_sample_time_s}"
