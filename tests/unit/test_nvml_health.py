"""NVML's view of a card beside the timings (semimig.straggler.nvml): the reason bits decoded, what
counts as a slowing reason, the read rate and the log on a change; on CPU nothing is read.

The card itself (NVML through ``pynvml``) exists only on a GPU machine; here a reading source with
the same ``read()`` stands in for it, so what is tested is the watch's own logic."""
from __future__ import annotations

import logging

import pytest
import torch

from semimig.straggler.nvml import REASONS, SLOWING, DeviceHealth, HealthWatch, decode_reasons, open_device


def test_every_reason_bit_is_named_once_in_nvml_order():
    bits = [bit for bit, _ in REASONS]
    assert bits == sorted(bits) and len(set(bits)) == len(bits) and all(b & (b - 1) == 0 for b in bits)
    assert decode_reasons(0) == ()
    assert decode_reasons(0x040 | 0x004) == ("software power cap", "hardware thermal slowdown")
    assert decode_reasons(0x1000 | 0x001) == ("gpu idle", "0x1000")  # an unknown bit is kept, as hex


@pytest.mark.parametrize("mask", [-1, 1.5, True, "8"])
def test_a_bad_mask_is_refused_naming_it(mask):
    with pytest.raises(ValueError, match=repr(mask).replace("(", r"\(").replace(".", r"\.")):
        decode_reasons(mask)


@pytest.mark.parametrize("mask, slowed", [(0x0, False), (0x001, False), (0x002, False), (0x100, False),
                                          (0x010, False), (0x004, True), (0x008, True), (0x020, True),
                                          (0x040, True), (0x080, True), (0x001 | 0x040, True)])
def test_only_power_thermal_and_hardware_reasons_slow_a_card(mask, slowed):
    health = DeviceHealth(sm_clock_mhz=1200, max_sm_clock_mhz=1980, reasons=mask)
    assert health.slowed is slowed and bool(mask & SLOWING) is slowed
    assert health.clock_ratio == pytest.approx(1200 / 1980)
    assert ("no slowing reason" in health.describe()) is (not slowed)


def test_on_cpu_there_is_no_card_and_nothing_is_read():
    assert open_device("cpu") is None
    watch = HealthWatch(torch.device("cpu"), rank=0)
    assert not watch.available and watch.poll() is None and watch.last is None


class _Readings:
    """A card's successive readings, in order (stands in for NVML on a machine without a GPU)."""

    def __init__(self, *masks: int) -> None:
        self.masks, self.reads = list(masks), 0

    def read(self) -> DeviceHealth:
        self.reads += 1
        return DeviceHealth(sm_clock_mhz=1000, max_sm_clock_mhz=2000, reasons=self.masks.pop(0))


def test_the_watch_reads_at_most_once_per_period_and_logs_a_change_of_state(caplog):
    watch = HealthWatch("cpu", rank=3, every_s=10.0)
    card = watch._device = _Readings(0x0, 0x040, 0x040, 0x0)
    with caplog.at_level(logging.INFO, logger="semimig.straggler.nvml"):
        assert not watch.poll(now=0.0).slowed
        assert watch.poll(now=5.0) is watch.last and card.reads == 1  # within the period: the last reading
        assert watch.poll(now=10.0).slowed                              # held down: said at WARNING
        assert watch.poll(now=20.0).slowed                              # still: said once only
        assert not watch.poll(now=30.0).slowed                          # free again: said at INFO
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert card.reads == 4 and len(said) == 2
    assert said[0][0] == logging.WARNING and "rank 3" in said[0][1] and "hardware thermal slowdown" in said[0][1]
    assert said[1][0] == logging.INFO and "runs free again" in said[1][1]


def test_a_card_that_stops_answering_ends_the_watch_not_the_training():
    class _Gone:
        def read(self):
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    watch = HealthWatch("cpu", rank=0)
    watch._device = _Gone()
    assert watch.poll(now=0.0) is None and not watch.available


@pytest.mark.parametrize("every_s", [0, -1.0, float("nan")])
def test_a_bad_period_is_refused_naming_it(every_s):
    with pytest.raises(ValueError, match="every_s"):
        HealthWatch("cpu", rank=0, every_s=every_s)
