"""Resizing under an uneven shard plan (semimig/controller/shedding.py, "Under an uneven plan"): each rank
is compared with its own baseline, and a straggler aims at the others' real times, never below its
baseline.  A synthetic clock as tests/unit/test_shed_whole_device.py drives it, through the runtime's own
scaling (the timing models read ``busy / s_r``, ``s_r = B_r / min B``):

    busy_r = χ_r · p_r · (F + V·w) · (1 + ε)       p_r: the rank's share of the paired work under the plan
    step   = max_r busy_r

The plan gives rank 0 four fifths of the work, made for rank 1 at a quarter of rank 0's speed.
"""
import random

import pytest

from semimig.controller.config import ControllerConfig
from semimig.controller.shedding import ShedPolicy
from semimig.controller.timing import RankTiming

F, V = 0.1, 1.0
SHARES = (0.8, 0.2)


def run(chis, baseline_chis, iterations=60, *, noise=0.02, seed=0, mode="zero"):
    """``chis``: per rank, a number or ``chi(iteration)``; the baseline is each rank's busy time at
    ``baseline_chis`` (what the plan was measured at).  Returns every decision's shed shares and steps."""
    cfg = ControllerConfig(mode=mode)
    baseline = [chi * p * (F + V) for chi, p in zip(baseline_chis, SHARES)]
    policy = ShedPolicy(2, cfg, baseline=baseline)
    timings = [RankTiming(cfg.window, react_steps=cfg.react_steps, change_ratio=cfg.change_ratio,
                          change_sigmas=cfg.change_sigmas) for _ in range(2)]
    rng = random.Random(seed)
    shed, sheds, steps = [0.0, 0.0], [], []
    for it in range(iterations):
        busy = []
        for r in range(2):
            chi = chis[r](it) if callable(chis[r]) else chis[r]
            w = 1.0 - shed[r]
            busy.append(chi * SHARES[r] * (F + V * w) * max(0.05, 1.0 + rng.gauss(0.0, noise)))
            timings[r].observe(w, busy[r] / policy.scale[r])
        steps.append(max(busy))
        shed = list(policy.decide(it, [t.estimate() for t in timings]).shed)
        sheds.append(tuple(shed))
    return sheds, steps


def balanced(p=SHARES[0]):
    return p * (F + V)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_rank_faster_than_its_baseline_prunes_nobody(seed):
    """The throttle the plan was made for lifts: rank 0 now holds the step, as the plan makes it; no
    rank slowed, so nobody sheds (the plan no longer fits: re-sharding's to answer, exactly)."""
    sheds, _ = run([1.0, lambda it: 4.0 if it < 20 else 1.0], [1.0, 4.0], seed=seed)
    assert max(s[0] for s in sheds) == 0.0 and max(s[1] for s in sheds) == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_rank_slower_than_its_baseline_sheds_back_to_it(seed):
    """Rank 1 slows from 4x to 8x: it sheds what the slowdown added, and the step returns to the
    plan's balanced step; rank 0 keeps every column."""
    sheds, steps = run([1.0, lambda it: 4.0 if it < 20 else 8.0], [1.0, 4.0], seed=seed)
    assert max(s[0] for s in sheds) == 0.0
    assert sheds[-1][1] > 0.3
    assert sum(steps[-10:]) / 10 == pytest.approx(balanced(), rel=0.15)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_others_real_time_bounds_the_shed(seed):
    """A baseline measured while rank 1 ran at full speed (the plan made stale by it): rank 1 then slows
    4x, to the real time rank 0 already takes; shedding could not shorten the step, so it stays small."""
    sheds, _ = run([1.0, lambda it: 1.0 if it < 20 else 4.0], [1.0, 1.0], seed=seed)
    assert max(s[0] for s in sheds) == 0.0
    assert max(s[1] for s in sheds) <= 0.1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_plans_big_holder_slowing_sheds_to_its_baseline(seed):
    """Rank 0 (four fifths of the work) slows 2x: it sheds until it is back at the balanced step."""
    sheds, steps = run([lambda it: 1.0 if it < 20 else 2.0, 4.0], [1.0, 4.0], seed=seed)
    assert max(s[1] for s in sheds) == 0.0
    assert sheds[-1][0] > 0.3
    assert sum(steps[-10:]) / 10 == pytest.approx(balanced(), rel=0.15)


def test_a_baseline_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="baseline must hold 2"):
        ShedPolicy(2, ControllerConfig(mode="zero"), baseline=[1.0])
