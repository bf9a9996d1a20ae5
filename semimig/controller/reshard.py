"""When to re-shard: a pure policy that re-plans uneven tensor-parallel shards during training (DESIGN §8).

Inputs, every step, identical on every rank of the TP group (all-gathered first): per rank ``r``
its *compute* seconds ``c_r`` (the whole step's own work, wall minus time in collectives:
:class:`~semimig.straggler.device.DeviceTime`), the part ``b_r ≤ c_r`` of it spent on shardable
work (the paired GEMMs and the spans between a pair's two layers: the attention core, the
activation) and its seconds in collectives ``m_r``.  The plan in force is one
:class:`~semimig.sharding.ShardPlan` per paired dimension (MLP blocks, KV groups), with a weight
``w_d`` per dimension (its share of the shardable work, e.g. its parameters); a rank's effective
share is ``p_r = Σ_d w_d·n_{d,r}/U_d / Σ_d w_d``.

Model (:mod:`semimig.sharding.solver`). ``c_r = (R + S·p_r)/v_r``. Before the first move the
replicated-to-shardable ratio ``k = R/S`` is read from the split: ``(c_r − b_r)·p_r/b_r`` on every
rank, the *smallest* over the ranks (a slowdown that lengthens a rank's compute but not its timed
work only inflates its ``k``). The timed work is not all the shardable work (the optimizer's update
of the shard, the reshapes around the GEMMs also shrink with ``p``), so this ``k`` is an upper bound
(on the example's tiny Llama at h1024, tp 2: 0.086–0.106 from the GEMMs alone, 0.05–0.08 with the
attention core and the activation counted, against 0.030–0.034 across a move); a move measures it: each rank whose share changed by ``Δp`` (at least ``0.05``)
and whose median compute moved the same way by ``Δc`` gives ``k = c_old·Δp/Δc − p_old`` (speeds are
stable on both sides of a move, or it would not have happened); a move whose ranks disagree by more
than 2x measured a speed change instead and is ignored; the median of every estimate so far is used
from then on, capped by the split's bound. The run's first step and the first step after a move
(allocations, first-touch of moved tensors) are not fed to the window (``warmup``). The scale is
fixed by ``R + S/e = 1`` and ``v_r = (R + S·p_r)/c_r`` in units of a healthy even step per second.
The speed *ratios* ``s_r = v_r / max_q v_q`` say who is slow.

A straggler that *stays*: over the last ``window`` steps, in at least ``agree`` of them (default
75 %: a shared machine has outlier steps) every rank's ``s_r`` is within ``tolerance`` (relative)
of its window median.  The state's *age* is how long the median has held within ``tolerance`` of
the median at which it became stable.  A straggler that comes and goes never becomes stable, or
becomes stable only for short ages.

Proposal: :func:`~semimig.sharding.solve_plan` on the window's median model (median ``c_r`` and
``b_r``), per dimension, rounded to whole units, ``≥ min_units`` per rank; the even plan (where
``tp`` divides every dimension: Colossal-AI's layout) is preferred unless the solved plan's
predicted step beats it by more than ``margin``.
Predicted step ``t(plan) = max_r (R + S·p_r)/v_r + min_r m_r`` (the slowest rank waits least: its
``m_r`` is the transfers' own time).

Re-plan only when all of these hold (hysteresis: no flip-flop):

- the state is stable and the proposal differs from the plan in force;
- ``gain = t(current) − t(proposal) > max(margin, noise_z · σ̂) · t(current)``, ``σ̂`` the largest
  relative standard error of a rank's window-median compute (``1.25 · 1.4826 · MAD / median / √W``):
  a plan is never changed for less than the noise of the numbers it is solved from;
- ``gain · min(horizon, age) > move + revert`` — ``move`` the cost measured at the last move,
  scaled by the bytes this move would send (``seconds/byte`` of the last move), or before the
  first move ``bytes / bandwidth + latency``; ``revert`` what the plan costs if the straggler
  leaves: the move back plus ``window`` steps (the time to notice) of the proposal's extra step
  at healthy speeds, ``t_healthy(proposal) − t_healthy(current)`` (nothing for a move back to
  even).  ``age`` is the evidence that the state lasts: a state ``age`` steps old is expected to
  last about as long again, so a come-and-go straggler whose phases are short never pays.  Once
  slow *episodes* have ended (a rank's speed ratio below ``1 − tolerance``, ended by
  ``EPISODE_END`` steps without one), a move toward an uneven plan counts the episode's expected
  *remaining* life instead: over the past episodes longer than the current one's age ``a``, the
  mean of ``L − a``; when the current one has outlived them all, ``a − max L`` (the evidence
  beyond what the past showed).  A throttle that came and went for ``L`` is not re-planned for
  again unless it now stays clearly longer.  Ages and lengths are counted both in steps and in
  seconds of the steps as they ran, and an episode has outlived the past ones only once it has on
  both clocks (the expected life is the shorter of the two, seconds turned into steps at the
  latest step's length): a real throttle lasts a time, not a number of steps — a phase served
  by resizing runs shorter steps than one served by re-sharding, so on the step clock alone it
  outlives an equally long earlier phase well before it ends and is re-planned for as a
  straggler that stays — while an emulated burst lasts a number of steps whatever they cost; and "clearly" is by :data:`OUTLIVE` (a quarter), since what the
  window sees of an episode whose start was re-planned for is shorter than the throttle;
- at least ``dwell`` steps since the last re-plan (and its window refilled under the new plan).

At *launch* (``launch`` steps, default 3: the run's first steps, warm-up included) early decisions
are taken on those steps alone, at each launch step from the second on, on the launch steps so far,
until one moves (the model from the steps after the warm-up; the stability and noise tests from them
too, or from all the launch steps so far when fewer than two follow the warm-up), with
the same tests except that the gain is counted over ``horizon`` instead of the age: a rank slow
from a run's first steps is taken for a slow device (an older card, a throttled share: the case
uneven shards exist for), and moving then spares the run the steps a window would wait at the
full slowdown.  The bet is insured by the cost test, which already charges the move back and a
window at the uneven plan if the slowdown passes.  With two samples the noise gate asks for a
large gain (a spike on one rank makes the speeds unstable, and nothing moves); if the launch
decision keeps the plan, the first window decides as before.  The warm-up step is left out of
the tests because step 0 is slower on every rank for reasons that are not noise (first-touch
allocations, lazy initialisation): a healthy rank's step 0 can take ~1.4x its step 1, and a
noise gate over those two steps then asks more than the gain of a rank at a quarter speed, so
the launch keeps the plan and runs a window at the full slowdown.  Hence three launch steps by
default: two after the warm-up to test.  And the launch's noise is that of each rank's compute
*relative to the fastest rank's in the same step*: the warm-up does not end on one step (every
rank's step 1 may still run ~15 % slower than its step 2), and a drift every rank shares moves the
step but not the relative gain the gate compares — over the raw times such a drift alone can ask
more than a real gain.  Relative, a warm-up
that slows every rank alike cancels in step 0 too, so the launch also decides at step 1, on steps 0
and 1, and the third step decides only when that one keeps the plan (noisier steps: the two-sample
gate asks for more).  A move at step 1 instead of step 2 spares one step at the full slowdown,
several healthy steps' time for a device at a quarter speed, and with no straggler the relative
gate still moves nothing.
Two launch steps may disagree on *how* slow a rank is and agree that it is slow: a throttle that
attaches while step 0 runs reads, say, 3x at step 0 and 4x at step 1, and the relative gate over
that spread can ask slightly more than the gain, so the move would wait a step more at the full
slowdown.  That spread is the slowdown's onset, not noise the gain could be lost in.  So the gate asks only the margin when every launch sample read
alone (its own step model) predicts a gain of at least ``probe`` (the device probe's bar, 25 %: a
rank ≳ 1.7x slower at tp 2) from the same proposal: two steps that slow are a straggler, and a
start-up spike on one step, or a rank slow at one launch step only, fails it (its other step
predicts no gain).  ``probe=0`` turns this off with the probe.
A straggler that came and went, shed.  The model's speeds and steps are at full work (a shedding
rank's compute scaled back up, :func:`semimig.resharder.unshed`), so the gain of a move is counted
against the even split's full step.  In mode ``semi`` resizing already serves the straggler and runs a
shorter step, so a gain counted against the full step overstates what the move buys several times
over (a phase whose steps resizing has halved reads a gain of ~1.4 s/step where the move buys ~0.3),
a move is made that does not pay, and the plan then runs uneven past the lift.  So while the episode in progress is younger than some ended one (a straggler that comes and goes,
by evidence, not yet shown to stay) and the last :data:`RAN_STEPS` samples all shed work, a move toward
uneven counts its gain against the median step as it ran (``ReshardSample.step_s``) when that is
shorter.  A straggler's first episode, one that has outlived every past episode, the launch and the
probe count against the full step as before: a device that stays slow is re-planned for exactly even
where pruning runs faster (the loss resizing costs is not in these seconds, and a straggler that stays
is what exact re-sharding is for).

The device probe.  Even a launch decision at step 1 leaves a device that is slow from the start
two steps at the full slowdown (under a 25 % CPU throttle each of them costs several healthy steps).
So before the first step every rank of
the group runs the same fixed work (square GEMMs of the model's hidden size, sized to ~20 ms on the
fastest rank, :data:`PROBE_REPEATS` times, each closed by a collective so that an emulated device
straggler's sleep lands in it) and :meth:`ReshardPolicy.profile` reads the speed ratios from it: it
moves at once when the probe's model — those speeds, ``R/S`` = :data:`PROBE_REPLICATED_RATIO` — predicts
a gain of at least ``probe`` (default 25 %, a rank ≳ 1.7x slower at tp 2) *and* every repeat agrees
(each slow rank below ``1 − tolerance`` in every repeat, every rank within ``tolerance`` of its
median in ``agree`` of them).  A probe is a bet on less evidence than any step, so it takes only a
large, consistent slowdown; the move then happens before any optimizer state exists (weights and
masters only), counts as a launch move (one window of dwell), and is not compared against a step it
was decided on (there is none): the first window under it is read by the window rule, which refines
the plan from measured steps.  A GEMM is not the whole step, and a device slow at GEMMs only (the
paper's injected straggler, ``scope=gemm``) is not seen by it: the launch decisions at steps 1-2 and
the window rule still serve what the probe does not move for.  ``probe=0`` turns it off.

A launch move was a bet without evidence that the state lasts, so the move back needs
one window of the new speeds, not the default ``dwell`` of ``2W``: a throttle that was on only while the run
started (on for its first few steps only) costs one window at the uneven plan instead of ``2W``
steps.  So is any move whose gain was counted over fewer steps than the dwell (a young state, or an
episode that outlived short past ones): such a move may come, with a few steps' expected life, as
its episode ends, and a ``2W`` dwell would then hold the uneven plan through a healthy phase.

The way back.  An uneven plan is held for a slow rank; when the slow rank recovers, the plan
makes the *other* ranks the slow ones at every step it is held (a plan that puts most of the MLP on
the fast rank runs a free step slower than the even plan).  So after ``return_steps`` samples (default 2) in which no rank was slow (every speed ratio at least
``1 − tolerance``) the plan in force moves to the plan the model of those samples proposes, when
that plan is more even (a smaller largest share) and gains beyond the margin and their noise
enough to pay the move within ``window`` steps (the window rule would make the same move a window
later), instead of waiting for a full window of the new speeds; the dwell does not hold it (it
guards against moving *for* a straggler on too little evidence).  The proposal, not the even plan
itself: a small shard runs its GEMMs less efficiently, so a recovered rank that holds 3 of 32 MLP
blocks reads ~0.86 of the other's speed and its model proposes 17/15, not 16/16; but the plan for
equal speeds unless the proposal beats it by the margin and those samples' noise (four noisy
samples otherwise land a unit or two beside it, and the window rule moves again).  A straggler
that comes back is re-planned for by the window rule above, with its episode history.  Two
samples, because a rank that stays slow reads slow in every sample (0.24-0.5 of the fastest under
a 25 % CPU throttle or a noisy neighbour), so two samples without a slow rank are not its noise;
and each sample waited is a step at the uneven plan with no straggler to serve (such a step can
take nearly twice the even plan's).  With more ``return_steps``, after a bet (the launch's move,
the probe's, or one whose gain was counted over fewer steps than the dwell) half as many samples,
at least 2, take the way back within a window of the move: the bet was placed on that little
evidence (a throttle that lifts just after a launch move would otherwise leave the uneven plan in
force for several free steps).

A move measured slower is undone.  The model's speeds are read under the plan in force, and a
rank's speed is not always a constant of the device: under a CPU quota (a cgroup), a throttled
rank that waits in the group's collectives for the others runs part of its throttled time inside
those waits, so it reads faster at a small share than it runs once it holds more (e.g. 0.26 of the
other's speed at 4 of 32 MLP blocks, 0.21 at 6), and a move predicted faster can run slower than
the plan it left.  So the first full window after a move (the one that measures
``R/S``) also compares the measured step with the step the move was decided against; when it is
slower by more than ``max(margin, noise_z·σ̂)`` the plan moves back to the plan it left, and the
rejected plan is not proposed again while the slow episode lasts (its end, or a move back toward
even, forgets it).  A launch move is compared like any other.  The way back is not undone when a rank
is slow again in that window: it was decided with no rank slow, so a slower step then is the
straggler's return, not the move's doing (undoing it would restore the uneven plan and hold it
past the straggler's next lift), and a new episode is for the window rule and, while
resizing serves it, the rule for a straggler that comes and goes.

Every input is a number all ranks share and the arithmetic is in a fixed order, so every rank
takes the same decision at the same step; nothing is broadcast.  With no straggler the proposal
is the plan in force (even) and nothing ever moves.
"""
from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from semimig._validate import check_int, check_number
from semimig.errors import ConfigError
from semimig.sharding.plan import ShardPlan
from semimig.sharding.solver import StepModel, solve_plan

__all__ = ["ReshardConfig", "ReshardSample", "ReshardDecision", "ReshardPolicy", "moved_units", "EPISODE_END",
           "PROBE_REPEATS", "PROBE_REPLICATED_RATIO", "RAN_STEPS"]

EPISODE_END = 3
"""Consecutive steps without a slow rank that end a slow episode (one fast outlier does not)."""

OUTLIVE = 1.25
"""How much longer than every ended slow episode (on both clocks) the one in progress must last before
it counts as a straggler that stays.  An ended episode's length is what the window saw of it: the
warm-up step and the steps after a move are not observed, so the same throttle reads shorter in the
episode whose start was re-planned for, and the next phase of the same throttle reaches that
length shortly before it lifts; without the margin it would then be re-planned for as a straggler
that stays, a step or two before it ends."""

RAN_STEPS = 3
"""Samples that must all have shed work before a move's gain is counted against the step as it ran
(module docstring, "A straggler that came and went, shed")."""
PROBE_REPEATS = 5
"""Repeats of the device probe's fixed work (module docstring, "The device probe")."""
PROBE_REPLICATED_RATIO = 0.05
"""``R/S`` of the probe's model, which has no step to read it from: 0.030-0.034 across moves and
0.05-0.08 as the split's bound for the example's tiny Llama (module docstring);
the window rule re-reads it from the first window under the probe's plan."""


@dataclass(frozen=True, kw_only=True)
class ReshardConfig:
    """Settings of :class:`ReshardPolicy` (module docstring)."""

    window: int = 20
    """``W``: steps a speed ratio must stay within ``tolerance`` before a straggler counts as staying."""
    first_window: int = 0
    """Steps enough for the *first* re-plan of a run (0: ``max(2, window // 2)``; in mode ``semi``
    ``window``).  In mode ``reshard`` a straggler is otherwise served at its full slowdown for ``W``
    steps; the first decision still needs the noise, margin and age tests, so only a large, steady
    gain moves early.  In mode ``semi`` resizing (and the step reflex) serve it meanwhile at about
    twice a healthy step, so the move waits for a full window of evidence that the straggler stays:
    a half window fills within a throttled phase of a few tens of seconds whose steps the reflex
    has shortened, and the uneven plan would then run past its lift at well above a healthy step.
    After a move the full ``W`` is needed (it also measures ``R/S``)."""
    tolerance: float = 0.25
    """Relative band of the speed ratios around their window median."""
    agree: float = 0.75
    """Share of the window's steps that must lie within ``tolerance`` (the rest are outliers)."""
    horizon: int = 500
    """Most steps a gain is counted over (the expected remaining run, or less)."""
    margin: float = 0.05
    """A re-plan must shorten the predicted step by more than this fraction of it."""
    noise_z: float = 3.0
    """... and by more than this many standard errors of the window's median compute times."""
    dwell: int = 0
    """Fewest steps between two re-plans; 0: ``2·window`` (after a bet, a launch move or one counted
    over fewer steps than that: one ``window``)."""
    bandwidth_bytes_s: float = 1e8
    """Before the first move: its cost is ``bytes / bandwidth + latency`` (100 MB/s: a host link
    under gloo moves ~70-150 MB/s on CPU; NVLink is far faster, and the first move measures it)."""
    latency_s: float = 0.05
    """Fixed cost of a move (also a floor of a measured one's estimate)."""
    min_units: int = 1
    """Units every rank keeps in every dimension (0 allowed: a rank may then hold none of a kind)."""
    warmup: int = 1
    """Steps not fed to the window at the start of the run and after each move."""
    launch: Optional[int] = None
    """Steps of the run's start (warm-up included) on which early decisions are taken with the gain
    counted over ``horizon``, one at each launch step from the second on (and none on warm-up steps
    alone: from step ``warmup`` on), until one moves (module
    docstring); 0: none, the first decision waits for ``first_window``; ``None``: ``min(3, window)``.
    Their stability and noise tests read the steps after ``warmup`` once there are two of them, else
    every launch step so far, relative to the fastest rank in the same step."""
    probe: float = 0.25
    """Before the first step: the smallest predicted gain (a fraction of the even step) for which the
    device probe's plan is taken at once (module docstring, "The device probe"); also the gain each
    launch step must predict alone for the launch's noise gate to ask only the margin (module
    docstring, "At launch"); 0: neither."""
    block_size: Optional[int] = None
    """MLP columns per unit when the model was built without a plan in units (``None``: 128)."""
    return_steps: Optional[int] = None
    """Samples with no slow rank after which an uneven plan moves toward even, to the plan those
    samples' model proposes (module docstring, "The way back"); ``None``: 2; 0: only a full window of
    the new speeds moves it back."""

    def __post_init__(self) -> None:
        check_int("ReshardConfig.window", self.window, minimum=2, maximum=10**6)
        check_int("ReshardConfig.first_window", self.first_window, minimum=0, maximum=self.window)
        if self.first_window == 1:
            raise ConfigError("ReshardConfig.first_window must be 0 (half the window) or at least 2, got 1")
        check_number("ReshardConfig.tolerance", self.tolerance, minimum=0.0, maximum=1.0, low_open=True)
        check_number("ReshardConfig.agree", self.agree, minimum=0.5, maximum=1.0)
        check_int("ReshardConfig.horizon", self.horizon, minimum=1, maximum=10**9)
        check_number("ReshardConfig.margin", self.margin, minimum=0.0, maximum=1.0)
        check_number("ReshardConfig.noise_z", self.noise_z, minimum=0.0, maximum=100.0)
        check_int("ReshardConfig.dwell", self.dwell, minimum=0, maximum=10**9)
        check_number("ReshardConfig.bandwidth_bytes_s", self.bandwidth_bytes_s, minimum=0.0, low_open=True)
        check_number("ReshardConfig.latency_s", self.latency_s, minimum=0.0)
        check_int("ReshardConfig.min_units", self.min_units, minimum=0)
        check_int("ReshardConfig.warmup", self.warmup, minimum=0, maximum=10**6)
        check_int("ReshardConfig.launch", self.launch, minimum=0, maximum=self.window, allow_none=True)
        if self.launch is None:
            object.__setattr__(self, "launch", min(3, self.window))
        if self.launch == 1:
            raise ConfigError("ReshardConfig.launch must be 0 (no launch decision) or at least 2 steps, got 1")
        check_number("ReshardConfig.probe", self.probe, minimum=0.0, maximum=1.0, high_open=True)
        check_int("ReshardConfig.block_size", self.block_size, minimum=1, allow_none=True)
        check_int("ReshardConfig.return_steps", self.return_steps, minimum=0, maximum=self.window, allow_none=True)
        if self.return_steps is None:
            object.__setattr__(self, "return_steps", 2)
        if self.return_steps == 1:
            raise ConfigError("ReshardConfig.return_steps must be 0 (the window rule only) or at least 2 steps, "
                              "got 1")

    @property
    def min_dwell(self) -> int:
        return self.dwell or 2 * self.window

    @property
    def first_steps(self) -> int:
        """Samples the first decision needs."""
        return self.first_window or max(2, self.window // 2)


@dataclass(frozen=True)
class ReshardSample:
    """One step of the group, every rank's numbers (all-gathered, so identical on every rank)."""

    compute_s: Tuple[float, ...]
    """``c_r``: the rank's own work in the step (wall minus collectives), seconds."""
    shardable_s: Tuple[float, ...]
    """``b_r``: the part of ``c_r`` in shardable work (the paired GEMMs and the spans between a pair's
    layers), seconds."""
    comm_s: Tuple[float, ...]
    """``m_r``: seconds in collectives."""
    gemm_s: Optional[Tuple[float, ...]] = None
    """The part of ``b_r`` in the paired GEMMs alone (unpruned): what a resizing controller's busy
    time measures; ``None``: all of ``b_r``."""
    step_s: Optional[float] = None
    """The step as it ran when some rank shed work (resizing or migration): ``max_r`` of the measured
    compute, shed work left out, ``+ min_r m_r``; ``None``: nothing was shed (the model's step is the
    step as it ran)."""

    def __post_init__(self) -> None:
        lengths = [len(self.compute_s), len(self.shardable_s), len(self.comm_s)]
        lengths += [] if self.gemm_s is None else [len(self.gemm_s)]
        if lengths[0] == 0 or any(n != lengths[0] for n in lengths):
            raise ConfigError(f"ReshardSample: compute_s, shardable_s, comm_s (and gemm_s) need one entry per rank, "
                              f"got {', '.join(map(str, lengths))}")
        for name in ("compute_s", "shardable_s", "comm_s") + (() if self.gemm_s is None else ("gemm_s",)):
            values = tuple(check_number(f"{name}[{r}]", float(v), minimum=0.0)
                           for r, v in enumerate(getattr(self, name)))
            object.__setattr__(self, name, values)
        if self.step_s is not None:
            object.__setattr__(self, "step_s", check_number("step_s", float(self.step_s), minimum=0.0))

    @property
    def gemm(self) -> Tuple[float, ...]:
        """``gemm_s``, or ``shardable_s`` when it was not given."""
        return self.shardable_s if self.gemm_s is None else self.gemm_s

    @property
    def valid(self) -> bool:
        """Every rank did shardable work, and less than its whole compute."""
        return all(0.0 < b < c for b, c in zip(self.shardable_s, self.compute_s))


@dataclass(frozen=True)
class ReshardDecision:
    """What :meth:`ReshardPolicy.observe` concluded at one step."""

    step: int
    plans: Optional[Tuple[ShardPlan, ...]] = None
    """The plans to move to now (one per dimension), or ``None``: keep the plan in force."""
    reason: str = ""
    predicted_s: float = 0.0
    """Predicted step (compute + communication) under ``plans`` (or under the plan in force)."""
    current_s: float = 0.0
    """Predicted step under the plan in force (equals its measured window median)."""
    speed_ratios: Tuple[float, ...] = ()
    move_bytes: int = 0
    move_cost_s: float = 0.0
    """The move's cost and its revert's (module docstring)."""
    horizon: int = 0

    @property
    def replan(self) -> bool:
        return self.plans is not None


def _speed_ratios(model: StepModel) -> Tuple[float, ...]:
    """``s_r = v_r / max_q v_q``: who is slow, and by how much."""
    return tuple(v / max(model.speeds) for v in model.speeds)


def moved_units(old: ShardPlan, new: ShardPlan) -> int:
    """Units that change owner: with consecutive units in rank order, the unit at position ``i``
    moves when its owner differs between the two plans."""
    if old.total_units != new.total_units or old.tp != new.tp:
        raise ConfigError(f"plans {old} and {new} are not of the same dimension and group")

    def owners(plan: ShardPlan) -> list[int]:
        return [r for r, n in enumerate(plan.units) for _ in range(n)]

    return sum(a != b for a, b in zip(owners(old), owners(new)))


@dataclass
class _State:
    reference: Optional[Tuple[float, ...]] = None
    since: int = 0


@dataclass
class _Episode:
    """The slow episode in progress (:meth:`ReshardPolicy._track_episode`)."""

    first: int
    """Its first slow step."""
    last: int
    """Its latest slow step."""
    seconds_to_last: float
    """Seconds from its start up to the end of :attr:`last` (how an ended episode is counted)."""
    seconds: float
    """Seconds from its start up to the end of :attr:`tracked`."""
    tracked: int
    """The latest step tracked."""


def _step_seconds(sample: ReshardSample) -> float:
    """A step's length as it ran: ``step_s`` when work was shed, else ``max_r c_r + min_r m_r``."""
    if sample.step_s is not None:
        return sample.step_s
    return max(sample.compute_s) + min(sample.comm_s)


class ReshardPolicy:
    """Decides, step by step, whether to move to another uneven plan (module docstring).

    ``plans``          the plan in force, one :class:`ShardPlan` per paired dimension;
    ``weights``        each dimension's share of the shardable work (e.g. its parameter count);
    ``bytes_per_unit`` bytes one unit of each dimension moves (weights + optimizer state, all layers).
    """

    def __init__(self, plans: Sequence[ShardPlan], *, weights: Sequence[float], bytes_per_unit: Sequence[int],
                 config: ReshardConfig = ReshardConfig()) -> None:
        if not isinstance(config, ReshardConfig):
            raise ConfigError(f"config must be a ReshardConfig, got {config!r}")
        plans = tuple(plans)
        if not plans or not all(isinstance(p, ShardPlan) for p in plans):
            raise ConfigError(f"plans must be a non-empty sequence of ShardPlan, got {plans!r}")
        if len({p.tp for p in plans}) != 1:
            raise ConfigError(f"plans must all have the same tp, got {[p.tp for p in plans]}")
        if len(weights) != len(plans) or len(bytes_per_unit) != len(plans):
            raise ConfigError(f"weights and bytes_per_unit need one entry per plan ({len(plans)}), got "
                              f"{len(weights)} and {len(bytes_per_unit)}")
        self.weights = tuple(check_number(f"weights[{d}]", float(w), minimum=0.0, low_open=True)
                             for d, w in enumerate(weights))
        self.bytes_per_unit = tuple(check_int(f"bytes_per_unit[{d}]", b, minimum=0)
                                    for d, b in enumerate(bytes_per_unit))
        self.config = config
        self.plans = plans
        self.tp = plans[0].tp
        self.step = 0
        self.last_move_step: Optional[int] = None
        self.seconds_per_byte: Optional[float] = None
        self.samples: collections.deque = collections.deque(maxlen=config.window)
        self._state = _State()
        self.measured_k: Optional[float] = None
        """``R/S`` measured across a move (module docstring); ``None`` before."""
        self._before: Optional[tuple] = None
        self._k_found: list[float] = []
        self.history: list[ReshardDecision] = []
        """Every decision that re-planned."""
        self.episodes: list[int] = []
        """Lengths in steps of the slow episodes that ended (module docstring)."""
        self.episode_seconds: list[float] = []
        """Their lengths in seconds of the steps as they ran (what the episode rules compare)."""
        self._episode: Optional[_Episode] = None  # the one in progress
        self._k = 0.0  # R/S of the latest decision's model (measured and capped), for the per-step ratios
        self._skip = config.warmup  # steps still to leave out of the window (warm-up)
        self._launch: list[ReshardSample] = []  # the run's first ``launch`` steps (module docstring)
        self._bet = False  # the decision just handed out is a bet (the launch's, or on a young state)
        self._dwell = config.min_dwell  # steps the plan in force must be kept (one window after a bet)
        self._reverting = False  # the decision just handed out undoes the last move
        self._returning = False  # the decision just handed out is the way back (no rank was slow)
        self._on_bet = False  # the plan in force was moved to on a bet (its way back needs fewer samples)
        # the last move's (plans it left, step seconds it was decided against, whether it was the way back),
        # until its window is measured
        self._undo: Optional[tuple] = None
        self.rejected: set = set()
        """Plans a move measured slower than the plan it left (module docstring); forgotten when the
        slow episode ends or a move evens the plan out."""

    # ------------------------------------------------------------------ public
    @property
    def replicated_ratio(self) -> float:
        """``R/S`` of the latest decision's model (0 before the first)."""
        return self._k

    def shares(self, plans: Optional[Sequence[ShardPlan]] = None) -> Tuple[float, ...]:
        """Effective share ``p_r = Σ_d w_d·n_{d,r}/U_d / Σ_d w_d`` of each rank."""
        plans = self.plans if plans is None else plans
        total = sum(self.weights)
        return tuple(sum(w * p.shares()[r] for w, p in zip(self.weights, plans)) / total for r in range(self.tp))

    def moved(self, new: Sequence[ShardPlan]) -> Tuple[int, int]:
        """``(units, bytes)`` a move from the plan in force to ``new`` sends."""
        units = [moved_units(old, plan) for old, plan in zip(self.plans, new)]
        return sum(units), sum(u * b for u, b in zip(units, self.bytes_per_unit))

    def moved_to(self, plans: Sequence[ShardPlan], *, seconds: float, bytes_moved: int) -> None:
        """The move decided at the last step happened: ``plans`` in force, its measured cost noted."""
        plans = tuple(plans)
        if len(plans) != len(self.plans) or any(p.total_units != q.total_units for p, q in zip(plans, self.plans)):
            raise ConfigError(f"moved_to: plans {[str(p) for p in plans]} do not match the dimensions in force")
        check_number("seconds", seconds, minimum=0.0)
        check_int("bytes_moved", bytes_moved, minimum=0)
        if bytes_moved > 0:
            self.seconds_per_byte = max(seconds - self.config.latency_s, 0.0) / bytes_moved
        before = list(self.samples)
        if self.last_move_step is None and len(before) < self._needed():  # a launch move: its steps after warm-up
            before = self._launch[self.config.warmup:]
        if before and (len(before) >= self._needed() or self.last_move_step is None):  # what the move was decided on
            self._before = (self.shares(), [statistics.median(s.compute_s[r] for s in before) for r in range(self.tp)])
        last = self.history[-1] if self.history else None
        reverting, returning = self._reverting, self._returning
        self._undo = None if reverting or last is None or last.current_s <= 0.0 else \
            (self.plans, last.current_s, returning)
        self._reverting = self._returning = False
        if max(self.shares(plans)) < max(self.shares()) and not reverting:
            self.rejected.clear()  # a move toward even: the state the rejections were measured in is gone
        self.plans = plans
        bet = self._bet and not self.config.dwell  # an explicit dwell always holds
        self._dwell = self.config.window if bet else self.config.min_dwell
        self._on_bet = bet
        self._bet = False
        self.last_move_step = self.step
        self.samples.clear()  # measurements under the old plan say nothing about the new one's times
        self._skip = self.config.warmup
        self._state = _State()

    def profile(self, times: Sequence[Sequence[float]]) -> ReshardDecision:
        """The plan to take before the first step from the device probe (module docstring, "The device
        probe"): ``times[i][r]`` is rank ``r``'s seconds for the probe's fixed work in repeat ``i``.

        Speed ratios per repeat ``s_r = min_q t_q / t_r``; the model is their medians with ``R/S`` =
        :data:`PROBE_REPLICATED_RATIO`, in units of a healthy even step (so ``predicted_s`` is the
        proposal's step relative to the even one, and ``current_s`` is 0: there is no measured step to
        compare the move against).  Moves when the proposal's relative gain is at least ``probe`` and
        every repeat agrees."""
        cfg = self.config
        if self.step != 0 or self.last_move_step is not None:
            moved = ", and a move was made" if self.last_move_step is not None else ""
            raise ConfigError(f"profile() is for before the first step and the first move; {self.step} steps were "
                              f"observed{moved}")
        rows = [tuple(row) for row in times] if isinstance(times, (list, tuple)) else None
        if not rows or any(len(row) != self.tp for row in rows):
            raise ConfigError(f"profile() takes one row of {self.tp} probe times per repeat, got {times!r}")
        rows = [tuple(check_number(f"times[{i}][{r}]", float(t), minimum=0.0, low_open=True)
                      for r, t in enumerate(row)) for i, row in enumerate(rows)]
        if cfg.probe <= 0.0:
            return ReshardDecision(-1, reason="the device probe is off (probe=0)")
        ratios = [tuple(min(row) / t for t in row) for row in rows]
        steady, median = self._steady(ratios)
        k = PROBE_REPLICATED_RATIO
        shardable = 1.0 / (k + 1.0 / self.tp)
        model = StepModel(speeds=median, replicated=k * shardable, shardable=shardable)
        current = self._predict(model, self.plans)
        base = dict(predicted_s=1.0, speed_ratios=median)
        slow = [r for r, v in enumerate(median) if v < 1.0 - cfg.tolerance]
        if not slow:
            return ReshardDecision(-1, reason=f"the device probe finds no slow rank (speed ratios "
                                              f"{'/'.join(f'{v:.2f}' for v in median)})", **base)
        if not steady or any(ratio[r] >= 1.0 - cfg.tolerance for ratio in ratios for r in slow):
            return ReshardDecision(-1, reason="the device probe's repeats disagree (noise, or a straggler that "
                                              "comes and goes): the launch steps decide", **base)
        proposal = self._propose(model)
        gain = 1.0 - self._predict(model, proposal) / current
        if proposal == self.plans or gain < cfg.probe:
            return ReshardDecision(-1, reason=f"the device probe's plan gains {gain:.0%} of the even step, below "
                                              f"probe={cfg.probe:.0%}: the launch steps decide", **base)
        units, nbytes = self.moved(proposal)
        self._bet = True
        decision = ReshardDecision(-1, plans=proposal, predicted_s=1.0 - gain, speed_ratios=median,
                                   move_bytes=nbytes, move_cost_s=self._move_cost(nbytes), horizon=cfg.horizon,
                                   reason=f"device probe: the same slowdown in {len(rows)} of {len(rows)} repeats, "
                                          f"{gain:.0%} off the even step predicted ({units} units)")
        self.history.append(decision)
        return decision

    def observe(self, sample: ReshardSample) -> ReshardDecision:
        """Feed one step; the decision for the next (``plans`` not ``None``: move now)."""
        if not isinstance(sample, ReshardSample):
            raise ConfigError(f"observe() takes a ReshardSample, got {sample!r}")
        if len(sample.compute_s) != self.tp:
            raise ConfigError(f"the sample has {len(sample.compute_s)} ranks, the plans {self.tp}")
        step, self.step = self.step, self.step + 1
        self._returning = False  # a way back that was not moved to (moved_to not called) is forgotten
        launch = self.config.launch
        if step < launch and sample.valid:
            self._launch.append(sample)
        if self._skip > 0:
            self._skip -= 1
        elif sample.valid:
            self.samples.append(sample)
            self._track_episode(step, sample)
        # every launch step from the first that is past the warm-up (and the second at the earliest) decides on
        # the launch steps so far, until one moves
        first = max(1, self.config.warmup)
        at_launch = first <= step <= launch - 1 and len(self._launch) == step + 1 and self.last_move_step is None
        decision = self._decide(step, launch=self._launch) if at_launch else self._decide(step)
        # a bet: the launch's move, or one counted over a life shorter than the dwell (a young state)
        self._bet = decision.replan and (at_launch or decision.horizon < self.config.min_dwell)
        if decision.replan:
            self.history.append(decision)
        return decision

    # ------------------------------------------------------------------ model
    def model(self, samples: Sequence[ReshardSample]) -> Tuple[StepModel, float]:
        """The step model of the window's medians (module docstring) and the communication floor."""
        e = self.tp
        c = [statistics.median(s.compute_s[r] for s in samples) for r in range(e)]
        b = [statistics.median(s.shardable_s[r] for s in samples) for r in range(e)]
        m = [statistics.median(s.comm_s[r] for s in samples) for r in range(e)]
        p = self.shares()
        k = min((c[r] - b[r]) * p[r] / b[r] for r in range(e) if p[r] > 0)  # an upper bound (module docstring)
        if self.measured_k is not None:
            k = min(self.measured_k, k)  # a measurement above the bound is noise of the move's two windows
        S = 1.0 / (k + 1.0 / e)
        R = k * S
        return StepModel(speeds=tuple((R + S * p[r]) / c[r] for r in range(e)), replicated=R, shardable=S), min(m)

    def _measure_k(self, samples: Sequence[ReshardSample]) -> None:
        """After a move, the first full window: ``R/S`` from the compute before and after it."""
        if self._before is None:
            return
        (p_old, c_old), self._before = self._before, None
        p_new = self.shares()
        found = []
        for r in range(self.tp):
            dp = p_new[r] - p_old[r]
            dc = statistics.median(s.compute_s[r] for s in samples) - c_old[r]
            if abs(dp) >= 0.05 and dp * dc > 0:
                k = c_old[r] * dp / dc - p_old[r]
                if k >= 0.0:
                    found.append(k)
        if len(found) > 1 and max(found) > 2.0 * min(found):
            return  # the ranks disagree: a speed changed across the move; this one measures nothing
        if found:
            self._k_found.extend(found)
            self.measured_k = statistics.median(self._k_found)

    def _has_slow_rank(self, sample: ReshardSample) -> bool:
        """Some rank's speed ratio in ``sample`` (at the latest ``R/S``) is below ``1 − tolerance``:
        what starts or extends a slow episode, keeps the way back and excuses the way back's window."""
        return min(self._ratios(sample, self._k)) < 1.0 - self.config.tolerance

    def _ratios(self, sample: ReshardSample, k: float) -> Tuple[float, ...]:
        p = self.shares()
        v = [(k + p[r]) / sample.compute_s[r] for r in range(self.tp)]
        top = max(v)
        return tuple(x / top for x in v)

    def _track_episode(self, step: int, sample: ReshardSample) -> None:
        """Slow episodes: begin at a step with a rank below ``1 − tolerance``, end after
        :data:`EPISODE_END` steps without one; the ended ones' lengths go to :attr:`episodes` (steps)
        and :attr:`episode_seconds` (the steps as they ran: :func:`_step_seconds`, a step left out of
        the window, as after a move, counted at the length of the next one tracked)."""
        slow = self._has_slow_rank(sample)
        seconds = _step_seconds(sample)
        episode = self._episode
        if episode is not None:
            episode.seconds += seconds * (step - episode.tracked)
            episode.tracked = step
        if slow:
            if episode is None:
                episode = self._episode = _Episode(first=step, last=step, seconds_to_last=seconds, seconds=seconds,
                                                   tracked=step)
            episode.last, episode.seconds_to_last = step, episode.seconds
        elif episode is not None and step - episode.last >= EPISODE_END:
            self.episodes.append(episode.last - episode.first + 1)
            self.episode_seconds.append(episode.seconds_to_last)
            self._episode = None
            self.rejected.clear()

    def _episode_age(self) -> Optional[tuple[int, float]]:
        """``(steps, seconds)`` of the slow episode in progress up to its last slow step (as the ended
        ones are counted); ``None`` when none is in progress or none has ended to compare it with."""
        if self._episode is None or not self.episodes:
            return None
        return self._episode.last - self._episode.first + 1, self._episode.seconds_to_last

    def _expected_life(self, age: int) -> int:
        """Steps the present state is expected to last (module docstring: age, or the episodes', the
        shorter of their steps and their seconds at the latest step's length)."""
        a = self._episode_age()
        if a is None:
            return age
        lives = []
        for lengths, now in ((self.episodes, a[0]), (self.episode_seconds, a[1])):
            longer = [length - now for length in lengths if length > now]
            lives.append(sum(longer) / len(longer) if longer else max(now - max(lengths), 0))
        latest = _step_seconds(self.samples[-1]) if self.samples else 0.0  # the latest step tracked
        seconds_in_steps = lives[1] / latest if latest > 0.0 else 0.0
        return int(min(lives[0], seconds_in_steps))

    def _within_past_episodes(self) -> bool:
        """A slow episode is in progress and some ended one lasted longer than it has so far, in steps
        or in seconds, by :data:`OUTLIVE` (a straggler that comes and goes, not yet shown to stay:
        module docstring)."""
        a = self._episode_age()
        return a is not None and (any(OUTLIVE * length > a[0] for length in self.episodes) or
                                  any(OUTLIVE * length > a[1] for length in self.episode_seconds))

    def _ran(self, samples: Sequence[ReshardSample]) -> Optional[float]:
        """The median step as it ran over the last :data:`RAN_STEPS` samples when every one of them
        shed work (``ReshardSample.step_s``); ``None`` otherwise."""
        recent = list(samples)[-RAN_STEPS:]
        if len(recent) < RAN_STEPS or any(s.step_s is None for s in recent):
            return None
        return statistics.median(s.step_s for s in recent)

    def _steady(self, ratios: list) -> tuple[bool, tuple]:
        """At least ``agree`` of the steps with every rank's ratio within ``tolerance`` of its median;
        and the medians."""
        tol = self.config.tolerance
        median = tuple(statistics.median(col) for col in zip(*ratios))
        inside = sum(all(abs(x - med) <= tol * med for x, med in zip(row, median)) for row in ratios)
        return inside >= self.config.agree * len(ratios), median

    def _stable(self, step: int, ratios: list) -> bool:
        """:meth:`_steady` over the window; tracks the state's age."""
        tol = self.config.tolerance
        stable, median = self._steady(ratios)
        state = self._state
        if not stable:
            self._state = _State()
        elif state.reference is None or any(abs(a - b) > tol * b for a, b in zip(median, state.reference)):
            self._state = _State(reference=median, since=step - len(ratios) + 1)
        return stable

    # ------------------------------------------------------------------ decision
    def _needed(self) -> int:
        """Samples a decision needs: the first window before the run's first move, then ``W``."""
        return self.config.first_steps if self.last_move_step is None else self.config.window

    def _decide(self, step: int, launch: Optional[Sequence[ReshardSample]] = None) -> ReshardDecision:
        """The decision at ``step``: on the window, or on the ``launch`` samples (module docstring)."""
        cfg = self.config
        uneven = not all(p.is_even for p in self.plans)  # an even plan has no way back to take
        back_steps = self._return_steps()
        if launch is None and back_steps and uneven and len(self.samples) >= back_steps:
            back = self._way_back(step)
            if back is not None:
                return back
        if launch is None and len(self.samples) < self._needed():
            return ReshardDecision(step, reason=f"window filling ({len(self.samples)}/{self._needed()})")
        if launch is None:
            samples = read = list(self.samples)
        else:  # the model after the warm-up (step 0's allocations inflate R); the tests too, given two steps
            read = list(launch[cfg.warmup:]) or list(launch)
            samples = read if len(read) >= 2 else list(launch)
        if launch is None and self._undo is not None:
            undo = self._undo_slower_move(step, samples)
            if undo is not None:
                return undo
        if launch is None:
            self._measure_k(samples)
        model, comm = self.model(read)
        k = self._k = model.replicated / model.shardable
        ratios = [self._ratios(s, k) for s in samples]
        stable = self._stable(step, ratios) if launch is None else self._steady(ratios)[0]
        speed = _speed_ratios(model)
        current = self._predict(model, self.plans) + comm
        base = dict(current_s=current, predicted_s=current, speed_ratios=speed)
        if not stable:
            return ReshardDecision(step, reason="speeds not stable over the window (a straggler that comes and goes, "
                                                "or noise)", **base)
        proposal = self._propose(model)
        if proposal == self.plans:
            return ReshardDecision(step, reason="the plan in force is the best", **base)
        if proposal in self.rejected:
            return ReshardDecision(step, reason="the proposal was measured slower than the plan in force (a move to "
                                                "it was undone); keeping the plan", **base)
        predicted = self._predict(model, proposal) + comm
        gain = current - predicted
        units, nbytes = self.moved(proposal)
        healthy = self._healthy(model)
        overstay = max(self._predict(healthy, proposal) - self._predict(healthy, self.plans), 0.0)
        cost = 2.0 * self._move_cost(nbytes) + cfg.window * overstay
        age = step - self._state.since + 1
        toward_uneven = max(self.shares(proposal)) > max(self.shares())
        if launch is not None:
            horizon = cfg.horizon  # a rank slow from the start is taken for a slow device
        else:
            horizon = min(cfg.horizon, self._expected_life(age) if toward_uneven else age)
        info = dict(current_s=current, predicted_s=predicted, speed_ratios=speed, move_bytes=nbytes,
                    move_cost_s=cost, horizon=horizon)
        needed = self._required_gain(samples, relative=launch is not None)
        agreed = launch is not None and needed > cfg.margin and self._launch_agrees(samples, proposal)
        if agreed:  # every launch step alone predicts a large gain: its noise is not the question (docstring)
            needed = cfg.margin
        against = current
        ran = self._ran(samples) if launch is None and toward_uneven and self._within_past_episodes() else None
        if ran is not None and ran < current:  # a straggler that came and went, shed now (module docstring)
            against, gain = ran, ran - predicted
        if gain <= needed * against:
            shed = f" (against the step as it ran, shedding: {ran:.4g} s)" if against < current else ""
            return ReshardDecision(step, reason=f"gain {gain:.4g} s/step within the margin "
                                                f"({needed:.0%} of {against:.4g} s){shed}", **info)
        if gain * horizon <= cost:
            return ReshardDecision(step, reason=f"gain {gain:.4g} s/step x {horizon} steps does not pay the move "
                                                f"and its revert ({cost:.4g} s)", **info)
        if self.last_move_step is not None and step - self.last_move_step < self._dwell:
            return ReshardDecision(step, reason=f"dwell: {step - self.last_move_step} of {self._dwell} steps since "
                                                "the last re-plan", **info)
        at = " (at launch)" if launch is not None else ""
        if agreed:
            at = f" (at launch, every launch step alone predicting at least {cfg.probe:.0%})"
        return ReshardDecision(step, plans=proposal, reason=f"gain {gain:.4g} s/step x {horizon} steps > move "
                                                            f"and revert {cost:.4g} s ({units} units){at}", **info)

    def _launch_agrees(self, samples: Sequence[ReshardSample], proposal: Sequence[ShardPlan]) -> bool:
        """Every launch sample, read alone (its own step model), predicts a gain of at least ``probe``
        of its step from ``proposal`` (module docstring, "At launch"); ``False`` when ``probe`` is 0."""
        if not self.config.probe:
            return False
        for sample in samples:
            model, comm = self.model([sample])
            current = self._predict(model, self.plans) + comm
            if current - (self._predict(model, proposal) + comm) < self.config.probe * current:
                return False
        return True

    def _undo_slower_move(self, step: int, samples: Sequence[ReshardSample]) -> Optional[ReshardDecision]:
        """The first full window after a move: back to the plan it left when the measured step is
        slower than the step it was decided against (module docstring, "A move measured slower");
        ``None`` when it is not.  Either way the comparison is made once per move."""
        cfg = self.config
        (left, before, way_back), self._undo = self._undo, None
        if way_back and any(self._has_slow_rank(s) for s in samples):
            return None  # the straggler came back: a new episode for the window rule, not the move's doing
        model, comm = self.model(samples)
        measured = self._predict(model, self.plans) + comm  # the window's median step (max c_r + min m_r)
        needed = self._required_gain(samples)
        if measured <= before * (1.0 + needed):
            return None
        self.rejected.add(self.plans)
        self._before = None  # the move measured a change of speed with the plan, not R/S: no estimate from it
        self._reverting = True
        units, nbytes = self.moved(left)
        return ReshardDecision(step, plans=tuple(left), current_s=measured, predicted_s=before,
                               speed_ratios=_speed_ratios(model),
                               move_bytes=nbytes, move_cost_s=self._move_cost(nbytes), horizon=cfg.horizon,
                               reason=f"the last move measured slower ({measured:.4g} s/step against {before:.4g} s "
                                      f"before it, beyond {needed:.0%}): back to the plan it left ({units} units)")

    def _return_steps(self) -> int:
        """Samples the way back needs: ``return_steps``; half as many (at least 2) within a window of a
        bet's move (module docstring, "The way back": a bet held for a window of the speeds it was
        placed for is no longer one); 0: no way back."""
        n = self.config.return_steps
        young = self._on_bet and self.last_move_step is not None and self.step - self.last_move_step <= \
            self.config.window
        return max(2, n // 2) if n and young else n

    def _healthy(self, model: StepModel) -> StepModel:
        """``model`` with every rank at its fastest rank's speed (the group with no straggler)."""
        return StepModel(speeds=(max(model.speeds),) * self.tp, replicated=model.replicated,
                         shardable=model.shardable)

    def _way_back(self, step: int) -> Optional[ReshardDecision]:
        """The move toward even after ``return_steps`` samples with no slow rank (module docstring,
        "The way back"); ``None`` when it does not apply."""
        cfg = self.config
        n = self._return_steps()
        recent = list(self.samples)[-n:]
        if any(self._has_slow_rank(s) for s in recent):
            return None
        model, comm = self.model(recent)
        needed = self._required_gain(recent)
        proposal = self._propose(model)
        home = self._propose(self._healthy(model))
        if self._predict(model, proposal) * (1.0 + needed) >= self._predict(model, home):
            proposal = home  # a few samples' noise does not pick a plan beside the plan for equal speeds
        if proposal == self.plans or max(self.shares(proposal)) >= max(self.shares()):
            return None  # the way back only evens a plan out
        current = self._predict(model, self.plans) + comm
        predicted = self._predict(model, proposal) + comm
        gain = current - predicted
        units, nbytes = self.moved(proposal)
        cost = self._move_cost(nbytes)
        speed = _speed_ratios(model)
        info = dict(current_s=current, predicted_s=predicted, speed_ratios=speed, move_bytes=nbytes,
                    move_cost_s=cost, horizon=cfg.window)
        if gain <= needed * current or gain * cfg.window <= cost:
            return None
        self._returning = True
        return ReshardDecision(step, plans=proposal, reason=f"no rank slow over the last {n} steps: "
                                                             f"toward even (gain {gain:.4g} s/step x {cfg.window} "
                                                             f"steps > move {cost:.4g} s, {units} units)", **info)

    def _required_gain(self, samples: Sequence[ReshardSample], *, relative: bool = False) -> float:
        """The relative gain a change of plan must beat: ``max(margin, noise_z · σ̂)``."""
        return max(self.config.margin, self.config.noise_z * self._noise(samples, relative=relative))

    def _noise(self, samples: Sequence[ReshardSample], *, relative: bool = False) -> float:
        """Largest relative standard error of a rank's median compute over the window; ``relative``:
        of its compute over the fastest rank's in the same step (a drift every rank shares cancels)."""
        worst = 0.0
        for r in range(self.tp):
            values = [s.compute_s[r] / (min(s.compute_s) if relative else 1.0) for s in samples]
            med = statistics.median(values)
            mad = statistics.median(abs(v - med) for v in values)
            worst = max(worst, 1.25 * 1.4826 * mad / med / len(values) ** 0.5)
        return worst

    def _propose(self, model: StepModel) -> Tuple[ShardPlan, ...]:
        """The solved plan, or the even one unless the solved plan beats it by more than the margin."""
        solved = tuple(solve_plan(model, total_units=p.total_units, unit_size=p.unit_size,
                                  min_units=self.config.min_units) for p in self.plans)
        if all(p.total_units % self.tp == 0 for p in self.plans):
            even = tuple(ShardPlan.even(p.total_units, self.tp, unit_size=p.unit_size) for p in self.plans)
            if self._predict(model, solved) * (1.0 + self.config.margin) >= self._predict(model, even):
                return even
        return solved

    def _predict(self, model: StepModel, plans: Sequence[ShardPlan]) -> float:
        return model.step(self.shares(plans))

    def _move_cost(self, nbytes: int) -> float:
        cfg = self.config
        if self.seconds_per_byte is None:
            return cfg.latency_s + nbytes / cfg.bandwidth_bytes_s
        return cfg.latency_s + nbytes * self.seconds_per_byte
