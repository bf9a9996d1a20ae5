"""Poplar Algorithm 1: a device's max batch size and its micro-step time at the probed sizes.

A *device* here is any callable ``step(b) -> ProbeResult`` that runs one forward/backward at
batch size ``b`` (raising ``torch.OutOfMemoryError`` when it does not fit), e.g.
:class:`~.device.ModelStepDevice`.  :func:`profile_device` searches its max batch size ``mbs``:

1. Probe ``b = 1``.  With a known capacity ``C``, Poplar's one-batch estimate
   ``mbs ≈ (C - bf)/(af - bf)`` (memory before the step and after its forward; the step's peak
   stands in for ``af`` if the device cannot report it) caps the exponential growth.  Taken after
   the forward it ignores gradients and optimizer state and over-estimates; taken at the peak it
   charges them to the one sample and under-estimates.  Either way steps 2-3 correct it.
2. Exponential growth ``b = 2, 4, 8, …`` while ``b`` stays within the estimate.  After every
   success the estimate is replaced by CAPTURE's: the line through the peaks of the two largest
   successful probes, ``peak(b) = α + β·b``, gives ``⌊(C - α)/β⌋``.
3. Probe the estimate itself; if it fits and no failure is known yet, probe one more and keep
   doubling (the estimate was low) until a probe fails or the ceiling is reached.
4. Binary search between the largest success and the smallest failure.

Every successful probe records its compute time (median of ``repeats`` runs), with the time spent
inside collectives subtracted (``ProbeResult.compute_s``, Poplar's ZeRO-2/3 rule; a device whose
step has no collectives reports 0 for them).  :meth:`DeviceProfile.curve` turns those points into
the speed curve of :mod:`.speed`.

:func:`gather_profiles` shares the profiles of all data-parallel devices, so that every rank can
compute the same plan.
"""
from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from semimig._validate import check_int, check_number
from semimig.allocation.memory import LinearMemoryFit, one_batch_estimate
from semimig.allocation.speed import MAX_BATCH_SIZE, SpeedCurve
from semimig.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["ProbeResult", "ProfilerConfig", "DeviceProfile", "profile_device", "gather_profiles"]


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    """One forward/backward at ``batch_size``."""

    batch_size: int
    time_s: float
    """Wall time of the step."""
    collective_s: float = 0.0
    """Part of ``time_s`` spent inside collectives (waiting included)."""
    peak_bytes: int
    """Peak memory of the step."""
    before_bytes: int
    """Memory held just before the step."""
    after_forward_bytes: Optional[int] = None
    """Memory held after the forward (Poplar's ``af``); None if the device cannot tell."""

    def __post_init__(self) -> None:
        check_int("ProbeResult.batch_size", self.batch_size, minimum=1)
        for name in ("time_s", "collective_s"):
            check_number(f"ProbeResult.{name}", getattr(self, name), minimum=0.0)
        for name in ("peak_bytes", "before_bytes", "after_forward_bytes"):
            check_int(f"ProbeResult.{name}", getattr(self, name), minimum=0, allow_none=name == "after_forward_bytes")

    @property
    def compute_s(self) -> float:
        """``time_s - collective_s``: the device's own work (floored at 1 ns)."""
        return max(self.time_s - self.collective_s, 1e-9)


@dataclass(frozen=True, kw_only=True)
class ProfilerConfig:
    """Knobs of :func:`profile_device`."""

    max_batch_size: int = 4096
    """Search ceiling: no batch above it is tried (needed when memory never runs out); at most
    :data:`~.speed.MAX_BATCH_SIZE`, the largest a speed curve accepts."""
    repeats: int = 1
    """Timed runs per probed batch size; the median compute time is kept."""
    warmup: int = 1
    """Untimed runs at batch size 1 before probing (first-call costs)."""

    def __post_init__(self) -> None:
        check_int("ProfilerConfig.max_batch_size", self.max_batch_size, minimum=1, maximum=MAX_BATCH_SIZE)
        check_int("ProfilerConfig.repeats", self.repeats, minimum=1)
        check_int("ProfilerConfig.warmup", self.warmup, minimum=0)


@dataclass(frozen=True, kw_only=True)
class DeviceProfile:
    """What profiling learned about one device."""

    name: str
    max_batch_size: int
    """Largest batch size that ran (the search result ``mbs``)."""
    probes: tuple[ProbeResult, ...]
    """Successful probes, one per batch size, increasing."""
    failed_batch_sizes: tuple[int, ...] = ()
    """Batch sizes that ran out of memory, in the order tried."""
    first_estimate: Optional[int] = None
    """Algorithm 1's one-batch estimate of ``mbs`` (None without a capacity)."""
    memory_fit: Optional[LinearMemoryFit] = None
    """CAPTURE's line through the two largest successful probes (None with fewer than two)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigError(f"DeviceProfile.name must be a str, got {self.name!r}")
        if not isinstance(self.probes, tuple) or not all(isinstance(p, ProbeResult) for p in self.probes):
            raise ConfigError(f"DeviceProfile({self.name!r}).probes must be a tuple of ProbeResult, got {self.probes!r}")
        if not self.probes:
            raise ConfigError(f"DeviceProfile({self.name!r}) needs at least one successful probe")
        sizes = [p.batch_size for p in self.probes]
        if sizes != sorted(set(sizes)):
            raise ConfigError(f"DeviceProfile({self.name!r}).probes must have increasing batch sizes, got {sizes}")
        if self.max_batch_size != sizes[-1]:
            raise ConfigError(
                f"DeviceProfile({self.name!r}).max_batch_size={self.max_batch_size} is not the largest probe {sizes[-1]}"
            )

    def curve(self, *, interpolation: str = "linear") -> SpeedCurve:
        """The speed curve through ``(b, compute_s)`` of every successful probe (:mod:`.speed`)."""
        return SpeedCurve.from_points([(p.batch_size, p.compute_s) for p in self.probes],
                                      max_batch_size=self.max_batch_size, name=self.name, interpolation=interpolation)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; ``points`` is what ``semimig plan`` reads."""
        return {
            "name": self.name,
            "max_batch_size": self.max_batch_size,
            "points": [[p.batch_size, p.compute_s] for p in self.probes],
            "probes": [
                {
                    "batch_size": p.batch_size,
                    "time_s": p.time_s,
                    "collective_s": p.collective_s,
                    "peak_bytes": p.peak_bytes,
                    "before_bytes": p.before_bytes,
                    "after_forward_bytes": p.after_forward_bytes,
                }
                for p in self.probes
            ],
            "failed_batch_sizes": list(self.failed_batch_sizes),
            "first_estimate": self.first_estimate,
            "memory_fit": None
            if self.memory_fit is None
            else {"intercept_bytes": self.memory_fit.intercept_bytes, "bytes_per_sample": self.memory_fit.bytes_per_sample},
        }


class _Search:
    """Bookkeeping of one run of Algorithm 1."""

    def __init__(self, step: Callable[[int], ProbeResult], config: ProfilerConfig, name: str) -> None:
        self.step = step
        self.config = config
        self.name = name
        self.ok: dict[int, ProbeResult] = {}
        self.failed: list[int] = []

    def attempt(self, batch_size: int) -> bool:
        if batch_size in self.ok:
            return True
        if batch_size in self.failed:
            return False
        runs = []
        try:
            for _ in range(self.config.repeats):
                result = self.step(batch_size)
                if not isinstance(result, ProbeResult) or result.batch_size != batch_size:
                    raise ValueError(
                        f"device {self.name!r}: step({batch_size}) must return a ProbeResult for that batch size, got {result!r}"
                    )
                runs.append(result)
        except torch.OutOfMemoryError:
            self.failed.append(batch_size)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            logger.debug("device %s: batch %d out of memory", self.name, batch_size)
            return False
        median = statistics.median(r.compute_s for r in runs)
        self.ok[batch_size] = min(runs, key=lambda r: (abs(r.compute_s - median), r.compute_s))
        logger.debug("device %s: batch %d ok, %.4g s, peak %d B", self.name, batch_size, median, self.ok[batch_size].peak_bytes)
        return True

    def fit(self) -> Optional[LinearMemoryFit]:
        if len(self.ok) < 2:
            return None
        b1, b2 = sorted(self.ok)[-2:]
        return LinearMemoryFit.through(b1, self.ok[b1].peak_bytes, b2, self.ok[b2].peak_bytes)


def profile_device(
    step: Callable[[int], ProbeResult],
    *,
    memory_capacity_bytes: Optional[int] = None,
    config: ProfilerConfig = ProfilerConfig(),
    name: Optional[str] = None,
) -> DeviceProfile:
    """Run Algorithm 1 (module docstring) on ``step``; ``memory_capacity_bytes`` enables the estimates.

    ``memory_capacity_bytes`` and ``name`` default to the step's attributes of those names, if any
    (:class:`~.device.ModelStepDevice` has both).

    Raises:
        RuntimeError: not even a batch of one sample fits (Poplar would move to a higher ZeRO stage).
    """
    if memory_capacity_bytes is None:
        memory_capacity_bytes = getattr(step, "memory_capacity_bytes", None)
    if name is None:
        name = str(getattr(step, "name", "device"))
    check_int("memory_capacity_bytes", memory_capacity_bytes, minimum=1, allow_none=True)
    if not isinstance(config, ProfilerConfig):
        raise ConfigError(f"config must be a ProfilerConfig, got {config!r}")
    search = _Search(step, config, name)
    ceiling = config.max_batch_size
    for _ in range(config.warmup):
        try:
            step(1)
        except torch.OutOfMemoryError as err:
            raise RuntimeError(f"device {name!r} cannot run a single sample (batch size 1): {err}") from err
    if not search.attempt(1):
        raise RuntimeError(f"device {name!r} cannot run a single sample (batch size 1): out of memory")

    first = search.ok[1]
    first_estimate = None
    estimate = ceiling
    if memory_capacity_bytes is not None:
        after = first.peak_bytes if first.after_forward_bytes is None else first.after_forward_bytes
        first_estimate = one_batch_estimate(memory_capacity_bytes, first.before_bytes, after, 1)
        if first_estimate is not None:
            estimate = max(1, min(first_estimate, ceiling))

    low, high = 1, None  # largest success, smallest failure
    # 2. exponential growth within the (refined) estimate
    b = 2
    while high is None and b <= min(estimate, ceiling):
        if search.attempt(b):
            low = b
            fit = search.fit()
            if memory_capacity_bytes is not None and fit is not None:
                estimate = max(low, min(fit.max_batch_within(memory_capacity_bytes), ceiling))
            b *= 2
        else:
            high = b
    # 3. the estimate itself, then past it if it was low
    target = min(estimate, ceiling)
    if high is None and target > low:
        if search.attempt(target):
            low = target
        else:
            high = target
    grow = low + 1
    while high is None and low < ceiling:
        b = min(grow, ceiling)
        if search.attempt(b):
            low, grow = b, 2 * b
        else:
            high = b
    # 4. binary search
    while high is not None and high - low > 1:
        mid = (low + high) // 2
        if search.attempt(mid):
            low = mid
        else:
            high = mid

    probes = tuple(search.ok[k] for k in sorted(search.ok))
    profile = DeviceProfile(
        name=name,
        max_batch_size=low,
        probes=probes,
        failed_batch_sizes=tuple(search.failed),
        first_estimate=first_estimate,
        memory_fit=search.fit(),
    )
    logger.info(
        "device %s: max batch size %d after %d probes (%d out of memory), first estimate %s",
        name, low, len(probes) + len(search.failed), len(search.failed), first_estimate,
    )
    return profile


def gather_profiles(profile: DeviceProfile, *, group: Optional[dist.ProcessGroup] = None) -> list[DeviceProfile]:
    """All-gather every rank's profile over ``group`` (collective); index = rank in ``group``."""
    gathered: list[Optional[DeviceProfile]] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, profile, group=group)
    return [p for p in gathered if p is not None]
