"""The whole-device straggler (``scope=device``): every span of work between two collectives takes
chi times as long, the collectives themselves do not; composes with bursts; every rank's step
splits into compute and communication."""
from __future__ import annotations

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

from semimig.errors import ConfigError
from semimig.straggler import device as device_mod
from semimig.straggler.busy import BusyMeter
from semimig.straggler.device import DeviceClock
from semimig.straggler.injection import StragglerConfig, StragglerInjector
from dist_harness import free_port


class FakeTime:
    """A synthetic clock: ``perf_counter`` reads it; work and collectives advance it by set amounts."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def perf_counter(self) -> float:
        return self.now

    def work(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:  # the injector's sleep, advancing the synthetic clock
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def fake_time(monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr(device_mod.time, "perf_counter", clock.perf_counter)
    monkeypatch.setattr(StragglerInjector, "inject", lambda self, delay, device: clock.sleep(delay))
    return clock


@pytest.fixture
def gloo_world_of_one():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def _collective_taking(clock: FakeTime, seconds: float):
    """A stand-in for a collective's own time, called through the wrapped torch.distributed.all_reduce."""
    def all_reduce(*args, **kwargs):
        clock.work(seconds)
    return all_reduce


def _run_spans(fake_time, monkeypatch, spec: str, spans, comm_s=0.5, iterations=None):
    """Work ``spans[j]`` seconds, then one collective of ``comm_s``; returns the clock's DeviceTime."""
    from torch.distributed import distributed_c10d as c10d

    original = _collective_taking(fake_time, comm_s)
    monkeypatch.setattr(c10d, "all_reduce", original)
    monkeypatch.setattr(dist, "all_reduce", original)
    injector = StragglerInjector(StragglerConfig.from_cli(spec), group_rank=1, group_size=2)
    with DeviceClock(injector) as clock:
        for j, span in enumerate(spans):
            if iterations is not None:
                injector.set_position(0, iterations[j])
            fake_time.work(span)
            dist.all_reduce(torch.zeros(1))
        return clock.take()


def test_device_scope_multiplies_every_span_of_work_and_not_the_collectives(fake_time, monkeypatch):
    spans = [0.1, 0.25, 0.05, 1.0]
    t = _run_spans(fake_time, monkeypatch, "fixed:1:4:scope=device", spans, comm_s=0.5)
    assert fake_time.slept == pytest.approx([3 * s for s in spans])  # (chi - 1) x span, before each collective
    assert t.comm_s == pytest.approx(0.5 * len(spans))  # the collectives' own time, unchanged
    assert t.sleep_s == pytest.approx(3 * sum(spans))
    assert t.compute_s == pytest.approx(4 * sum(spans))  # the emulated device took chi x the work
    assert t.collectives == len(spans)


def test_time_off_the_step_is_no_work_no_collective_and_no_sleep(fake_time, monkeypatch):
    """An evaluation between steps (``off``): its time leaves the step's wall time and the span a slow
    rank's next sleep scales with, its collectives are not the step's, and the slow rank is not slowed in it."""
    from torch.distributed import distributed_c10d as c10d

    collective = _collective_taking(fake_time, 0.5)
    monkeypatch.setattr(c10d, "all_reduce", collective)
    monkeypatch.setattr(dist, "all_reduce", collective)
    injector = StragglerInjector(StragglerConfig.from_cli("fixed:1:4:scope=device"), group_rank=1, group_size=2)
    with DeviceClock(injector) as clock:
        fake_time.work(0.1)
        with clock.off():
            fake_time.work(2.0)
            dist.all_reduce(torch.zeros(1))
        fake_time.work(0.1)
        dist.all_reduce(torch.zeros(1))
        t = clock.take()
    assert fake_time.slept == pytest.approx([3 * 0.2])  # one sleep, for the step's own 0.2 s of work
    assert t.collectives == 1 and t.comm_s == pytest.approx(0.5)
    assert t.compute_s == pytest.approx(4 * 0.2)


def test_a_rank_that_does_not_straggle_only_measures(fake_time, monkeypatch):
    # rank 1 is the injector's rank; the straggler is rank 0
    t = _run_spans(fake_time, monkeypatch, "fixed:0:4:scope=device", [0.2, 0.3], comm_s=0.1)
    assert fake_time.slept == []
    assert t.compute_s == pytest.approx(0.5) and t.comm_s == pytest.approx(0.2)


def test_gemm_scope_never_sleeps_at_collectives(fake_time, monkeypatch):
    _run_spans(fake_time, monkeypatch, "fixed:1:4", [0.2, 0.3])
    assert fake_time.slept == []


def test_device_scope_composes_with_bursts(fake_time, monkeypatch):
    # every 4 iterations, the first 2 are slow (chi 3): spans of iterations 0,1,4,5 are tripled
    iterations = list(range(8))
    t = _run_spans(fake_time, monkeypatch, "burst:1:3:every=4:len=2:scope=device", [0.1] * 8,
                   iterations=iterations)
    assert fake_time.slept == pytest.approx([0.2, 0.2, 0.2, 0.2])
    assert t.sleep_s == pytest.approx(0.8)


def test_nested_collectives_are_counted_once(gloo_world_of_one):
    injector = StragglerInjector(StragglerConfig.from_cli("fixed:0:2:scope=device"), group_rank=0, group_size=1)
    with DeviceClock(injector) as clock:
        clock.take()
        dist.all_gather_object([None], {"a": 1})  # all_gather_object calls all_gather (and more) inside
        t = clock.take()
    assert t.collectives == 1


def test_real_gloo_collectives_are_wrapped_and_restored(gloo_world_of_one):
    original = dist.all_reduce
    injector = StragglerInjector(StragglerConfig.from_cli("fixed:0:3:scope=device"), group_rank=0, group_size=1)
    x = torch.ones(4)
    with DeviceClock(injector) as clock:
        assert dist.all_reduce is not original and dist.all_reduce.__wrapped__ is original
        clock.take()
        for _ in range(3):
            start = time.perf_counter()
            while time.perf_counter() - start < 0.02:  # 20 ms of real work
                pass
            dist.all_reduce(x)
        t = clock.take()
    assert dist.all_reduce is original  # unwrapped once the last clock detached
    assert t.collectives == 3
    # 60 ms of work at chi 3: about 120 ms slept (the spans also hold the loop's own overhead)
    assert 0.11 <= t.sleep_s <= 0.2, t
    assert t.compute_s >= 0.17
    assert torch.equal(x, torch.ones(4))  # the collective still did its job


def test_two_clocks_share_one_patch_and_a_sleep_is_never_communication(fake_time, monkeypatch):
    from torch.distributed import distributed_c10d as c10d

    original = _collective_taking(fake_time, 0.1)
    monkeypatch.setattr(c10d, "all_reduce", original)
    monkeypatch.setattr(dist, "all_reduce", original)
    measuring = DeviceClock(None).attach()
    slowing = DeviceClock(StragglerInjector(StragglerConfig.from_cli("fixed:0:5:scope=device"), 0, 2)).attach()
    fake_time.work(0.2)
    dist.all_reduce(torch.zeros(1))
    a, b = measuring.take(), slowing.take()
    slowing.detach()
    assert dist.all_reduce.__wrapped__ is original  # one clock still attached
    measuring.detach()
    assert dist.all_reduce is original
    for t in (a, b):
        assert t.comm_s == pytest.approx(0.1) and t.compute_s == pytest.approx(1.0)


def test_busy_meter_charges_chi_times_the_gemm_under_device_scope():
    injector = StragglerInjector(StragglerConfig.from_cli("fixed:0:4:scope=device"), 0, 2)
    meter = BusyMeter(injector)
    start = time.perf_counter()
    meter.timed(lambda: time.sleep(0.01), flops=1.0, full_flops=1.0)
    wall = time.perf_counter() - start
    busy = meter.snapshot().busy_s
    assert wall < 0.03  # not slowed inside the GEMM: the sleep comes at the next collective
    assert busy == pytest.approx(4 * wall, rel=0.1)


@pytest.mark.parametrize("spec, fragment", [
    ("fixed:1:4:scope=node", "scope must be one of"),
    ("fixed:1:4:mode=flops:flops=1e9:scope=device", "needs mode='measured'"),
    ("fixed:1:4:scope=device:scope=gemm", "given twice"),
])
def test_bad_scopes_are_refused_by_name(spec, fragment):
    with pytest.raises(ConfigError, match=fragment):
        StragglerConfig.from_cli(spec)


@pytest.mark.parametrize("spec", ["fixed:1:4:scope=device", "burst:1:4:every=10:len=3:scope=device",
                                  "round-robin:8:scope=device", "multi:0=2,1=4:scope=device", "fixed:1:4"])
def test_scope_round_trips_through_the_cli_grammar(spec):
    config = StragglerConfig.from_cli(spec)
    assert StragglerConfig.from_cli(config.to_cli()) == config
    assert config.scope == ("device" if "scope=device" in spec else "gemm")


def test_an_async_collectives_wait_is_communication_and_the_span_before_it_is_slowed(gloo_world_of_one):
    original_wait = dist.Work.wait
    injector = StragglerInjector(StragglerConfig.from_cli("fixed:0:3:scope=device"), group_rank=0, group_size=1)
    with DeviceClock(injector) as clock:
        assert dist.Work.wait is not original_wait
        clock.take()
        handle = dist.all_reduce(torch.ones(4), async_op=True)  # boundary 1
        start = time.perf_counter()
        while time.perf_counter() - start < 0.03:  # 30 ms of work overlapping the collective
            pass
        handle.wait()  # boundary 2: the 30 ms span is slowed before it
        t = clock.take()
    assert dist.Work.wait is original_wait
    assert t.collectives == 1  # the wait is timed as communication, not counted as a second collective
    assert 0.055 <= t.sleep_s <= 0.09, t
