"""The step clock's bookkeeping (semimig.straggler.clock), driven through the host backend, which runs
the same code as the CUDA one: lag, pool reuse and exhaustion, a step whose markers are not complete
yet, nested regions, reset between steps, and the busy meter on top of it."""
import math
import time

import pytest
import torch

from semimig.straggler.busy import BusyMeter
from semimig.straggler.clock import HostClock, Span, StepTimes, make_clock


def _work(clock, kind="gemm", n=1):
    for _ in range(n):
        with clock.region(kind):
            sum(range(200))


def test_make_clock_picks_the_host_backend_on_cpu():
    clock = make_clock("cpu")
    assert clock.backend == "host" and clock.lag == 1
    assert make_clock(None, lag=0).lag == 0
    with pytest.raises(Exception, match="lag"):
        make_clock("cpu", lag=-1)
    with pytest.raises(ValueError, match="kind"):
        with clock.region("sleep"):
            pass


def test_a_span_reads_the_work_between_its_two_points():
    span = Span("cpu")
    time.sleep(0.05)
    first = span.seconds()
    time.sleep(0.02)
    second = span.seconds()  # read again: from the same start
    assert 0.05 <= first < second < 5.0
    assert second - first >= 0.02
    with pytest.raises(RuntimeError, match="nowhere"):
        Span("nowhere")


def test_lag_one_returns_the_step_before_the_one_that_ended():
    clock = HostClock()
    _work(clock, n=2)
    assert clock.step() is None  # step 0 just ended: lag 1 reads it at the next boundary
    _work(clock, "comm")
    first = clock.step()
    assert isinstance(first, StepTimes) and first.step == 0
    assert first.regions == 2 and first.gemm_s > 0 and first.comm_s == 0.0
    assert first.wall_s >= first.gemm_s
    second = clock.step()
    assert second.step == 1 and second.gemm_s == 0.0 and second.comm_s > 0
    assert second.compute_s == pytest.approx(second.wall_s - second.comm_s)
    assert clock.host_syncs == 0


def test_lag_zero_reads_the_step_at_its_own_end():
    clock = HostClock(lag=0)
    _work(clock)
    times = clock.step()
    assert times.step == 0 and times.gemm_s > 0
    assert clock.step().step == 1


def test_nested_regions_of_one_kind_count_once():
    clock = HostClock(lag=0)
    with clock.region("gemm"):
        with clock.region("gemm"):
            with clock.region("gemm"):
                sum(range(1000))
        with clock.region("comm"):  # another kind nested inside: counted in its own sum
            sum(range(1000))
    times = clock.step()
    assert times.regions == 2
    assert times.comm_s < times.gemm_s <= times.wall_s


def test_the_optimizer_update_is_timed_apart_inside_the_step_s_compute():
    clock = HostClock(lag=0)
    _work(clock)
    with clock.region("update"):
        sum(range(20000))
    times = clock.step()
    assert 0 < times.update_s < times.compute_s and times.update_s + times.gemm_s <= times.wall_s
    assert clock.step().update_s == 0.0


def test_live_reads_the_open_step_as_the_steps_resolve_it():
    clock = HostClock(lag=0)
    _work(clock, n=3)
    live = clock.live("gemm")
    assert live > 0 and clock.live("comm") == 0.0
    assert clock.step().gemm_s == live


def test_an_incomplete_step_stays_pending_until_its_markers_complete():
    clock = HostClock()
    clock.hold()  # markers recorded from now on are not complete (an event still queued on the device)
    _work(clock)
    assert clock.step() is None
    assert clock.step() is None  # step 0 is due but not complete: pending, no wait without wait=True
    assert clock.pending == 2 and clock.host_syncs == 0
    _work(clock)
    assert clock.live("gemm") is None  # the open step is held too
    clock.release()
    times = clock.step()  # step 1 due: step 0 resolves late on the way
    assert times.step == 1 and clock.pending == 1
    assert [t.step for t in clock.late] == [0] and clock.late[0].gemm_s > 0


def test_wait_does_one_wait_at_most():
    clock = HostClock()
    clock.hold()
    _work(clock, n=3)
    clock.step()
    times = clock.step(wait=True)
    assert times.step == 0 and times.gemm_s > 0
    assert clock.host_syncs == 1
    clock.release()
    assert clock.step(wait=True).step == 1 and clock.host_syncs == 1  # complete: no wait


def test_markers_return_to_the_pool():
    clock = HostClock(pool_size=64)
    for _ in range(20):
        _work(clock, n=5)
        clock.step()
    made = clock.markers_made
    assert made <= 2 * (2 * 5 + 1) + 2  # two steps in flight at lag 1, never one set per step
    for _ in range(20):
        _work(clock, n=5)
        clock.step()
    assert clock.markers_made == made


def test_a_dry_pool_drops_the_rest_of_the_step_and_says_so():
    clock = HostClock(pool_size=8, lag=0)
    _work(clock, n=10)
    times = clock.step()
    assert times.dropped > 0 and times.regions + times.dropped == 10
    _work(clock, n=2)  # the markers are back: the next step is whole
    times = clock.step()
    assert times.dropped == 0 and times.regions == 2


def test_time_that_is_no_steps_work_is_left_out_of_the_step():
    """An "off" region (an evaluation between steps) leaves the step's wall time, and no region inside it is
    recorded: the step reads as the work around it alone."""
    clock = HostClock(lag=0)
    _work(clock)
    with clock.region("off"):
        _work(clock, n=3)
        _work(clock, "comm", n=2)
        sum(range(200_000))
    whole = clock.live("off")
    times = clock.step()
    assert whole > 0 and times.regions == 2 and times.comm_s == 0.0  # the gemm before it and the "off" itself
    assert times.wall_s < whole and times.gemm_s > 0
    _work(clock, n=2)  # the next step counts its regions again
    assert clock.step().regions == 2


def test_reset_drops_pending_steps_and_restarts_the_open_one():
    clock = HostClock()
    _work(clock)
    clock.step()
    _work(clock, n=4)
    clock.reset()  # a re-plan between steps: neither the pending step nor the open one so far counts
    assert clock.pending == 0
    assert clock.step() is None  # the open step restarted; nothing due yet
    times = clock.step()
    assert times.step == 1 and times.regions == 0


def test_spans_count_only_when_closed():
    clock = HostClock(lag=0)
    clock.open_span()
    sum(range(1000))
    clock.close_span()
    clock.open_span()
    clock.drop_span()  # a collective inside the span: not counted
    clock.close_span()  # nothing open: nothing counted
    times = clock.step()
    assert times.gap_s > 0 and times.regions == 1


def test_a_region_open_at_the_boundary_is_dropped():
    clock = HostClock(lag=0)
    clock.start("gemm")
    times = clock.step()
    assert times.regions == 0
    with pytest.raises(RuntimeError, match="without a start"):
        clock.stop("gemm")


def test_meter_busy_time_is_the_clocks_gemm_time():
    meter = BusyMeter()
    a = torch.randn(64, 64)
    for _ in range(3):
        meter.timed(lambda: a @ a, flops=10.0, full_flops=20.0)
    with meter.comm():
        sum(range(100))
    live = meter.snapshot()
    assert live.gemm_count == 3 and live.work_fraction == 0.5 and live.busy_s == meter.busy_s > 0
    stats, times = meter.end_step()
    assert stats.busy_s == times.gemm_s == live.busy_s and stats.gemm_count == 3
    assert times.comm_s > 0 and meter.snapshot().gemm_count == 0


def test_meter_at_lag_one_pairs_the_counts_with_their_step():
    meter = BusyMeter(clock=HostClock(lag=1))
    meter.timed(lambda: None, flops=1.0, full_flops=1.0)
    assert meter.end_step() is None
    meter.timed(lambda: None, flops=1.0, full_flops=2.0)
    meter.timed(lambda: None, flops=1.0, full_flops=2.0)
    stats, times = meter.end_step()
    assert times.step == 0 and stats.gemm_count == 1 and stats.work_fraction == 1.0
    stats, times = meter.end_step()
    assert times.step == 1 and stats.gemm_count == 2 and stats.work_fraction == 0.5
    assert math.isfinite(stats.busy_s)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_events_carry_the_same_bookkeeping():
    from semimig.straggler.clock import CudaEventClock

    clock = make_clock("cuda")
    assert isinstance(clock, CudaEventClock) and clock.backend == "cuda-events"
    a = torch.randn(2048, 2048, device="cuda")
    results = []
    for _ in range(4):
        with clock.region("gemm"):
            a @ a
        with clock.region("comm"):
            a + 1
        results.append(clock.step(wait=True))
    assert results[0] is None and [r.step for r in results[1:]] == [0, 1, 2]
    assert all(r.gemm_s > 0 and r.comm_s > 0 and r.wall_s >= r.gemm_s for r in results[1:])
    assert clock.host_syncs <= 3  # at most one wait per step
    assert clock.markers_made <= 2 * 5 + 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_span_on_cuda_reads_the_device_not_the_host_issuing():
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    issued = time.perf_counter()
    span = Span("cuda")
    for _ in range(20):
        a = a @ a / 4096.0
    issued = time.perf_counter() - issued  # the host only queued the products
    seconds = span.seconds()
    assert seconds > issued and torch.isfinite(a).all()
