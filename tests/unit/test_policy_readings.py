"""The policy's per-step readings kept in order as values come and go equal the same readings taken afresh.

The noise estimate keeps its pairs in order, the window's change test reads the medians of a rank's earlier
steps from one sorted list, units are handed out soonest first with the ones below the continuous level in
one pass, and the simulator reads a plan's collectives without numpy: each is checked here
against the plain computation it replaces, value for value, on random inputs with ties and changes of speed.
"""
from __future__ import annotations

import heapq
import math
import random
import statistics

import numpy as np
import pytest

from semimig.controller.policy.gain import NOISE_PAIRS, NOISE_PRIOR_PAIRS, Noise
from semimig.controller.policy.propose import plan_step
from semimig.controller.policy.records import ReshardSample
from semimig.controller.policy.states import N_MIN
from semimig.controller.policy.stepmodel import ordered_median
from semimig.controller.policy.window import SLOW_STEPS, Window
from semimig.controller.sim import Workload
from semimig.errors import ConfigError
from semimig.sharding.jobmodel import seat_scale
from semimig.sharding.plan import ShardPlan
from semimig.sharding.solver import StepModel, soonest_first


def _change_afresh(times, fresh, sigma, z):
    """The change test with every median read afresh (:meth:`Window._change`'s definition)."""
    slower = False
    for m in range(1, min(N_MIN, fresh - N_MIN) + 1):
        base = statistics.median(times[:-m])
        devs = [math.log(t / base) for t in times[-m:]]
        band = z * sigma / math.sqrt(m)
        if all(d < -band for d in devs):
            return m, False
        if m >= SLOW_STEPS and all(d > band for d in devs):
            return m, all(d > z * sigma for d in devs)
        slower = slower or (m == 1 and devs[0] > band)
    return 0, slower


@pytest.mark.parametrize("seed", range(6))
def test_the_ordered_median_is_the_median(seed):
    rng = random.Random(seed)
    for n in range(1, 30):
        values = sorted(rng.choice([0.5, 1.0, 1.5]) + rng.random() * (n % 3) for _ in range(n))
        assert ordered_median(values) == statistics.median(values)


@pytest.mark.parametrize("seed", range(4))
def test_the_noise_kept_in_order_reads_the_median_of_its_pairs(seed):
    rng = np.random.default_rng(seed)
    noise = Noise()
    before = [1.0, 2.0, 0.5]
    for i in range(NOISE_PAIRS + 150):  # past the deque's length: old pairs leave the order too
        after = [b * float(np.exp(0.1 * rng.standard_normal())) if i % 7 else b for b in before]  # ties: log 1 = 0
        noise.add(before, after)
        before = after
        expected = statistics.median(noise.diffs) if len(noise.diffs) >= 4 else None
        if expected is not None:
            floor = noise.prior * NOISE_PRIOR_PAIRS / (NOISE_PRIOR_PAIRS + len(noise.diffs))
            assert noise.sigma == max(1.4826 * expected / math.sqrt(2.0), floor)
    assert sorted(noise.diffs) == noise._ordered


@pytest.mark.parametrize("seed", range(8))
def test_the_change_test_equals_its_medians_read_afresh(seed):
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(200):
        fresh = int(rng.integers(1, 49))
        level = np.where(np.arange(fresh) >= fresh - int(rng.integers(0, 5)), rng.choice([0.5, 1.0, 2.0]), 1.0)
        times = [float(t) for t in level * np.exp(0.05 * rng.standard_normal(fresh))]
        sigma = float(rng.choice([0.01, 0.05, 0.2]))
        got = Window._change(times, fresh, sigma, 3.0)[:2]
        assert got == _change_afresh(times, fresh, sigma, 3.0)
        hits += got[0] > 0
    assert hits > 0  # some of the drawn sequences hold a change


@pytest.mark.parametrize("idle_skips", [False, True])
def test_the_simulators_collectives_for_one_plan_equal_its_batch_reading(idle_skips):
    rng = np.random.default_rng(1)
    workload = Workload(tp=4, replicated_share=0.2, mlp_units=8, kv_units=4, idle_skips=idle_skips)
    for _ in range(100):
        mlp = ShardPlan(units=tuple(int(n) for n in rng.multinomial(8, [0.25] * 4)))
        kv = ShardPlan(units=tuple(int(n) for n in rng.multinomial(4, [0.25] * 4)))
        speeds = tuple(float(v) for v in rng.uniform(0.1, 1.0, 4))
        batch = workload.seat_comms([(mlp, kv)], np.array(speeds)[None, :])[0, 0]
        assert workload.seat_comm((mlp, kv), speeds) == batch


def test_plain_values_pass_the_constructors_and_bad_ones_are_still_refused():
    assert StepModel(speeds=(1.0, 0.5), replicated=0.2, shardable=1.6).speeds == (1.0, 0.5)
    assert StepModel(speeds=[1, np.float64(0.5)], replicated=0, shardable=2).speeds == (1.0, 0.5)
    for speeds in [(1.0, math.nan), (1.0, 0.0), (1.0, math.inf), (1.0, True)]:
        with pytest.raises(ConfigError, match="speeds"):
            StepModel(speeds=speeds, replicated=0.2, shardable=1.0)
    with pytest.raises(ConfigError, match="replicated"):
        StepModel(speeds=(1.0,), replicated=math.inf, shardable=1.0)
    assert ShardPlan(units=(np.int64(2), 1)).units == (2, 1)
    assert type(ShardPlan(units=(np.int64(2), 1)).units[0]) is int
    for units in [(True, 1), (-1, 2), (0, 0), (1.0, 1)]:
        with pytest.raises(ConfigError, match="units"):
            ShardPlan(units=units)
    sample = ReshardSample((1.0, np.float64(2.0)), (0.5, 1), (0.1, 0.2))
    assert sample.compute_s == (1.0, 2.0) and type(sample.compute_s[1]) is float and type(sample.shardable_s[1]) is float
    for bad in [(1.0, -0.1), (1.0, math.nan), (1.0, math.inf)]:
        with pytest.raises(ConfigError, match="compute_s"):
            ReshardSample(bad, (0.5, 0.5), (0.1, 0.1))


@pytest.mark.parametrize("seed", range(40))
def test_soonest_first_hands_out_the_units_of_the_one_at_a_time_order(seed):
    rng = random.Random(seed)
    tp = rng.choice([2, 3, 4, 8])
    model = StepModel(speeds=tuple(rng.choice([1.0, rng.uniform(0.05, 1.0)]) for _ in range(tp)),
                      replicated=rng.choice([0.0, rng.uniform(0.0, 0.5)]), shardable=rng.uniform(0.5, 8.0))
    base = [rng.choice([0.0, rng.uniform(0.0, 0.3)]) for _ in range(tp)]
    ranks = sorted(rng.sample(range(tp), rng.randint(1, tp)))
    count, unit = rng.choice([1, 4, 8, 32, 64]), rng.uniform(0.005, 0.2)
    units = [0] * tp
    heap = [(model.rank_time(r, base[r] + unit), r) for r in ranks]
    heapq.heapify(heap)
    for _ in range(count):
        _, r = heapq.heappop(heap)
        units[r] += 1
        heapq.heappush(heap, (model.rank_time(r, base[r] + (units[r] + 1) * unit), r))
    assert soonest_first(model, base, unit, ranks, count) == units


@pytest.mark.parametrize("idle_free", [False, True])
def test_a_proposals_shared_terms_price_every_candidate_as_alone(idle_free):
    rng = random.Random(3)
    memo_steps, memo_seats = {}, {}
    model = StepModel(speeds=(1.0, 0.3, 1.0, 0.9), replicated=0.2, shardable=3.2, idle_free=idle_free)
    weights = (0.7, 0.3)
    for _ in range(200):
        plans = tuple(ShardPlan(units=tuple(int(n) for n in np.random.default_rng(rng.randrange(10**6))
                                            .multinomial(total, [0.25] * 4))) for total in (8, 4))
        assert plan_step(model, weights, plans, memo_steps) == plan_step(model, weights, plans)
        assert seat_scale(model.speeds, plans, idle_free=idle_free, memo=memo_seats) == \
            seat_scale(model.speeds, plans, idle_free=idle_free)
    assert memo_seats and (memo_steps or idle_free)  # the terms were shared, where the ranks allow it
    assert hash(ShardPlan(units=(3, 1))) == hash(((3, 1), 1))


@pytest.mark.parametrize("seed", range(4))
def test_the_windows_readings_equal_its_fresh_steps_read_afresh(seed):
    rng = np.random.default_rng(seed)
    window, speeds = Window(48, 3), np.ones(3)
    for step in range(300):
        if step % 60 == 30:
            speeds[int(rng.integers(3))] = float(rng.choice([0.25, 0.5, 1.0]))
        compute = tuple(float(c) for c in np.exp(0.05 * rng.standard_normal(3)) / speeds)
        window.add(ReshardSample(compute, tuple(0.5 * c for c in compute), (0.01,) * 3), sigma=0.05)
        terciles = tuple(sorted(window.compute[r][-max(f, 1):])[(max(f, 1) - 1) // 3] for r, f in enumerate(window.fresh))
        assert window.times()[0] == terciles
        assert [list(c) for c in window.compute] == [[s.compute_s[r] for s in window] for r in range(3)]
        assert [list(c) for c in window.shardable] == [[s.shardable_s[r] for s in window] for r in range(3)]


@pytest.mark.parametrize("factor", [0.5, 1.05, 2.0])
def test_only_a_speed_up_is_read_as_one(factor):
    """A rank's last change names it sped up only when its steps got faster: a slowdown whose steps clear the
    band only together (each inside the one-step band) is a change too, and not a speed-up."""
    sigma, tp = 0.02, 2
    window = Window(48, tp)
    rng = np.random.default_rng(0)
    steps = [1.0] * 20 + [factor] * SLOW_STEPS
    for i, c in enumerate(steps):
        base = tuple(float(x) for x in np.exp(0.002 * rng.standard_normal(tp)))
        compute = (c * base[0], base[1])
        changed = window.add(ReshardSample(compute, compute, (0.01,) * tp), sigma=sigma)
        if factor < 1.0 and i == 20:  # one faster step is a change at once
            assert changed and window.sped_up() == (0,)
            return
    assert window.trigger[0] > 0  # the last steps made a change
    assert window.sped_up() == ()
    assert (0 in window.unconfirmed()) == (factor == 2.0)
