"""The re-shard policy (DESIGN §8 'When', §9), pure: its state table, its gain test, its step model's
learning, zero-unit plans, and runs through the policy simulator (semimig.controller.sim).

Synthetic series come from the step model itself, ``c_r = (R + S·p_r)/v_r`` with ``R = ρ``,
``S = e·(1 − ρ)`` (a healthy even step is 1 s) and ``b_r = timed·S·p_r/v_r``; when the policy moves, the
series moves (the next samples use the new shares).  Expected plans are the solver's for the true
speeds and the true ``R/S`` (:func:`semimig.sharding.solve_plan`), computed independently.
"""
import dataclasses
import math
import random

import numpy as np
import pytest

import semimig.controller.reshard as reshard
from semimig.controller.policy.gain import Noise, bet_pays, gain_test, move_pace, movers, return_risk
from semimig.controller.policy.states import N_MIN, TABLE, Slowdown, expected_life, took_over
from semimig.controller.policy.stepmodel import LearnedModel, tercile
from semimig.controller.policy.window import LASTED, Rates
from semimig.controller.reshard import ReshardConfig, ReshardPolicy, ReshardSample, moved_units
from semimig.controller.sim import Scenario, Workload, run_policy
from semimig.controller.sim.simulate import reshard_policy
from semimig.errors import ConfigError
from semimig.sharding import ShardPlan, StepModel, solve_plan

MLP_UNITS, KV_UNITS = 32, 4
BYTES = (1 << 20, 1 << 21)
WEIGHTS = (12.0, 3.0)
COMM = 0.05


def even_plans(tp=2):
    return ShardPlan.even(MLP_UNITS, tp), ShardPlan.even(max(KV_UNITS, tp), tp)


def policy(config=ReshardConfig(), tp=2, plans=None):
    return ReshardPolicy(plans or even_plans(tp), weights=WEIGHTS, bytes_per_unit=BYTES, config=config)


def sample(pol, speeds, *, rho=0.2, timed=1.0, noise=0.0, rng=None):
    """One step of the group at true ``speeds`` under the policy's plan in force."""
    e = pol.tp
    R, S = rho, e * (1.0 - rho)
    w = [x / sum(WEIGHTS) for x in WEIGHTS]
    shares = [sum(wd * p.shares()[r] for wd, p in zip(w, pol.plans)) for r in range(e)]
    jitter = [math.exp(noise * rng.gauss(0.0, 1.0)) if rng else 1.0 for _ in range(e)]
    compute = tuple((R + S * p) / v * j for p, v, j in zip(shares, speeds, jitter))
    shardable = tuple(timed * S * p / v * j for p, v, j in zip(shares, speeds, jitter))
    return ReshardSample(compute, shardable, (COMM,) * e)


def run(pol, speeds_at, steps, *, move_s=0.01, **kw):
    """Feed ``steps`` steps; carry out every move; the decisions that moved."""
    moves = []
    for step in range(steps):
        decision = pol.observe(sample(pol, speeds_at(step), **kw))
        if decision.replan:
            moves.append(decision)
            pol.moved_to(decision.plans, seconds=move_s, bytes_moved=pol.moved(decision.plans)[1])
    return moves


def solved(speeds, rho=0.2):
    model = StepModel.normalised(speeds, replicated_share=rho)
    return tuple(solve_plan(model, total_units=n) for n in (MLP_UNITS, KV_UNITS))


# ---------------------------------------------------------------- the state table
def test_every_transition_of_the_table_is_taken(monkeypatch):
    """Three short runs take every transition of the table, and no other: a probe that moves and a straggler
    that moves to the other rank while the plan settles; a healthy start with steps without numbers, then a
    straggler whose first move the caller does not make; a straggler from the first step, probe off."""
    seen = []
    original = reshard.transition

    def recording(state, event):
        seen.append((state, event))
        return original(state, event)

    monkeypatch.setattr(reshard, "transition", recording)
    broken = ReshardSample((0.0, 1.0), (0.0, 0.5), (COMM, COMM))

    def feed(pol, steps, *, carry_out=True):
        for speeds in steps:
            decision = pol.observe(broken if speeds is None else sample(pol, speeds))
            if decision.replan and carry_out:
                pol.moved_to(decision.plans, seconds=0.01, bytes_moved=pol.moved(decision.plans)[1])

    pol = policy(ReshardConfig(window=6))
    assert pol.profile([[0.02, 0.08]] * 5).replan
    pol.moved_to(pol.history[-1].plans, seconds=0.01, bytes_moved=1 << 20)
    feed(pol, [(0.25, 1.0)] * 12)  # the straggler is on the other rank as the plan settles: settling -> moving
    assert [e for _, e in seen][:6] == ["probe_move", "moved", "skip", "short", "short", "gain"]

    pol = policy(ReshardConfig(window=6))
    assert not pol.profile([[0.02, 0.02]] * 5).replan
    feed(pol, [(1.0, 1.0), (1.0, 1.0), None, (1.0, 1.0), (1.0, 1.0), (1.0, 1.0), None])
    feed(pol, [(1.0, 0.25)] * 5, carry_out=False)  # the move handed out is not made: moving -> holding
    assert pol.state == "moving"
    feed(pol, [(1.0, 0.25)] * 8)

    pol = policy(ReshardConfig(window=6, probe=0.6))  # the probe sees a rank slow, gaining less than probe
    assert not pol.profile([[0.02, 0.04]] * 5).replan and pol.slowdown.slow == {1}
    feed(pol, [(1.0, 0.25)] * 4)
    assert pol.history and pol.history[0].step == N_MIN  # decided as the first plan was measured

    expected = {(state, event) for state, row in TABLE.items() for event in row}
    assert expected - set(seen) == set()
    assert set(seen) - expected == set()


def test_an_event_the_state_does_not_take_is_refused():
    with pytest.raises(ConfigError, match="no transition from state 'moving' on event 'hold'"):
        reshard.transition("moving", "hold")


def test_the_slowdown_has_hysteresis_and_an_age():
    slow = Slowdown()
    assert not slow.update(10, (1.0, 0.95), se=0.01, tolerance=0.1, z=3.0, samples=3)  # 5 % slower: not slow
    assert not slow.update(20, (1.0, 0.5), se=0.01, tolerance=0.1, z=3.0, samples=N_MIN - 1)  # a first: N_MIN
    assert slow.update(20, (1.0, 0.5), se=0.01, tolerance=0.1, z=3.0, samples=N_MIN + 1)
    assert slow.slow == {1} and slow.age(20) == 4 and slow.age(29) == 13
    assert not slow.update(30, (1.0, 0.88), se=0.01, tolerance=0.1, z=3.0, samples=3)  # inside the band: kept
    assert slow.update(40, (1.0, 1.0), se=0.01, tolerance=0.1, z=3.0, samples=3)
    assert slow.slow == set() and slow.ended[True] == [38 - 17]
    assert slow.past() == []  # the first state began with the run: its length is not a life


# ---------------------------------------------------------------- the gain test
def test_the_gain_test_pays_the_move_and_its_way_back_beyond_the_noise():
    # g = 0.4 s, ε·t₀ = 0.1 s: 0.3 s a step beyond the noise, over 10 steps = 3 s against 2 x 1.4 s
    test = gain_test(1.0, 0.6, needed=0.1, life=10, move_s=1.4)
    assert test.gain_s == pytest.approx(0.4) and test.margin_s == pytest.approx(0.3)
    assert test.cost_s == pytest.approx(2.8) and test.passed
    assert not gain_test(1.0, 0.6, needed=0.1, life=10, move_s=1.6).passed
    assert not gain_test(1.0, 0.95, needed=0.1, life=10**6, move_s=0.0).passed  # inside the noise: never


def test_the_move_back_is_paid_with_the_odds_that_the_state_before_returns():
    # a state after this one that is new calls for a move from either plan: only a return is this move's
    assert gain_test(1.0, 0.6, needed=0.1, life=10, move_s=1.6, risk_s=0.5, back_odds=0.0).cost_s == pytest.approx(2.1)
    assert gain_test(1.0, 0.6, needed=0.1, life=10, move_s=1.6, risk_s=0.5, back_odds=0.25).cost_s == pytest.approx(2.5)
    assert gain_test(1.0, 0.6, needed=0.1, life=10, move_s=1.6, back_odds=0.0).passed  # 3 s against 1.6 s


def test_a_state_expected_to_outlive_the_run_pays_the_move_alone():
    assert gain_test(1.0, 0.6, needed=0.1, life=10, move_s=1.6, risk_s=5.0, way_back=False).cost_s == 1.6
    # a straggler recovers 12 steps before the run's end: the even plan's gain over the steps left pays
    # the move (3 s), not a move back as well (and the risk of the straggler returning) past the run's end
    pol = policy(ReshardConfig(horizon=52))
    moves = run(pol, lambda step: (1.0, 0.25) if step < 40 else (1.0, 1.0), 52, move_s=3.0)
    assert len(moves) == 2 and moves[1].plans == even_plans() and 40 <= moves[1].step < 52  # read from step 40 on
    assert moves[1].reason.split(" > ")[1].startswith(f"the move {3.0 / 2.5:.4g} s")  # the first at pace 2.5


def test_a_states_life_is_read_in_seconds_of_the_runs_clock():
    """A slowdown lasted 4 steps of 25 s (100 s) and ended; a new one is 3 steps of 4 s old (12 s): it is expected to
    hold the rest of 100 s, 88 s, which is 22 steps of the plan in force (in steps it would be 4 − 3 = 1)."""
    slow = Slowdown()
    for seconds in [1.0] * 10 + [25.0] * 4 + [1.0] * 6 + [4.0] * 3:
        slow.clock.add(seconds)
    kw = dict(se=0.01, tolerance=0.1, z=3.0, samples=3)
    assert slow.update(12, (1.0, 0.25), since=10, **kw) and slow.update(16, (1.0, 1.0), since=14, **kw)
    assert slow.update(22, (1.0, 0.25), since=20, **kw) and slow.past() == [4]
    life, ends = slow.life(22, 4.0, 1.0, floor=10, remaining=None)
    assert life == pytest.approx(22.0) and ends
    assert slow.life(22, 4.0, 1.0, floor=10, remaining=80) == (80.0, False)  # 88 s hold 88 steps of 1 s: past the end
    assert slow.life(22, 4.0, 1.0, floor=10, remaining=100) == (pytest.approx(22.0), True)


def test_the_expected_life_is_the_age_floored_or_the_past_states_residual_life():
    assert expected_life(3, [], floor=10, remaining=None) == 10
    assert expected_life(40, [], floor=10, remaining=None) == 40
    assert expected_life(40, [], floor=10, remaining=25) == 25
    assert expected_life(3, [4, 4, 10], floor=10, remaining=None) == 3  # mean of 1, 1 and 7
    assert expected_life(12, [4, 4, 10], floor=10, remaining=None) == 12  # outlived them all: its age
    assert expected_life(5, [4, 4], floor=10, remaining=None) == 5  # outlived them all: its age, not the floor


def test_the_odds_of_the_state_before_coming_back_are_counted_from_the_changes_after_the_first():
    slowdown = Slowdown()
    healthy, slow1, slow2 = (1.0, 1.0, 1.0), (1.0, 0.25, 1.0), (1.0, 1.0, 0.25)
    read = dict(se=0.01, tolerance=0.1, z=3.0, samples=N_MIN)
    slowdown.update(0, healthy, **read)
    assert slowdown.previous is None and slowdown.return_odds() == pytest.approx(1 / 2)
    slowdown.update(5, slow1, **read)
    assert slowdown.previous == (frozenset(), healthy)
    slowdown.update(20, healthy, **read)  # back to the run's first state: by construction, no evidence
    assert slowdown.previous == (frozenset({1}), slow1) and slowdown.return_odds() == pytest.approx(1 / 2)
    slowdown.update(30, slow1, **read)  # the straggler came back
    assert slowdown.return_odds() == pytest.approx(2 / 3)
    slowdown.update(40, slow2, **read)  # it moved on instead of going away
    assert slowdown.return_odds() == pytest.approx(2 / 4)
    trial = slowdown.trial()
    trial.update(50, healthy, **read)
    assert len(trial.sets) == len(slowdown.sets) + 1 and slowdown.slow == {2}  # a trial leaves the original


def test_a_straggler_that_moves_to_another_rank_is_counted_as_a_handover():
    slowdown = Slowdown()
    read = dict(se=0.01, tolerance=0.1, z=3.0, samples=N_MIN)
    assert slowdown.handover(2) == pytest.approx(1 / 2) and slowdown.handover(4) == pytest.approx(1 / 6)
    slowdown.update(0, (1.0, 0.25, 1.0), **read)
    slowdown.update(10, (1.0, 1.0, 0.25), **read)  # rank 1 recovered as rank 2 slowed: a hand-over
    assert (slowdown.ends, slowdown.handovers) == (1, 1) and slowdown.handover(3) == pytest.approx(2 / 3 / 2)
    slowdown.update(20, (1.0, 1.0, 1.0), **read)  # rank 2 recovered, no other slowed
    slowdown.update(30, (1.0, 1.0, 1.0), **read)
    assert (slowdown.ends, slowdown.handovers) == (2, 1) and slowdown.handover(3) == pytest.approx(2 / 4 / 2)


def test_a_rank_taking_a_slowdown_over_joins_when_nearer_its_size_than_health():
    """Rank 1 slow at 0.65; then, on three steps of a new window (a wide band), rank 0 reads 0.70 and rank 1
    healthy.  The band alone (0.9 over a factor 1.6) leaves rank 0 out and the set empty; nearer the leaving
    slowdown's size than health, rank 0 takes it over.  A rank reading 0.85 is nearer health: it does not;
    nor does one where the slowdown leaving was read on too few steps to have lasted."""
    read = dict(tolerance=0.1, z=3.0, samples=N_MIN)
    slowdown = Slowdown()
    slowdown.update(0, (1.0, 0.65), se=0.05, **read)
    assert slowdown.slow == {1} and slowdown.handed == set()
    assert slowdown.update(40, (0.70, 1.0), se=0.157, **read)
    assert slowdown.slow == {0} and slowdown.handed == {0} and slowdown.handovers == 1
    without = Slowdown()  # no slowdown leaving: the band decides, and 0.70 is inside it
    without.update(40, (0.70, 1.0), se=0.157, **read)
    assert without.slow == set()
    milder = Slowdown()
    milder.update(0, (1.0, 0.65), se=0.05, **read)
    milder.update(40, (0.85, 1.0), se=0.157, **read)
    assert milder.slow == set() and milder.handed == set()
    brief = Slowdown()  # a slowdown read on fewer than LASTED steps (a probe's, a bet's) has no size to hand over
    brief.update(2, (1.0, 0.65), se=0.05, **read)
    assert brief.slow == {1}
    brief.update(4, (0.70, 1.0), se=0.157, **read)
    assert brief.slow == set() and brief.handed == set()
    probe = Slowdown()  # the device probe's five repeats are no steps run: its reading has no size either
    probe.update(-1, (1.0, 0.65), se=0.05, tolerance=0.1, z=3.0, samples=5)
    probe.update(3, (0.70, 1.0), se=0.157, **read)
    assert probe.slow == set() and probe.handed == set()


def test_a_hand_over_that_shows_after_the_slowdown_ended_is_read_at_its_size_while_the_set_stays_empty():
    """Rank 1 slow at 0.65 for 40 steps leaves the set while rank 0 still reads healthy (its window holds its
    healthy steps); three steps later rank 0 reads 0.70 on a restarted window (a wide band).  The band alone
    leaves it out; read against the slowdown that emptied the set, it is nearer that size than health and
    joins, counted as a hand-over (no reading of its own speed is forced: ``handed`` stays empty).  Not so
    once another state came between, nor for a rank of the set that ended (its return is the band's to read),
    nor after a slowdown too short to have lasted."""
    read = dict(tolerance=0.1, z=3.0, samples=N_MIN)

    def run(steps):
        slowdown = Slowdown()
        slowdown.update(0, (1.0, 0.65), se=0.05, **read)
        for step, ratios in steps:
            slowdown.update(step, ratios, se=0.157, **read)
        return slowdown

    late = run([(40, (1.0, 1.0)), (43, (0.70, 1.0))])
    assert late.slow == {0} and late.handed == set() and (late.ends, late.handovers) == (1, 1)
    assert run([(40, (1.0, 1.0)), (43, (1.0, 0.70))]).slow == set()  # rank 1 itself: the band reads it
    assert run([(40, (1.0, 1.0)), (43, (0.85, 1.0))]).slow == set()  # nearer health
    brief = Slowdown()
    brief.update(2, (1.0, 0.65), se=0.05, **read)
    brief.update(4, (1.0, 1.0), se=0.05, **read)
    brief.update(7, (0.70, 1.0), se=0.157, **read)
    assert brief.slow == set()
    between = run([(40, (1.0, 1.0)), (41, (1.0, 0.5)), (42, (1.0, 1.0)), (45, (0.70, 1.0))])
    assert between.slow == set()  # the state before the empty set is a brief one: no size to hand over
    probe = Slowdown()  # the device probe's five repeats read rank 1 slow; it reads healthy by step 3
    probe.update(-1, (1.0, 0.65), se=0.05, tolerance=0.1, z=3.0, samples=5)
    probe.update(3, (1.0, 1.0), se=0.05, **read)
    probe.update(6, (0.70, 1.0), se=0.157, **read)
    assert probe.slow == set()  # the probe's repeats are no steps run: its reading has no size to hand over


def test_a_taken_over_slowdown_is_read_at_the_size_and_over_the_steps_of_the_one_that_ended():
    read = dict(tolerance=0.1, z=3.0, samples=N_MIN)
    slowdown = Slowdown()
    slowdown.update(0, (1.0, 1.0), se=0.05, **read)
    slowdown.update(10, (1.0, 0.5), se=0.05, **read)
    slowdown.update(40, (0.62, 1.0), se=0.2, **read)  # rank 1's slowdown, 30 steps long, taken over by rank 0
    assert slowdown.handed == {0}
    model, lasted = took_over(StepModel(speeds=(0.55, 1.2), replicated=0.2, shardable=1.6), slowdown)
    assert model.speeds == pytest.approx((0.6, 1.2)) and lasted == 30  # no slower than 0.5 of the fastest


def test_a_straggler_that_moves_while_a_plan_settles_is_followed_at_the_next_reading():
    """Rank 1 at 0.65 of its speed (14 % noise) until the policy has moved for it, then rank 0 instead, from
    the second step after the move: the slowdown moves while the new plan settles.  The first reading of the
    new plan hands it over and the mirror move follows within three steps in most runs (eight seeds), not
    once the band has narrowed on a longer window.  The first move is priced at two steps' cost so that it
    comes after the slowdown lasted (:data:`LASTED` steps): a slowdown read on fewer has no size to hand over
    (a cheaper prior moves sooner, and the band alone then reads the new rank)."""
    delays = []
    for seed in range(8):
        pol, switch = policy(ReshardConfig(move_steps=2.0)), []

        def speeds(step):
            if not switch and pol.last_move_step is not None:
                switch.append(step + 1)
            return (0.65, 1.0) if switch and step >= switch[0] else (1.0, 0.65)

        moves = run(pol, speeds, 60, move_s=0.3, noise=0.14, rng=random.Random(seed))
        after = [m for m in moves if m.step >= switch[0]]
        assert after and pol.slowdown.slow == {0}, [(m.step, m.reason) for m in moves]
        assert "slow ranks [0]" in after[0].reason, after[0].reason
        delays.append(after[0].step - switch[0])
    assert sum(d <= 3 for d in delays) >= 6, delays


def test_a_slow_step_where_the_slowdown_ends_is_bet_on_as_the_straggler_moving():
    """Rank 1 at a quarter of its speed, then from step 40 rank 0 instead; outliers counted common, so a
    single slow step alone is not worth a move (odds under 0.15).  Rank 1's slowdown ends at rank 0's first
    slow step: read at the hand-over's odds, the move (three healthy steps' worth) follows that step at
    once (step 40, a bet on one step).  In a run whose many slowdowns all ended without one, the step waits for the next (step 41)."""
    for handed_over in (True, False):
        pol = policy()
        got = []
        for step in range(44):
            if step == 20:
                pol.samples.rates.rank_steps, pol.samples.rates.outliers = 2000, 100
                assert pol.samples.rates.change_odds(1) < 0.15
                if not handed_over:
                    pol.slowdown.ends = 200
            decision = pol.observe(sample(pol, (1.0, 0.25) if step < 40 else (0.25, 1.0)))
            if decision.replan:
                got.append(decision)
                pol.moved_to(decision.plans, seconds=3.0, bytes_moved=pol.moved(decision.plans)[1])
        later = [(d.step, d.bet) for d in got if d.step >= 40]
        assert later[:1] == ([(40, 1)] if handed_over else [(41, 0)]), later
        assert pol.slowdown.slow == {0}


@pytest.mark.parametrize("first", [1 / 4.5, 1 / 2])
def test_a_handed_over_slowdown_is_bet_on_at_the_size_it_had(first):
    """Rank 1 at a third of its speed, then from step 40 rank 0 instead.  Its first slow step reads it at
    ``first``: further slowed by half (noise, 4.5x), or at half its speed (the step the straggler moved during,
    half of it at each rank's pace).  Read from that one step the bet would take a plan for that slowdown and a
    correction would follow; read at rank 1's size it takes the mirror of the plan rank 1's slowdown held, and
    the steps after it call for no correction."""
    pol = policy()
    moves = run(pol, lambda step: (1.0, 1 / 3) if step < 40 else ((first, 1.0) if step == 40 else (1 / 3, 1.0)), 60,
                move_s=0.3)
    held = [m for m in moves if m.step < 40][-1].plans
    bet = [m for m in moves if m.step >= 40]
    assert bet[0].step == 40 and bet[0].bet == 1
    assert [p.units for p in bet[0].plans] == [tuple(reversed(p.units)) for p in held]
    assert len(bet) == 1, [(m.step, [p.units for p in m.plans]) for m in bet]


def test_no_move_is_taken_that_unconfirmed_slow_steps_would_undo():
    """Rank 1 at a sixth of its speed, free from step 40; with moves this costly the way back to even is
    decided some steps into the pause.  Where rank 1 slows again the step before, its two slow steps are not
    yet a slowdown (the step after them confirms it), but read as one they make the way back a loss: the
    policy waits for the step that tells, keeps the plan it holds and makes neither the move nor the move
    back."""
    def speeds(back):
        return lambda step: (1.0, 1 / 6) if step < 40 or (back is not None and step >= back) else (1.0, 1.0)

    pause = run(policy(), speeds(None), 80, move_s=2.0)
    way_back = [m.step for m in pause if m.step >= 40]
    assert way_back and way_back[0] > 42  # decided on the pause's steps, not on its first
    held = [m for m in pause if m.step < 40][-1].plans
    moves = run(policy(), speeds(way_back[0] - 1), 80, move_s=2.0)
    assert [m.plans for m in moves] == [held], [(m.step, [p.units for p in m.plans]) for m in moves]


def test_the_risk_of_the_state_before_coming_back_prices_the_plan_at_its_speeds():
    model = StepModel(speeds=(1.0, 1.0), replicated=0.2, shardable=1.6)  # a healthy even step of 1
    even, uneven = (0.5, 0.5), (0.9, 0.1)
    straggler = (frozenset({1}), (1.0, 0.25))
    at_slow = StepModel(speeds=(1.0, 0.25), replicated=0.2, shardable=1.6)
    extra = at_slow.step(even) - at_slow.step(uneven)
    # back to even as the straggler pauses: if it resumes, SLOW_STEPS to see it and one to move at its pace
    assert return_risk(model, frozenset(), straggler, uneven, even, 0.5) == pytest.approx(0.5 * 3 * extra)
    # onto a straggler: if it recovers, one step to see it and one to move, the uneven plan at healthy speeds
    assert return_risk(at_slow, frozenset({1}), (frozenset(), (1.0, 1.0)), even, uneven, 1.0) == pytest.approx(
        2 * (model.step(uneven) - model.step(even)))
    assert return_risk(model, frozenset(), straggler, even, uneven, 0.5) == 0.0  # better there: no risk
    assert return_risk(model, frozenset(), None, uneven, even, 0.5) == 0.0  # no state ended yet
    assert gain_test(1.0, 0.5, needed=0.0, life=10, move_s=1.0, risk_s=3.0).cost_s == 5.0


def test_the_noise_is_one_robust_estimator_of_a_steps_relative_noise():
    rng = np.random.default_rng(0)
    times = np.exp(0.1 * rng.standard_normal((2000, 4)))
    times[rng.random((2000, 4)) < 0.02] *= 3.0  # outliers
    noise = Noise().add_rows(times)
    assert noise.sigma == pytest.approx(0.1, rel=0.15)
    assert noise.of_median(16) == pytest.approx(1.25 * noise.sigma / 4)
    assert tercile([5.0, 1.0, 9.0, 2.0, 100.0, 3.0]) == 2.0


# ---------------------------------------------------------------- the step model
@pytest.mark.parametrize("rho", [0.05, 0.2, 0.4])
def test_two_plans_measure_r_over_s(rho):
    e, k = 2, rho / (2 * (1 - rho))
    learned = LearnedModel(e, 0.2, (0.8, 0.2))
    S = 1.0 / (k + 1.0 / e)
    speeds = (1.0, 0.3)

    def window(shares):
        return [ReshardSample(tuple((k * S + S * p) / v for p, v in zip(shares, speeds)), (0.0, 0.0), (0.0, 0.0))
                for _ in range(3)]

    assert learned.fit((0.5, 0.5), window((0.5, 0.5)), (0.8, 0.2), window((0.8, 0.2))) == pytest.approx(k)
    assert learned.k == pytest.approx(max(k, 1e-3))


def test_a_pair_that_moves_too_little_to_tell_r_over_s_from_the_noise_measures_nothing():
    """A move of a few units changes a rank's compute by about the noise of its reading: no fit; a rank
    that gives all its units up measures ``k`` well under the same noise."""
    e, k, se = 2, 0.05, 0.01
    S = 1.0 / (k + 1.0 / e)

    def window(shares, speeds=(1.0, 0.4)):
        return [ReshardSample(tuple((k * S + S * p) / v for p, v in zip(shares, speeds)), (0.0, 0.0), (0.0, 0.0))
                for _ in range(3)]

    learned = LearnedModel(e, 0.2, (0.8, 0.2))
    assert learned.fit((0.7, 0.3), window((0.7, 0.3)), (0.73, 0.27), window((0.73, 0.27)), se=se) is None
    assert learned.fit((0.7, 0.3), window((0.7, 0.3)), (1.0, 0.0), window((1.0, 0.0)), se=se) == pytest.approx(k)


def test_a_rank_holding_nothing_is_read_no_faster_than_the_fastest_of_two_holders():
    """``R/S`` read 3x too high would read a healthy rank holding nothing 3x fast (and the holders slow
    beside it); with two or more holders it is read no faster than the fastest of them."""
    e, k_true = 4, 0.02
    learned = LearnedModel(e, 0.2, (0.8, 0.2))
    learned.fits.append(3 * k_true)
    S = 1.0 / (k_true + 1.0 / e)
    shares, speeds = (0.0, 1 / 3, 1 / 3, 1 / 3), (1.0, 1.0, 1.0, 0.3)
    read = learned.speeds(shares, [(k_true * S + S * p) / v for p, v in zip(shares, speeds)])
    assert read[0] == pytest.approx(max(read[1:])) and read[3] / read[1] == pytest.approx(0.3)
    one = learned.speeds((0.0, 1.0), [k_true * S, (k_true * S + S) / 0.3])  # one holder, the slow one: no cap
    assert one[0] > one[1]


@pytest.mark.parametrize("pace, recovered", [(2.0, False), (0.5, False), (1.0, True)])
def test_a_rank_a_measured_move_emptied_is_read_through_its_own_replicated_work(pace, recovered):
    """Rank 1 at a quarter speed holding a share 0.2, then emptied at the same speeds.  Its replicated work
    runs ``pace`` times as fast as its shardable work (a quota that lets short kernels through, or the
    other way round): read through ``R`` it would read ``pace`` times its speed; the move measured its own
    ``R_r``, and it reads its speed, and a later speed-up of its own scales the reading.  A move during
    which its slowdown ended (the compute after it a quarter of a healthy rank's replicated work, a factor
    4 under ``R``) is not read as its own work: it reads the speed it recovered to; nor is a move that emptied it
    from a share whose work was mostly ``R``."""
    e, k = 2, 0.1
    learned = LearnedModel(e, 0.2, (0.8, 0.2))
    learned.fits.append(k)
    R, S = learned.scale()
    v = 0.25
    before = ((R + S * 0.8) / 1.0, (R / pace + S * 0.2) / v)
    after = ((R + S) / 1.0, R / (1.0 if recovered else v * pace))
    learned.calibrate((0.8, 0.2), before, (1.0, 0.0), after)
    read = learned.speeds((1.0, 0.0), after)
    if recovered:
        assert learned.replicated_at == {} and read[1] == pytest.approx(1.0)
        return
    assert read[1] / read[0] == pytest.approx((R + S * 0.2) / (R / pace + S * 0.2) * v)
    assert abs(read[1] / read[0] - v) < abs(pace * v - v)  # nearer its speed than R alone reads it
    faster = learned.speeds((1.0, 0.0), (after[0], after[1] / 2.0))
    assert faster[1] == pytest.approx(2.0 * read[1])
    little = LearnedModel(e, 0.2, (0.8, 0.2))  # holding 0.05 its work was mostly R: its speed was read through k
    little.fits.append(k)
    little.calibrate((0.95, 0.05), ((R + S * 0.95) / 1.0, (R / pace + S * 0.05) / v), (1.0, 0.0), after)
    assert little.replicated_at == {}


def test_a_rank_seated_again_reads_while_empty_at_the_speed_its_units_bore_out():
    """Rank 1 at a quarter speed, emptied, its replicated work running 4x its shardable pace: read through ``R`` it
    reads healthy.  A move that seats it again measures it at a quarter holding a share 0.2; its compute while empty
    then reads that speed, and a later speed-up of its own scales the reading."""
    e, k, v = 2, 0.1, 0.25
    learned = LearnedModel(e, 0.2, (0.8, 0.2))
    learned.fits.append(k)
    R, S = learned.scale()
    empty = ((R + S) / 1.0, R / (4 * v))  # its replicated work at 4x its shardable pace: a healthy rank's seconds
    assert learned.speeds((1.0, 0.0), empty)[1] == pytest.approx(learned.speeds((1.0, 0.0), empty)[0])
    seated = ((R + S * 0.8) / 1.0, (R + S * 0.2) / v)
    learned.reseat((0.8, 0.2), empty, seated, {1})
    read = learned.speeds((1.0, 0.0), empty)
    assert read[1] / read[0] == pytest.approx(v)
    assert learned.speeds((1.0, 0.0), (empty[0], empty[1] / 4))[1] == pytest.approx(4 * read[1])


def test_an_emptied_straggler_whose_replicated_work_runs_near_healthy_is_not_moved_back_and_forth():
    """tp 8, rank 1 5.4x slower from the start, its replicated work at ``v^0.31`` (a CPU quota): emptied by the
    probe, it reads near healthy through ``R``.  The policy tries it once with units, measures it slow, and from then
    reads it at that speed while empty: the run moves a few times, not once every straggler's life."""
    from semimig.controller.sim.oracle import candidate_plans, oracle_time
    from semimig.controller.sim.scenarios import make_scenario
    scenario = make_scenario(703, "persistent")
    scenario = dataclasses.replace(scenario, workload=dataclasses.replace(scenario.workload, replicated_pace=0.31))
    assert scenario.tp == 8 and scenario.info["chi"] > 5 and scenario.info["start"] == 0
    run = run_policy(scenario, reshard_policy)
    assert run.moves <= 4, [(step, mlp, kv) for step, mlp, kv, _ in run.plans]
    assert run.time_s <= 1.10 * oracle_time(scenario, candidate_plans(scenario))[0]


def test_a_plan_without_the_slow_rank_seated_prices_its_seat_at_the_rate_last_measured_with_it():
    """Rank 1 at a quarter speed.  Seated in both kinds the reductions measure 0.2 s (seat scale 12: each
    kind and the vocabulary at its pace); emptied, they measure 0.004 s, for the slow rank now only waits
    for the vocabulary's sums, early.  The emptied plan prices seating it again at the rate measured when
    it sat (0.2/12 per unit of scale), not at its own reading; a plan reading more than that keeps its own."""
    from semimig.controller.policy.memory import SeatRates
    from semimig.controller.policy.propose import seat_delta
    from semimig.sharding.jobmodel import seat_scale

    speeds, slow = (1.0, 0.25), {1}
    seated = (ShardPlan(units=(28, 4)), ShardPlan(units=(7, 1)))
    emptied = (ShardPlan(units=(32, 0)), ShardPlan(units=(8, 0)))
    rates = SeatRates()
    assert rates.read(0.004, speeds, emptied, slow) == 0.004  # nothing measured with it seated: its own reading
    assert seat_scale(speeds, seated) == pytest.approx(12.0)
    assert rates.read(0.2, speeds, seated, slow) == 0.2
    here = seat_scale(speeds, emptied)
    assert rates.read(0.004, speeds, emptied, slow) == pytest.approx(0.2 / 12.0 * here)
    assert rates.read(1.0, speeds, emptied, slow) == 1.0
    assert rates.read(0.004, speeds, emptied, {0}) == 0.004  # another slow set: nothing kept for it
    gain = seat_delta(speeds, emptied, seated, rates.read(0.004, speeds, emptied, slow))
    assert gain == pytest.approx(0.2 - 0.2 / 12.0 * here)  # seating it again costs what it measured


def test_the_healthy_ranks_measure_the_dimensions_weights():
    """Across healthy ranks holding different mixes of units: the true weights and R/S."""
    k, w = 0.1, (0.6, 0.4)
    learned = LearnedModel(5, 0.2, (0.8, 0.2))
    fractions = [(0.25, 0.25), (0.25, 0.5), (0.3, 0.25), (0.2, 0.0), (0.0, 0.0)]
    c = [k + w[0] * a + w[1] * b for a, b in fractions[:4]] + [5.0]
    learned.fit_across(fractions, [ReshardSample(tuple(c), (0.0,) * 5, (0.0,) * 5)] * 3, healthy=[0, 1, 2, 3])
    assert learned.weights == pytest.approx(w) and learned.k == pytest.approx(k)


def test_a_healthy_ranks_readings_over_the_plans_measure_r_over_s_where_no_window_can():
    """tp 2: a window has one healthy rank, so no window reads R/S across the ranks; the healthy rank's readings at
    three shares over three plans do (``c = R + S·p`` on a line), and readings within their noise leave the prior."""
    k = 0.3
    for se, expected in ((None, k), (0.5, 0.2 / (2 * 0.8))):
        learned = LearnedModel(2, 0.2, (0.5, 0.5))
        for f in (0.5, 0.625, 0.75):
            window = [ReshardSample((k + f, 9.0), (0.0,) * 2, (0.0,) * 2)] * 3  # rank 1 slow: not read
            learned.fit_across([(f, f), (1 - f, 1 - f)], window, healthy=[0], se=se)
        assert learned.k == pytest.approx(expected) and not learned.fits


def test_a_plan_that_under_delivers_is_revisited():
    """The split hides R/S (a third of the shardable seconds untimed) and the prior is below it: the first
    plan gives the slow rank too much; its measurement refits R/S and the next plan is the true one."""
    rho = 0.4
    pol = policy(ReshardConfig(window=8, replicated_share=0.1))
    moves = run(pol, lambda step: (1.0, 0.25), 80, rho=rho, timed=0.66)
    assert len(moves) >= 2
    assert pol.replicated_ratio == pytest.approx(rho / (2 * (1 - rho)), rel=0.05)
    truth = StepModel.normalised((1.0, 0.25), replicated_share=rho)
    step_of = lambda plans: truth.step(pol.shares(plans))  # noqa: E731
    assert step_of(pol.plans) <= step_of(moves[0].plans) * 0.97
    assert step_of(pol.plans) == pytest.approx(step_of(solved((1.0, 0.25), rho)), rel=0.03)


def test_a_plans_first_steps_are_read_across_the_ranks_only_beyond_their_noise():
    """A plan's first steps (``se`` given): R/S well above the noise is taken, R/S inside it is not (a rank
    holding nothing would be read through a noise-sized R), nor a fit whose residuals are small by chance
    against the noise the window's steps were measured with; a full window (no ``se``) reads its weights."""
    w, scatter = (0.6, 0.4), (0.02, -0.02, 0.015, -0.015, 0.0)
    fractions = [(0.3, 0.25), (0.3, 0.5), (0.2, 0.25), (0.2, 0.0), (0.0, 0.0)]
    for k, scale, se, taken in ((0.2, 1.0, 0.01, True), (0.002, 1.0, 0.01, False), (0.002, 1.0, None, True),
                                (0.2, 0.01, 0.2, False), (0.2, 0.01, 0.001, True)):
        learned = LearnedModel(5, 0.2, (0.8, 0.2))
        c = [k + w[0] * a + w[1] * b + scale * d for (a, b), d in zip(fractions, scatter)]
        learned.fit_across(fractions, [ReshardSample(tuple(c), (0.0,) * 5, (0.0,) * 5)] * 3, healthy=range(5), se=se)
        assert bool(learned.fits) is taken, (k, scale, se)


def test_a_plan_is_read_across_the_ranks_as_soon_as_it_is_measured():
    """tp 8, all healthy, the prior R/S a sixth of the truth, which the even plan cannot read (every rank
    holds the same); moved to a plan that varies among the ranks, one of them holding nothing, its first
    N_MIN steps read the true R/S across the ranks, so the rank that holds nothing (read through R alone)
    is read at its true speed, not as a straggler, long before the plan's full window."""
    rho, e = 0.4, 8
    pol = policy(ReshardConfig(replicated_share=0.1), tp=e)
    for _ in range(20):
        assert not pol.observe(sample(pol, (1.0,) * e, rho=rho)).replan
    assert pol.replicated_ratio < 0.2 * rho / (e * (1 - rho))
    plans = (ShardPlan(units=(5, 5, 5, 5, 4, 4, 4, 0)), ShardPlan(units=(2, 1, 1, 1, 1, 1, 1, 0)))
    pol.moved_to(plans, seconds=0.01, bytes_moved=pol.moved(plans)[1])
    for _ in range(pol.config.warmup + N_MIN):
        pol.observe(sample(pol, (1.0,) * e, rho=rho))
    assert pol.replicated_ratio == pytest.approx(rho / (e * (1 - rho)), rel=1e-6)
    assert not pol.slowdown.slow


# ---------------------------------------------------------------- zero units
def test_a_rank_holding_nothing_is_read_from_its_replicated_work():
    plans = (ShardPlan(units=(MLP_UNITS, 0)), ShardPlan(units=(KV_UNITS, 0)))
    pol = policy(ReshardConfig(window=6, replicated_share=0.2), plans=plans)
    for _ in range(3):
        pol.observe(sample(pol, (1.0, 0.5)))
    model = pol.learned.model(pol.shares(), pol.samples.times()[0])
    assert model.speeds[1] / model.speeds[0] == pytest.approx(0.5, rel=1e-6)
    # healthy again: back toward even, units returned to the rank that held none
    moves = run(pol, lambda step: (1.0, 1.0), 40)
    assert moves and pol.plans == even_plans()


def test_a_slow_rank_may_be_given_no_units():
    pol = policy(ReshardConfig(window=6))
    run(pol, lambda step: (1.0, 0.05), 30, rho=0.3)
    assert pol.plans[0].units[1] == 0 and pol.plans[1].units[1] == 0


# ---------------------------------------------------------------- no straggler
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_no_straggler_never_moves_under_noise_and_outliers(tp):
    for seed in range(3):
        rng = random.Random(seed)
        pol = policy(tp=tp)
        pol.profile([[0.02 * math.exp(0.2 * rng.gauss(0, 1)) for _ in range(tp)] for _ in range(5)])
        for step in range(300):
            s = sample(pol, (1.0,) * tp, noise=0.2, rng=rng)
            if rng.random() < 0.03:  # an outlier step on one rank
                r = rng.randrange(tp)
                s = ReshardSample(tuple(c * (2.5 if q == r else 1.0) for q, c in enumerate(s.compute_s)),
                                  s.shardable_s, s.comm_s)
            assert not pol.observe(s).replan, (tp, seed, step)


def test_a_run_of_outliers_on_one_rank_is_not_a_slow_rank():
    """Outlier, outlier, a true step, outlier on one of eight ranks: the first two pass the change test as
    a slowdown, but the steps after them read the rank's true speed, so no rank is slow and nothing moves."""
    rng = random.Random(0)
    pol = policy(tp=8)
    for step in range(40):
        s = sample(pol, (1.0,) * 8, noise=0.1, rng=rng)
        if step - 30 in (0, 1, 3):
            s = ReshardSample(tuple(c * (2.5 if r == 4 else 1.0) for r, c in enumerate(s.compute_s)), s.shardable_s,
                              s.comm_s)
        assert not pol.observe(s).replan, step
        assert not pol.slowdown.slow, step


def _slow_run(sizes, seed=0):
    """Forty steps of two healthy ranks on a quiet machine (1.6 % noise), rank 0's steps 30, 31, ... times ``sizes``;
    every move carried out.  The steps that moved, and the steps rank 0 was in the slow set."""
    rng, pol, moved, slow = random.Random(seed), policy(tp=2), [], []
    for step in range(40):
        s = sample(pol, (1.0, 1.0), noise=0.016, rng=rng)
        if 0 <= step - 30 < len(sizes):
            s = ReshardSample((s.compute_s[0] * sizes[step - 30], s.compute_s[1]), s.shardable_s, s.comm_s)
        decision = pol.observe(s)
        if decision.replan:
            moved.append(step)
            pol.moved_to(decision.plans, seconds=0.01, bytes_moved=pol.moved(decision.plans)[1])
        if 0 in pol.slowdown.slow:
            slow.append(step)
    return moved, slow


def test_slow_steps_that_recede_beyond_the_noise_are_outliers_and_a_level_is_a_slowdown():
    """Three slow steps in a row on one rank, 1.7x, 2.3x then 1.85x its reading: each beyond the band, but the
    last falls below the one before by far more than the noise, which a new speed's steps do not: outliers,
    nothing moves.  The same rank at one level (1.85x), or slowing step by step (a ramp), is a slowdown."""
    assert _slow_run((1.68, 2.3, 1.85)) == ([], [])
    for sizes in ((1.85,) * 10, (1.5, 1.9, 2.3, 2.7) + (3.0,) * 6):
        moved, slow = _slow_run(sizes)
        assert moved and moved[0] <= 33 and slow and slow[-1] == 39, sizes


# ---------------------------------------------------------------- traces replayed through the simulator
def _scenario(speeds, *, noise=0.05, step_s=1.0, move_steps=ReshardConfig().move_steps, kv_units=KV_UNITS):
    workload = Workload(tp=len(speeds[0]), replicated_share=0.2, mlp_units=MLP_UNITS, kv_units=kv_units,
                        attention_share=0.2, attention_param_share=0.2, comm_share=0.05, step_s=step_s,
                        state_bytes=int(move_steps * step_s * 1e8), bandwidth_bytes_s=1e8, latency_s=0.0)
    return Scenario(name="trace", category="persistent", workload=workload, speeds=np.array(speeds), noise=noise,
                    seed=1)


def test_a_device_slow_from_the_start_moves_before_the_first_step_and_stays():
    run_ = run_policy(_scenario([[1.0, 0.25]] * 120), reshard_policy)
    assert run_.plans[0][0] == -1  # the device probe's move
    assert run_.moves <= 3 and all(step < 20 for step, *_ in run_.plans)
    assert run_.plans[-1][1][1] < MLP_UNITS // 4  # the slow rank holds little


def test_the_probe_reads_each_rank_at_its_fastest_repeat():
    """Interference only adds to a repeat: a rank slowed 6x in four repeats in a row but not in the fifth is as
    fast as the others and nothing moves; a rank slowed 4x in every repeat moves before the first step."""
    flaky = [[0.02, 0.12], [0.021, 0.121], [0.02, 0.12], [0.0205, 0.119], [0.02, 0.021]]
    pol = policy(ReshardConfig(window=6))
    assert not pol.profile(flaky).replan and not pol.slowdown.slow
    pol = policy(ReshardConfig(window=6))
    slow = [[0.02, 0.08 * (1.0 + 0.02 * i)] for i in range(5)]
    assert pol.profile(slow).replan and pol.slowdown.slow == {1}


def test_a_straggler_that_comes_and_goes_slowly_is_served_and_released():
    """Back to even once the healthy state's expected life pays the move and the risk of the straggler
    resuming (even odds after one episode: a few steps at a quarter speed on the even plan)."""
    speeds = [[1.0, 0.25 if 40 <= i < 140 else 1.0] for i in range(240)]
    run_ = run_policy(_scenario(speeds), reshard_policy)
    steps = [step for step, *_ in run_.plans]
    assert any(40 < s < 50 for s in steps)  # moved for it within a few steps
    assert any(140 <= s < 160 for s in steps)  # and back (140: decided on the first healthy step)
    assert run_.plans[-1][1:3] == (even_plans()[0].units, even_plans()[1].units)


def test_a_straggler_that_pauses_briefly_keeps_its_plan():
    """On for 14 steps, off for 11, at an eighth of the speed: going back to even for each pause costs a
    few steps at the straggler's pace each time it resumes, more than the uneven plan's third while it is
    away.  The plan is held through the pauses (going back for each: seven to nine moves)."""
    speeds = [[1.0, 1.0, 1.0, 0.125 if i >= 62 and (i - 62) % 25 < 14 else 1.0] for i in range(160)]
    workload = Workload(tp=4, replicated_share=0.11, mlp_units=64, kv_units=8, attention_share=0.42,
                        attention_param_share=0.35, timed_share=0.82, comm_share=0.03, step_s=2.66,
                        state_bytes=354_000_000, bandwidth_bytes_s=6.25e7, latency_s=0.05)
    scenario = Scenario(name="pauses", category="come_and_go", workload=workload, speeds=np.array(speeds),
                        noise=0.02, seed=1)
    run_ = run_policy(scenario, reshard_policy)
    assert run_.moves <= 3, run_.plans  # the pattern changes eight times


def test_a_straggler_too_short_to_pay_its_move_is_not_moved_for():
    """A move of every unit costs 20 steps (and the policy's prior says so): 4 steps at half speed do not pay."""
    speeds = [[1.0, 0.5 if 50 <= i < 54 else 1.0] for i in range(150)]
    config = ReshardConfig(move_steps=20.0)
    run_ = run_policy(_scenario(speeds, move_steps=20.0),
                      lambda plans, **kw: ReshardPolicy(plans, config=config, **kw))
    assert run_.moves == 0


def test_a_move_is_priced_at_the_least_rate_of_the_last_two_moves():
    """A run's first move pays the exchange's one-time set-up, a move off a slow rank its pace: neither prices the
    next move (the way back above all) by its excess, while two slower moves in a row raise the price."""
    pol, uneven, even = policy(), solved([1.0, 0.25]), even_plans()
    n = pol.moved(uneven)[1]
    assert pol.move_cost_s(uneven, 1.0) == pytest.approx(n / sum(b * p.total_units for b, p in zip(BYTES, even))
                                                         * ReshardConfig().move_steps)  # the prior, in steps
    pol.moved_to(uneven, seconds=5e-9 * n, bytes_moved=n)  # the first move, set-up included
    assert pol.move_cost_s(even, 1.0) == pytest.approx(5e-9 * n)
    pol.moved_to(even, seconds=1e-9 * n, bytes_moved=n)
    assert pol.move_cost_s(uneven, 1.0) == pytest.approx(1e-9 * n)
    pol.moved_to(uneven, seconds=2e-9 * n, bytes_moved=n)  # one slower move
    assert pol.move_cost_s(even, 1.0) == pytest.approx(1e-9 * n)
    pol.moved_to(even, seconds=0.0, bytes_moved=0)  # a move of no bytes tells no rate
    assert pol.move_cost_s(uneven, 1.0) == pytest.approx(1e-9 * n)
    pol.moved_to(uneven, seconds=3e-9 * n, bytes_moved=n)  # two slower moves in a row
    assert pol.move_cost_s(even, 1.0) == pytest.approx(2e-9 * n)


def test_a_move_is_priced_at_the_pace_of_its_slowest_rank_and_read_back_at_it():
    """Half a move's work runs at each end's pace: a move onto a rank at a quarter of its speed costs 2.5 free moves,
    and, measured, prices the way back (no slow rank in it) at its seconds over that pace."""
    assert move_pace((False, True), (1.0, 0.25)) == 2.5 and move_pace((True, False), (1.0, 0.25)) == 1.0
    assert move_pace((False, False), (1.0, 0.25)) == 1.0 and move_pace((True, True), (0.5, 1.0)) == 1.5
    even, uneven = even_plans(4), (ShardPlan(units=(10, 10, 10, 2)), ShardPlan(units=(2, 2, 3, 1)))
    assert movers(even, uneven) == (True, True, True, True) and movers(even, even) == (False,) * 4
    assert movers(even, (ShardPlan(units=(9, 7, 8, 8)), even[1])) == (True, True, False, False)
    pol, uneven = policy(), solved([1.0, 0.25])
    n = pol.moved(uneven)[1]
    prior = n / sum(b * p.total_units for b, p in zip(BYTES, even_plans())) * ReshardConfig().move_steps
    assert pol.move_cost_s(uneven, 1.0, (1.0, 0.25)) == pytest.approx(2.5 * prior)  # the prior, at the pace
    pol.speeds = (1.0, 0.25)  # as the decision to move read them
    pol.moved_to(uneven, seconds=5e-9 * n, bytes_moved=n)
    assert pol.move_cost_s(even_plans(), 1.0, (1.0, 1.0)) == pytest.approx(2e-9 * n)  # the way back, free
    assert pol.move_cost_s(even_plans(), 1.0, (1.0, 0.25)) == pytest.approx(5e-9 * n)  # back while it is slow
    with pytest.raises(ConfigError, match=r"one positive speed per rank.*\[1.0, 0.25, 0.5\]"):
        pol.move_cost_s(uneven, 1.0, (1.0, 0.25, 0.5))
    with pytest.raises(ConfigError, match=r"\[1.0, 0.0\]"):
        move_pace((True, True), (1.0, 0.0))


def test_a_plan_measured_at_the_speeds_in_force_is_not_traded_on_a_biased_prediction():
    """The policy's KV weight (the parameter share, 0.27) understates attention's work (0.39): read from
    either of two neighbouring plans, the other looks a few per cent faster.  Once both were measured at
    the same speeds, the faster one is kept instead of the pair being traded back and forth."""
    workload = Workload(tp=2, replicated_share=0.08, mlp_units=16, kv_units=8, attention_share=0.39,
                        attention_param_share=0.27, timed_share=0.8, comm_share=0.03, step_s=0.075,
                        state_bytes=7_700_000_000, bandwidth_bytes_s=3.5e10, latency_s=0.005)
    speeds = np.array([[1.0, 1.0 / 2.36]] * 300)
    run_ = run_policy(Scenario(name="bias", category="persistent", workload=workload, speeds=speeds, noise=0.016,
                               seed=0), reshard_policy)
    assert run_.moves <= 8, run_.plans  # the pair traded on predictions alone: 35 moves


def test_a_straggler_emptied_as_it_recovers_is_read_recovered():
    """A 4-step burst on rank 2: the move empties it as the burst ends.  The pair of plans around the move
    is no reading of ``R/S`` through rank 2 (its speed changed across it), so its replicated work alone
    reads it healthy again and the plan goes back to even."""
    burst = [[1.0, 1.0, 1.0 / 6.45 if 18 <= i < 22 else 1.0, 1.0] for i in range(150)]
    workload = Workload(tp=4, replicated_share=0.23, mlp_units=64, kv_units=32, attention_share=0.31,
                        attention_param_share=0.31, timed_share=0.9, comm_share=0.085, step_s=0.24,
                        state_bytes=8_550_000_000, bandwidth_bytes_s=7.3e10, latency_s=0.005)
    run_ = run_policy(Scenario(name="burst", category="come_and_go", workload=workload, speeds=np.array(burst),
                               noise=0.11, seed=5), reshard_policy)
    assert run_.plans and run_.plans[0][1][2] == 0, run_.plans  # moved for the burst, rank 2 emptied
    back = [p for p in run_.plans[1:] if p[1][2] >= 12]
    assert back and back[0][0] < 60 and run_.plans[-1][1][2] >= 12, run_.plans  # its share given back, and kept


# ---------------------------------------------------------------- inputs
def test_moved_units_counts_changed_owners():
    even = ShardPlan.even(8, 2)
    assert moved_units(even, ShardPlan(units=(6, 2))) == 2
    assert moved_units(ShardPlan(units=(2, 3, 3)), ShardPlan(units=(3, 3, 2))) == 2
    assert moved_units(even, even) == 0
    with pytest.raises(ConfigError):
        moved_units(even, ShardPlan(units=(4, 5)))


def test_bad_configs_and_inputs_are_refused_by_name():
    for kw, name in ((dict(window=2), "window"), (dict(margin=-0.1), "margin"), (dict(tolerance=1.0), "tolerance"),
                     (dict(life_floor=0), "life_floor"), (dict(replicated_share=0.0), "replicated_share"),
                     (dict(move_steps=-1.0), "move_steps"), (dict(probe=1.0), "probe")):
        with pytest.raises(ConfigError, match=f"ReshardConfig.{name}"):
            ReshardConfig(**kw)
    with pytest.raises(ConfigError, match=r"weights must be a sequence with one entry per plan \(2\), got \(1.0,\)"):
        ReshardPolicy(even_plans(), weights=(1.0,), bytes_per_unit=BYTES)
    with pytest.raises(ConfigError, match="same tp"):
        ReshardPolicy((ShardPlan(units=(2, 2)), ShardPlan(units=(1, 1, 1))), weights=(1, 1), bytes_per_unit=(1, 1))
    pol = policy()
    with pytest.raises(ConfigError, match="ReshardSample"):
        pol.observe((1.0, 1.0))
    with pytest.raises(ConfigError, match="3 ranks"):
        pol.observe(ReshardSample((1.0,) * 3, (0.5,) * 3, (0.0,) * 3))
    pol.observe(sample(pol, (1.0, 1.0)))
    arrays = ReshardSample(np.array([0.4, 0.5]), np.array([0.3, 0.3]), np.array([0.01, 0.02]))  # as profile() takes
    assert arrays == ReshardSample((0.4, 0.5), (0.3, 0.3), (0.01, 0.02))
    with pytest.raises(ConfigError, match=r"compute_s\[1\]"):
        ReshardSample(np.array([0.4, -1.0]), np.array([0.3, 0.3]), np.array([0.01, 0.02]))
    with pytest.raises(ConfigError, match="ReshardSample.compute_s must be a tuple"):
        ReshardSample(np.float64(0.4), (0.3,), (0.01,))
    with pytest.raises(ConfigError, match="before the first step"):
        pol.profile([[0.02, 0.02]])
    assert N_MIN == ReshardConfig().first_steps


@pytest.mark.parametrize("call, said", [
    (lambda: ReshardPolicy(None, weights=WEIGHTS, bytes_per_unit=BYTES), r"plans must be .*, got None"),
    (lambda: ReshardPolicy(ShardPlan(units=(2, 2)), weights=(1.0,), bytes_per_unit=(1,)),
     r"plans must be .*, got ShardPlan\(units=\(2, 2\)"),
    (lambda: ReshardPolicy(even_plans(), weights=5, bytes_per_unit=BYTES), r"weights must be a sequence .*, got 5"),
    (lambda: ReshardPolicy(even_plans(), weights=WEIGHTS, bytes_per_unit=3), r"bytes_per_unit must be .*, got 3"),
    (lambda: ReshardPolicy(even_plans(), weights=(1.0, "x"), bytes_per_unit=BYTES), r"weights\[1\] .*, got 'x'"),
    (lambda: ReshardPolicy(even_plans(), weights=(None, 1.0), bytes_per_unit=BYTES), r"weights\[0\] .*, got None"),
    (lambda: policy().profile([0.02, 0.02]), r"one row of 2 probe times per repeat, got \[0.02, 0.02\]"),
    (lambda: policy().profile([[0.02, "slow"]]), r"times\[0\]\[1\] must be a finite number > 0, got 'slow'"),
    (lambda: policy().moved_to(None, seconds=1.0, bytes_moved=0), r"moved_to: plans must be .*, got None"),
    (lambda: ReshardSample(1.0, (0.5,), (0.0,)), r"ReshardSample.compute_s must be a tuple .*, got 1.0"),
    (lambda: ReshardSample((1.0,), (0.5,), (0.0,), gemm_s=0.5), r"ReshardSample.gemm_s must be a tuple .*, got 0.5"),
    (lambda: ReshardSample(("x",), (0.5,), (0.0,)), r"compute_s\[0\] must be a finite number >= 0, got 'x'"),
    (lambda: ReshardSample((1.0,), (0.5,), (0.0,), step_s="x"), r"step_s must be a finite number >= 0, got 'x'"),
    (lambda: ReshardSample(("1.5",), (0.5,), (0.0,)), r"compute_s\[0\] must be a finite number >= 0, got '1.5'"),
    (lambda: policy().profile(np.array([0.02, 0.02])), r"one row of 2 probe times per repeat, got \[0.02, 0.02\]"),
])
def test_a_policy_input_of_the_wrong_shape_or_type_is_refused_naming_it(call, said):
    """Not a sequence, or an entry that is not a number: a ConfigError naming the value, not a TypeError or
    ValueError from inside ``len`` or ``float``."""
    with pytest.raises(ConfigError, match=said):
        call()


def test_numpy_and_torch_seconds_are_read_as_the_numbers_they_hold():
    """A numpy array of probe times and numpy or torch scalars in a sample are what a caller timing with
    those libraries holds: they give the decision the same floats would."""
    import torch

    rows = [[0.02, 0.08], [0.021, 0.079]]
    assert policy().profile(np.array(rows)) == policy().profile(rows)
    assert policy().profile(torch.tensor(rows, dtype=torch.float64)) == policy().profile(rows)
    got = ReshardSample((np.float32(1.0), torch.tensor(2.0)), (np.float64(0.5), 0.5), (0.0, 0.0))
    assert got.compute_s == (1.0, 2.0) and all(type(v) is float for v in got.compute_s + got.shardable_s)


def test_the_odds_of_one_slow_step_follow_the_counts_of_outliers_and_lasting_slowdowns():
    rates = Rates()
    prior = rates.change_odds()
    assert 0.0 < prior < 0.5  # before any count: outliers are the likelier reading
    rates.rank_steps = 400
    rates.joined(10, {1})
    rates.held(10 + LASTED, {1})  # stayed slow: a slowdown that lasted
    assert rates.slowdowns == 1 and rates.change_odds() > prior
    rates.joined(50, {2})
    rates.left(51, {2})  # left at once: counted as an outlier
    assert rates.outliers == 1 and rates.slowdowns == 1
    assert rates.change_odds(2) > rates.change_odds(1)  # two slow steps in a row are rarer as outliers


def test_two_slow_steps_each_beyond_the_one_step_band_await_the_step_after_them():
    """Two steps in a row on rank 1, each beyond the one-step band, are a change with no step after it yet
    (what a two-step bet prices); two that clear only the two-step band are a change too, but no bet's
    evidence; the step after either confirms it."""
    from semimig.controller.policy.window import Window

    for factor, bettable in ((1.5, True), (1.09, False)):  # sigma 0.04: one-step band 1.127, two-step 1.089
        window = Window(48, 2)
        for _ in range(10):
            window.add(ReshardSample((1.0, 1.0), (0.5, 0.5), (0.0, 0.0)), sigma=0.04)
        window.add(ReshardSample((1.0, factor + 0.003), (0.5, 0.5), (0.0, 0.0)), sigma=0.04)
        assert window.unconfirmed() == {}
        window.add(ReshardSample((1.0, factor + 0.003), (0.5, 0.5), (0.0, 0.0)), sigma=0.04)
        assert window.fresh[1] == 2 and window.unconfirmed() == ({1: 2} if bettable else {}), factor
        window.add(ReshardSample((1.0, factor + 0.003), (0.5, 0.5), (0.0, 0.0)), sigma=0.04)
        assert window.unconfirmed() == {}


@pytest.mark.parametrize("slowdowns", [0, 10])
def test_two_slow_steps_are_bet_on_once_the_run_has_seen_slowdowns_last(slowdowns):
    """Rank 1 at a third of its speed from step 30, outliers common (their odds low for one slow step).
    With no slowdown counted the move waits for the step that confirms the change (step 32); once
    slowdowns were seen to last, two slow steps in a row are bet on (step 31), at their odds (the move
    onto the slow rank at twice a free move's price, its pace)."""
    pol = policy()
    rates = pol.samples.rates
    rates.rank_steps, rates.slowdowns, rates.outliers = 2000, slowdowns, 100
    assert rates.change_odds(1) < 0.15 and (slowdowns == 0 or rates.change_odds(2) > 0.6)
    moves = run(pol, lambda step: (1.0, 1.0 / 3.0 if step >= 30 else 1.0), 40)
    assert [(d.step, d.bet) for d in moves] == ([(32, 0)] if slowdowns == 0 else [(31, 2)])


def test_a_bet_pays_when_the_odds_weigh_its_gain_above_what_being_wrong_costs():
    assert bet_pays(1.0, 1.0, 0.6) and not bet_pays(1.0, 1.0, 0.4)
    assert not bet_pays(10.0, 0.0, 0.0)  # no chance of a change: nothing to gain
    assert bet_pays(0.1, 0.0, 0.01)  # nothing to lose


def test_a_slow_step_many_times_the_reading_is_rarer_as_an_outlier():
    """Outliers stretch a step by a small factor: up to ``OUTLIER_SIZE`` times the reading a slow step is
    priced as any outlier, beyond it as a thinning share of them, so its odds of being a change grow; a run
    whose counted outliers were large prices large steps by them (one of unknown size counts as any)."""
    from semimig.controller.policy.window import OUTLIER_SIZE, outlier_tail

    rates = Rates()
    rates.rank_steps, rates.outliers = 2000, 20
    assert outlier_tail(1.2) == outlier_tail(OUTLIER_SIZE) == 1.0 > outlier_tail(2 * OUTLIER_SIZE) > outlier_tail(8.0)
    assert rates.change_odds(1, size=1.2) == rates.change_odds(1, size=OUTLIER_SIZE) == rates.change_odds(1)
    assert rates.change_odds(1) < rates.change_odds(1, size=5.0) < rates.change_odds(1, size=10.0)
    assert rates.change_odds(2, size=5.0) > rates.change_odds(1, size=5.0)
    small, large = Rates(), Rates()
    for rates, size in ((small, 1.5), (large, 10.0)):
        rates.rank_steps, rates.outliers, rates.sizes = 2000, 40, [size] * 40
    assert small.change_odds(1, size=8.0) > 10 * large.change_odds(1, size=8.0)
    assert large.change_odds(1, size=8.0) < 2 * large.change_odds(1)


def test_the_slowdowns_counted_keep_the_size_of_the_change_that_began_them():
    """A rank 1.6x slower for good: the window's change test reads the size of its slow steps, and the stay
    counted as a slowdown keeps it; a step far beyond that size is then likelier an outlier than another such
    slowdown, one of that size is not (its odds fall by less than half: a step at the slowdown's size is at
    least it half the time), and a run that counted none prices every size alike."""
    from semimig.controller.policy.window import Window

    window = Window(48, 2)
    for step in range(40):
        window.add(ReshardSample((1.0, 1.6 if step >= 20 else 1.0), (0.5, 0.5), (0.0, 0.0)), sigma=0.03)
    rates = window.rates
    rates.joined(20, {1})
    rates.held(20 + LASTED, {1})
    assert rates.slowdowns == 1 and rates.slowdown_sizes == [pytest.approx(1.6)]
    rates.rank_steps, rates.outliers = 2000, 20
    fresh = Rates()
    fresh.rank_steps, fresh.outliers, fresh.slowdowns, fresh.sigma = 2000, 20, 1, 0.03
    assert rates.change_odds(1, size=2.6) < 0.6 * fresh.change_odds(1, size=2.6)
    assert rates.change_odds(1, size=1.6) > 0.5 * fresh.change_odds(1, size=1.6)
    assert fresh.change_odds(1, size=1.6) == fresh.change_odds(1, size=2.6) == fresh.change_odds(1)


def test_a_slowdown_that_began_within_a_step_is_counted_at_its_latest_steps_size():
    """Rank 1 turns 4x slower part-way through step 20 (that step runs 1.6x, a mix of the two paces) and stays:
    the change's steps read 1.6x and 4x, and the slowdown counted keeps the latest step's size, 4x, not the
    straddled step's."""
    from semimig.controller.policy.window import Window

    window = Window(48, 2)
    for step in range(40):
        slow = 1.0 if step < 20 else (1.6 if step == 20 else 4.0)
        window.add(ReshardSample((1.0, slow), (0.5, 0.5), (0.0, 0.0)), sigma=0.03)
    rates = window.rates
    rates.joined(20, {1})
    rates.held(20 + LASTED, {1})
    assert rates.slowdown_sizes == [pytest.approx(4.0)]


def test_a_bet_on_slow_steps_reads_their_rank_at_the_latest():
    """Rank 1's step 20 runs 1.6x (a slowdown beginning within it), step 21 4x: the two make a change with no
    step after them, and the speeds a bet reads take rank 1 at its latest step, 4x, where the window's reading
    of its fresh steps (their lower tercile) is the straddled 1.6x; after one slow step it is that step."""
    from semimig.controller.policy.window import Window

    window = Window(48, 2)
    for step in range(21):
        window.add(ReshardSample((1.0, 1.6 if step == 20 else 1.0), (0.5, 0.5), (0.0, 0.0)), sigma=0.03)
    assert window.pending == (1,) and window.betting() == pytest.approx((1.0, 1.6))
    window.add(ReshardSample((1.0, 4.0), (0.5, 0.5), (0.0, 0.0)), sigma=0.03)
    assert set(window.unconfirmed()) == {1}
    assert window.times()[0] == pytest.approx((1.0, 1.6))
    assert window.betting() == pytest.approx((1.0, 4.0))


def test_a_stay_that_ended_as_an_outlier_leaves_no_size_to_a_later_slowdown():
    """Rank 1's change to 3x slower steps joins the slow set and leaves it at once (an outlier stay); a later
    stay that begins with no change read (a slow drift) and lasts is a slowdown of unknown size, not of the
    outlier's."""
    rates = Rates()
    rates.change_size[1] = 3.0  # the window read the outlier's change
    rates.joined(20, {1})
    rates.left(22, {1})
    rates.joined(40, {1})
    rates.held(40 + LASTED, {1})
    assert rates.outliers == 1 and rates.slowdowns == 1 and rates.slowdown_sizes == []


@pytest.mark.parametrize("counted", [2.6, 1.6])
def test_a_step_larger_than_the_runs_slowdowns_waits_for_the_step_after_it(counted):
    """Rank 1 at 1/2.6 of its speed from step 30, slowdowns seen to last and outliers common.  Where the run's
    slowdowns were that size, two slow steps are bet on (step 31); where they were 1.6x, steps of 2.6x are
    likelier outliers and the move waits for the step that confirms the change (step 32)."""
    import random

    pol = policy()
    rates = pol.samples.rates
    rates.rank_steps, rates.slowdowns, rates.outliers, rates.slowdown_sizes = 2000, 10, 50, [counted] * 10
    moves = run(pol, lambda step: (1.0, 1.0 / 2.6 if step >= 30 else 1.0), 40, noise=0.02, rng=random.Random(0))
    assert [(d.step, d.bet) for d in moves][:1] == ([(31, 2)] if counted == 2.6 else [(32, 0)])


def test_expected_max_is_the_mean_of_the_largest_of_n_normals():
    from semimig.controller.policy.states import expected_max

    largest = np.random.default_rng(0).standard_normal((200_000, 8))
    for n in (2, 4, 8):
        assert expected_max(n) == pytest.approx(float(largest[:, :n].max(axis=1).mean()), abs=0.03)
    assert expected_max(1) == expected_max(0) == 0.0


@pytest.mark.parametrize("tp", [2, 8])
def test_a_recovered_rank_leaves_the_slow_set_read_against_the_fastest_of_many_noisy_readings(tp):
    """Rank 1 slow, then read at 0.90 of the fastest rank, its readings' relative error 7 %: among eight ranks
    the fastest of seven noisy readings stands about 1.36 errors above their speed, so 0.90 is what a recovered
    rank reads and it leaves the set; with one other rank there is no such excess and 0.90 stays below the
    band's edge (0.95).  A rank at 0.80 stays at either size, and joining reads the plain ratio."""
    se = 0.1  # a ratio's relative error: sqrt(2) readings' of 0.071

    def read(ratio_1, slowdown):
        ratios = tuple(ratio_1 if r == 1 else 1.0 for r in range(tp))
        slowdown.update(30, ratios, se=se, tolerance=0.1, z=3.0, samples=10)
        return slowdown.slow

    for recovered, left in ((0.90, tp == 8), (0.80, False)):
        slowdown = Slowdown()
        assert read(0.5, slowdown) == {1}
        assert read(recovered, slowdown) == (frozenset() if left else {1}), (tp, recovered)
    assert read(0.70, Slowdown()) == set()  # above (1 - 0.1)/e^0.3 = 0.67: not slow at any size
    assert read(0.66, Slowdown()) == {1}


@pytest.mark.parametrize("speed", [1.0 / 12.0, 0.5])
def test_a_first_slowdown_far_beyond_any_outlier_is_bet_on_at_its_first_step(speed):
    """The run's first slowdown, on the prior's odds (an outlier three times as likely as a slowdown): rank 1
    at a twelfth of its speed from step 30 is read at a step ten times its reading, beyond what outliers
    reach, and moved on at that step (a bet on one step); at half its speed (twice its reading, an outlier's
    size) the move waits for the step that confirms the change (step 32)."""
    pol = policy()
    assert pol.samples.rates.change_odds(1) < 0.25
    moves = run(pol, lambda step: (1.0, speed if step >= 30 else 1.0), 40)
    assert [(d.step, d.bet) for d in moves][:1] == ([(30, 1)] if speed < 0.5 else [(32, 0)])


def test_a_bet_on_the_first_slow_step_weighs_every_step_it_saves():
    """Rank 1 at a sixth of its speed from step 30, the run's first slowdown: one step's gain alone does not
    pay what a wrong bet costs, but before any slowdown was seen to last two slow steps are not bet on either,
    so waiting costs the steps until the third confirms the change; acting at once saves two, and the move
    follows the first slow step (step 30).  Once slowdowns were seen to last, the next step can be bet on, and
    the first waits for it (step 31, a bet on two)."""
    for slowdowns, expected in ((0, [(30, 1)]), (10, [(31, 2)])):
        pol = policy()
        rates = pol.samples.rates
        if slowdowns:
            rates.rank_steps, rates.slowdowns, rates.outliers = 2000, slowdowns, 40
        moves = run(pol, lambda step: (1.0, 1.0 / 6.0 if step >= 30 else 1.0), 40)
        assert [(d.step, d.bet) for d in moves][:1] == expected, slowdowns


def test_a_window_drifted_where_a_rank_ran_its_last_step_beyond_the_two_step_band_of_its_first():
    from semimig.controller.policy.window import CHANGE_Z, drifted

    def window(times):
        return [ReshardSample((1.0, t), (0.5, 0.5), (0.0, 0.0)) for t in times]
    sigma = 0.02
    band = math.exp(CHANGE_Z * math.sqrt(2.0) * sigma)  # 1.088
    steady, deepening = window([1.0, 1.03, 0.98, 1.02]), window([1.0, 1.05, 1.08, 1.10])
    assert not drifted((steady,), {1}, sigma) and drifted((steady, deepening), {1}, sigma)
    assert not drifted((deepening,), {0}, sigma)  # only the ranks asked about
    assert not drifted((window([1.0, band * 0.99]),), {1}, sigma) and drifted((window([1.0, band * 1.01]),), {1}, sigma)
    assert drifted((window([1.0, 1.0 / (band * 1.01)]),), {1}, sigma)  # faster as well as slower
    assert not drifted((window([1.3]), []), {1}, sigma)  # one step, or none: nothing to compare


@pytest.mark.parametrize("size", [1.3, 1.7])
def test_two_slow_steps_beside_a_slow_rank_are_a_bet_at_their_odds(size):
    """Rank 2 at a quarter of its speed from step 10 (moved for), then rank 0 ``size`` times slower for two steps
    only, in a run whose outliers are common.  Joining the slow set on those two steps alone would take the
    move without their odds; they are a bet like a first slow rank's, and at these odds not taken: no move
    for rank 0, and nothing to move back."""
    pol = policy(tp=4)

    def speeds(step):
        return (1.0 / size if step in (60, 61) else 1.0, 1.0, 0.25 if step >= 10 else 1.0, 1.0)
    moves = run(pol, speeds, 30)
    rates = pol.samples.rates
    rates.rank_steps, rates.outliers = rates.rank_steps + 2000, 400
    moves += run(pol, lambda step: speeds(step + 30), 50)
    assert [d.step for d in moves] == [12] and 0 not in pol.slowdown.slow


def test_ranks_slow_from_the_run_s_first_reading_are_counted_only_when_they_end():
    """The device probe reads rank 1 slow before step 0: while it stays slow nothing was seen to begin, so no
    slowdown is counted (the odds of a slow step being a change rest on onsets; a device slow for the whole
    run tells nothing of how often a rank slows); rank 2 slowing at step 30 and staying is one.  Rank 1's
    slowdown ending at step 40, after lasting, is counted then (one was there and ended), and no outlier; a
    rank read slow at the start that leaves within :data:`LASTED` steps is neither."""
    rates = Rates()
    slowdown = Slowdown(rates)
    kw = dict(se=0.02, tolerance=0.15, z=3.0)
    slowdown.update(-1, (1.0, 0.3, 1.0), samples=10, **kw)
    for step in range(3, 30):
        slowdown.update(step, (1.0, 0.3, 1.0), samples=step + 1, **kw)
    assert slowdown.slow == {1} and rates.slowdowns == 0
    for step in range(30, 40):
        slowdown.update(step, (1.0, 0.3, 0.3), samples=step - 29, **kw)
    assert slowdown.slow == {1, 2} and rates.slowdowns == 1
    slowdown.update(40, (1.0, 1.0, 0.3), samples=1, **kw)
    assert slowdown.slow == {2} and rates.outliers == 0 and rates.slowdowns == 2
    brief = Rates()
    misread = Slowdown(brief)
    misread.update(-1, (1.0, 0.3), samples=N_MIN, **kw)
    assert misread.slow == {1}
    misread.update(1, (1.0, 1.0), samples=1, **kw)
    assert misread.slow == frozenset() and brief.slowdowns == 0 and brief.outliers == 0


def test_stragglers_slow_from_the_start_lend_no_odds_to_bets_on_other_ranks_outliers():
    """tp 8, ranks 2 and 7 at 0.79 and 0.5 of the others' speed from the start, 14 % noise and 3 % outliers: the
    probe's move serves them; the other ranks' single slow steps stay outliers (no bet moves on them)."""
    speeds = [1.0, 1.0, 0.79, 1.0, 1.0, 1.0, 1.0, 0.5]
    scenario = dataclasses.replace(_scenario([speeds] * 200, noise=0.14, kv_units=16), outliers=0.03, seed=1)
    run_ = run_policy(scenario, reshard_policy)
    assert not [reason for *_, reason in run_.plans if "slow step(s)" in reason]
    assert run_.moves <= 3


def test_a_slow_rank_s_recovery_read_before_it_leaves_is_not_the_size_kept_for_its_slowdown():
    """Rank 1 holds at a quarter, then reads half as its recovery begins (still slow): the state before, kept as
    the set changes, holds it within the band of a quarter, the size the risk of its return is priced at."""
    slowdown = Slowdown()
    kw = dict(se=0.02, tolerance=0.15, z=3.0)
    for step in range(3, 12):
        slowdown.update(step, (1.0, 0.25), samples=step - 2, **kw)
    slowdown.update(12, (1.0, 0.5), samples=10, **kw)
    assert slowdown.slow == {1}
    slowdown.update(13, (1.0, 1.0), samples=1, **kw)
    before, ratios = slowdown.previous
    assert before == {1} and ratios[1] == pytest.approx(0.25, rel=0.1)
