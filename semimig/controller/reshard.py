"""When to re-shard: a pure policy that re-plans uneven tensor-parallel shards during training (DESIGN §8, §9).

Inputs, every step, identical on every rank of the TP group (all-gathered first): per rank ``r`` its
*compute* seconds ``c_r`` (the whole step's own work, wall minus time in collectives), the part
``b_r ≤ c_r`` spent on shardable work and its seconds in collectives ``m_r`` (:class:`ReshardSample`).
The plan in force is one :class:`~semimig.sharding.ShardPlan` per paired dimension (MLP blocks, KV
groups), with a weight ``w_d`` per dimension (its share of the shardable work); a rank's share is
``p_r = Σ_d w_d·n_{d,r}/U_d / Σ_d w_d`` and may be 0 (``min_units=0``: a rank holding no unit of a kind).

The decision is a small state machine (:mod:`semimig.controller.policy.states`: the table), one gain test shared by
every move (:mod:`semimig.controller.policy.gain`) and a step model that learns ``R/S`` from every plan it measured
(:mod:`semimig.controller.policy.stepmodel`). Per step: the step joins a window of the plan in force (at most
``window`` steps; each rank reads only its steps since its speed last changed, a change-point test on its log
compute: :mod:`semimig.controller.policy.window`); the window's readings give the step model, the slow ranks and
their age; the proposal is the solved plan (or the even one, when it is within ``margin``), scored by its own
measurement when it was measured at the speeds in force (:mod:`semimig.controller.policy.memory`); the gain test
decides. A move is then measured for ``N_MIN`` steps before the next decision, and the two plans refit ``R/S``. A
rank whose last step alone is slower than the noise is an outlier or a change, told apart at the next step, and a
slowdown of two steps in a row is confirmed by the step after them; the move either calls for is taken at once when
the gain test passes on it and acting a step sooner pays for the risk of outliers
(:func:`~semimig.controller.policy.gain.bet_pays`, the odds of that many slow steps counted over the run, or a
hand-over's where a slowdown ends; two steps once a slowdown lasted), and no move that such steps, read as a change,
would undo is taken before the step that tells. Before the first step, :meth:`profile` reads the device probe's
speed ratios with the prior ``R/S`` and takes its plan only when the gain test passes on the probe's noise and the
gain is at least ``probe`` of the even step.

Every input is a number all ranks share and the arithmetic is in a fixed order, so every rank takes
the same decision at the same step; nothing is broadcast.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from semimig._validate import check_int, check_number
from semimig.controller.policy.gain import (MoveRate, Noise, bet_pays, gain_test, move_pace, movers,
                                            return_risk)
from semimig.controller.policy.memory import PlanMemory, SeatRates
from semimig.controller.policy.propose import healthy_step, plan_step, pooled, propose, seat_delta, seat_reading, shares
from semimig.controller.policy.records import ReshardDecision, ReshardSample, check_plans, moved_units
from semimig.controller.policy.states import MOVING, N_MIN, SETTLING, START, Slowdown, handed_over, took_over, transition
from semimig.controller.policy.stepmodel import LearnedModel, median_times
from semimig.controller.policy.window import SLOW_STEPS, Window, drifted
from semimig.errors import ConfigError
from semimig.sharding.plan import ShardPlan
from semimig.sharding.solver import StepModel

__all__ = ["ReshardConfig", "ReshardSample", "ReshardDecision", "ReshardPolicy", "moved_units", "PROBE_REPEATS"]

PROBE_REPEATS = 5
"""Repeats of the device probe's fixed work."""


@dataclass(frozen=True, kw_only=True)
class ReshardConfig:
    """The policy's knobs (docs/policy.md has them in one table).  Frozen; nothing derived is stored."""

    window: int = 48
    """Most steps of one plan the step model reads: more averages the noise away, fewer follow a change sooner."""
    margin: float = 0.03
    """Smallest relative gain ever acted on: guards against the step model's error, at the price of gains below it."""
    noise_z: float = 3.0
    """Standard errors a gain (and a slow rank) must clear: fewer false moves against a later reaction under noise."""
    tolerance: float = 0.1
    """Smallest slowdown (relative speed) that counts as a straggler: lower reacts to milder ones, and to more noise."""
    life_floor: int = 10
    """Fewest steps any state is expected to last: higher bets on young slowdowns sooner, loses more on short ones."""
    move_steps: float = 1.5
    """Before a move is measured, moving every unit's assumed cost in healthy even steps: lower moves sooner."""
    replicated_share: float = 0.2
    """Before ``R/S`` is measured, the replicated work's assumed share of a healthy even step (the first prior)."""
    horizon: Optional[int] = None
    """Steps the run has left at its start (``None``: unknown): a gain is never counted past the run's end."""
    warmup: int = 1
    """Steps not fed to the model at the start and after each move (allocations, first touch)."""
    min_units: int = 0
    """Units every rank keeps of every kind (0: a rank may hold none)."""
    probe: float = 0.25
    """Smallest gain (of the even step) for which the device probe's plan is taken before the first step; 0: off."""
    block_size: Optional[int] = None
    """MLP columns per unit when the model was built without a plan in units (``None``: 128)."""

    def __post_init__(self) -> None:
        check_int("ReshardConfig.window", self.window, minimum=N_MIN, maximum=10**6)
        check_number("ReshardConfig.margin", self.margin, minimum=0.0, maximum=1.0)
        check_number("ReshardConfig.noise_z", self.noise_z, minimum=0.0, maximum=100.0)
        check_number("ReshardConfig.tolerance", self.tolerance, minimum=0.0, maximum=1.0, high_open=True)
        check_int("ReshardConfig.life_floor", self.life_floor, minimum=1, maximum=10**9)
        check_number("ReshardConfig.move_steps", self.move_steps, minimum=0.0)
        check_number("ReshardConfig.replicated_share", self.replicated_share, minimum=0.0, maximum=1.0,
                     low_open=True, high_open=True)
        check_int("ReshardConfig.horizon", self.horizon, minimum=1, allow_none=True)
        check_int("ReshardConfig.warmup", self.warmup, minimum=0, maximum=10**6)
        check_int("ReshardConfig.min_units", self.min_units, minimum=0)
        check_number("ReshardConfig.probe", self.probe, minimum=0.0, maximum=1.0, high_open=True)
        check_int("ReshardConfig.block_size", self.block_size, minimum=1, allow_none=True)

    @property
    def first_steps(self) -> int:
        """Steps the first decision after the warm-up reads."""
        return N_MIN


class ReshardPolicy:
    """Decides, step by step, whether to move to another plan (module docstring).

    ``plans``          the plan in force, one :class:`ShardPlan` per paired dimension;
    ``weights``        each dimension's share of the shardable work (e.g. its parameter count);
    ``bytes_per_unit`` bytes one unit of each dimension moves (weights + optimizer state, all layers).
    """

    def __init__(self, plans: Sequence[ShardPlan], *, weights: Sequence[float], bytes_per_unit: Sequence[int],
                 config: ReshardConfig = ReshardConfig()) -> None:
        if not isinstance(config, ReshardConfig):
            raise ConfigError(f"config must be a ReshardConfig, got {config!r}")
        plans = check_plans("plans", plans)
        if len({p.tp for p in plans}) != 1:
            raise ConfigError(f"plans must all have the same tp, got {[p.tp for p in plans]}")
        for name, values in (("weights", weights), ("bytes_per_unit", bytes_per_unit)):
            if not isinstance(values, (list, tuple)) or len(values) != len(plans):
                raise ConfigError(f"{name} must be a sequence with one entry per plan ({len(plans)}), got {values!r}")
        self.weights = tuple(check_number(f"weights[{d}]", w, minimum=0.0, low_open=True) for d, w in enumerate(weights))
        self.bytes_per_unit = tuple(check_int(f"bytes_per_unit[{d}]", b, minimum=0) for d, b in enumerate(bytes_per_unit))
        self.config, self.plans, self.tp = config, plans, plans[0].tp
        self.state, self.step, self.last_move_step = START, 0, None
        self.move_rate = MoveRate()  # seconds per byte of the moves measured (what a move is priced at)
        self.speeds: Tuple[float, ...] = (1.0,) * self.tp  # the ranks' speeds the last decision read
        self.samples = Window(config.window, self.tp)  # the plan in force's steps fed to the model, each rank's fresh ones
        total = sum(self.weights)
        self.learned = LearnedModel(self.tp, config.replicated_share, [w / total for w in self.weights])
        self.noise, self.seats = Noise(), SeatRates()  # the reductions' rate where a slow rank was seated
        self.measured = PlanMemory()  # the step each plan measured at the speeds in force (policy.memory)
        self.slowdown = Slowdown(self.samples.rates)
        self.history: list[ReshardDecision] = []  # every decision that re-planned
        self._skip, self._fitted = config.warmup, 0  # _fitted: reads of the plan across the ranks (N_MIN steps, full)
        self._before: Optional[tuple] = None  # (plans, window, slow ranks) the last move was decided on

    # ------------------------------------------------------------------ public
    @property
    def replicated_ratio(self) -> float:
        """``R/S`` the step model uses now."""
        return self.learned.k

    def shares(self, plans: Optional[Sequence[ShardPlan]] = None) -> Tuple[float, ...]:
        """Effective share ``p_r = Σ_d w_d·n_{d,r}/U_d / Σ_d w_d`` of each rank."""
        return shares(self.learned.weights, self.plans if plans is None else plans)

    def moved(self, new: Sequence[ShardPlan]) -> Tuple[int, int]:
        """``(units, bytes)`` a move from the plan in force to ``new`` sends."""
        units = [moved_units(old, plan) for old, plan in zip(self.plans, new)]
        return sum(units), sum(u * b for u, b in zip(units, self.bytes_per_unit))

    def moved_to(self, plans: Sequence[ShardPlan], *, seconds: float, bytes_moved: int) -> None:
        """The move decided at the last step happened: ``plans`` in force, its measured cost noted."""
        plans = check_plans("moved_to: plans", plans)
        if len(plans) != len(self.plans) or any(p.total_units != q.total_units for p, q in zip(plans, self.plans)):
            raise ConfigError(f"moved_to: plans {[str(p) for p in plans]} do not match the dimensions in force")
        check_number("seconds", seconds, minimum=0.0)
        check_int("bytes_moved", bytes_moved, minimum=0)
        self.move_rate.add(seconds, bytes_moved, move_pace(movers(self.plans, plans), self.speeds))
        self.slowdown.clock.moved(seconds)
        window = self.samples.steady()  # at one set of speeds, as R/S needs
        # a move bet on slow steps left a window whose last steps have other speeds: it measures nothing
        measured = len(window) >= N_MIN and not (self.history and self.history[-1].step == self.step - 1
                                                 and self.history[-1].bet)
        self._before = (self.plans, window, self.slowdown.slow) if measured else None
        self.state = transition(self.state if self.state == MOVING else MOVING, "moved")
        self.plans, self.last_move_step = plans, self.step
        self.samples.clear()
        self._skip, self._fitted = self.config.warmup, 0

    def profile(self, times: Sequence[Sequence[float]]) -> ReshardDecision:
        """The plan to take before the first step from the device probe: ``times[i][r]`` is rank ``r``'s
        seconds for the probe's fixed work in repeat ``i`` (module docstring).  A repeat's seconds are
        the rank's speed plus interference that only adds (another process on its core, a late wake-up),
        so each rank is read at its fastest repeat: its ratio is ``min_r' min_i t[i][r'] / min_i t[i][r]``,
        and a rank slowed in some repeats but not in all is not called slow.  ``predicted_s`` is the
        proposal's step relative to the even one; ``current_s`` is 0 (no step was measured)."""
        cfg = self.config
        if self.step != 0 or self.last_move_step is not None:
            raise ConfigError(f"profile() is for before the first step and the first move; {self.step} steps were "
                              f"observed{', and a move was made' if self.last_move_step is not None else ''}")
        times = times.tolist() if hasattr(times, "tolist") else times  # a numpy array or a tensor of seconds
        rows = list(times) if isinstance(times, (list, tuple)) else None
        if not rows or any(not isinstance(row, (list, tuple)) or len(row) != self.tp for row in rows):
            raise ConfigError(f"profile() takes one row of {self.tp} probe times per repeat, got {times!r}")
        rows = [tuple(check_number(f"times[{i}][{r}]", t, minimum=0.0, low_open=True)
                      for r, t in enumerate(row)) for i, row in enumerate(rows)]
        if cfg.probe <= 0.0:
            return self._hold(-1, "the device probe is off (probe=0)", event="probe_hold")
        noise = Noise().add_rows(rows)
        best = [min(row[r] for row in rows) for r in range(self.tp)]  # interference only adds to a repeat
        ratios = tuple(min(best) / b for b in best)
        model = self.learned.from_ratios(ratios)
        se = noise.of_median(len(rows))
        self.slowdown.update(-1, ratios, se=math.sqrt(2.0) * se, tolerance=cfg.tolerance, z=cfg.noise_z, samples=len(rows))
        decision = self._decide(-1, model, 0.0, se, healthy_s=1.0, needed_gain=cfg.probe, hold="probe_hold",
                                gain="probe_move")
        relative = dataclasses.replace(decision, reason=f"device probe: {decision.reason}",
                                       predicted_s=decision.predicted_s / plan_step(model, self.learned.weights, self.plans))
        if decision.replan:
            self.history[-1] = relative
        return relative

    def observe(self, sample: ReshardSample) -> ReshardDecision:
        """Feed one step; the decision for the next (``plans`` not ``None``: move now)."""
        if not isinstance(sample, ReshardSample):
            raise ConfigError(f"observe() takes a ReshardSample, got {sample!r}")
        if len(sample.compute_s) != self.tp:
            raise ConfigError(f"the sample has {len(sample.compute_s)} ranks, the plans {self.tp}")
        step, self.step = self.step, self.step + 1
        self.slowdown.clock.add(sample.step_s or max(c + m for c, m in zip(sample.compute_s, sample.comm_s)))
        if self.state == MOVING:
            self.state = transition(MOVING, "stayed")
        if self._skip > 0 or not sample.valid:
            self._skip -= self._skip > 0
            return self._hold(step, "warm-up step (not fed to the model)" if sample.valid else "a step without "
                              "numbers", event="skip")
        if self.samples:
            self.noise.add(self.samples[-1].compute_s, sample.compute_s)
        if self.samples.add(sample, sigma=self.noise.sigma):
            self.measured.forget()
        window = list(self.samples)
        if len(window) < N_MIN:
            return self._hold(step, f"measuring the plan in force ({len(window)}/{N_MIN} steps)", event="short")
        if self.samples.pending:  # a bet, or wait: the next step tells a change from an outlier
            return self._bet(step) or self._hold(step, "a rank's last step alone is slower than the noise")
        shares = self.shares()
        self.learned.read_bound(shares, self.samples.compute, self.samples.shardable)
        compute, comm = self.samples.times()
        full = len(window) == self.config.window  # a plan is read across the ranks at N_MIN steady steps and full
        if self._fitted < 1 + full and (full or self.samples.steps >= N_MIN):
            self._fitted = 1 + full
            read = window if full else self.samples.steady()
            self.learned.fit_across([[p.shares()[r] for p in self.plans] for r in range(self.tp)], read,
                                    [r for r in range(self.tp) if r not in self.slowdown.slow],
                                    se=None if full else self.noise.of_median(len(read)))
            shares = self.shares()
        model = self.learned.model(shares, compute)
        se = self.noise.of_median(self.samples.independent)
        ratios = tuple(v / max(model.speeds) for v in model.speeds)
        after = self.samples.after_change()  # a rank with no step after its change is not confirmed slow
        confirm = tuple(1.0 if c is None else v / max(model.speeds)
                        for c, v in zip(after, self.learned.speeds(shares, [c or 1.0 for c in after])))
        self.slowdown.update(step, ratios, se=math.sqrt(2.0) * se, tolerance=self.config.tolerance,
                             z=self.config.noise_z, samples=self.samples.steps, confirm=confirm)
        # slow steps in a row with none after them: a bet at their odds once a slowdown was seen to last (on the
        # prior alone, pairs of outliers would move plans in runs without a straggler)
        unconfirmed = [m for r, m in self.samples.unconfirmed().items() if r not in self.slowdown.slow]
        if unconfirmed and self.samples.rates.slowdowns and (bet := self._bet(step, min(unconfirmed))):
            return bet
        measured = self.learned.slowest(compute, self.shares()) + comm
        if self.state == SETTLING and self._verify(self.samples.steady(), measured):
            model = self.learned.model(self.shares(), compute)
        model, lasted = took_over(model, self.slowdown) if self.slowdown.handed else (model, 0)  # a moved straggler
        se = self.noise.of_median(max(self.samples.independent, min(self.config.window, lasted)))  # keeps its pace
        state = self.state
        decision = self._decide(step, model, comm, se, healthy_s=healthy_step(model) + comm, measured_s=measured)
        if decision.replan and unconfirmed:  # read as a change, those steps must not undo it: the next step tells
            w, pending = self.learned.weights, self.learned.model(self.shares(), self.samples.betting())
            if plan_step(pending, w, decision.plans) > plan_step(pending, w, self.plans):
                self.history.pop()
                self.state = state
                return self._hold(step, "unconfirmed slow steps would undo the move: the next step tells")
        return decision

    # ------------------------------------------------------------------ decision
    def _bet(self, step: int, steps: int = 1) -> Optional[ReshardDecision]:
        """A rank's last ``steps`` steps are slower than the band: read as a change, its move is taken now when the gain
        test passes and acting sooner pays for the risk (:func:`~semimig.controller.policy.gain.bet_pays`: the odds of
        that many slow steps, the gain of each step until the move is believed, two before a slowdown lasted); else None."""
        cfg, shares = self.config, self.shares()
        compute, comm = self.samples.times()
        base = self.learned.model(shares, compute)
        model = self.learned.model(shares, self.samples.betting())
        se = max(self.noise.sigma, self.noise.of_median(self.samples.independent))  # one step's reading
        slowdown = self.slowdown.trial()  # the set if the step is a change; the counts only if it is taken
        slowdown.update(step, tuple(v / max(model.speeds) for v in model.speeds), se=math.sqrt(2.0) * se,
                        tolerance=cfg.tolerance, z=cfg.noise_z, samples=max(self.samples.steps, N_MIN),
                        since=step - steps + 1)
        if not slowdown.slow - self.slowdown.slow:
            return None
        base, ended = pooled(base, slowdown.slow), self.slowdown.slow & set(self.samples.sped_up())  # one ended now
        model = handed_over(pooled(model, slowdown.slow), self.slowdown, ended, slowdown.slow, shares)
        seats = self._seat_comm(slowdown.slow, model.speeds)
        proposal = self._propose(model, seats, slowdown.slow)
        if proposal == self.plans:
            return None
        w, seated = self.learned.weights, seat_delta(model.speeds, self.plans, proposal, seats, idle_free=model.idle_free)
        wrong = max(0.0, plan_step(base, w, proposal) - plan_step(base, w, self.plans)) * (cfg.warmup + N_MIN + 1)
        healthy = healthy_step(base) + comm
        move = 2.0 * self.move_cost_s(proposal, healthy, model.speeds)
        gain = plan_step(model, w, self.plans) - plan_step(model, w, proposal) - seated
        onset = self.slowdown.handover(self.tp) if ended else None
        waits = 1 if steps >= SLOW_STEPS or self.samples.rates.slowdowns else SLOW_STEPS + 1 - steps  # steps saved
        if not bet_pays(gain * waits, wrong + move, self.samples.rates.change_odds(steps, onset, self.samples.bet_size())):
            return None
        saved, state, self.slowdown, slowdown.rates = self.slowdown, self.state, slowdown, self.slowdown.rates
        decision = self._decide(step, model, comm, se, healthy_s=healthy,
                                measured_s=self.learned.slowest(compute, shares) + comm)
        if not decision.replan:
            self.slowdown, self.state = saved, state
            return None
        saved.rates.joined(step - steps + 1, slowdown.slow - saved.slow)  # a stay counts from its first slow step
        self.history[-1] = decision = dataclasses.replace(decision, reason=f"on {steps} slow step(s): "
                                                          f"{decision.reason}", bet=steps)
        return decision

    def _decide(self, step: int, model: StepModel, comm: float, se: float, *, healthy_s: float,
                measured_s: float = 0.0, needed_gain: float = 0.0, hold: str = "hold",
                gain: str = "gain") -> ReshardDecision:
        """The gain test on the best proposal (module docstring), the ranks outside the slow set alike."""
        cfg = self.config
        model = pooled(model, self.slowdown.slow)
        self.speeds = model.speeds
        current = plan_step(model, self.learned.weights, self.plans) + comm
        seats = self._seat_comm(self.slowdown.slow, model.speeds)
        proposal = self._propose(model, seats)
        ratios = tuple(v / max(model.speeds) for v in model.speeds)
        base = dict(current_s=measured_s, predicted_s=current, speed_ratios=ratios)
        if self.samples.steps >= N_MIN and not self.samples.pending:  # a reading at one set of speeds
            self.measured.record(self.plans, measured_s, self.slowdown.slow)
        if proposal == self.plans:
            return self._hold(step, "the plan in force is the best", event=hold, **base)
        if not self.slowdown.slow and not max(self.shares(proposal)) < max(self.shares()):  # not toward even
            return self._hold(step, "no rank is slow: only a move toward even is taken", event=hold, **base)
        known = self.measured.measured(proposal, self.slowdown.slow) if measured_s > 0.0 else None
        current, predicted = (measured_s, known) if known is not None else (  # measured beats predicted
            current, plan_step(model, self.learned.weights, proposal) + comm
            + seat_delta(model.speeds, self.plans, proposal, seats, idle_free=model.idle_free))
        units, nbytes = self.moved(proposal)
        remaining = None if cfg.horizon is None else max(cfg.horizon - step, 1)
        life, way_back = self.slowdown.life(step, current, predicted, floor=cfg.life_floor, remaining=remaining)
        slow, odds = self.slowdown.slow, self.slowdown.return_odds()
        risk = return_risk(model, slow, self.slowdown.previous, self.shares(), self.shares(proposal), odds)
        test = gain_test(current, predicted, needed=self.needed_gain(se), life=life, risk_s=risk, way_back=way_back,
                         back_odds=odds, move_s=self.move_cost_s(proposal, healthy_s, model.speeds))
        paid = "the move and its way back" if way_back else "the move"
        info = dict(base, predicted_s=predicted, move_bytes=nbytes, move_cost_s=test.cost_s, horizon=life)
        if not test.passed or test.gain_s < needed_gain * current:
            return self._hold(step, f"gain {test.gain_s:.4g} s/step ({test.margin_s:.4g} beyond the noise) x {life:.3g} "
                                    f"steps does not pay {paid} ({test.cost_s:.4g} s)", event=hold, **info)
        self.state = transition(self.state, gain)
        decision = ReshardDecision(step, plans=proposal, reason=f"gain {test.gain_s:.4g} s/step "
                                   f"({test.margin_s:.4g} beyond the noise) x {life:.3g} steps > {paid} "
                                   f"{test.cost_s:.4g} s ({units} units; slow ranks {sorted(self.slowdown.slow)})",
                                   **info)
        self.history.append(decision)
        return decision

    def _verify(self, window: list, measured_s: float) -> bool:
        """Leaving ``settling`` (the slow set read on the new window): the plan moved to against the plan it left (``R/S``,
        an emptied rank's own ``R``; where only ranks it seated changed the slow set, their own ``R``) and against its
        prediction re-read with the refit (none where a slow rank drifted).  ``True``: refitted."""
        (before_plans, before, slow), self._before = self._before or (None, None, None), None
        if before is None or len(window) < N_MIN:
            return False  # no window before the move: it measures nothing
        then, now, before_c, after_c = self.shares(before_plans), self.shares(), median_times(before)[0], median_times(window)[0]
        if changed := slow ^ self.slowdown.slow:  # speeds changed across it, or ranks it seated read otherwise empty
            if all(then[r] == 0.0 < now[r] for r in changed):
                self.learned.reseat(now, before_c, after_c, changed)
            return False
        calibrated = self.learned.calibrate(then, before_c, now, after_c)  # an emptied rank's own R
        old, se = self.learned.model(then, before_c).step(now), self.noise.of_median(min(len(before), len(window)))
        fitted = self.learned.fit(then, before, now, window, se=se,  # an emptied slow rank: read through k alone
                                  doubtful={r for r in slow if now[r] == 0.0}) is not None
        new = self.learned.model(self.shares(before_plans), before_c).step(self.shares())
        if self.history and (last := self.history[-1]).current_s > 0.0 and not drifted((before, window), slow, self.noise.sigma):
            self.learned.errors.append(max(0.0, (measured_s - last.predicted_s - new + old) / last.current_s))
        return fitted or calibrated

    def _hold(self, step: int, reason: str, *, event: str = "hold", **info) -> ReshardDecision:
        self.state = transition(self.state, event)
        return ReshardDecision(step, reason=reason, **info)

    def _propose(self, model: StepModel, seats: float, slow=None) -> Tuple[ShardPlan, ...]:
        """The proposal for ``model`` with ``slow`` the slow set (default: the one in force); ``seats``: :meth:`_seat_comm` of it."""
        slow = self.slowdown.slow if slow is None else slow
        return propose(model, self.plans, self.learned.weights, slow=bool(slow), min_units=self.config.min_units,
                       margin=self.config.margin, unseat=slow, comm=seats)

    def _seat_comm(self, slow, speeds: Sequence[float]) -> float:
        """What a slow rank's seats stretch at ``speeds``: the reductions in force (:func:`seat_reading`), at the rate where one sat."""
        return self.seats.read(seat_reading(list(self.samples), self.plans), speeds, self.plans, slow,
                               idle_free=self.learned.idle_free) if slow else 0.0

    def needed_gain(self, se: Optional[float] = None) -> float:
        """``ε``: the margin, ``z`` relative errors ``se`` of a median (default: the window in force's) and the
        step model's own error; the least share of the step a move must predict to save."""
        se = self.noise.of_median(max(self.samples.independent, 1)) if se is None else se
        return max(self.config.margin, -math.expm1(-self.config.noise_z * se), self.learned.error)

    def move_cost_s(self, new: Sequence[ShardPlan], step_s: float, speeds: Optional[Sequence[float]] = None) -> float:
        """Seconds a move from the plan in force to ``new`` costs at ``speeds`` (default: the last decision's): its
        bytes at the moves' rate (:class:`MoveRate`) or the prior in steps of ``step_s``, times its pace."""
        total, rate = sum(b * p.total_units for b, p in zip(self.bytes_per_unit, self.plans)), self.move_rate.per_byte
        rate = (self.config.move_steps * step_s / total if total else 0.0) if rate is None else rate
        return self.moved(new)[1] * rate * move_pace(movers(self.plans, new), self.speeds if speeds is None else speeds)
