"""The policy's states and transitions, in one table (DESIGN §9), and the slowdown it serves.

=========  ===========================================================  ============================
state      what holds                                                   event → next state
=========  ===========================================================  ============================
start      no step fed yet; the device probe may move                   probe_move → moving,
                                                                        probe_hold / skip → start,
                                                                        short → measuring
measuring  the plan in force has fewer than ``N_MIN`` steps measured    skip / short → measuring,
                                                                        hold → holding, gain → moving
holding    the plan is measured; every step runs the gain test          skip / hold → holding,
                                                                        gain → moving
moving     a move was handed out                                        moved → settling,
                                                                        stayed → holding
settling   a move was made: its warm-up and first ``N_MIN`` steps;      skip / short → settling,
           leaving it, the two plans measured refit ``R/S``            hold → holding, gain → moving
=========  ===========================================================  ============================

Events: ``skip`` a step not fed to the model (warm-up after the start or a move, or a step without
numbers); ``short`` a step fed, fewer than ``N_MIN`` in the window; ``gain`` / ``hold`` the gain test
(:mod:`~semimig.controller.policy.gain`) passed / failed; ``moved`` the move happened; ``stayed`` the
caller did not make it.  A re-plan is thus always: decided on ``N_MIN`` or more steps of one plan,
moved, measured again (``settling``), and only then decided again — on the refitted model, so a plan
that under-delivers is revisited by the same test that chose it.

The slowdown (:class:`Slowdown`): the set of ranks that are slow, with hysteresis — a rank joins when
its speed ratio (to the fastest rank) is below ``1 − tolerance`` by ``z`` standard errors (the first
slow rank over ``N_MIN`` or more steps, and also over its steps after the ones that made its change:
a few slow steps in a row on one rank are also what a run of outliers looks like, and the steps after
them read its true speed; a rank that keeps slowing, a change every few steps, is read so after each), and leaves when it is above by as many — and its age, the steps since
that set last changed.  The fastest rank is the fastest of ``n`` noisy readings (``n`` the ranks outside the
set), which stands about ``E_n`` standard errors above their speed (``E_n`` the expected largest of ``n``
standard normals, :func:`expected_max`: 1.4 at ``n = 8``): a rank that recovered reads that much below 1, so
the test for leaving reads it with that excess taken off.  Joining keeps the plain ratio, so a mild straggler
is not hidden by the correction.  A change of the set that a slow rank leaves as another joins is a *hand-over*, the straggler moving
(:meth:`Slowdown.handover`: their share of the ended slowdowns, the odds the bet on one slow step
reads at the step a slowdown ends).  A set that is
empty is the state "no straggler": from it only moves toward even (a smaller largest share) are
proposed, so noise never moves an even plan.  A straggler that ends empties the set and starts the
way back toward even; one that moves to another rank changes the set and restarts the age.  The
lengths of the ended states are kept by kind (some rank slow, or none): they are the evidence of how
long the present state will last (:meth:`Slowdown.life`, in seconds of the run's clock); the first state
is not among them, for it began with the run, not with a change, and its length tells when the run
started rather than how long a state lasts.  For the same reason the ranks the run's first reading finds
slow (the device probe's, or the first window's over steps reaching back to the run's start) are no onset:
their stays count neither as slowdowns nor as outliers in the rates that price a bet on slow steps
(:class:`~semimig.controller.policy.window.Rates`), which count only what was seen to begin.

The set's ratios (:attr:`Slowdown.ratios`, kept as the state before when the set changes) are the latest
reading, except that a slow rank's is not let rise beyond the band while it stays in the set: its recovery
begins some steps before it leaves, and those readings are not the size of its slowdown (the risk of its
return and a hand-over are priced at that size).

A slowdown handed over keeps its size.  As a slow rank leaves, another rank joins when its reading is
likelier slowed as the leaving one was than healthy: the log-likelihood ratio of its ratio ``s`` under
the leaving rank's last ratio ``ρ`` against 1, ``(ln²s − ln²(s/ρ))/(2·se²)``, plus the log-odds of a
hand-over, is positive (a rank must still read below ``1 − tolerance``).  The one-sided band asks a
rank that just took a straggler over for ``z`` standard errors below the tolerance on the few steps
since it did; the known size asks it only to be nearer that size than health.  Only a slowdown that
lasted (:data:`LASTED` steps in the set) has a size to hand over: the device probe's reading and a bet's
on a step or two are not one.  The step it joins on, its
speed is read no slower than the ended one read, over as many steps as the ended state lasted
(:func:`took_over`): one step's (or a few steps') noise is the larger error.  The bet on a rank's one slow step
at the step another's slowdown ended reads it at the ended one's size (:func:`handed_over`): that step is
often the one the straggler moved during, which ran partly at each rank's pace and reads the new rank less
slow than it is.  A hand-over need not show on the step the
slowdown ends: the new rank's window still holds its healthy steps, and the change test restarts it as its
slow ones come in, so its band stays wide for as many steps.  While the set stays empty after a slowdown
that lasted, every reading is tested the same way (no rank of the ended set, the same size and odds), so a
straggler that moved joins on the steps that show it, not when the band has narrowed on them.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from statistics import NormalDist
from typing import AbstractSet, Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

from semimig.errors import ConfigError

__all__ = ["START", "MEASURING", "HOLDING", "MOVING", "SETTLING", "TABLE", "N_MIN", "LASTED", "transition",
           "Slowdown", "RunClock", "expected_life", "handed_over", "took_over", "expected_max"]

START, MEASURING, HOLDING, MOVING, SETTLING = "start", "measuring", "holding", "moving", "settling"
N_MIN = 3
"""Fewest steps of one plan a decision reads: a median that one outlier step cannot move."""
LASTED = 2 * N_MIN
"""Steps a rank must stay in the slow set, from its first slow step, for its slowdown to count as one that
lasted: two decisions' worth of steps, past the move a bet may have made and the steps that measure the
plan it moved to (a bet on outliers leaves the set within them)."""

TABLE: Dict[str, Dict[str, str]] = {
    START: {"probe_move": MOVING, "probe_hold": START, "skip": START, "short": MEASURING},
    MEASURING: {"skip": MEASURING, "short": MEASURING, "hold": HOLDING, "gain": MOVING},
    HOLDING: {"skip": HOLDING, "hold": HOLDING, "gain": MOVING},
    MOVING: {"moved": SETTLING, "stayed": HOLDING},
    SETTLING: {"skip": SETTLING, "short": SETTLING, "hold": HOLDING, "gain": MOVING},
}


def transition(state: str, event: str) -> str:
    """The next state (the table above); an event the state does not take is a bug, refused."""
    try:
        return TABLE[state][event]
    except KeyError:
        raise ConfigError(f"the re-shard policy has no transition from state {state!r} on event {event!r}") \
            from None


def expected_max(n: int) -> float:
    """The expected largest of ``n`` independent standard normals (Blom's approximation,
    ``Φ⁻¹((n − 0.375)/(n + 0.25))``, within 0.03 of it for ``n ≤ 8``; 0 for one)."""
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


def expected_life(age: float, past: Sequence[float], *, floor: float, remaining: Optional[float]) -> float:
    """``L``: with ended states of the same kind, the mean of ``D − age`` over those that lasted
    ``D > age``, or ``age`` when none did; with none, ``max(age, floor)``; at most the run's
    ``remaining`` steps (module docstring; ``L == remaining``: the state is expected to outlive the run)."""
    longer = [d - age for d in past if d > age]
    if longer:
        life = sum(longer) / len(longer)
    else:  # no evidence: a bet on a young state; outlived every past one: its age alone (Lindy)
        life = age if past else max(age, floor)
    return min(life, remaining) if remaining is not None else life


class RunClock:
    """The run's seconds at the start of each step: its steps as measured and its moves between them.

    A slowdown from outside the job (a neighbour, a cooling limit, another job on the device) keeps its
    own time: it lasts seconds, and a plan that steps slower meets fewer of its steps.  The states'
    lives are read on this clock (:meth:`Slowdown.life`)."""

    def __init__(self) -> None:
        self._at: List[float] = [0.0]
        self._between = 0.0  # a move's seconds, counted into the next step's start
        self._last = 0.0

    def add(self, seconds: float) -> None:
        """One step observed, ``seconds`` long (a step without numbers: as long as the last)."""
        if isinstance(seconds, bool) or not (isinstance(seconds, (int, float)) and 0.0 < seconds < math.inf):
            seconds = self._last
        self._last = seconds
        self._at.append(self._at[-1] + self._between + seconds)
        self._between = 0.0

    def moved(self, seconds: float) -> None:
        """A move of ``seconds`` before the next step."""
        self._between += seconds

    def at(self, step: int) -> float:
        """Seconds from the run's first step to the start of ``step`` (clamped to the steps observed)."""
        return self._at[min(max(step, 0), len(self._at) - 1)]


class Slowdown:
    """Which ranks are slow, and since when (module docstring)."""

    def __init__(self, rates: Optional[Any] = None) -> None:
        self.rates = rates
        """Where stays in the set are counted (:class:`~semimig.controller.policy.window.Rates`), or ``None``."""
        self.clock = RunClock()
        """The run's seconds by step (:class:`RunClock`): what the states' lives are read in."""
        self.spans: Dict[bool, List[Tuple[int, int]]] = {False: [], True: []}
        """First and next-after-last step of the ended states, by kind (as :attr:`ended`)."""
        self.slow: FrozenSet[int] = frozenset()
        self.since = 0
        self.changes = 0
        self.ended: Dict[bool, List[int]] = {False: [], True: []}
        """Lengths in steps of the ended states, by kind: some rank slow (``True``) or none."""
        self.ratios: Optional[Tuple[float, ...]] = None
        """The speed ratios last read while the present set held."""
        self.previous: Optional[Tuple[FrozenSet[int], Tuple[float, ...]]] = None
        """The state before the present one: its slow set and its last speed ratios (``None``: none ended)."""
        self.sets: List[FrozenSet[int]] = [frozenset()]
        """Every set the run has held, the first (the run's start) included."""
        self.ends = 0
        """Changes of the set that some slow rank left."""
        self.handovers = 0
        """Those of :attr:`ends` that another rank joined: a straggler that moved to another rank."""
        self.handed: FrozenSet[int] = frozenset()
        """The ranks that joined by a hand-over at the last :meth:`update` (empty: none did)."""
        self.lasted_before = 0
        """Steps the state before the present one held, from step 0 at the earliest (0: none ended)."""
        self.start: Optional[int] = None
        """The first step of the run's first reading of steps (``None`` before it; the device probe's reading
        comes before step 0): ranks that join the set at the run's first change over readings reaching back
        to it were slow from the start."""

    def update(self, step: int, ratios: Sequence[float], *, se: float, tolerance: float, z: float,
               samples: int, confirm: Optional[Sequence[float]] = None, since: Optional[int] = None) -> bool:
        """Read the window's speed ratios (``se``: a ratio's relative standard error) at ``step`` over
        ``samples`` steps; ``True`` when the set changed.  ``confirm``: each rank's ratio read over only
        its steps after its last change; a rank joins only where it is slow on those too (slow steps with none
        after them are a bet, priced at their odds, whether or not another rank is slow).  ``since``: the
        step the new set holds from (default: the first of the ``samples``)."""
        band = math.exp(z * se)  # the ratio's noise is relative: its band is a factor
        slow = set(self.slow)
        onset = bool(self.slow) or samples >= N_MIN  # a median one outlier cannot move
        confirm = ratios if confirm is None else confirm
        excess = math.exp(expected_max(len(ratios) - len(self.slow)) * se / math.sqrt(2.0))  # a reading's se: se/√2
        for r, (s, c) in enumerate(zip(ratios, confirm)):
            if max(s, c) < (1.0 - tolerance) / band and onset:
                slow.add(r)
            elif s * excess > min((1.0 - tolerance) * band, 1.0 - tolerance / 2.0):
                slow.discard(r)
        since = step - samples + 1 if since is None else since
        if step >= 0 and self.start is None:
            self.start = since
        from_start = not self.changes and (self.start is None or since <= self.start)
        taken = self._taken_over(ratios, slow, since, se=se, tolerance=tolerance)
        slow |= taken
        self.handed = frozenset(slow - self.slow) if self.slow - slow else frozenset()
        if self.rates is not None:  # a stay is counted from the slowdown's first step
            self.rates.held(step, self.slow & slow)
            self.rates.left(step, self.slow - slow)
            if from_start:  # a rank slow since the run's first reading is no onset: counted only if it ends
                self.rates.began(since, slow - self.slow)
            else:
                self.rates.joined(since, slow - self.slow)
        if frozenset(slow) == self.slow:
            self.ratios = self._held_ratios(ratios, band)
            return False
        self.ends += bool(self.slow - slow)
        self.handovers += bool(self.slow - slow) and bool(slow - self.slow) or bool(taken) and not self.slow
        self.previous = (self.slow, self.ratios if self.ratios is not None else (1.0,) * len(ratios))
        self.lasted_before = self.ran(since)
        self.sets.append(frozenset(slow))
        self.ratios = tuple(ratios)
        if self.changes:  # the first state began with the run, not with a change: its length is not a life
            self.ended[bool(self.slow)].append(max(1, since - self.since))
            self.spans[bool(self.slow)].append((self.since, max(since, self.since + 1)))
        self.slow, self.since, self.changes = frozenset(slow), since, self.changes + 1
        return True

    def _held_ratios(self, ratios: Sequence[float], band: float) -> Tuple[float, ...]:
        """The ratios the present set holds at: each rank's reading, but a slow rank's not above its last by more
        than the band (its recovery beginning, read before it leaves, is not the size of its slowdown)."""
        if self.ratios is None:
            return tuple(ratios)
        return tuple(min(s, old * band) if r in self.slow else s
                     for r, (s, old) in enumerate(zip(ratios, self.ratios)))

    def _taken_over(self, ratios: Sequence[float], slow: AbstractSet[int], since: int, *, se: float,
                    tolerance: float) -> set:
        """The ranks that took over a slowdown leaving now, or one whose end emptied the set that has stayed
        empty since: nearer its size than health (module docstring)."""
        leaving = self.slow - slow
        if leaving and self.ratios is not None and self.ran(since) >= LASTED:
            size = math.log(min(self.ratios[r] for r in leaving))
        elif not self.slow and not slow and self.previous is not None and self.previous[0] \
                and self.lasted_before >= LASTED:
            leaving = set(self.previous[0])
            size = math.log(min(self.previous[1][r] for r in leaving))
        else:
            return set()  # a slowdown read on fewer steps (a probe's, a bet's on outliers) has no size to hand
        if se <= 0.0 or size >= math.log(1.0 - tolerance):
            return set()
        p = self.handover(len(ratios))
        prior = math.log(p / (1.0 - p))
        return {r for r, s in enumerate(ratios) if r not in slow and r not in leaving and s < 1.0 - tolerance
                and (math.log(s) ** 2 - (math.log(s) - size) ** 2) / (2.0 * se * se) + prior > 0.0}

    def ran(self, since: int) -> int:
        """Steps the present set ran before ``since`` (the first step of the next): counted from step 0 at the
        earliest, as the device probe's repeats, before step 0, are no steps run."""
        return since - max(self.since, 0)

    def age(self, step: int) -> int:
        """Steps the present set has held (at least 1)."""
        return max(1, step - self.since + 1)

    def trial(self) -> "Slowdown":
        """A copy to read a step on that may not be kept: its own lists, no :attr:`rates` to count in."""
        out = copy.copy(self)
        out.ended = {kind: list(lengths) for kind, lengths in self.ended.items()}
        out.spans = {kind: list(spans) for kind, spans in self.spans.items()}
        out.sets, out.rates = list(self.sets), None
        return out

    def return_odds(self) -> float:
        """Probability that the state after the present one is the one before it: among the ended states
        that began with a change and were followed by another, the share followed by the state before them
        (a straggler that comes and goes; one that moves on is not), with one of each assumed (Laplace).
        The run's first state is before none of them: it began with the run, so what follows the first
        change is the way back to it by construction, not by evidence."""
        back = sum(a == b for a, b in zip(self.sets[1:], self.sets[3:]))
        return (back + 1.0) / (max(len(self.sets) - 3, 0) + 2.0)

    def handover(self, tp: int) -> float:
        """Probability that a given other rank of ``tp`` slows at the step a slowdown ends: the share of ended
        slowdowns that another rank took over at once, with one of each assumed (Laplace), spread over the
        ``tp − 1`` ranks it could go to.  Beside the outlier rate (a percent of rank-steps) even the prior
        reads a slow step at that moment as the straggler moving, and a run whose slowdowns end without one
        learns to read it as an outlier."""
        return (self.handovers + 1.0) / (self.ends + 2.0) / max(tp - 1, 1)

    def past(self) -> List[int]:
        """Lengths of the ended states of the present kind (some rank slow, or none)."""
        return self.ended[bool(self.slow)]

    def life(self, step: int, current_s: float, proposed_s: float, *, floor: int,
             remaining: Optional[int]) -> Tuple[float, bool]:
        """``(L, ends)``: the steps of the plan in force (``current_s`` each) the present state is expected to
        hold from ``step`` on, and whether it is expected to end within the run.  Its remaining seconds ``W``
        are :func:`expected_life` on :attr:`clock`: its age and the ended
        lives of its kind in seconds, at least ``floor`` steps of the plan in force.  A move to a plan of
        step ``t₁`` costing ``C`` runs ``(W − C)/t₁`` steps in them where staying runs ``W/t₀``; the
        difference, at ``t₁`` a step, is ``(W/t₀)·(t₀ − t₁) − C``: the gain test with ``L = W/t₀``.  Where
        ``W`` holds the run's ``remaining`` steps at ``proposed_s`` the state outlives the run: ``L`` is
        ``remaining`` and nothing ends."""
        clock = self.clock
        lives = [clock.at(b) - clock.at(a) for a, b in self.spans[bool(self.slow)]]
        seconds = expected_life(clock.at(step + 1) - clock.at(self.since), lives, floor=floor * current_s,
                                remaining=None)
        if remaining is not None and seconds >= remaining * proposed_s:
            return float(remaining), False
        return seconds / current_s, True


def handed_over(model: Any, slowdown: Slowdown, ended: AbstractSet[int], slow: AbstractSet[int],
                shares: Sequence[float]) -> Any:
    """``model`` (a :class:`~semimig.sharding.solver.StepModel` read from one step) with each rank newly in
    ``slow`` read at the size of the slowdown that ``ended`` on the same step, the ratio ``slowdown`` last read
    for it: if the straggler moved, the new rank's speed is the one the ended rank held, read over its
    window.  The one step the bet reads is as noisy as one step is (an overshooting plan, a correction after
    it), and, where the straggler moved during it, it ran partly at each rank's pace, so it reads the new rank
    less slow than the slowdown it took over (a plan one correction short, a second move after it).  The bet
    itself is priced at the odds of that one step (:meth:`Slowdown.handover`).  Only where every ended rank
    held units: an emptied rank's ratio rests on its replicated work alone (``R/S``) and is the less sure
    reading."""
    if not ended or slowdown.ratios is None or any(shares[r] <= 0.0 for r in ended):
        return model
    return _no_slower(model, slow, set(slow) - slowdown.slow, min(slowdown.ratios[r] for r in ended), exact=True)


def took_over(model: Any, slowdown: Slowdown) -> Tuple[Any, int]:
    """At the step ranks joined by a hand-over (:attr:`Slowdown.handed`): ``model`` with them read no slower
    than the ended slowdown's last ratio, and the steps that reading rests on, the ended state's length
    (module docstring)."""
    before, ratios = slowdown.previous
    ended = set(before) - slowdown.slow
    ratio = min(ratios[r] for r in ended)
    return _no_slower(model, slowdown.slow, slowdown.handed, ratio), (slowdown.ended[True] or [N_MIN])[-1]


def _no_slower(model: Any, slow: AbstractSet[int], new: AbstractSet[int], ratio: float, exact: bool = False) -> Any:
    """``model`` with each rank of ``new`` read no slower than ``ratio`` of the fastest rank outside ``slow``
    (``exact``: read at it)."""
    top = max((v for r, v in enumerate(model.speeds) if r not in slow), default=max(model.speeds))
    return dataclasses.replace(model, speeds=tuple((ratio * top if exact else max(v, ratio * top)) if r in new else v
                                                   for r, v in enumerate(model.speeds)))
