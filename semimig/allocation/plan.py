"""The frozen result of an allocation: per-device micro-batch size, accumulation steps, last batch.

Device ``i`` processes ``samples_i = (gas_i - 1)·mbs_i + lbs_i`` samples per iteration: ``gas_i``
micro-steps, all of ``mbs_i`` samples except the last, which has ``lbs_i``.  Over the devices,
``Σ_i samples_i = gbs`` (the global batch).

ZeRO-0/1 plans may give devices different ``gas_i`` (gradients are accumulated locally and
reduced once, after the last micro-step).  ZeRO-2/3 plans reduce-scatter after *every* micro-step,
a collective every device must join, so all devices share one ``gas``; a device whose last share
is empty (``lbs_i = 0``) still runs that micro-step on an empty batch.
"""
from __future__ import annotations

from dataclasses import dataclass

from semimig._validate import check_choice, check_int, check_number, is_int
from semimig.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class DevicePlan:
    """One data-parallel device's share of the global batch."""

    name: str
    """The device's label (from its speed curve)."""
    micro_batch_size: int
    """``mbs``: samples per micro-step except the last; 0 only for a device with no samples."""
    accumulation_steps: int
    """``gas``: micro-steps per iteration, >= 1."""
    last_batch_size: int
    """``lbs``: samples in the last micro-step, ``0 <= lbs <= mbs``."""
    predicted_time_s: float = 0.0
    """Model compute time of this device's micro-steps in one iteration (collectives excluded)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigError(f"DevicePlan.name must be a str, got {self.name!r}")
        where = f"DevicePlan({self.name!r})"
        check_int(f"{where}.micro_batch_size", self.micro_batch_size, minimum=0)
        check_int(f"{where}.accumulation_steps", self.accumulation_steps, minimum=1)
        check_int(f"{where}.last_batch_size", self.last_batch_size, minimum=0)
        if self.last_batch_size > self.micro_batch_size:
            raise ConfigError(
                f"{where}.last_batch_size={self.last_batch_size} exceeds micro_batch_size={self.micro_batch_size}"
            )
        check_number(f"{where}.predicted_time_s", self.predicted_time_s, minimum=0.0)

    @property
    def samples(self) -> int:
        """Samples this device processes per iteration."""
        return (self.accumulation_steps - 1) * self.micro_batch_size + self.last_batch_size

    @property
    def micro_batch_sizes(self) -> tuple[int, ...]:
        """Samples of each micro-step, in order: ``(mbs,)*(gas-1) + (lbs,)``."""
        return (self.micro_batch_size,) * (self.accumulation_steps - 1) + (self.last_batch_size,)


@dataclass(frozen=True, kw_only=True)
class AllocationPlan:
    """Every data-parallel device's share; device ``i`` is data-parallel rank ``i``."""

    zero_stage: int
    """0, 1, 2 or 3; stages 2 and 3 require one common ``accumulation_steps``."""
    global_batch_size: int
    """``gbs``: samples per iteration over all devices."""
    devices: tuple[DevicePlan, ...]
    """One entry per data-parallel device, in data-parallel rank order."""
    comm_time_s: float = 0.0
    """Collective time the model charges: once per iteration (ZeRO-0/1) or per micro-step (2/3)."""
    predicted_iteration_time_s: float = 0.0
    """Model iteration time: slowest device plus collectives (see the allocator docs)."""

    def __post_init__(self) -> None:
        check_choice("AllocationPlan.zero_stage", self.zero_stage, (0, 1, 2, 3))
        check_int("AllocationPlan.global_batch_size", self.global_batch_size, minimum=1)
        if not isinstance(self.devices, tuple) or not self.devices or \
                not all(isinstance(d, DevicePlan) for d in self.devices):
            raise ConfigError(f"AllocationPlan.devices must be a non-empty tuple of DevicePlan, got {self.devices!r}")
        total = sum(d.samples for d in self.devices)
        if total != self.global_batch_size:
            raise ConfigError(
                f"AllocationPlan: device samples {[d.samples for d in self.devices]} sum to {total}, "
                f"not global_batch_size={self.global_batch_size}"
            )
        if self.zero_stage >= 2:
            steps = {d.accumulation_steps for d in self.devices}
            if len(steps) != 1:
                raise ConfigError(
                    f"AllocationPlan: ZeRO-{self.zero_stage} needs one accumulation_steps on every device "
                    f"(every micro-step ends in a reduce-scatter), got {[d.accumulation_steps for d in self.devices]}"
                )
        for field_name in ("comm_time_s", "predicted_iteration_time_s"):
            check_number(f"AllocationPlan.{field_name}", getattr(self, field_name), minimum=0.0)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def samples(self) -> tuple[int, ...]:
        """Samples per device per iteration."""
        return tuple(d.samples for d in self.devices)

    def offset(self, device: int) -> int:
        """Index of ``device``'s first sample inside the global batch (devices are contiguous)."""
        self._check_device(device)
        return sum(d.samples for d in self.devices[:device])

    def device(self, device: int) -> DevicePlan:
        self._check_device(device)
        return self.devices[device]

    def _check_device(self, device: int) -> None:
        if not is_int(device) or not 0 <= device < len(self.devices):
            raise ConfigError(f"device index must be an int in [0, {len(self.devices)}), got {device!r}")

    def to_dict(self) -> dict:
        """A JSON-ready description (what ``semimig plan --json`` writes)."""
        return {
            "zero_stage": self.zero_stage,
            "global_batch_size": self.global_batch_size,
            "comm_time_s": self.comm_time_s,
            "predicted_iteration_time_s": self.predicted_iteration_time_s,
            "devices": [
                {
                    "name": d.name,
                    "samples": d.samples,
                    "micro_batch_size": d.micro_batch_size,
                    "accumulation_steps": d.accumulation_steps,
                    "last_batch_size": d.last_batch_size,
                    "predicted_time_s": d.predicted_time_s,
                }
                for d in self.devices
            ],
        }

    def format_table(self) -> str:
        """A fixed-width table, one row per device, for humans."""
        header = f"{'rank':>4}  {'device':<16} {'samples':>7} {'mbs':>5} {'gas':>4} {'lbs':>5} {'time_s':>10}"
        rows = [header, "-" * len(header)]
        for i, d in enumerate(self.devices):
            rows.append(
                f"{i:>4}  {d.name[:16]:<16} {d.samples:>7} {d.micro_batch_size:>5} "
                f"{d.accumulation_steps:>4} {d.last_batch_size:>5} {d.predicted_time_s:>10.4g}"
            )
        rows.append(
            f"ZeRO-{self.zero_stage}  global batch {self.global_batch_size}  "
            f"predicted iteration {self.predicted_iteration_time_s:.4g} s (collectives {self.comm_time_s:.4g} s)"
        )
        return "\n".join(rows)
