"""What an allocation is asked to do: devices, global batch, ZeRO stage, collective time, step cap.

Every allocator and bound of :mod:`.allocate` and :mod:`.bounds` takes one
:class:`AllocationRequest`; it validates its inputs once, on construction, and answers the
questions they share (the devices' capacities, the stage's kind).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from semimig._validate import check_choice, check_int, check_number
from semimig.allocation.speed import SpeedCurve
from semimig.errors import ConfigError

__all__ = ["AllocationRequest", "MAX_GLOBAL_BATCH_SIZE", "MAX_SEARCH_CANDIDATES"]

MAX_GLOBAL_BATCH_SIZE = 2**31 - 1
"""Largest global batch accepted: sample indices and counts stay within int32 (data loaders)."""
MAX_SEARCH_CANDIDATES = 2**24
"""Most micro-step times the ZeRO-2/3 search may scan (``Σ_i M_i``; ~128 MiB per float64 array)."""


@dataclass(frozen=True, kw_only=True)
class AllocationRequest:
    """One allocation problem (notation of :mod:`.allocate`)."""

    curves: tuple[SpeedCurve, ...]
    """Device ``i``'s speed curve ``τ_i`` (its max micro-batch ``M_i``); index = DP rank."""
    global_batch_size: int
    """``gbs``: samples per iteration over all devices, ``1 … MAX_GLOBAL_BATCH_SIZE``."""
    zero_stage: int
    """0, 1 (gradients reduced once per iteration) or 2, 3 (after every micro-step)."""
    comm_time_s: float = 0.0
    """``t_comm``: collective seconds per iteration (ZeRO-0/1) or per micro-step (ZeRO-2/3)."""
    max_accumulation_steps: Optional[int] = None
    """``A``: cap on micro-steps per iteration; ``None`` for none."""

    def __post_init__(self) -> None:
        curves = self.curves
        if isinstance(curves, (str, bytes)) or not isinstance(curves, Sequence):
            raise ConfigError(f"curves must be a sequence of SpeedCurve, got {curves!r}")
        if not curves:
            raise ConfigError("cannot allocate a batch over an empty cluster: got 0 devices")
        for i, curve in enumerate(curves):
            if not isinstance(curve, SpeedCurve):
                raise ConfigError(f"device {i} must be a SpeedCurve, got {type(curve).__name__}")
        object.__setattr__(self, "curves", tuple(curves))
        check_int("global_batch_size", self.global_batch_size, minimum=1, maximum=MAX_GLOBAL_BATCH_SIZE)
        check_choice("zero_stage", self.zero_stage, (0, 1, 2, 3))
        check_number("comm_time_s", self.comm_time_s, minimum=0.0)
        check_int("max_accumulation_steps", self.max_accumulation_steps, minimum=1, allow_none=True)
        if self.capacity < self.global_batch_size:
            raise ConfigError(
                f"global_batch_size={self.global_batch_size} exceeds what the devices can hold: "
                f"max batch sizes {[c.max_batch_size for c in self.curves]} x max_accumulation_steps="
                f"{self.max_accumulation_steps} = {self.capacity} samples per iteration"
            )
        if self.lockstep and self.max_batch_total > MAX_SEARCH_CANDIDATES:
            raise ConfigError(
                f"the ZeRO-{self.zero_stage} search scans every micro-step time of every device: max batch sizes "
                f"sum to {self.max_batch_total} > {MAX_SEARCH_CANDIDATES}; profile smaller max_batch_size values"
            )

    @classmethod
    def of(cls, curves: Sequence[SpeedCurve], global_batch_size: int, *, zero_stage: int, comm_time_s: float = 0.0,
           max_accumulation_steps: Optional[int] = None) -> "AllocationRequest":
        """The request for the functional entry points' arguments (same names, same checks)."""
        return cls(curves=curves, global_batch_size=global_batch_size, zero_stage=zero_stage,
                   comm_time_s=comm_time_s, max_accumulation_steps=max_accumulation_steps)

    @property
    def lockstep(self) -> bool:
        """ZeRO-2/3: every micro-step ends in a collective, so all devices share one ``gas``."""
        return self.zero_stage >= 2

    @property
    def num_devices(self) -> int:
        return len(self.curves)

    @property
    def max_batch_total(self) -> int:
        """``Σ_i M_i``: samples one micro-step of every device can hold."""
        return sum(c.max_batch_size for c in self.curves)

    @property
    def capacity(self) -> int:
        """Samples the devices can take per iteration: ``Σ_i M_i·A`` (``gbs`` when ``A`` is None)."""
        if self.max_accumulation_steps is None:
            return max(self.global_batch_size, self.max_batch_total)
        return self.max_batch_total * self.max_accumulation_steps

    def device_capacity(self, device: int) -> int:
        """``C_i = min(gbs, M_i·A)``: the most samples device ``i`` can take in one iteration."""
        if self.max_accumulation_steps is None:
            return self.global_batch_size
        return min(self.global_batch_size, self.curves[device].max_batch_size * self.max_accumulation_steps)
