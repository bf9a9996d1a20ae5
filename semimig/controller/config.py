"""Configuration of the controller: the pure decision core (DESIGN §3) and its evidence on real time (§3a)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from semimig._validate import check_choice, check_int, check_number
from semimig.controller.reflex import ReflexConfig
from semimig.errors import ConfigError
from semimig.modes import PLAN_MODES

PlanMode = Literal["baseline", "zero", "mig", "semi"]
MODES: tuple[str, ...] = PLAN_MODES
"""How shed columns are planned (:attr:`semimig.modes.Mode.plan_mode` of the balancing mode)."""
ZERO_REFERENCES: tuple[str, ...] = ("mean", "min")
RECEIVER_POLICIES: tuple[str, ...] = ("non_migrating", "normal")


@dataclass(frozen=True, kw_only=True)
class ControllerConfig:
    """How busy times become a plan: who sheds how much (Eq. 1), split how (Eqs. 2, 3).

    The first group of fields drives :func:`semimig.controller.plan.decide_plan`; the second
    (``window`` … ``backoff_iterations``) drives the evidence on real time
    (:mod:`semimig.controller.timing`, :mod:`semimig.controller.shedding`): no rank sheds work
    without a sustained, significant imbalance, and a rank whose pruning does not pay backs off.
    """

    mode: PlanMode = "semi"
    """``baseline``: every rank normal. ``zero``: every straggler resizes (Eq. 1 against
    ``zero_reference``). ``mig``: every straggler migrates, nobody prunes. ``semi``: Eq. 2 for a
    single straggler, Eq. 3 for several (paper IV-B).  Inside a
    :class:`~semimig.controller.BalanceConfig` it is read from the balancing mode
    (:meth:`BalanceConfig.controller_in_force <semimig.controller.BalanceConfig.controller_in_force>`); left at
    its default there, or set to the mode's own plan mode."""

    tol: float = 0.20
    """Relative band of the straggler test: rank ``i`` straggles only if its unpruned time exceeds
    the fastest rank's by more than ``tol`` (and, on real time, by more than ``noise_sigmas``
    standard errors).  20 %: on a shared CPU two equal ranks differ by 10-15 % for stretches of
    iterations (their collective threads compete with the GEMMs), and balancing a smaller
    imbalance buys less time than the accuracy its pruning costs."""

    refresh_threshold: float = 0.10
    """Hysteresis of :func:`decide_plan`: the previous plan is kept while every rank's busy time
    differs from the times that plan was decided on by less than this relative amount."""

    gamma_max: float = 0.9
    """Upper bound of a rank's shed share (pruned + migrated share of its K columns), so a
    straggler always computes at least ``1 − gamma_max`` of its own columns. In ``[0, 1)``.  Inside a
    :class:`~semimig.controller.BalanceConfig` it is ``resizing.gamma_max`` (set it there; a
    different value here is refused)."""

    zero_reference: Literal["mean", "min"] = "mean"
    """``T_ref`` of mode ``zero``: the mean over the ranks that do not straggle (the fixed point of
    the paper's group average, which converges there as the straggler catches up) or the minimum.
    The other modes always use ``T_min`` (paper IV-B)."""

    receivers: Literal["non_migrating", "normal"] = "non_migrating"
    """Who computes migrated columns when several ranks straggle. ``non_migrating`` (the paper's
    Eq. 3 read literally: the ``e − x`` ranks at sorted positions ``x+1 … e``, so resizing
    stragglers receive too) or ``normal`` (only the ``e − z`` non-stragglers receive; Eq. 3's
    ``e − x`` becomes ``e − z`` and ``y`` ranges over the normal ranks)."""

    migrators: int | None = None
    """λ of the paper's Fig. 11: when set, mode ``semi`` with several stragglers migrates the
    ``min(λ, z)`` slowest instead of Eq. 3's ``x`` (the others resize), so a sweep over λ shows
    where Eq. 3's choice lands.  ``None`` (default) lets Eq. 3 decide."""

    min_migrate_share: float = 0.1
    """Mode ``semi``: Eq. 2 migrating less than this share of the straggler's columns resizes
    instead.  Each migrating layer issues its own broadcasts and reduces, which hold the receivers
    at the straggler's pace inside the layer; that fixed cost is not in the pretest's Φ1 (bare
    traffic), and a sliver of migration never pays for it."""

    max_receiver_load: float | None = 0.15
    """Mode ``semi``, one straggler: Eq. 2's β is capped so that every receiver computes at most
    this share of its own columns on top of them, ``β·n/(e − 1) ≤ max_receiver_load·L`` (so at
    most ``max_receiver_load·(e − 1)`` of the straggler's columns migrate); the rest is pruned.
    Eq. 2 equates the straggler's resizing overhead with the receivers' migration overhead but
    bounds neither against ``T_min``: where the pruned path is dear (a CPU gather, f ≈ 0.25) it
    lets a single receiver take two thirds of the straggler's columns, and the group then runs at
    the receiver's loaded pace, well above the fast ranks' time (~1.7x at tp = 2).  The cap keeps
    SEMI's time within about this share of ZERO's (DESIGN §3a: the controller must never hurt) and
    is harmless where the paper applies Eq. 2: with ``e = 8`` a whole χ = 8 straggler's shed share
    spread over 7 receivers is 0.125 each.  ``None``: Eq. 2 alone."""

    # ---------------------------------------------------------------- evidence on real time (§3a)
    window: int = 7
    """Observations per rank the timing model keeps: its unpruned time is their median."""

    patience: int = 4
    """Consecutive decisions a rank must look like a straggler before it sheds work (and look
    normal before it stops): one descheduled iteration never triggers pruning."""

    noise_sigmas: float = 5.0
    """The imbalance must also exceed this many standard errors of the difference of the two
    ranks' median unpruned times (their noise estimated robustly, MAD-based).  Five, not three:
    the fastest of ``e`` ranks is an order statistic, biased low by about one standard error at
    ``e = 4``, and one false straggler costs accuracy."""

    react_steps: int = 3
    """A straggler that comes and goes (:mod:`semimig.controller.timing`, regimes): this many
    consecutive observations of a rank's dense-equivalent busy time beyond ``change_ratio`` (and
    ``change_sigmas`` of its noise) from its current regime start a new regime, and the policy flags
    or unflags on it at once instead of waiting out ``patience``.  0: one sliding window only."""

    change_ratio: float = 0.5
    """Smallest relative change of a rank's busy time at the same work that can start a regime
    (0.5: a 1.5x step; a throttle to 25 % of a core is a 3-4x step).  On a loaded machine other
    processes alone give runs of three steps more than 0.3 off, so a smaller ratio flags phantom
    stragglers with no straggler present."""

    change_sigmas: float = 4.0
    """... and it must also exceed this many of the rank's relative noise (MAD-based)."""

    short_burst: int = 4
    """A straggler that comes and goes faster than the plan can follow: when the median length of a
    rank's latest slow regimes (two or more ended, :attr:`RankEstimate.burst_length`) is at most
    this many observations, a rise does not flag it (by either path of the shedding policy)
    until the new slow regime outlasts that median plus ``react_steps`` (the
    observations a dense fall takes to show), nor while its latest observation already left it
    downward.  The plan acts two steps after a rise at the earliest (the all-gather's lag, then the
    next step), so on bursts of a few steps it arrives as the burst ends and prunes free steps
    until it is released: those pruned steps are no faster than dense (the fast rank sets a free
    step's pace) and cost accuracy for nothing.  Holding such rises back roughly halves the pruned
    steps; the step reflex serves such bursts inside the step.  0: every fresh rise flags at
    once."""

    gamma_step: float = 0.02
    """A rank's shed share changes only when the new target differs by at least this much, so
    noise does not rebuild keep sets every iteration."""

    max_fixed_fraction: float = 0.5
    """Pruning must pay: if the fitted fixed fraction ``f`` of a pruned rank's path (the part that
    does not shrink with the kept columns: gathers, copies, launches) exceeds this, pruning saves
    less than half of what it costs in accuracy, and the rank backs off."""

    backoff_iterations: int = 100
    """After a back-off the rank does not prune for this many iterations (doubling at each
    repeated back-off), then may try again if it still straggles."""

    migration_trial: int = 7
    """Mode ``semi``: migration must pay in wall time (:mod:`semimig.controller.trial`).  After
    this many iterations with stragglers migrating, the same stragglers shed the same share by
    resizing only for as many iterations; resizing only is kept if its median iteration is more
    than 5 % faster, otherwise migration resumes.  Eq. 2's curves measure traffic, not how a
    migrating layer's collectives sit in the real iteration (gloo on one machine: 50-70 ms more
    per iteration at a 15 % migrated share, measured).  0 disables the trial; so does setting
    ``migrators`` (λ fixes who migrates)."""

    pretest_tasks_per_step: int = 1
    """Mode ``semi``: the pretest (SEMI's cost curves) runs this many of its small tasks per
    training step (:class:`~semimig.controller.pretest.PretestRun`: 4 kinds x 3 shares x the
    distinct layer shapes, one layer's GEMMs each), so no step stalls, on the steps at which a
    straggler is flagged and was flagged at the step before (a free phase pays nothing, nor does the
    step that flags it, which ran at its slow pace); until the curves exist the stragglers resize
    only.  0 runs the whole pretest in the step that first needs it (seconds on a large model: one
    stalled step)."""

    pretest_repeats: int = 1
    """Mode semi: how often the pretest measures each (kind, share) — best of this many.  1: the
    pretest is a cost SEMI pays and ZERO does not (under ``fixed:1:4`` it can make SEMI's run
    markedly slower than ZERO's), each task slowed by the straggler's own χ, and Eq. 2's β it feeds is
    capped (``max_receiver_load``) and then checked in wall time by the migration trial, which is
    what decides whether migration stays.  3 (three times the tasks) gives smoother curves; how
    much that changes β was not measured."""

    reflex: Optional[ReflexConfig] = field(default_factory=ReflexConfig)
    """The resizing modes (``zero-*``, ``semi``): a rank whose own work turns slow within a step
    prunes the rest of that step on its own evidence (:mod:`semimig.controller.reflex`), so the
    steps before the controller's decision do not run at the slow device's pace.  ``None``: off."""

    def __post_init__(self) -> None:
        check_choice("ControllerConfig.mode", self.mode, MODES)
        if self.reflex is not None and not isinstance(self.reflex, ReflexConfig):
            raise ConfigError(f"ControllerConfig.reflex must be a ReflexConfig or None, got {self.reflex!r}")
        if self.migrators is not None:
            check_int("ControllerConfig.migrators", self.migrators, minimum=0)
            if self.mode != "semi":
                raise ConfigError(f"ControllerConfig.migrators (λ={self.migrators}) only applies to mode 'semi', "
                                  f"got mode {self.mode!r}")
        check_number("ControllerConfig.tol", self.tol, minimum=0.0)
        check_number("ControllerConfig.refresh_threshold", self.refresh_threshold, minimum=0.0)
        check_number("ControllerConfig.gamma_max", self.gamma_max, minimum=0.0, maximum=1.0, high_open=True)
        check_number("ControllerConfig.min_migrate_share", self.min_migrate_share, minimum=0.0, maximum=1.0)
        check_number("ControllerConfig.max_receiver_load", self.max_receiver_load, minimum=0.0, allow_none=True,
                     maximum=100.0)
        check_choice("ControllerConfig.zero_reference", self.zero_reference, ZERO_REFERENCES)
        check_choice("ControllerConfig.receivers", self.receivers, RECEIVER_POLICIES)
        check_int("ControllerConfig.window", self.window, minimum=3, maximum=1000)
        check_int("ControllerConfig.patience", self.patience, minimum=1, maximum=1000)
        check_number("ControllerConfig.noise_sigmas", self.noise_sigmas, minimum=0.0, maximum=100.0)
        check_int("ControllerConfig.react_steps", self.react_steps, minimum=0, maximum=self.window - 1)
        check_number("ControllerConfig.change_ratio", self.change_ratio, minimum=0.0, low_open=True, maximum=100.0)
        check_number("ControllerConfig.change_sigmas", self.change_sigmas, minimum=0.0, maximum=100.0)
        check_int("ControllerConfig.short_burst", self.short_burst, minimum=0)
        check_number("ControllerConfig.gamma_step", self.gamma_step, minimum=0.0, maximum=0.5)
        check_number("ControllerConfig.max_fixed_fraction", self.max_fixed_fraction, minimum=0.0, maximum=1.0)
        check_int("ControllerConfig.backoff_iterations", self.backoff_iterations, minimum=1, maximum=10**7)
        check_int("ControllerConfig.migration_trial", self.migration_trial, minimum=0, maximum=10**6)
        check_int("ControllerConfig.pretest_repeats", self.pretest_repeats, minimum=1, maximum=100)
        check_int("ControllerConfig.pretest_tasks_per_step", self.pretest_tasks_per_step, minimum=0, maximum=10**6)
