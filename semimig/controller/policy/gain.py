"""The one gain test every move passes (DESIGN §9), and the one noise estimator it reads.

A move from the plan in force (step ``t₀``) to a proposal (step ``t₁``, both predicted by the same
step model) is taken when

    (g − ε·t₀) · L  >  (1 + p)·C + ρ   with  g = t₀ − t₁,  ε = max(margin, z·σ̂_med, e_model)

- ``L`` the present state's expected remaining life (the state: which ranks are slow, or that none is),
  counted in steps of the plan in force: its remaining seconds ``W`` over ``t₀``.  A slowdown from outside
  the job keeps its own time, so the lives are read in seconds of the run's clock
  (:meth:`~semimig.controller.policy.states.Slowdown.life`): a state that lasted 4 steps of a plan
  stepping 25 s lasts some 25 of one stepping 4 s, and in steps the two would read as different lives.
  Staying runs ``W/t₀`` steps in them and moving ``(W − C)/t₁``, a difference of ``(W/t₀)·(t₀ − t₁) − C``
  at ``t₁`` a step: the test below with ``L = W/t₀``.  With no ended state of the same kind to go by, its age so far ``a`` (a state that has
  lasted ``a`` steps is, with no other knowledge, as likely to end before ``2a`` as after — the Lindy
  estimate), at least ``life_floor`` (a bet on a young state).  With ended states of the same kind
  (a straggler that comes and goes, or moves), their residual lives past ``a``: the mean of ``D − a``
  over the ended lengths ``D > a`` (the empirical hazard); a state that has outlived every past one
  falls back to its age ``a`` (the floor is a bet on a state nothing is known of, and here the past
  says states of this kind end sooner).  At most the run's remaining steps when they are known;
- ``C`` the move's cost: the bytes of this one at the least free seconds per byte of the last
  :data:`MOVE_RATES` moves measured (:class:`MoveRate`), or before any move
  ``bytes / all bytes × move_steps × the healthy even step`` (a prior in steps, so it holds from
  20 ms to 5 s steps), times its pace (:func:`move_pace`: a slow rank taking part stretches it).
  ``(1 + p)·C`` pays the move, and the move back with the odds ``p`` that the state after the present
  one is the one before (below): a state after it that is new calls for a move from either plan, so
  only a return makes the move back this move's own cost.  Where
  the state is expected to outlive the run (its life, uncapped, reaches the run's remaining steps) no
  move back is paid and nothing comes back within the run: the cost is ``C`` alone, without ``ρ``;
- ``ρ`` the risk of the state before coming back: when the present state ends, with probability ``p``
  (:meth:`~semimig.controller.policy.states.Slowdown.return_odds`) it is the one before again, and the
  plan moved to runs at its speeds for the steps it takes to be seen and left, ``D``:
  ``ρ = p · D · max(0, t₁' − t₀')``, ``t'`` the two plans' steps at the state before's speeds (a move back
  to even as a straggler pauses pays what the even plan costs if it resumes; a move onto a straggler,
  only the uneven plan's cost if it recovers).  ``D`` is the window's own delay plus the step the move
  takes effect before: :data:`~semimig.controller.policy.window.SLOW_STEPS` when a rank slows again,
  one when ranks only recover (a faster step is believed at once);
- ``ε·t₀`` the risk of being wrong: the gain is read from medians of noisy times, so it is counted
  only beyond ``z`` standard errors of a median (``σ̂_med = 1.25·σ̂/√n`` over ``n`` samples) and
  beyond what the step model itself may be off by: ``margin``, or more when the latest moves measured
  slower than predicted (``e_model``, their median under-delivery).

``σ̂`` is the one noise estimator: the relative noise of one rank's compute in one step, read from
consecutive steps under one plan (``1.4826·MAD(Δ log c)/√2``: robust to outliers, blind to slow
drifts and to the plan changing, which is never inside a pair).
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import math
from dataclasses import dataclass
from typing import AbstractSet, Optional, Sequence, Tuple

import numpy as np

from semimig.controller.policy.propose import pooled
from semimig.errors import ConfigError
from semimig.controller.policy.stepmodel import ordered_median
from semimig.controller.policy.window import SLOW_STEPS
from semimig.sharding.plan import ShardPlan
from semimig.sharding.solver import StepModel

__all__ = ["Noise", "Gain", "MoveRate", "MOVE_RATES", "move_pace", "movers", "gain_test", "bet_pays",
           "return_risk"]

NOISE_PAIRS = 400
"""Consecutive-step pairs (all ranks together) the noise estimate is read from."""
NOISE_PRIOR_PAIRS = 24
"""Pairs after which the prior noise has faded to half its value."""
MOVE_RATES = 2
"""Moves whose seconds per byte price the next (:class:`MoveRate`)."""


class Noise:
    """``σ̂``: relative noise of one rank's compute in one step (module docstring)."""

    def __init__(self, prior: float = 0.1) -> None:
        self.diffs: collections.deque = collections.deque(maxlen=NOISE_PAIRS)
        self.prior = prior
        self._ordered: list = []
        """:attr:`diffs` in order, kept as pairs come and go: the median is read every step."""
        self._sigma: Optional[float] = None
        """:attr:`sigma` as last read (it is read several times a step)."""

    def add(self, before: Sequence[float], after: Sequence[float]) -> None:
        """Two consecutive steps under one plan: every rank's compute."""
        for a, b in zip(before, after):
            if a > 0.0 and b > 0.0:
                diff = abs(math.log(b / a))
                if len(self.diffs) == self.diffs.maxlen:
                    del self._ordered[bisect.bisect_left(self._ordered, self.diffs[0])]
                self.diffs.append(diff)
                bisect.insort(self._ordered, diff)
                self._sigma = None

    def add_rows(self, rows: Sequence[Sequence[float]]) -> "Noise":
        """Every consecutive pair of ``rows`` (:meth:`add`); returns itself."""
        for before, after in zip(rows, rows[1:]):
            self.add(before, after)
        return self

    @property
    def sigma(self) -> float:
        """The estimate, at least a prior that fades as pairs accrue (a few pairs can read a noisy machine
        as a quiet one, and a move decided on that costs more than the steps a wider band waits)."""
        if self._sigma is None:
            floor = self.prior * NOISE_PRIOR_PAIRS / (NOISE_PRIOR_PAIRS + len(self.diffs))
            self._sigma = (max(self.prior, floor) if len(self.diffs) < 4
                           else max(1.4826 * ordered_median(self._ordered) / math.sqrt(2.0), floor))
        return self._sigma

    def of_median(self, n: int) -> float:
        """Relative standard error of a median over ``n`` steps."""
        return 1.25 * self.sigma / math.sqrt(max(n, 1))


def movers(old: Sequence[ShardPlan], new: Sequence[ShardPlan]) -> Tuple[bool, ...]:
    """Per rank, whether a move from plans ``old`` to ``new`` changes its units of some dimension."""
    return tuple(any(o.units[r] != n.units[r] for o, n in zip(old, new)) for r in range(old[0].tp))


def move_pace(moving, speeds: Sequence[float]):
    """How much slower than a free move one is: ``(1 + χ)/2``, ``χ`` the slowdown (the fastest rank's speed over
    its own) of the slowest rank ``moving``; 1 when none moves.  Half of a move's work (packing and sending, or
    receiving and unpacking) runs at each end's pace (a move with a rank at a quarter of a core, ``χ`` 4,
    measured 2-4x a free move's seconds per byte on the reference machine).  ``moving``: one flag per rank, or
    an array of such rows (the last axis the ranks), for which the paces come as an array."""
    speeds = np.asarray(speeds, dtype=float)
    if speeds.ndim != 1 or np.shape(moving)[-1:] != speeds.shape or not np.all(speeds > 0.0):
        raise ConfigError(f"move_pace: speeds must be one positive speed per rank of the move's flags "
                          f"({np.shape(moving)[-1:]} ranks), got {[float(v) for v in speeds.ravel()]}")
    slowdown = speeds.max() / speeds
    return (1.0 + np.max(np.where(moving, slowdown, 1.0), axis=-1)) / 2.0


class MoveRate:
    """Seconds per byte of a free move (:func:`move_pace` 1): the least over the last :data:`MOVE_RATES` moves
    measured, each read at its pace (``None`` before any).

    A move's time is its bytes at the exchange's rate, stretched by the pace of its slowest rank, plus whatever
    else delayed it, and every such part only lengthens it: the exchange's one-time set-up, which a run's first
    move pays (measured at several times the same move made later), contention on the link.  One such move
    read alone would price the next moves by its excess, the way back from it above all (and a way back
    priced too high keeps a plan made for a slowdown that has ended); the least of the last two leaves one
    move's excess out, while a link that stays slower raises the rate after two moves.  Read at its pace, a
    move onto a straggler prices the way back, which no slow rank slows, at a free move's rate."""

    def __init__(self) -> None:
        self._rates: collections.deque = collections.deque(maxlen=MOVE_RATES)

    def add(self, seconds: float, nbytes: int, pace: float = 1.0) -> None:
        """A move of ``nbytes`` at ``pace`` took ``seconds`` (nothing is learned from a move of no bytes)."""
        if nbytes > 0:
            self._rates.append(seconds / nbytes / pace)

    @property
    def per_byte(self) -> Optional[float]:
        return min(self._rates) if self._rates else None


@dataclass(frozen=True)
class Gain:
    """The test's numbers, for the decision's record."""

    gain_s: float
    """``g``: predicted seconds saved per step."""
    margin_s: float
    """``g − ε·t₀``: the gain beyond the noise and the margin."""
    life: float
    """``L``: steps the gain is counted over."""
    cost_s: float
    """``(1 + p)·C + ρ``: the move, and the move back and the risk of the state before coming back."""

    @property
    def passed(self) -> bool:
        return self.margin_s > 0.0 and self.margin_s * self.life > self.cost_s


def gain_test(current_s: float, proposed_s: float, *, needed: float, life: float, move_s: float,
              risk_s: float = 0.0, way_back: bool = True, back_odds: float = 1.0) -> Gain:
    """The gain test (module docstring); ``way_back``: whether the state is expected to end within the run
    (else the move alone is paid); ``back_odds``: ``p``, the odds that the state before follows the present one."""
    gain = current_s - proposed_s
    cost = (1.0 + back_odds) * move_s + risk_s if way_back else move_s
    return Gain(gain_s=gain, margin_s=gain - needed * current_s, life=life, cost_s=cost)


def return_risk(model: StepModel, slow: AbstractSet[int], previous: Optional[Tuple[AbstractSet[int], Sequence[float]]],
                now: Sequence[float], then: Sequence[float], odds: float) -> float:
    """``ρ`` (module docstring) for a move from shares ``now`` to ``then`` with ``slow`` the present slow set:
    ``model`` at the state before's speed ratios (``previous``: its slow set and ratios; ``None``: no state
    ended, no risk), the ranks outside its slow set at their median."""
    if previous is None:
        return 0.0
    before_slow, ratios = previous
    fastest = max(model.speeds)
    before = pooled(dataclasses.replace(model, speeds=tuple(v * fastest for v in ratios)), before_slow)
    delay = (SLOW_STEPS if set(before_slow) - set(slow) else 1) + 1
    return odds * delay * max(0.0, before.step(then) - before.step(now))


def bet_pays(gain_s: float, wrong_s: float, odds: float) -> bool:
    """Whether to act on slow steps before the steps after them tell a change from outliers: with
    probability ``odds`` it is a change and acting now saves ``gain_s``, the gain of every step until the
    change would be believed; otherwise the move, its way back and the steps under a plan made for a
    slowdown that was not there cost ``wrong_s``.  Waiting costs nothing else, so the bet pays when
    ``odds·gain_s > (1 − odds)·wrong_s``."""
    return odds * gain_s > (1.0 - odds) * wrong_s
