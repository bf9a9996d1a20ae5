"""A flagged rank aims its GEMM time so that its *whole* own work ends with the others'
(semimig/controller/shedding.py, "The rest of a rank's own work"), on a synthetic clock as
tests/unit/test_controller_timing.py drives the controller:

    busy_i = χ_i · (F + V·w) · (1 + ε)        the timed GEMMs (what the busy meter sees)
    O_i    = χ_dev,i · O · (1 + ε)            the rest of the rank's own work (norms, optimizer, ...)
    step   = max_i (busy_i + O_i)

A straggler slow only at its GEMMs (χ_dev = 1) sheds exactly as before; a whole slow device
(χ_dev = χ) sheds until its whole work matches, or γ_max when no share can do that.
"""
import math
import random

import pytest

from semimig.controller.config import ControllerConfig
from semimig.controller.shedding import ShedPolicy
from semimig.controller.timing import RankTiming

F, V, O = 0.1, 1.0, 0.3


def run(chis, device_chis, iterations=80, *, give_others=True, noise=0.02, seed=0, mode="zero", sudden=(),
        no_other=()):
    """``chis`` / ``device_chis``: per rank, a number or ``chi(iteration)``; ``sudden``: the iterations
    whose observation carries the step reflex's evidence (a sudden rise); ``no_other``: those that post
    no ``O``.  The timing models are the runtime's (regimes, and ``O`` restarting with them)."""
    cfg = ControllerConfig(mode=mode)
    size = len(chis)
    timings = [RankTiming(cfg.window, react_steps=cfg.react_steps, change_ratio=cfg.change_ratio,
                          change_sigmas=cfg.change_sigmas) for _ in range(size)]
    policy = ShedPolicy(size, cfg)
    rng = random.Random(seed)
    shed, steps, decisions = [0.0] * size, [], []

    def at(chi, it):
        return chi(it) if callable(chi) else chi

    for it in range(iterations):
        totals = []
        for r in range(size):
            w = 1.0 - shed[r]
            busy = at(chis[r], it) * (F + V * w) * max(0.05, 1.0 + rng.gauss(0.0, noise))
            other = at(device_chis[r], it) * O * max(0.05, 1.0 + rng.gauss(0.0, noise))
            timings[r].observe(w, busy, sudden=it in sudden, other_s=math.nan if it in no_other else other)
            totals.append(busy + other)
        steps.append(max(totals))
        others = [t.other_s for t in timings] if give_others else None
        decision = policy.decide(it, [t.estimate() for t in timings], others)
        shed = list(decision.shed)
        decisions.append(decision)
    return shed, steps, decisions


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_gemm_only_straggler_sheds_as_before(seed):
    """χ_dev = 1: O is the same on every rank, so the aim is T_ref itself: the same shares."""
    with_others, _, decisions = run([1.0, 3.0], [1.0, 1.0], seed=seed)
    without, _, _ = run([1.0, 3.0], [1.0, 1.0], seed=seed, give_others=False)
    assert with_others[1] > 0.5
    assert with_others[1] == pytest.approx(without[1], abs=0.06)
    assert len(decisions[-1].other_s) == 2 and all(math.isfinite(o) for o in decisions[-1].other_s)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_whole_slow_device_sheds_until_its_whole_work_ends_with_the_others(seed):
    """χ = 2.5 everywhere on rank 1: balancing its GEMMs alone leaves its step ~1.3x the fast
    rank's (the rest of its work is 2.5x too); aimed with O it ends within 10 % of it."""
    healthy = F + V + O
    shed, steps, _ = run([1.0, 2.5], [1.0, 2.5], seed=seed)
    gemm_only, gemm_steps, _ = run([1.0, 2.5], [1.0, 2.5], seed=seed, give_others=False)
    # the exact share: 2.5 (F + V w) + 2.5 O = F + V + O
    exact = 1.0 - ((healthy - 2.5 * O) / 2.5 - F) / V
    assert shed[1] == pytest.approx(exact, abs=0.06)
    assert shed[1] > gemm_only[1] + 0.1
    late = sorted(steps[-20:])[10] / healthy
    assert late <= 1.10, late
    assert sorted(gemm_steps[-20:])[10] / healthy >= 1.2


def test_a_device_too_slow_for_any_share_sheds_gamma_max():
    """χ = 4: even γ = 1 leaves its other work at 4 O > F + V + O, so it sheds γ_max."""
    shed, _, _ = run([1.0, 4.0], [1.0, 4.0])
    assert shed[1] == ControllerConfig().gamma_max


def test_other_work_restarts_with_the_regime_at_a_sudden_rise():
    """A whole device slowing 2.5x at iteration 40, the step reflex's evidence in that observation (a
    sudden rise: ``S`` restarts from it) and, as in the runtime, no ``O`` from that step (its GEMMs were
    not all timed).  ``O`` restarts with the regime, so the next decision aims with the slow device's
    ``O``; a median over the free phase's would still read the free ``O`` there (two of its three
    values), and shed less."""
    def chi(it):
        return 2.5 if it >= 40 else 1.0

    _, _, decisions = run([1.0, chi], [1.0, chi], iterations=50, sudden=(40,), no_other=(40,))
    assert decisions[40].flagged == (1,) and math.isnan(decisions[40].other_s[1])  # the aim at T_ref meanwhile
    assert decisions[41].other_s[1] == pytest.approx(2.5 * O, rel=0.1)
    assert decisions[39].other_s[1] == pytest.approx(O, rel=0.1)
    # the shares: with the slow O at 41 the aim sheds more than the GEMM-only aim of 40
    assert decisions[41].shed[1] >= decisions[40].shed[1]


def test_other_s_of_the_wrong_length_is_refused_by_name():
    policy = ShedPolicy(2, ControllerConfig())
    with pytest.raises(ValueError, match="expected 2 other_s, got 3"):
        policy.decide(0, [None, None], [0.1, 0.2, 0.3])


# --------------------------------------------------------------------------- real 2-rank group
def _other_body(rank, world, spec, iterations):
    """Train a column -> row pair under ``spec`` with extra non-GEMM work each step (a stand-in for the
    optimizer and norms); every rank's records of the decisions' ``other_s`` and shed shares."""
    import torch
    import torch.distributed as dist

    from tiny_models import zero_pri_pair

    width = 256
    model, ctl = zero_pri_pair(width, world, spec)
    x, state = torch.randn(256, width), torch.zeros(1 << 20)
    records = []
    try:
        for _ in range(iterations):
            ctl.set_epoch(0)
            model(x).pow(2).mean().backward()
            for _ in range(12):  # not a GEMM: the busy meter does not see it, the device clock does
                state.mul_(0.5).add_(1.0)
            report = ctl.step()
            decision = report.decision
            records.append((report.gamma_target, None if decision is None else tuple(decision.other_s)))
    finally:
        ctl.close()
    gathered = [None] * world
    dist.all_gather_object(gathered, records)
    return gathered


@pytest.mark.serial  # the emulated device's sleeps against the real rank's work: a loaded machine skews the ratio
def test_on_a_real_group_a_whole_device_reports_its_other_work_and_sheds_gamma_max():
    """``fixed:1:2.5:scope=device``: rank 1's non-GEMM work is slept 2.5x as well, its ``O`` reads about
    2.5 times rank 0's, the same on every rank, and with it the aim asks for more than shedding can
    give: ``γ_max`` (balancing its GEMM time alone held it at 0.8 in this setup), so every share it
    sheds is ``γ_max``, and it does shed; ``fixed:1:2.5`` (GEMMs only): the two ranks' ``O`` are
    alike.  What this checks is the aim, not how steadily the rank stays flagged: on a loaded machine
    the evidence rule may release the rank for a window and flag it again, so how many of the steps
    shed is not a property of the aim."""
    from dist_harness import run_on_ranks

    gamma_max = ControllerConfig().gamma_max
    for spec, device in (("fixed:1:2.5:scope=device", True), ("fixed:1:2.5", False)):
        records0, records1 = run_on_ranks(_other_body, 2, spec, 30, timeout_s=300)
        assert records0 == records1 or [r[1] for r in records0] == [r[1] for r in records1]  # one decision
        others = [o for _, o in records0[-10:] if o]
        assert others and all(len(o) == 2 and all(math.isfinite(v) and v > 0 for v in o) for o in others), others
        ratio = sorted(o[1] / o[0] for o in others)[len(others) // 2]
        if device:
            assert ratio > 1.8, others
            targets = [g for g, _ in records1]
            assert all(g == 0.0 or g == pytest.approx(gamma_max) for g in targets), targets
            assert any(g == pytest.approx(gamma_max) for g in targets), targets
        else:
            assert ratio < 1.5, others
