"""Speed curves: how long one device takes for one micro-step at each batch size.

Poplar (Algorithm 1, "Offline Analyzing") profiles a device at a few batch sizes ``b_k`` and
interpolates between them over ``b ∈ [1, mbs]`` (``mbs`` the largest batch that fits in memory).
Two interpolations, both exact at every profiled point:

``linear`` (the default): the micro-step time ``τ(b)`` is piecewise linear between profiled
points.  Poplar's profiler probes ``b = 1, 2, 4, 8, …`` (then a binary search), so the points are
sparse where the batches are large; a device whose time is ``fixed + per_sample·b`` (the usual
shape: launch costs, then work) is reproduced exactly between them, and noise at one point
moves only its two neighbouring segments.

``spline`` (Poplar's own choice): the natural cubic spline (zero second derivative at both ends,
the Poplar appendix) through the measured speeds

    s(b_k) = b_k / τ(b_k)          samples per second, τ the compute time of one micro-step,

floored at a tiny positive value so that a wiggle can never produce a zero or negative speed.
On a loaded machine one noisy probe at ``b = 4`` can bend the spline by 5 % at ``b = 12``,
halfway between the probes 8 and 16, enough for the allocator to realise 47 samples as four
micro-steps of 12 instead of three of 16, so the device pays one whole micro-step's fixed cost
more (a few percent of the iteration).  The linear model has no such reach, hence the default.

Outside ``[b_min, b_max]`` of the profiled points both hold the speed constant at the nearest end
(no extrapolation).  The time of one micro-step of ``b`` samples is ``τ(b) = b / s(b)`` and
``τ(0) = 0``.  A device processes ``B`` samples per iteration as ``gas - 1`` micro-steps of
``mbs`` samples and one of ``lbs`` samples, taking ``(gas - 1)·τ(mbs) + τ(lbs)``.

A device known only by its peak speed (a JSON spec, say) gets a constant-speed curve:
``τ(b) = b / s_peak``.
"""
from __future__ import annotations

import logging
import numbers
from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

import numpy as np
from scipy.interpolate import CubicSpline

from semimig._validate import check_choice, check_int, check_number, is_int, is_number
from semimig.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["SpeedCurve", "INTERPOLATIONS", "MAX_BATCH_SIZE", "MIN_TIME_S", "MAX_TIME_S"]

INTERPOLATIONS = ("linear", "spline")
"""How a curve fills the batch sizes between its profiled points (module docstring)."""

_MIN_SPEED_FRACTION = 1e-6  # spline floor, as a fraction of the slowest profiled speed

MAX_BATCH_SIZE = 2**20
"""Largest ``max_batch_size`` a curve accepts (1 048 576 samples in one micro-step).

The curve tabulates ``τ(b)`` for every ``b <= M`` (8 bytes each: 8 MiB at the limit) and the
allocators scan that table (ZeRO-2/3: every micro-step time of every device), so ``M`` is a
memory and time budget; ``10**11`` would ask numpy for 745 GiB.  No accelerator holds a
micro-batch of a million samples of a model worth data parallelism (Poplar's profiled maxima are
in the tens to hundreds), so the limit only refuses unit mistakes."""
MIN_TIME_S = 1e-9
"""Shortest micro-step time accepted (1 ns, below any kernel launch): keeps ``b/τ`` finite."""
MAX_TIME_S = 1e9
"""Longest micro-step time accepted (~31 years): keeps sums of times and speeds finite."""


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class SpeedCurve:
    """A device's profiled micro-step times and the spline through its speeds.

    Build with :meth:`from_points` (profiled ``(batch, seconds)`` pairs) or :meth:`constant`.
    """

    name: str = "device"
    """A label for logs, tables and error messages."""
    batch_sizes: tuple[int, ...]
    """Profiled batch sizes, strictly increasing, all >= 1."""
    times_s: tuple[float, ...]
    """Compute time of one micro-step (fwd + bwd, collectives excluded) at each batch size,
    in ``[MIN_TIME_S, MAX_TIME_S]``."""
    max_batch_size: int
    """Largest micro-batch the device holds (memory), in ``[1, MAX_BATCH_SIZE]``."""
    interpolation: str = "linear"
    """One of :data:`INTERPOLATIONS`: ``linear`` in time (default) or Poplar's cubic ``spline`` of speed."""
    _table: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigError(f"SpeedCurve.name must be a str, got {self.name!r}")
        where = f"SpeedCurve({self.name!r})"
        check_int(f"{where}.max_batch_size", self.max_batch_size, minimum=1, maximum=MAX_BATCH_SIZE)
        check_choice(f"{where}.interpolation", self.interpolation, INTERPOLATIONS)
        for field_name in ("batch_sizes", "times_s"):
            if not isinstance(getattr(self, field_name), tuple):
                raise ConfigError(f"{where}.{field_name} must be a tuple, got {getattr(self, field_name)!r}")
        if len(self.batch_sizes) == 0:
            raise ConfigError(f"{where} needs at least one profiled point, got none")
        if len(self.batch_sizes) != len(self.times_s):
            raise ConfigError(f"{where}: {len(self.batch_sizes)} batch_sizes but {len(self.times_s)} times_s")
        previous = 0
        for b in self.batch_sizes:
            if not is_int(b) or b <= previous:
                raise ConfigError(f"{where}.batch_sizes must be strictly increasing ints >= 1, got {self.batch_sizes!r}")
            previous = b
        for t in self.times_s:
            if not (is_number(t) and MIN_TIME_S <= t <= MAX_TIME_S):
                raise ConfigError(
                    f"{where}.times_s must be finite seconds in [{MIN_TIME_S:g}, {MAX_TIME_S:g}] "
                    f"(a zero time is an infinitely fast device), got {self.times_s!r}"
                )
        if self.batch_sizes[-1] > self.max_batch_size:
            raise ConfigError(
                f"{where}: profiled batch size {self.batch_sizes[-1]} exceeds max_batch_size={self.max_batch_size}"
            )
        object.__setattr__(self, "_table", self._build_table())

    # ---------------------------------------------------------------- constructors
    @classmethod
    def from_points(
        cls, points: Sequence[tuple[int, float]], *, max_batch_size: int, name: str = "device",
        interpolation: str = "linear",
    ) -> "SpeedCurve":
        """Curve through profiled ``(batch_size, time_s)`` points (any order, no duplicates)."""
        if not isinstance(points, (list, tuple)) or not all(isinstance(p, (tuple, list)) and len(p) == 2 and is_int(p[0]) and _is_real(p[1]) for p in points):
            raise ConfigError(f"device {name!r}: points must be (batch_size int, seconds) pairs, got {points!r}")
        ordered = sorted((int(b), float(t)) for b, t in points)
        return cls(
            name=name,
            batch_sizes=tuple(b for b, _ in ordered),
            times_s=tuple(t for _, t in ordered),
            max_batch_size=max_batch_size,
            interpolation=interpolation,
        )

    @classmethod
    def constant(cls, *, peak_speed: float, max_batch_size: int, name: str = "device") -> "SpeedCurve":
        """Constant speed ``peak_speed`` samples/s at every batch size up to ``max_batch_size``.

        ``peak_speed`` must lie in ``[1/MAX_TIME_S, 1/MIN_TIME_S]`` (one sample's time in the range
        a curve accepts).
        """
        check_number(f"device {name!r}: peak_speed (samples/s)", peak_speed,
                     minimum=1.0 / MAX_TIME_S, maximum=1.0 / MIN_TIME_S)
        check_int(f"device {name!r}: max_batch_size", max_batch_size, minimum=1, maximum=MAX_BATCH_SIZE)
        return cls(name=name, batch_sizes=(1,), times_s=(1.0 / peak_speed,), max_batch_size=max_batch_size)

    # ---------------------------------------------------------------- the model
    def _build_table(self) -> np.ndarray:
        """``τ(b)`` for ``b = 0 … max_batch_size`` (index = batch size), float64."""
        b_points = np.asarray(self.batch_sizes, dtype=np.float64)
        t_points = np.asarray(self.times_s, dtype=np.float64)
        s_points = b_points / t_points
        grid = np.arange(1, self.max_batch_size + 1, dtype=np.float64)
        inside = np.clip(grid, b_points[0], b_points[-1])
        if len(b_points) == 1:
            speeds = np.full_like(grid, s_points[0])
        elif self.interpolation == "linear":
            speeds = inside / np.interp(inside, b_points, t_points)  # constant speed outside the points
        else:
            speeds = CubicSpline(b_points, s_points, bc_type="natural")(inside)
            speeds = np.maximum(speeds, _MIN_SPEED_FRACTION * s_points.min())
        table = np.empty(self.max_batch_size + 1, dtype=np.float64)
        table[0] = 0.0
        table[1:] = grid / speeds
        # exact at the profiled points (the interpolants already are, up to rounding)
        table[np.asarray(self.batch_sizes)] = t_points
        return table

    @property
    def micro_step_times(self) -> np.ndarray:
        """Read-only view of ``τ(b)`` for ``b = 0 … max_batch_size``."""
        view = self._table.view()
        view.flags.writeable = False
        return view

    def time(self, batch_size: int) -> float:
        """``τ(b)``: seconds for one micro-step of ``batch_size`` samples (0 for 0)."""
        check_int(f"device {self.name!r}: batch_size", batch_size, minimum=0, maximum=self.max_batch_size)
        return float(self._table[batch_size])

    def speed(self, batch_size: int) -> float:
        """``s(b) = b / τ(b)`` samples per second, for ``b >= 1``."""
        check_int(f"device {self.name!r}: batch_size", batch_size, minimum=1, maximum=self.max_batch_size)
        return batch_size / float(self._table[batch_size])

    @cached_property
    def peak_batch_size(self) -> int:
        """The batch size of highest speed (the largest one on ties)."""
        speeds = np.arange(1, self.max_batch_size + 1) / self._table[1:]
        best = speeds.max()
        return int(np.flatnonzero(speeds >= best * (1 - 1e-12))[-1]) + 1

    @cached_property
    def peak_speed(self) -> float:
        """``max_b s(b)`` over ``b ∈ [1, max_batch_size]``, samples per second."""
        return self.speed(self.peak_batch_size)

    def largest_batch_within(self, seconds: float) -> int:
        """Largest ``b <= max_batch_size`` with ``τ(b) <= seconds`` (0 if none): Poplar's find(g, t)."""
        fits = np.flatnonzero(self._table[1:] <= seconds)
        return int(fits[-1]) + 1 if fits.size else 0

    def iteration_time(self, samples: int, micro_batch_size: int) -> float:
        """Seconds to process ``samples`` in micro-batches of ``micro_batch_size`` (last one smaller)."""
        if samples == 0:
            return 0.0
        steps = -(-samples // micro_batch_size)
        last = samples - (steps - 1) * micro_batch_size
        return (steps - 1) * self.time(micro_batch_size) + self.time(last)
