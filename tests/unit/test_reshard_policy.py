"""The re-shard policy (DESIGN §8 'When'), pure: synthetic per-rank timing series, no process group.

Each series is generated from the step model itself, ``c_r = (R + S·p_r)/v_r`` with
``R = ρ``, ``S = e·(1 − ρ)`` (a healthy even step is 1 s), ``b_r = S·p_r/v_r`` and a constant
communication time; when the policy decides to move, the simulation moves (the next samples use
the new shares) and reports the move's cost.  The expected plan is the solver's for the true
speeds (:func:`semimig.sharding.solve_plan` on ``StepModel.normalised``), computed independently.
"""
import itertools
import math
import random

import pytest

from semimig.controller.reshard import ReshardConfig, ReshardDecision, ReshardPolicy, ReshardSample, moved_units
from semimig.errors import ConfigError
from semimig.resharder import gemm_scale, unshed
from semimig.sharding import ShardPlan, StepModel, solve_plan

RHO = 0.2      # replicated share of a healthy even step
COMM = 0.05    # seconds in collectives, every rank (the transfers' own time)
MLP_UNITS, KV_UNITS = 32, 4   # the example's tiny Llama h1024: 4096 / 128 blocks, 4 KV groups
BYTES = (1 << 20, 1 << 21)    # per unit moved: MLP block, KV group
FIRST_LAUNCH_STEP = 1  # the launch decides from its second step on (step 0 is the warm-up): steps 0-1 first


def even_plans(tp=2):
    return (ShardPlan.even(MLP_UNITS, tp, unit_size=128), ShardPlan.even(KV_UNITS, tp, unit_size=128))


def policy(config=ReshardConfig(), tp=2):
    # weights: parameters per dimension of a Llama block (MLP 12 h², attention 3 h² with 4 of 8 KV heads)
    return ReshardPolicy(even_plans(tp), weights=(12.0, 3.0), bytes_per_unit=BYTES, config=config)


def expected(speeds):
    model = StepModel.normalised(speeds, replicated_share=RHO)
    floor = ReshardConfig().min_units  # the policy's floor, not the solver's default
    return (solve_plan(model, total_units=MLP_UNITS, unit_size=128, min_units=floor),
            solve_plan(model, total_units=KV_UNITS, unit_size=128, min_units=floor))


def simulate(pol, speeds_at, steps, *, noise=0.0, move_s=0.5, seed=0, gemm=1.0, decisions=None, ran=None,
             by_time=False):
    """Run ``steps`` steps; ``speeds_at(step)`` gives every rank's true speed (``by_time``:
    ``speeds_at(seconds)``, the simulated time at the step's start: a throttle that lasts a time);
    ``gemm`` of the shardable work is timed as GEMMs (the rest: attention, optimizer).
    ``ran(speeds)``: the fraction of the full step a resizing controller ran it at
    (``ReshardSample.step_s``), ``None`` when nothing was shed.  Returns the re-plans (and appends
    every decision to the list ``decisions`` when given)."""
    rng = random.Random(seed)
    e = pol.tp
    R, S = RHO, e * (1.0 - RHO)
    moves = []
    clock = 0.0
    for step in range(steps):
        speeds = speeds_at(clock if by_time else step)
        shares = pol.shares()
        jitter = [math.exp(noise * rng.gauss(0.0, 1.0)) for _ in range(e)]
        compute = tuple((R + S * p) / v * j for p, v, j in zip(shares, speeds, jitter))
        shardable = tuple(gemm * S * p / v * j for p, v, j in zip(shares, speeds, jitter))
        fraction = ran(speeds) if ran is not None else None
        step_s = None if fraction is None else fraction * max(compute) + COMM
        decision = pol.observe(ReshardSample(compute, shardable, (COMM,) * e, step_s=step_s))
        clock += (max(compute) + COMM if step_s is None else step_s) + (move_s if decision.replan else 0.0)
        assert isinstance(decision, ReshardDecision) and decision.step == step
        if decisions is not None:
            decisions.append(decision)
        if decision.replan:
            _, nbytes = pol.moved(decision.plans)
            pol.moved_to(decision.plans, seconds=move_s, bytes_moved=nbytes)
            moves.append((step, decision))
    return moves


def test_stays_slow_replans_once_to_the_expected_plan():
    pol = policy()
    moves = simulate(pol, lambda s: (1.0, 0.25), 300)
    assert len(moves) == 1, [(s, str(d.plans)) for s, d in moves]
    step, decision = moves[0]
    # slow from the run's first steps: the launch decision (steps 0 and 1), the gain over the horizon
    assert step == FIRST_LAUNCH_STEP and decision.horizon == pol.config.horizon
    assert "at launch" in decision.reason
    assert decision.plans == expected((1.0, 0.25))
    assert decision.plans[0].units[1] < decision.plans[0].units[0]
    # predicted against the closed form of the even-split (2/(1/χ)·... ) and uneven steps, plus communication
    model = StepModel.normalised((1.0, 0.25), replicated_share=RHO)
    assert decision.current_s == pytest.approx(model.step((0.5, 0.5)) + COMM, rel=1e-9)
    assert decision.predicted_s < decision.current_s
    assert pol.plans == decision.plans
    # every GEMM timed (gemm=1): the split's R/S is the true one, R / (e·(1 − ρ))
    assert pol.replicated_ratio == pytest.approx(RHO / (2 * (1.0 - RHO)), rel=1e-9)
    # the cost counts the move, the move back and a window of the new plan at healthy speeds
    healthy = StepModel.normalised((1.0, 1.0), replicated_share=RHO)
    overstay = healthy.step(pol.shares(decision.plans)) - healthy.step((0.5, 0.5))
    move = pol.config.latency_s + decision.move_bytes / pol.config.bandwidth_bytes_s
    assert overstay > 0 and decision.move_cost_s == pytest.approx(2 * move + pol.config.window * overstay, rel=1e-9)


def test_stays_slow_with_noise_still_one_replan():
    pol = policy()
    moves = simulate(pol, lambda s: (1.0, 0.25), 300, noise=0.02, seed=3)
    assert len(moves) == 1
    # at launch the model is one step's (step 1): within a unit of the true plan
    want = expected((1.0, 0.25))
    assert all(abs(a - b) <= 1 for p, q in zip(moves[0][1].plans, want) for a, b in zip(p.units, q.units))
    pol = policy(ReshardConfig(launch=0))  # from the first window's medians: the plan itself
    moves = simulate(pol, lambda s: (1.0, 0.25), 300, noise=0.02, seed=3)
    assert len(moves) == 1 and moves[0][1].plans == expected((1.0, 0.25))


def test_move_that_does_not_pay_waits_for_age():
    # an expensive move (predicted from bytes at a slow link) pays only once the state is old enough
    # (no launch decision: it counts the horizon, not the age)
    # 14 MiB / 0.1 MB/s ≈ 147 s; gain 4 - 1.6 s/step: 62 steps
    slow_link = ReshardConfig(bandwidth_bytes_s=1e5, launch=0)
    pol = policy(slow_link)
    moves = simulate(pol, lambda s: (1.0, 0.25), 300)
    assert len(moves) == 1
    step, decision = moves[0]
    assert decision.move_cost_s > (decision.current_s - decision.predicted_s) * pol.config.window
    assert decision.horizon * (decision.current_s - decision.predicted_s) > decision.move_cost_s
    assert step > pol.config.window - 1


def test_come_and_go_does_not_replan_when_the_gain_does_not_pay():
    # 20 slow / 40 fast steps: a slow state is never older than 20 steps, 20 x gain < the move's cost
    # (no launch decision: a throttle on at launch is taken for a slow device, tested below)
    cfg = ReshardConfig(window=10, bandwidth_bytes_s=1e5, launch=0)  # ≈ 147 s a move, gain ≈ 2.4 s/step: 48 s
    pol = policy(cfg)
    moves = simulate(pol, lambda s: (1.0, 0.25) if s % 60 < 20 else (1.0, 1.0), 600, noise=0.01)
    assert moves == []
    # the same straggler staying: the age grows and the move pays
    pol = policy(cfg)
    assert len(simulate(pol, lambda s: (1.0, 0.25), 600, noise=0.01)) == 1


def test_noise_never_replans():
    pol = policy()
    assert simulate(pol, lambda s: (1.0, 1.0), 500, noise=0.05, seed=1) == []
    pol = policy()
    assert simulate(pol, lambda s: (1.0, 1.0), 500, noise=0.3, seed=2) == []
    assert all(p.is_even for p in pol.plans)


def test_no_straggler_never_replans_tp4():
    pol = policy(tp=4)
    assert simulate(pol, lambda s: (1.0,) * 4, 300, noise=0.03) == []


@pytest.mark.parametrize("return_steps", [0, 4])
def test_recovery_replans_back_to_even(return_steps):
    pol = policy(ReshardConfig(return_steps=return_steps))
    recover = 150
    moves = simulate(pol, lambda s: (1.0, 0.25) if s < recover else (1.0, 1.0), 400)
    assert len(moves) == 2
    (first, d1), (second, d2) = moves
    assert d1.plans == expected((1.0, 0.25))
    assert all(p.is_even for p in d2.plans)
    if return_steps:  # the way back: return_steps samples with no slow rank
        assert recover + return_steps - 1 <= second <= recover + return_steps, (second, d2.reason)
    else:  # the window rule: a window mostly (agree = 75 %) of the recovered speed first
        assert second >= recover + math.ceil(pol.config.agree * pol.config.window) - 1
    assert all(p.is_even for p in pol.plans)


def test_hysteresis_dwell_and_margin():
    # a mild straggler whose best plan is within the margin: never moves
    pol = policy(ReshardConfig(margin=0.05))
    assert simulate(pol, lambda s: (1.0, 0.96), 300) == []
    # speeds that flip every 2*window+5 steps between two stable states: at most one move per dwell
    cfg = ReshardConfig(window=10, dwell=100)
    pol = policy(cfg)
    moves = simulate(pol, lambda s: (1.0, 0.25) if (s // 25) % 2 == 0 else (1.0, 0.5), 400)
    steps = [s for s, _ in moves]
    assert all(b - a >= 100 for a, b in zip(steps, steps[1:])), steps


def test_measured_move_cost_replaces_the_estimate():
    pol = policy()
    simulate(pol, lambda s: (1.0, 0.25), 40, move_s=2.05)
    assert pol.seconds_per_byte is not None
    units, nbytes = pol.moved(even_plans())
    assert pol._move_cost(nbytes) == pytest.approx(pol.config.latency_s + 2.0 * nbytes / pol.history[0].move_bytes)


def test_moved_units_counts_changed_owners():
    even = ShardPlan(units=(4, 4))
    assert moved_units(even, ShardPlan(units=(6, 2))) == 2
    assert moved_units(ShardPlan(units=(2, 3, 3)), ShardPlan(units=(3, 3, 2))) == 2
    assert moved_units(even, even) == 0
    with pytest.raises(ConfigError, match="same dimension"):
        moved_units(even, ShardPlan(units=(4, 5)))


@pytest.mark.parametrize("first", [0, 2, 5, 20])
def test_the_first_move_waits_for_the_first_window_and_later_moves_for_the_full_one(first):
    """A straggler from the start moves after ``first_steps`` samples; once it leaves, the move back
    needs a full window of the new state (and the dwell), whatever the first window was."""
    pol = policy(ReshardConfig(window=20, first_window=first, launch=0, return_steps=0))
    moves = simulate(pol, lambda s: (1.0, 0.25) if s < 100 else (1.0, 1.0), 300)
    # not before the first window; after it as soon as gain x age pays the move and its revert (6 steps here)
    first = pol.config.warmup + pol.config.first_steps - 1
    assert first <= moves[0][0] <= max(first, pol.config.warmup + 5)
    assert pol.config.first_steps == (first or 10)
    assert len(moves) == 2 and moves[1][1].plans == even_plans()
    # ``agree`` of a full window must be of the new state (the rest count as outliers)
    assert moves[1][0] >= 100 + math.ceil(pol.config.agree * pol.config.window) - 1


def test_a_short_first_window_does_not_move_on_noise_or_a_mild_straggler():
    for seed in range(5):
        pol = policy(ReshardConfig(window=20, first_window=3))
        assert simulate(pol, lambda s: (1.0, 1.0), 200, noise=0.08, seed=seed) == []
        pol = policy(ReshardConfig(window=20, first_window=3))
        assert simulate(pol, lambda s: (1.0, 0.97), 200, noise=0.03, seed=seed) == []


@pytest.mark.parametrize("launch", [2, 4])
def test_slow_from_the_start_moves_at_launch_and_a_passing_slowdown_is_moved_back(launch):
    """The launch decision bets that a rank slow from the start stays; when it recovers at step 15
    the revert follows ``return_steps`` samples of the recovered speeds (or, without the way back,
    a window of them), and nothing else moves."""
    for return_steps in (0, 4):
        pol = policy(ReshardConfig(window=10, launch=launch, return_steps=return_steps))
        moves = simulate(pol, lambda s: (1.0, 0.25) if s < 15 else (1.0, 1.0), 200, noise=0.02)
        assert [s for s, _ in moves][:1] == [FIRST_LAUNCH_STEP], [(s, d.reason) for s, d in moves]
        assert moves[0][1].plans == expected((1.0, 0.25))
        assert len(moves) == 2 and moves[1][1].plans == even_plans()
        back = return_steps or math.ceil(pol.config.agree * pol.config.window)
        assert 15 + back - 1 <= moves[1][0] <= 15 + (return_steps or 2 * pol.config.window), return_steps


def test_a_launch_move_is_moved_back_after_one_window_not_the_dwell():
    """The throttle of a 40 s on / 40 s off pattern was on for the run's first 3 steps only: the
    launch moved after its last step and the move back follows one window of the recovered speeds,
    not the 2W dwell a move decided on a window's evidence keeps."""
    cfg = ReshardConfig(window=10, return_steps=0)  # the dwell rule alone (the way back is tested below)
    pol = policy(cfg)
    moves = simulate(pol, lambda s: (1.0, 0.25) if s < 3 else (1.0, 1.0), 60, noise=0.02)
    launched = FIRST_LAUNCH_STEP
    assert [s for s, _ in moves][:1] == [launched] and len(moves) == 2, [(s, d.reason) for s, d in moves]
    assert moves[1][1].plans == even_plans()
    back = moves[1][0]
    assert back < launched + cfg.min_dwell, back  # the dwell alone would have held the plan 2W steps
    assert back >= 3 + math.ceil(cfg.agree * cfg.window) - 1  # a window (agree of it) of the new speeds
    # the control: a move whose gain was counted over at least the dwell keeps the full dwell (a
    # first move priced at 0.5 MB/s pays only once the state is old)
    pol = policy(ReshardConfig(window=10, launch=0, bandwidth_bytes_s=5e5, return_steps=0))
    moves = simulate(pol, lambda s: (1.0, 0.25) if s < 60 else (1.0, 1.0), 160, noise=0.02)
    assert len(moves) == 2 and moves[0][1].horizon >= cfg.min_dwell, [(s, d.reason) for s, d in moves]
    assert moves[1][0] - moves[0][0] >= cfg.min_dwell, [s for s, _ in moves]


def test_a_move_on_a_young_state_is_moved_back_after_one_window_not_the_dwell():
    """A move whose gain was counted over fewer steps than the dwell is a bet like the launch's: it
    may come, with a few steps' expected life, as its episode ends, and the 2W dwell would then hold
    the uneven plan through a healthy phase.  Here the way back comes one window after the move."""
    cfg = ReshardConfig(window=10, launch=0, return_steps=0)  # the dwell rule alone
    pol = policy(cfg)
    moves = simulate(pol, lambda s: (1.0, 0.25) if s < 12 else (1.0, 1.0), 80, noise=0.02)
    assert len(moves) == 2 and moves[0][1].horizon < cfg.min_dwell, [(s, d.reason) for s, d in moves]
    assert moves[1][1].plans == even_plans()
    assert moves[1][0] - moves[0][0] < cfg.min_dwell, [s for s, _ in moves]
    assert moves[1][0] >= 12 + math.ceil(cfg.agree * cfg.window) - 1  # a window (agree of it) of the new speeds


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("lift", [3, 10, 30])
def test_an_uneven_plan_goes_back_within_return_steps_of_the_lift(lift, seed):
    """A throttle on from the training's start: the launch moves for rank 1 at 1/4 speed; when the
    throttle lifts the uneven plan makes rank 0 the slow one, so the plan goes back after
    ``return_steps`` samples with no slow rank (not after a whole window of the new speeds, each of
    its steps well above an even one), whatever the dwell — half as many (2) within a window of the
    launch move, a bet placed on little evidence (a lift right after it would otherwise hold the
    uneven plan for several free steps); nothing else moves."""
    cfg = ReshardConfig(window=10)
    pol = policy(cfg)
    # move_s: 0.1 s a move (the simulation's cost does not scale with the bytes: a one-unit refinement
    # priced at 0.5 s would price the way back's 14 units above its gain over a window)
    moves = simulate(pol, lambda s: (1.0, 0.25) if s < lift else (1.0, 1.0), lift + 60, noise=0.05, seed=seed,
                     move_s=0.1)
    # a one-unit refinement of the launch plan may come between
    moves = [(s, d) for s, d in moves if s >= lift or s == FIRST_LAUNCH_STEP]
    assert [s for s, _ in moves] == [FIRST_LAUNCH_STEP, moves[1][0]] and moves[1][1].plans == even_plans(), \
        [(s, d.reason) for s, d in moves]
    young = lift - FIRST_LAUNCH_STEP <= cfg.window  # the lift comes within a window of the bet
    needed = max(2, cfg.return_steps // 2) if young else cfg.return_steps
    assert lift + needed - 1 <= moves[1][0] <= lift + needed + 1, (moves[1][0], needed)
    assert moves[1][1].reason.startswith(f"no rank slow over the last {needed} steps")


@pytest.mark.parametrize("seed", range(3))
def test_the_way_back_moves_to_the_more_even_plan_the_recent_steps_propose(seed):
    """A recovered rank that holds 3 of 32 MLP blocks runs its small GEMMs at ~0.86 of the other's
    speed, so its model proposes 17/15 rather than 16/16, and a way back that insisted on the even
    plan would never fire (leaving it to the window rule, a window after the lift).  Here rank 1
    recovers to 0.86 (within the tolerance, so no sample shows it slow): the way back moves to the
    solver's plan for (1, 0.86) within return_steps of the lift."""
    cfg = ReshardConfig(window=10)
    pol = policy(cfg)
    lift = 12
    moves = simulate(pol, lambda s: (1.0, 0.25) if s < lift else (1.0, 0.86), 60, noise=0.03, seed=seed,
                     move_s=0.1)
    later = [(s, d) for s, d in moves if s >= lift]
    assert moves[0][0] == FIRST_LAUNCH_STEP and later, [(s, d.reason) for s, d in moves]
    back, decision = later[0]
    assert back <= lift + cfg.return_steps and decision.reason.startswith("no rank slow"), (back, decision.reason)
    # the solver's plan for (1, 0.86), or the even one where four samples' noise cannot tell them apart
    want = expected((1.0, 0.86))
    assert max(pol.shares(decision.plans)) <= max(pol.shares(want)) + 1.0 / MLP_UNITS, (decision.plans, want)
    assert max(pol.shares(decision.plans)) < max(pol.shares(moves[0][1].plans))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("speed", [0.25, 0.6, 0.8])
def test_the_way_back_never_undoes_a_plan_for_a_rank_that_is_still_slow(speed, seed):
    """A rank that stays slow (mildly: 0.8 is within the tolerance, so no sample shows it slow)
    keeps the plan solved for it: the way back moves only to the plan the recent samples propose."""
    pol = policy(ReshardConfig(window=10))
    moves = simulate(pol, lambda s: (1.0, speed), 200, noise=0.05, seed=seed)
    # (the window rule may refine the plan by a unit once R/S is measured across the first move)
    assert all(d.plans != even_plans() and not d.reason.startswith("no rank slow") for _, d in moves), \
        [(s, d.reason) for s, d in moves]


def test_launch_does_not_move_on_one_ranks_slow_first_step_or_without_a_straggler():
    """Step 0 is where start-up lands unevenly (one rank's imports, first-touch allocations): a
    rank 3x slower at step 0 is the warm-up the launch does not read, and nothing moves; nor with
    two launch steps, where it makes them disagree."""
    for slow, launch in itertools.product((0, 1), (2, 3)):
        spike = tuple(1.0 / 3.0 if r == slow else 1.0 for r in range(2))
        pol = policy(ReshardConfig(window=10, launch=launch))
        assert simulate(pol, lambda s: spike if s == 0 else (1.0, 1.0), 100, noise=0.02) == []
        assert all(p.is_even for p in pol.plans)
    for seed in range(10):  # healthy with noise: the two-sample noise gate asks for a large gain
        pol = policy(ReshardConfig(window=10))
        assert simulate(pol, lambda s: (1.0, 1.0), 30, noise=0.1, seed=seed) == []
    # the control: the same launch with the straggler there moves at once
    pol = policy(ReshardConfig(window=10))
    assert [s for s, _ in simulate(pol, lambda s: (1.0, 0.25), 30, noise=0.1)] in ([[s] for s in range(FIRST_LAUNCH_STEP, pol.config.launch)])


def test_launch_reads_the_noise_after_the_warm_up_so_a_slow_step_0_on_every_rank_still_moves():
    """Step 0 runs 1.36x rank 0's step 1 and 1.20x rank 1's (first-touch allocations, not noise), as
    under a 25 % CPU throttle; a noise gate over the raw steps 0-1 would ask a 61 % gain of a 57 %
    one and keep the plan.  The start moves at launch, with three launch steps (the tests read steps
    1-2) and with two (the noise relative to the fastest rank: the warm-up slows both)."""
    def start(step):
        return (1.0 / 1.36, 0.25 / 1.20) if step == 0 else (1.0, 0.25)

    for launch in (2, 3):
        pol = policy(ReshardConfig(window=10, launch=launch))
        moves = simulate(pol, start, 30, noise=0.02)
        assert [s for s, _ in moves] == [FIRST_LAUNCH_STEP], [(s, d.reason) for s, d in moves]
        assert "at launch" in moves[0][1].reason and moves[0][1].plans == expected((1.0, 0.25))


def test_launch_noise_is_relative_so_a_warm_up_every_rank_shares_still_moves():
    """Rank 1 at about half speed (a noisy neighbour) and both ranks 14-16 % slower at step 1 than at
    step 2 — the warm-up does not end on one step — so a noise gate over the raw times would ask 29 %
    of a 24 % gain.  Relative to the fastest rank that drift cancels and the launch moves; a rank
    that is slow at one launch step only still moves nothing (its ratio is noise)."""
    def warming(step):  # rank 1 at 0.6: a gain of about a quarter of the step
        slower = {0: 1.3, 1: 1.16}.get(step, 1.0)
        return (1.0 / slower, 0.6 / slower)

    decisions = []
    pol = policy(ReshardConfig(window=10))
    moves = simulate(pol, warming, 30, decisions=decisions)
    assert [s for s, _ in moves] == [FIRST_LAUNCH_STEP], [(d.step, d.reason) for d in decisions[:4]]
    assert moves[0][1].plans == expected((1.0, 0.6))
    pol = policy(ReshardConfig(window=10))
    assert simulate(pol, lambda s: (1.0, 0.6) if s == 1 else (1.0, 1.0), 30) == []


def _pattern(on, off, start=0, then_stays=None):
    """Rank 1 at 1/4 speed for ``on`` steps, healthy for ``off``, repeating; slow for good from ``then_stays``."""
    def speeds(step):
        if then_stays is not None and step >= then_stays:
            return (1.0, 0.25)
        return (1.0, 0.25) if step >= start and (step - start) % (on + off) < on else (1.0, 1.0)
    return speeds


def test_a_throttle_that_came_and_went_is_not_re_planned_for_again():
    """10 slow steps in 60, repeating: the first episode (no history yet) may move and move back;
    once an episode has ended, a new one of the same length is not worth a move."""
    pol = policy(ReshardConfig(window=10))
    moves = simulate(pol, _pattern(10, 50), 600, noise=0.03)
    toward_uneven = [s for s, d in moves if d.plans != even_plans()]
    assert all(s < 60 for s in toward_uneven), [(s, str(d.plans)) for s, d in moves]
    assert len(pol.episodes) >= 9 and all(9 <= n <= 11 for n in pol.episodes), pol.episodes
    assert not moves or moves[-1][1].plans == even_plans()


def test_a_straggler_that_then_stays_is_re_planned_for_once_it_outlives_the_past_episodes():
    pol = policy(ReshardConfig(window=10))
    moves = simulate(pol, _pattern(7, 53, start=20, then_stays=140), 400, noise=0.03)
    assert moves, "the straggler that stayed from step 140 was never re-planned for"
    want = expected((1.0, 0.25))  # within a unit: R/S is re-measured across the earlier moves
    assert all(abs(a - b) <= 1 for p, q in zip(pol.plans, want) for a, b in zip(p.units, q.units)), pol.plans
    late = [s for s, d in moves if s >= 140]
    assert late and 140 + 7 <= late[0] <= 140 + 30, [(s, str(d.plans)) for s, d in moves]


def test_without_the_episode_history_a_repeating_throttle_is_moved_for_every_time():
    """The control: the same pattern with the age rule alone re-plans in later episodes too
    (so the test above shows what the history changes)."""
    pol = policy(ReshardConfig(window=10))
    pol._expected_life = lambda age: age  # the age rule only
    moves = simulate(pol, _pattern(10, 50), 600, noise=0.03)
    assert len([s for s, d in moves if d.plans != even_plans() and s >= 60]) >= 1


def test_refusals_name_the_input():
    with pytest.raises(ConfigError, match="ReshardConfig.window"):
        ReshardConfig(window=1)
    with pytest.raises(ConfigError, match="ReshardConfig.first_window"):
        ReshardConfig(window=10, first_window=1)
    with pytest.raises(ConfigError, match="ReshardConfig.first_window"):
        ReshardConfig(window=10, first_window=11)
    with pytest.raises(ConfigError, match="ReshardConfig.launch.*got 1"):
        ReshardConfig(launch=1)
    with pytest.raises(ConfigError, match="ReshardConfig.launch"):
        ReshardConfig(window=10, launch=11)
    with pytest.raises(ConfigError, match="ReshardConfig.tolerance"):
        ReshardConfig(tolerance=0.0)
    with pytest.raises(ConfigError, match="ReshardConfig.return_steps.*got 1"):
        ReshardConfig(return_steps=1)
    with pytest.raises(ConfigError, match="ReshardConfig.return_steps"):
        ReshardConfig(window=10, return_steps=11)
    assert ReshardConfig(window=3).return_steps == 2 and ReshardConfig().return_steps == 2
    with pytest.raises(ConfigError, match="weights"):
        ReshardPolicy(even_plans(), weights=(1.0,), bytes_per_unit=BYTES)
    with pytest.raises(ConfigError, match="same tp"):
        ReshardPolicy((ShardPlan(units=(2, 2)), ShardPlan(units=(1, 1, 1))), weights=(1, 1), bytes_per_unit=(1, 1))
    with pytest.raises(ConfigError, match="one entry per rank"):
        ReshardSample((1.0, 1.0), (0.5,), (0.0, 0.0))
    with pytest.raises(ConfigError, match=r"compute_s\[1\]"):
        ReshardSample((1.0, -1.0), (0.5, 0.5), (0.0, 0.0))
    pol = policy()
    with pytest.raises(ConfigError, match="3 ranks"):
        pol.observe(ReshardSample((1.0,) * 3, (0.5,) * 3, (0.0,) * 3))


def test_identical_inputs_identical_decisions():
    # every rank runs its own policy on the same all-gathered numbers: the same decisions, step for step
    a, b = policy(), policy()
    ra = simulate(a, lambda s: (1.0, 0.3) if s > 30 else (1.0, 1.0), 200, noise=0.02, seed=7)
    rb = simulate(b, lambda s: (1.0, 0.3) if s > 30 else (1.0, 1.0), 200, noise=0.02, seed=7)
    assert [(s, d.plans) for s, d in ra] == [(s, d.plans) for s, d in rb] and ra


def test_a_move_measures_the_shardable_work_the_gemms_do_not_show():
    # only 60 % of the shardable work is timed as GEMMs: the split overstates R/S, so the first
    # plan leaves the slow rank less than the optimum; the move measures R/S exactly; the first
    # plan is then within the margin of the optimum (no second move for it), and recovery goes
    # back to exactly even
    pol = policy()
    moves = simulate(pol, lambda s: (1.0, 0.25) if s < 200 else (1.0, 1.0), 400, gemm=0.6)
    assert pol.measured_k == pytest.approx(RHO / (2 * (1 - RHO)), rel=1e-9)  # R/S of the generator
    (_, first), (_, back) = moves
    best = expected((1.0, 0.25))
    assert first.plans[0].units[1] < best[0].units[1]
    truth = StepModel.normalised((1.0, 0.25), replicated_share=RHO)
    assert truth.step(pol.shares(first.plans)) <= (1 + pol.config.margin) * truth.step(pol.shares(best))
    assert all(p.is_even for p in back.plans) and all(p.is_even for p in pol.plans)


def test_a_measured_replicated_share_above_the_splits_bound_is_capped():
    """The GEMM split bounds R/S from above (the timed GEMMs are only part of the shardable work);
    a move's measurement above it (noise of two short windows) must not make the slow rank look fast."""
    pol = policy()
    samples = [ReshardSample((1.0, 4.0), (0.8, 3.2), (COMM, COMM)) for _ in range(5)]
    bound = 0.2 * 0.5 / 0.8
    model, _ = pol.model(samples)
    assert math.isclose(model.replicated / model.shardable, bound)
    pol.measured_k = 0.05
    model, _ = pol.model(samples)
    assert math.isclose(model.replicated / model.shardable, 0.05)
    pol.measured_k = 0.6
    model, _ = pol.model(samples)
    assert math.isclose(model.replicated / model.shardable, bound)
    assert model.speeds[1] / model.speeds[0] == pytest.approx(0.25)


@pytest.mark.parametrize("S,f,w", [(1.0, 0.0, 0.22), (2.6, 0.1, 0.22), (0.54, 0.3, 0.5), (1.0, 0.05, 0.999)])
def test_unshed_scales_a_pruned_steps_gemm_seconds_to_full_work(S, f, w):
    """The policy sees a pruning rank at full work from the step itself: with the controller's
    model ``b = S·(f + (1 − f)·w)`` the full work's ``S`` comes back, and the rest of the compute
    (attention, optimizer: ``rest``) is kept."""
    rest = 0.3
    b = S * (f + (1.0 - f) * w)
    c, s = unshed(b + rest, b, sleep_s=0.0, work=w, fixed=f)
    assert s == pytest.approx(S, rel=1e-12) and c == pytest.approx(S + rest, rel=1e-12)
    # nothing shed, or nothing timed: as measured
    assert unshed(b + rest, b, sleep_s=0.0, work=1.0, fixed=f) == (b + rest, b)
    assert unshed(rest, 0.0, sleep_s=0.0, work=w, fixed=f) == (rest, 0.0)


def test_unshed_without_a_fitted_fixed_fraction_and_under_an_emulated_sleep():
    # no estimate yet (NaN) or a nonsense one: the proportional model, b / w
    for f in (math.nan, -0.1, 1.0):
        assert unshed(1.0, 0.25, sleep_s=0.0, work=0.5, fixed=f) == pytest.approx((1.25, 0.5))
    # an emulated whole-device straggler: half of the compute is its sleep, so the extra work is slowed 2x
    assert unshed(2.0, 0.25, sleep_s=1.0, work=0.5, fixed=0.0) == pytest.approx((2.5, 0.75))


def test_a_move_measured_slower_is_undone_and_not_tried_again_while_the_episode_lasts():
    """Under a real CPU throttle a rank that waits for the others reads faster than it runs once it
    holds more work (module docstring, "A move measured slower").  Rank 1 reads 0.35 of rank 0's
    speed while it holds at most 12 % of the work, 0.2 above: the window rule moves toward even on the
    fast reading, the next window measures the step slower, and the plan goes back to the one it
    left, once, and stays; when the straggler leaves, the rejection is forgotten."""
    pol = policy(ReshardConfig(window=10))
    gone = 60

    rejected_while_slow = []

    def speeds(step):
        if step == gone - 1:
            rejected_while_slow.extend(pol.rejected)
        if step >= gone:
            return (1.0, 1.0)
        return (1.0, 0.35 if pol.shares()[1] <= 0.12 else 0.2)

    moves = simulate(pol, speeds, gone + 30)
    later = [(s, d) for s, d in moves if s >= gone]
    moves = [(s, d) for s, d in moves if s < gone]
    plans = [d.plans for _, d in moves]
    assert len(moves) == 3, [(s, d.reason) for s, d in moves]
    (launch_step, launch), (toward_step, toward), (back_step, back) = moves
    assert "at launch" in launch.reason and max(pol.shares(toward.plans)) < max(pol.shares(launch.plans))
    # undone at the first full window under the slower plan, back to exactly the plan it left
    assert back_step == toward_step + pol.config.window + pol.config.warmup
    assert back.plans == launch.plans and "measured slower" in back.reason
    assert len(back.speed_ratios) == 2 and back.speed_ratios[0] == 1.0 and back.speed_ratios[1] < 0.75
    assert back.current_s > back.predicted_s * (1.0 + pol.config.margin)  # measured after vs before the move
    assert rejected_while_slow == [toward.plans]
    assert plans.count(toward.plans) == 1 and pol.history[2] is back  # proposed again since, never taken
    assert back_step + 2 * pol.config.window < gone  # ...over two windows and more
    # the straggler leaves: the way back evens the plan out and forgets the rejection
    assert later and all(p.is_even for p in later[-1][1].plans), [(s, d.reason) for s, d in later]
    assert pol.rejected == set()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_way_back_is_not_undone_when_the_straggler_comes_back_in_its_window(seed):
    """A straggler that comes and goes: slow at the launch, the launch move, the way back, then the
    straggler back within the first window under the even plan.  That window reads "slower", but
    the way back was decided with no rank slow, so a slow rank in its window is the straggler's
    return, left to the window rule (here: too short to be stable, so no move) — with or without
    resizing's shorter steps; undoing the way back would hold the uneven plan past the next lift.
    (Here slow 0-3, the way back at 5 after two free samples, the first window 7-16 with 6 of 10
    slow.)"""
    slow = {0, 1, 2, 3, *range(11, 18), *range(40, 46)}
    for ran in (None, _shed_while_slow):
        pol, decisions = policy(ReshardConfig(window=10)), []
        moves = simulate(pol, lambda step: (1.0, 0.25) if step in slow else (1.0, 1.0), 70, noise=0.03,
                         seed=seed, ran=ran, decisions=decisions)
        assert [s for s, _ in moves][:2] == [FIRST_LAUNCH_STEP, 5], [(s, d.reason) for s, d in moves]
        assert "toward even" in moves[1][1].reason
        assert not any("measured slower" in d.reason for d in decisions), [(s, d.reason) for s, d in moves]
        assert [s for s, _ in moves if 5 < s < 40] == [], [(s, d.reason) for s, d in moves]
        assert decisions[16].reason.startswith("speeds not stable")  # the window rule read it, not the undo


def test_no_move_is_undone_when_the_speeds_are_what_the_model_reads():
    """The control: speeds independent of the plan (the model's assumption), with noise; every
    move measures what it predicted within the noise, and none is undone."""
    for seed in range(4):
        pol = policy(ReshardConfig(window=10))
        moves = simulate(pol, lambda s: (1.0, 0.25) if s < 80 else (1.0, 1.0), 140, noise=0.03, seed=seed)
        assert moves and not any("measured slower" in d.reason for _, d in moves), [(s, d.reason) for s, d in moves]
        assert pol.rejected == set()


def test_the_resizing_scale_is_the_gemms_split_not_the_shardable_one():
    """Under an uneven plan a rank's share of the spans between a pair's layers (the attention core)
    is not its share of the GEMMs; the resizing controller divides its GEMM busy time by the scale,
    so the scale is the GEMMs' own split.  On the example's tiny Llama at `7,1:3,1` a scale from
    GEMMs + spans reads the balanced rank 1 at ~1.27x, and resizing would prune it."""
    samples = [ReshardSample((1.0, 1.0), (0.5 + g, 0.3 + 2 * g), (0.1, 0.1), gemm_s=(0.4, 0.1 + 0.01 * g))
               for g in (0.0, 0.01, 0.02)]
    assert gemm_scale(samples, 2) == pytest.approx((0.4 / 0.1001, 1.0))  # medians 0.4, 0.1001 (the spans: 0.51, 0.32)
    assert gemm_scale([], 2) == (1.0, 1.0)
    # without gemm_s (a sample built by hand) the shardable split stands in
    assert gemm_scale([ReshardSample((1.0, 1.0), (0.5, 0.25), (0.1, 0.1))], 2) == pytest.approx((2.0, 1.0))
    for short in ((0.4,), ()):
        with pytest.raises(ConfigError, match="gemm_s"):
            ReshardSample((1.0, 1.0), (0.5, 0.5), (0.0, 0.0), gemm_s=short)
    with pytest.raises(ConfigError, match=r"gemm_s\[1\]"):
        ReshardSample((1.0, 1.0), (0.5, 0.5), (0.0, 0.0), gemm_s=(0.4, -0.1))


def test_launch_decides_at_step_1_and_again_at_step_2_when_the_first_keeps_the_plan():
    """The launch decides on steps 0-1 (relative to the fastest rank, a warm-up every rank shares
    cancels), so a rank slow from the start costs one step at the full slowdown fewer; when step 1
    keeps the plan (here the slowdown starts at step 1: step 0 alone predicts no gain, and the ratios
    of the two steps are far apart) the third launch step decides on steps 1-2."""
    for seed in range(6):  # 2 % noise: at step 1 in every seed
        pol = policy(ReshardConfig(window=10))
        assert [s for s, _ in simulate(pol, lambda s: (1.0, 0.25), 30, noise=0.02, seed=seed)] == [1]

    def from_step_1(step):
        return (1.0, 1.0) if step == 0 else (1.0, 0.25)

    decisions = []
    pol = policy(ReshardConfig(window=10))
    moves = simulate(pol, from_step_1, 30, noise=0.02, decisions=decisions)
    assert not decisions[1].replan, decisions[1].reason
    assert [s for s, _ in moves] == [2] and "at launch" in moves[0][1].reason, [(d.step, d.reason) for d in decisions[:3]]
    # launch=2 is the step-1 decision alone: declined there, a window decides
    pol = policy(ReshardConfig(window=10, launch=2))
    assert [s for s, _ in simulate(pol, from_step_1, 30, noise=0.02)][:1] == [5]


def test_launch_steps_that_each_predict_a_large_gain_move_at_step_1_whatever_their_spread():
    """A throttle that attaches while step 0 runs: rank 1's compute 2.96x the other's at step 0 and
    3.94x at step 1; the relative noise gate over the two asks 56 % of a 55 % gain.  Each step alone
    predicts a gain of at least ``probe`` (25 %), so the gate asks only the margin and the launch
    moves at step 1 — also at 10 % noise per step, where the noise gate would ask 66 % of 59 %.
    With ``probe=0`` the noise gate decides alone (step 2, or the first window with two launch
    steps)."""
    def onset(step):
        return (1.0, 1 / 2.96) if step == 0 else (1.0, 1 / 3.94)

    for launch in (2, 3):
        decisions = []
        pol = policy(ReshardConfig(window=10, launch=launch))
        moves = simulate(pol, onset, 30, noise=0.02, decisions=decisions)
        assert [s for s, _ in moves] == [1], [(d.step, d.reason) for d in decisions[:3]]
        assert "every launch step alone" in moves[0][1].reason
        assert moves[0][1].plans == expected((1.0, 1 / 3.94))
    pol = policy(ReshardConfig(window=10))
    assert [s for s, _ in simulate(pol, lambda s: (1.0, 0.25), 30, noise=0.1, seed=0)] == [1]
    for launch, first in ((3, 2), (2, 5)):
        decisions = []
        pol = policy(ReshardConfig(window=10, launch=launch, probe=0.0))
        moves = simulate(pol, onset, 30, noise=0.02, decisions=decisions)
        assert "within the margin" in decisions[1].reason, decisions[1].reason
        assert [s for s, _ in moves][:1] == [first], [(d.step, d.reason) for d in decisions[:6]]


def test_no_launch_decision_reads_warm_up_steps_alone():
    """With two warm-up steps the launch cannot decide at step 1 (steps 0-1 are both warm-up): its
    first decision is at step 2, on a step past the warm-up; with one it decides at step 1."""
    for warmup, first in ((1, 1), (2, 2)):
        pol = policy(ReshardConfig(window=10, warmup=warmup))
        assert [s for s, _ in simulate(pol, lambda s: (1.0, 0.25), 30, noise=0.02)][:1] == [first]


# ----------------------------------------------------------------------------- the device probe
def probe_rows(speeds, *, repeats=5, noise=0.0, seed=0, work=0.02):
    """Probe seconds per repeat: the same ``work`` on every rank at its speed, with log-normal noise."""
    rng = random.Random(seed)
    return [[work / v * math.exp(noise * rng.gauss(0.0, 1.0)) for v in speeds] for _ in range(repeats)]


@pytest.mark.parametrize("chi", [2.0, 4.0])
def test_the_probe_moves_a_clearly_slow_rank_before_the_first_step_and_the_launch_steps_then_wait(chi):
    pol = policy()
    decision = pol.profile(probe_rows((1.0, 1.0 / chi), noise=0.03))
    assert decision.replan and decision.step == -1 and "device probe" in decision.reason
    mlp, kv = decision.plans
    assert mlp.units[1] < mlp.units[0] and kv.units[1] <= kv.units[0]
    # the plan the solver gives for those speeds at the probe's R/S, predicted against the even step (1)
    from semimig.controller.reshard import PROBE_REPLICATED_RATIO
    k = PROBE_REPLICATED_RATIO
    S = 1.0 / (k + 0.5)
    model = StepModel(speeds=(1.0, 1.0 / chi), replicated=k * S, shardable=S)
    assert decision.plans[0] == solve_plan(model, total_units=MLP_UNITS, unit_size=128, min_units=1) or \
        decision.predicted_s <= model.step(pol.shares(decision.plans)) / model.step(pol.shares()) + 0.02
    assert decision.current_s == 0.0 and 0.0 < decision.predicted_s < 1.0 - pol.config.probe
    pol.moved_to(decision.plans, seconds=0.1, bytes_moved=decision.move_bytes)
    # the steps after it: no launch decision (the probe was the launch's), no undo against a step it was not
    # decided on; the window rule reads the first full window under it (warm-up step left out) and refines
    # the plan to the one for the true R/S (the probe assumed PROBE_REPLICATED_RATIO)
    decisions = []
    moves = simulate(pol, lambda s: (1.0, 1.0 / chi), 80, decisions=decisions)
    assert all("at launch" not in d.reason and "measured slower" not in d.reason for d in decisions)
    assert all(step >= pol.config.window for step, _ in moves) and len(moves) <= 1, moves
    true = StepModel.normalised((1.0, 1.0 / chi), replicated_share=RHO)  # within the margin of the true optimum
    assert true.step(pol.shares()) <= true.step(pol.shares(expected((1.0, 1.0 / chi)))) * (1.0 + pol.config.margin)


def test_the_probe_keeps_the_plan_without_a_straggler_on_noisy_repeats():
    for seed in range(20):
        pol = policy()
        decision = pol.profile(probe_rows((1.0, 1.0), noise=0.15, seed=seed))
        assert not decision.replan, (seed, decision.reason)
        assert pol.plans == even_plans() and pol.history == []


def test_the_probe_leaves_a_mild_slowdown_and_disagreeing_repeats_to_the_launch_steps():
    mild = policy().profile(probe_rows((1.0, 1.0 / 1.4)))  # gain ~15 % < probe 25 %
    assert not mild.replan and "below probe=25%" in mild.reason
    rows = probe_rows((1.0, 0.25))
    rows[2] = [0.02, 0.021]  # one repeat with the rank at full speed: a burst, not a device
    burst = policy().profile(rows)
    assert not burst.replan and "disagree" in burst.reason
    pol = policy()
    assert pol.profile(probe_rows((1.0, 0.25))).replan  # the same slowdown in every repeat moves
    # and a rank the probe left alone is still moved for by the launch steps
    after = policy()
    assert not after.profile(rows).replan
    moves = simulate(after, lambda s: (1.0, 0.25), 4)
    assert [s for s, _ in moves] == [FIRST_LAUNCH_STEP]


def test_probe_zero_turns_the_probe_off_and_bad_probe_input_is_refused():
    off = policy(ReshardConfig(probe=0))
    assert not off.profile(probe_rows((1.0, 0.25))).replan
    for bad in (-0.1, 1.0, float("nan"), "0.2"):
        with pytest.raises(ConfigError, match="ReshardConfig.probe"):
            ReshardConfig(probe=bad)
    pol = policy()
    with pytest.raises(ConfigError, match="one row of 2 probe times per repeat"):
        pol.profile([[0.02, 0.02, 0.02]])
    with pytest.raises(ConfigError, match="one row of 2 probe times per repeat"):
        pol.profile([])
    with pytest.raises(ConfigError, match=r"times\[0\]\[1\]"):
        pol.profile([[0.02, 0.0]])
    simulate(pol, lambda s: (1.0, 1.0), 1)
    with pytest.raises(ConfigError, match="before the first step and the first move; 1 steps were observed$"):
        pol.profile(probe_rows((1.0, 0.25)))
    twice = policy()
    decision = twice.profile(probe_rows((1.0, 0.25)))
    twice.moved_to(decision.plans, seconds=0.1, bytes_moved=decision.move_bytes)
    with pytest.raises(ConfigError, match="0 steps were observed, and a move was made"):
        twice.profile(probe_rows((1.0, 0.25)))


# ----------------------------------------------------------------------------- a come-and-go straggler, shed
def _shed_while_slow(speeds):
    """Resizing while a rank is slow: the step runs at 40 % of its full length (γ ≈ 0.8 on the slow rank)."""
    return 0.4 if min(speeds) < 0.5 else None


def test_a_come_and_go_straggler_that_resizing_serves_is_not_re_planned_for_on_the_full_step():
    """13 slow steps in 60: once an episode has ended, a later one has ~5 steps of expected life left when
    the window turns stable, and its gain on the full step (4 s -> 1.6 s) pays for a move; while resizing
    runs it at 40 % (1.6 s, ``step_s``) the same move gains nothing, so it is not made."""
    def later_moves(ran):
        pol, decisions = policy(ReshardConfig(window=10)), []
        moves = simulate(pol, _pattern(13, 47), 300, noise=0.03, ran=ran, decisions=decisions)
        return [s for s, d in moves if s >= 60 and max(pol.shares(d.plans)) > 0.5], pol, decisions

    full, _, _ = later_moves(None)
    assert full, "the control: on the full step the episode rule re-plans in later episodes"
    shed, pol, decisions = later_moves(_shed_while_slow)
    assert shed == [], shed
    assert len(pol.episodes) >= 4  # the episodes were seen all the same
    assert any("against the step as it ran, shedding" in d.reason for d in decisions if d.step >= 60)


def test_a_first_episode_and_a_straggler_that_stays_are_still_re_planned_for_while_shed():
    """No past episode: a straggler that arrives mid-run and stays is moved for on the full step even
    while resizing serves it (the exact plan is what re-sharding is for), as without ``step_s``."""
    pol = policy(ReshardConfig(window=10))
    moves = simulate(pol, lambda step: (1.0, 0.25) if step >= 30 else (1.0, 1.0), 120, noise=0.03,
                     ran=_shed_while_slow)
    assert moves and 30 < moves[0][0] <= 30 + 2 * 10 and max(pol.shares(moves[0][1].plans)) > 0.5, moves


def test_a_straggler_that_comes_back_to_stay_is_re_planned_for_while_shed_once_it_outlives_the_past():
    """After episodes that ended, a straggler that stays while resizing serves it (here pruning even
    runs faster than the exact plan would): once it outlives the past episodes it counts as staying and
    the move is counted on the full step again, so the exact plan comes."""
    pol = policy(ReshardConfig(window=10))
    moves = simulate(pol, _pattern(7, 53, start=20, then_stays=140), 600, noise=0.03, ran=_shed_while_slow)
    late = [s for s, d in moves if s >= 140 and max(pol.shares(d.plans)) > 0.5]
    assert late and late[0] <= 140 + 40, [(s, str(d.plans)) for s, d in moves]
    assert max(pol.shares()) > 0.5  # and it is held: the straggler stays


def test_a_throttle_that_lasts_a_time_is_compared_in_seconds_not_steps(monkeypatch):
    """A throttle 30 s on, 60 s off (by the simulated clock): the first episode, re-planned for at
    launch, ran ~0.55 s steps (52 of them); the later ones, which resizing serves at 30 % of the full
    step (~1.25 s), last 24. Counted in seconds every episode lasts ~30 s and the later ones are never
    re-planned for; counted in steps only (the control), each later one is re-planned for as it ends —
    the move comes as the throttle lifts and goes back five steps later."""
    def throttle(seconds):
        return (1.0, 0.25) if seconds % 90.0 < 30.0 else (1.0, 1.0)

    def resizing(speeds):
        return 0.3 if min(speeds) < 0.5 else None

    def later_moves():
        pol = policy(ReshardConfig(window=10))
        moves = simulate(pol, throttle, 260, noise=0.03, ran=resizing, by_time=True)
        return [s for s, d in moves if s > pol.episodes[0] and max(pol.shares(d.plans)) > 0.5], pol

    late, pol = later_moves()
    assert late == [], late
    assert len(pol.episode_seconds) >= 2 and all(27.0 <= s <= 31.0 for s in pol.episode_seconds), pol.episode_seconds
    assert pol.episodes[0] > 1.5 * pol.episodes[1], pol.episodes  # in steps they differ
    monkeypatch.setattr("semimig.controller.reshard._step_seconds", lambda sample: 1.0)  # seconds = steps
    late, _ = later_moves()
    assert late, "the control: counted in steps, a later episode is re-planned for"


def test_an_episode_outlives_the_past_only_by_a_quarter_on_both_clocks():
    """A throttle whose phases last the same time: the first phase, re-planned for at launch, is seen
    for 10 steps and ~14 s (its warm-up and the step after the move unobserved); the second, at
    shorter steps, reaches 14 steps and ~14 s a step before it lifts.  That is not a straggler that
    stays: 14 s is within a quarter of 14 s."""
    from semimig.controller.reshard import _Episode

    pol = policy(ReshardConfig(window=10))
    pol.episodes, pol.episode_seconds = [10], [14.0]

    def episode(first, last, seconds):
        return _Episode(first=first, last=last, seconds_to_last=seconds, seconds=seconds, tracked=last)

    pol._episode = episode(60, 73, 14.2)  # steps 60-73, 14.2 s up to the last slow one
    assert pol._within_past_episodes()
    pol._episode = episode(60, 75, 18.0)  # 16 steps, 18 s: beyond a quarter on both clocks
    assert not pol._within_past_episodes()
    pol._episode = episode(60, 69, 18.0)  # 18 s but 10 steps: within on the step clock
    assert pol._within_past_episodes()
