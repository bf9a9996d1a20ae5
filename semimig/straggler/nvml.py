"""What a GPU says of its own speed: clocks and throttle reasons from NVML, beside the timings.

A card that is thermally or power throttled, or slowed by the hardware, reports it directly: the SM
clock it runs at against its maximum, and a bit mask of the reasons the driver holds it down.  That
is a cheap and early signal beside the step clock (:mod:`semimig.straggler.clock`): it names *why*
a rank is slow, where the clock only says *that* it is.  Decisions still come from the clock's
device time, which sees every cause (a noisy neighbour, a slow link, a smaller card); this module
only explains them in the log.

NVML comes from ``nvidia-ml-py`` (imported as ``pynvml``), an optional dependency imported only on
a CUDA device; without it, or on CPU, :func:`open_device` returns ``None`` and nothing is read.
Reading costs a few NVML calls (tens of µs), so :class:`HealthWatch` reads at most once per
``every_s`` seconds of wall time, never inside a step's GEMMs.

The reason bits (NVML's ``nvmlClocksEventReason*``, formerly ``nvmlClocksThrottleReason*``)::

    0x001 gpu idle                 0x020 software thermal slowdown
    0x002 application clocks       0x040 hardware thermal slowdown
    0x004 software power cap       0x080 hardware power brake
    0x008 hardware slowdown        0x100 display clock setting
    0x010 sync boost

Idle, application-clock and display settings say nothing of a straggler; the others slow the card.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Optional, Tuple

__all__ = ["REASONS", "SLOWING", "DeviceHealth", "HealthWatch", "decode_reasons", "open_device"]

logger = logging.getLogger(__name__)

REASONS: Tuple[Tuple[int, str], ...] = (
    (0x001, "gpu idle"), (0x002, "application clocks"), (0x004, "software power cap"),
    (0x008, "hardware slowdown"), (0x010, "sync boost"), (0x020, "software thermal slowdown"),
    (0x040, "hardware thermal slowdown"), (0x080, "hardware power brake"), (0x100, "display clock setting"),
)
"""NVML's clock-event reason bits and their names."""

SLOWING = 0x004 | 0x008 | 0x020 | 0x040 | 0x080
"""The reasons that make a busy card slower than its peers (power, thermal, hardware)."""


def decode_reasons(mask: int) -> Tuple[str, ...]:
    """The names of the reason bits set in ``mask``, in NVML's order (unknown bits as hex)."""
    if isinstance(mask, bool) or not isinstance(mask, int) or mask < 0:
        raise ValueError(f"mask must be an int >= 0 (an NVML reason bit mask), got {mask!r}")
    names = [name for bit, name in REASONS if mask & bit]
    rest = mask & ~sum(bit for bit, _ in REASONS)
    if rest:
        names.append(f"0x{rest:x}")
    return tuple(names)


@dataclass(frozen=True)
class DeviceHealth:
    """One reading of a card."""

    sm_clock_mhz: int
    """The SM clock now."""
    max_sm_clock_mhz: int
    """The SM clock the card can reach."""
    reasons: int
    """NVML's reason bit mask (:data:`REASONS`)."""
    temperature_c: Optional[int] = None
    power_w: Optional[float] = None

    @property
    def clock_ratio(self) -> float:
        """``sm_clock / max_sm_clock``: 1 for a card at full speed."""
        return self.sm_clock_mhz / self.max_sm_clock_mhz if self.max_sm_clock_mhz > 0 else 1.0

    @property
    def slowed(self) -> bool:
        """Whether a power, thermal or hardware reason holds the card down (:data:`SLOWING`)."""
        return bool(self.reasons & SLOWING)

    def describe(self) -> str:
        why = ", ".join(name for name in decode_reasons(self.reasons & SLOWING)) or "no slowing reason"
        extra = "".join((f", {self.temperature_c} °C" if self.temperature_c is not None else "",
                         f", {self.power_w:.0f} W" if self.power_w is not None else ""))
        return f"SM clock {self.sm_clock_mhz}/{self.max_sm_clock_mhz} MHz ({why}{extra})"


class _NvmlDevice:
    """A handle on one card through ``pynvml``."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml, self._handle = nvml, handle

    def read(self) -> DeviceHealth:
        nvml, h = self._nvml, self._handle
        reasons_of = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        try:
            temperature = int(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
        except nvml.NVMLError:
            temperature = None
        try:
            power = nvml.nvmlDeviceGetPowerUsage(h) / 1000.0
        except nvml.NVMLError:
            power = None
        return DeviceHealth(sm_clock_mhz=int(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
                            max_sm_clock_mhz=int(nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM)),
                            reasons=int(reasons_of(h)), temperature_c=temperature, power_w=power)


def open_device(device: Any) -> Optional[_NvmlDevice]:
    """NVML's handle on the card torch calls ``device``, or ``None`` (CPU, no ``pynvml``, no driver).

    The card is found by its UUID (torch and NVML number cards differently under
    ``CUDA_VISIBLE_DEVICES``), by the visible index when torch gives no UUID."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    try:
        import pynvml as nvml
    except ImportError:
        logger.debug("nvidia-ml-py is not installed: no NVML clocks or throttle reasons beside the timings")
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        nvml.nvmlInit()
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        if uuid is not None:
            text = str(uuid)
            handle = nvml.nvmlDeviceGetHandleByUUID(text if text.startswith("GPU-") else f"GPU-{text}")
        else:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
            ids = [v.strip() for v in visible.split(",") if v.strip()]
            handle = nvml.nvmlDeviceGetHandleByIndex(int(ids[index]) if ids and ids[index].isdigit() else index)
        return _NvmlDevice(nvml, handle)
    except Exception as err:  # NVML raises its own error types, and an old driver lacks calls
        logger.debug("NVML has no handle on cuda:%s (%s): no clocks beside the timings", index, err)
        return None


class HealthWatch:
    """Reads a card at most once per ``every_s`` seconds and logs when a slowing reason appears or goes.

    ``poll()`` returns the newest reading (``None`` without NVML); a change of :attr:`DeviceHealth.slowed`
    is logged at WARNING (appears) or INFO (goes), naming the rank and the reasons."""

    def __init__(self, device: Any, *, rank: int, every_s: float = 10.0) -> None:
        if not every_s > 0:
            raise ValueError(f"every_s must be > 0 seconds, got {every_s!r}")
        self.rank, self.every_s = rank, float(every_s)
        self._device = open_device(device)
        self._next = 0.0
        self._slowed = False
        self.last: Optional[DeviceHealth] = None

    @property
    def available(self) -> bool:
        return self._device is not None

    def poll(self, now: Optional[float] = None) -> Optional[DeviceHealth]:
        if self._device is None:
            return None
        now = time.monotonic() if now is None else now
        if now < self._next:
            return self.last
        self._next = now + self.every_s
        try:
            health = self._device.read()
        except Exception as err:  # a card that stops answering is not the training's failure
            logger.debug("NVML read on rank %d failed: %s", self.rank, err)
            self._device = None
            return None
        if health.slowed != self._slowed:
            (logger.warning if health.slowed else logger.info)(
                "rank %d's GPU %s: %s", self.rank, "is held down" if health.slowed else "runs free again",
                health.describe())
        self._slowed, self.last = health.slowed, health
        return health
