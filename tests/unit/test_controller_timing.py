"""The controller on a synthetic clock (pure core, no processes, no sleeping): DESIGN §3a.

A simulated rank ``i`` at shed share ``γ`` (kept work ``w = 1 − γ``) takes

    T_i = χ_i · ( F + V·w + G·[γ > 0] ) · (1 + ε),    ε ~ N(0, noise)

``F`` a fixed cost of every iteration, ``V`` the work that scales with the kept columns, ``G`` the
pruned path's own fixed cost (gathers): the model the controller has to get right without knowing
it.  The tests drive :class:`RankTiming` + :class:`ShedPolicy` exactly as the runtime does.
"""
import math
import random

import pytest

from semimig.controller.config import ControllerConfig
from semimig.controller.shedding import ShedPolicy
from semimig.controller.timing import MIN_SPREAD, RankTiming, fit_fixed_fraction


def simulate(chis, iterations, *, fixed=0.2, variable=1.0, gather=0.0, noise=0.03, seed=0, mode="semi",
             config=None, chi_at=None, migrate=False):
    """Run the controller on the synthetic clock; returns per-iteration shed shares and decisions.

    ``migrate``: shed columns go to the other ranks (equal shares) instead of being pruned, so a
    receiver's work fraction is ``1 + sum of the migrated shares / (e - 1)``."""
    cfg = config or ControllerConfig(mode=mode)
    size = len(chis)
    timings = [RankTiming(cfg.window) for _ in range(size)]
    policy = ShedPolicy(size, cfg)
    rng = random.Random(seed)
    shed = [0.0] * size
    trajectory, decisions = [], []
    for it in range(iterations):
        current = chi_at(it) if chi_at else chis
        received = sum(shed) / (size - 1) if migrate else 0.0
        for r in range(size):
            w = 1.0 - shed[r] + (received - (shed[r] / (size - 1) if migrate else 0.0))
            busy = current[r] * (fixed + variable * w + (gather if shed[r] > 0 and not migrate else 0.0))
            timings[r].observe(w, busy * max(0.05, 1.0 + rng.gauss(0.0, noise)))
        decision = policy.decide(it, [t.estimate() for t in timings])
        shed = list(decision.shed)
        trajectory.append(tuple(shed))
        decisions.append(decision)
    return trajectory, decisions


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("noise", [0.0, 0.05, 0.15])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_straggler_means_no_rank_ever_sheds(size, noise, seed):
    """Equal ranks with up to 15 % noise per iteration: γ = 0 on every rank for the whole run."""
    trajectory, decisions = simulate([1.0] * size, 400, noise=noise, seed=seed)
    assert all(share == 0.0 for step in trajectory for share in step)
    assert all(d.flagged == () for d in decisions)


def test_a_single_slow_iteration_never_flags_a_rank():
    """A rank descheduled for one iteration in ten (3x slower then) is not a straggler."""
    trajectory, _ = simulate([1.0, 1.0], 300, noise=0.02,
                             chi_at=lambda it: (1.0, 3.0 if it % 10 == 0 else 1.0))
    assert all(share == 0.0 for step in trajectory for share in step)


@pytest.mark.parametrize("chi", [2.0, 4.0, 8.0])
@pytest.mark.parametrize("fixed_cost", [0.0, 0.2])
def test_a_straggler_settles_where_its_time_matches_the_others(chi, fixed_cost):
    """γ settles (small spread over the last 50 iterations) at the value that balances the ranks:
    χ(F + V(1−γ)) = F + V, i.e. γ* = 1 − (F+V)/(χV) + F/V ... solved exactly below; not at γ_max."""
    f, v = fixed_cost, 1.0
    trajectory, _ = simulate([1.0, chi], 300, fixed=f, variable=v, noise=0.03)
    tail = [step[1] for step in trajectory[-50:]]
    balanced = 1.0 - ((f + v) / chi - f) / v  # kept work w with chi (f + v w) = f + v
    expected = min(balanced, 0.9)
    assert max(tail) - min(tail) <= 0.1
    assert sum(tail) / len(tail) == pytest.approx(expected, abs=0.07)
    assert all(step[0] == 0.0 for step in trajectory)  # the fast rank never prunes


def test_the_fixed_cost_of_pruning_does_not_inflate_the_ratio():
    """With a gather cost on the pruned path, γ still settles at the balancing value (not γ_max):
    dividing busy time by the kept fraction would push it to γ_max."""
    f, v, g, chi = 0.05, 1.0, 0.1, 4.0
    trajectory, decisions = simulate([1.0, chi], 300, fixed=f, variable=v, gather=g, noise=0.02)
    tail = [step[1] for step in trajectory[-50:]]
    w = ((f + v) / chi - f - g) / v  # chi (f + g + v w) = f + v
    assert sum(tail) / len(tail) == pytest.approx(1.0 - w, abs=0.07)
    assert max(tail) < 0.9
    est = decisions[-1]
    assert est.backed_off == ()


def test_pruning_that_costs_more_than_it_saves_is_backed_off():
    """A pruned path whose fixed cost outweighs the saved columns (small layers): the straggler
    tries, the fit shows it does not pay, it backs off to dense and retries only after the back-off."""
    cfg = ControllerConfig(mode="semi", backoff_iterations=60)
    trajectory, decisions = simulate([1.0, 1.5], 200, fixed=0.1, variable=1.0, gather=1.2, noise=0.02, config=cfg)
    pruned = [i for i, step in enumerate(trajectory) if step[1] > 0]
    assert pruned, "the straggler must try pruning"
    first_backoff = next(i for i, d in enumerate(decisions) if 1 in d.backed_off)
    assert first_backoff - pruned[0] <= 5  # noticed within a few iterations
    assert all(trajectory[i][1] == 0.0 for i in range(first_backoff, first_backoff + 60))
    share_pruned = len(pruned) / len(trajectory)
    assert share_pruned < 0.1  # a few probing iterations, not a slow run
    assert any("does not pay" in e for d in decisions for e in d.events)


@pytest.mark.parametrize("noise", [0.15, 0.2])
@pytest.mark.parametrize("seed", range(16))
def test_a_straggler_that_pays_off_is_never_backed_off_by_noise(noise, seed):
    """A χ = 4 straggler whose pruned path keeps ~20 % of its time (F = 0.2, G = 0.05: real
    compute's f) prunes steadily at γ_max with 15-20 % noise per iteration: ``f`` is fitted
    against the dense observations and kept, never refitted from two nearby pruned clusters, so
    no phantom "does not pay" sends it back to dense (it did, on the quick benchmark)."""
    trajectory, decisions = simulate([1.0, 4.0], 200, fixed=0.2, variable=1.0, gather=0.05, noise=noise, seed=seed)
    assert all(d.backed_off == () for d in decisions)
    fitted = [d.fixed_fraction[1] for d in decisions[20:]]
    assert max(fitted) < 0.4
    assert all(step[1] > 0.5 for step in trajectory[30:])


def test_one_straggler_and_three_fast_ranks_fast_ranks_stay_dense():
    """The fast ranks are at γ = 0 in every iteration (mode zero, mean reference)."""
    trajectory, decisions = simulate([1.0, 1.0, 8.0, 1.0], 300, noise=0.05, mode="zero")
    assert all(step[r] == 0.0 for step in trajectory for r in (0, 1, 3))
    assert decisions[-1].flagged == (2,)
    tail = [step[2] for step in trajectory[-50:]]
    assert sum(tail) / len(tail) > 0.8  # at chi = 8 with F = 0.2: gamma* = 1 - (1.2/8 - 0.2) -> gamma_max


def test_a_straggler_that_recovers_returns_to_dense():
    trajectory, decisions = simulate([1.0, 1.0], 300, noise=0.03,
                                     chi_at=lambda it: (1.0, 4.0 if it < 150 else 1.0))
    assert trajectory[140][1] > 0.5
    assert all(step[1] == 0.0 for step in trajectory[180:])
    assert decisions[-1].flagged == ()


def test_every_rank_decides_the_same_from_the_same_observations():
    """Determinism: two policies fed the same observations agree exactly (floats included)."""
    a, _ = simulate([1.0, 3.0, 1.0], 120, noise=0.1, seed=7)
    b, _ = simulate([1.0, 3.0, 1.0], 120, noise=0.1, seed=7)
    assert a == b


def test_fixed_fraction_fit():
    points = [(1.0, 1.0), (0.5, 0.6), (0.25, 0.4)]  # T = 0.2 + 0.8 w
    assert fit_fixed_fraction(points) == pytest.approx(0.2)
    assert fit_fixed_fraction([(1.0, 1.0), (1.0 - MIN_SPREAD / 2, 0.99)]) is None  # no spread
    assert fit_fixed_fraction([(1.0, 1.0), (0.5, 1.5)]) == 1.0  # pruning made it slower
    # time falling faster than the work (a throttle's dense steps, then pruned steps after its lift):
    # no fixed fraction does that, so no fit; a slightly negative intercept is noise about f = 0
    assert fit_fixed_fraction([(1.0, 4.0), (1.0, 4.1), (0.5, 0.6), (0.5, 0.62)]) is None
    assert fit_fixed_fraction([(1.0, 1.0), (0.5, 0.48)]) == 0.0
    timing = RankTiming(5)
    for w, t in points:
        timing.observe(w, t)
    est = timing.estimate()
    assert est.informed and est.fixed_fraction == pytest.approx(0.2)
    assert est.unpruned_s == pytest.approx(1.0)
    assert est.time_at(0.5) == pytest.approx(0.6)
    assert est.work_for(0.6) == pytest.approx(0.5)
    assert timing.observe(0.5, math.nan) is False and timing.estimate() == est  # skipped, nothing changed


@pytest.mark.parametrize("work, busy", [(0.5, math.nan), (0.5, math.inf), (math.nan, 1.0), (math.inf, 1.0),
                                        (0.0, 0.3), (-0.1, 0.3), (0.5, 0.0), (0.5, -1.0), (0.5, None)])
def test_what_is_not_an_observation_leaves_the_model_as_it_was(work, busy):
    """A NaN/inf time (a run whose loss went NaN) and a full prune's w = 0 (force(prune={r: 1.0})) must
    not raise out of optimizer.step(): they are skipped, and the estimate stays what it was."""
    from semimig.controller.timing import observation_problem

    timing = RankTiming(5)
    for w, t in [(1.0, 1.0), (0.5, 0.6), (0.25, 0.4)]:
        assert timing.observe(w, t) is True
    before = timing.estimate()
    assert observation_problem(work, busy) is not None
    assert timing.observe(work, busy) is False
    assert timing.estimate() == before


def test_the_balancer_does_not_shed_on_non_finite_timings():
    """Equal ranks whose busy times turn NaN/inf (a NaN loss) after 30 iterations: no rank ever sheds,
    and the estimates are frozen at the last finite ones (nothing is decided from the NaNs)."""
    cfg = ControllerConfig(mode="zero")
    timings, policy = [RankTiming(cfg.window) for _ in range(2)], ShedPolicy(2, cfg)
    rng = random.Random(0)
    frozen = None
    for it in range(120):
        for r in range(2):
            busy = 1.0 + rng.gauss(0.0, 0.03)
            if it >= 30 and r == 1:
                busy = (math.nan, math.inf)[it % 2]
            timings[r].observe(1.0, busy)
        if it == 29:
            frozen = timings[1].estimate()
        decision = policy.decide(it, [t.estimate() for t in timings])
        assert decision.shed == (0.0, 0.0) and decision.flagged == ()
    assert timings[1].estimate() == frozen


def test_a_clear_straggler_is_flagged_even_on_a_noisy_machine():
    """χ = 4 with 25 % noise per iteration (a loaded 2-core machine): flagged within 20 iterations."""
    trajectory, decisions = simulate([1.0, 4.0], 60, fixed=0.0, noise=0.25, seed=3)
    first = next(i for i, d in enumerate(decisions) if d.flagged == (1,))
    assert first < 20
    assert all(step[0] == 0.0 for step in trajectory)


@pytest.mark.parametrize("size", [2, 4])
def test_a_migrating_straggler_stops_where_its_receivers_become_the_bottleneck(size):
    """Migration loads the receivers: the straggler settles where its time equals theirs,
    χ(1 − m) = 1 + m/(e − 1), not at Eq. 1's 1 − 1/χ (the receivers would then be the slowest)."""
    chi = 4.0
    chis = [1.0] * (size - 1) + [chi]
    trajectory, _ = simulate(chis, 300, fixed=0.0, noise=0.02, migrate=True, mode="mig")
    tail = [step[-1] for step in trajectory[-80:]]
    expected = (chi - 1.0) / (chi + 1.0 / (size - 1))
    assert sum(tail) / len(tail) == pytest.approx(expected, abs=0.06)
    assert max(tail) - min(tail) <= 0.15
    assert all(step[r] == 0.0 for step in trajectory for r in range(size - 1))


def test_semi_retries_resizing_only_when_shedding_with_migration_does_not_pay():
    """The runtime's rule (``BalanceController._retry_resizing_only``) on the synthetic clock, with
    the real ShedPolicy and RankTiming: migrating adds a large fixed cost to the straggler (its
    operand hand-out), resizing only a small gather.  The first back-off, taken while migrating,
    is forgiven and the rank resizes only from then on; resizing pays, so it keeps shedding and
    never backs off again.  A rank already resizing only backs off as usual."""
    from types import SimpleNamespace

    from semimig.controller.runtime import BalanceController, GroupActions

    cfg = ControllerConfig(mode="semi")
    chis = [1.0, 4.0]
    state = SimpleNamespace(policy=ShedPolicy(2, cfg), timings=[RankTiming(cfg.window) for _ in chis],
                            resize_only=set(), iteration=0)
    previous, shed, history = GroupActions(prune=(0.0, 0.0)), [0.0, 0.0], []
    for it in range(300):
        state.iteration = it
        migrating = shed[1] > 0.0 and 1 not in state.resize_only
        for r, chi in enumerate(chis):
            w = 1.0 - shed[r]
            extra = (0.1 if shed[r] > 0 else 0.0) + (3.0 if migrating and r == 1 else 0.0)
            state.timings[r].observe(w, chi * (0.2 + w + extra))
        decision = BalanceController._retry_resizing_only(state, state.policy.decide(it, [t.estimate() for t in state.timings]),
                                                          previous)
        shed = list(decision.shed)
        migrate = {1: shed[1] / 2} if shed[1] > 0 and 1 not in state.resize_only else {}
        previous = GroupActions(prune=(0.0, shed[1] - migrate.get(1, 0.0)), migrate=migrate)
        history.append((shed[1], decision.backed_off, 1 in state.resize_only))
    assert state.resize_only == {1}
    switched = next(i for i, h in enumerate(history) if h[2])
    assert 5 <= switched < 40  # after patience decisions of a migration that does not pay
    assert not any(1 in h[1] for h in history[switched:])  # forgiven, then resizing pays: never backs off
    assert all(h[0] >= 0.85 for h in history[switched + 20:])  # resizing only, balancing the straggler

    # a rank that already resizes only is not retried: its back-off stands
    state.policy.states[1].backoff_until, state.policy.states[1].backoffs = 10_000, 1
    held = state.policy.decide(301, [t.estimate() for t in state.timings])
    assert BalanceController._retry_resizing_only(state, held, previous).backed_off == (1,)


def _decisions(rows, config=None):
    """Feed dense observations ``rows`` (one tuple of busy times per iteration) to the regime
    models and the policy as the runtime does; the flags of every decision."""
    cfg = config or ControllerConfig(mode="zero")
    timings = [RankTiming(cfg.window, react_steps=cfg.react_steps, change_ratio=cfg.change_ratio,
                          change_sigmas=cfg.change_sigmas) for _ in rows[0]]
    policy = ShedPolicy(len(rows[0]), cfg)
    flags = []
    for it, row in enumerate(rows):
        for timing, busy in zip(timings, row):
            timing.observe(1.0, busy)
        flags.append(policy.decide(it, [t.estimate() for t in timings]).flagged)
    return flags


def test_a_warm_up_that_delayed_some_first_steps_is_no_straggler():
    """A loaded machine's warm-up: rank 1's first three steps 4x delayed, its fourth at rank 0's pace.
    A device slow from the start is slow at every step; the opening does not flag this one."""
    rows = [(1.06, 4.1), (0.98, 4.39), (0.95, 4.73), (0.92, 0.88)] + [(0.9, 0.9)] * 10
    assert all(f == () for f in _decisions(rows))
