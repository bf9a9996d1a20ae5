"""What the balancing runtime decides each step (identical on every rank: every input is gathered):
who sheds how much (:mod:`semimig.controller.shedding`), split how between migration and resizing
(:func:`~semimig.controller.plan.decide_plan`), SEMI's migration trial and cost-curve pretest.

:class:`Decisions` is the deciding half of :class:`~semimig.controller.runtime.BalanceController`
(which observes and acts); it reads the controller's timing models, policy and phase.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Optional

from semimig.controller.actions import GroupActions
from semimig.controller.curves import CostCurves, Curve
from semimig.controller.plan import decide_plan
from semimig.controller.pretest import REFERENCE_COLUMNS, PretestRun, fit_curves
from semimig.controller.shedding import ShedDecision

__all__ = ["Decisions"]

logger = logging.getLogger("semimig.controller.runtime")

_NO_COST = CostCurves(omega1=0.0, omega2=Curve.constant(0.0), phi1=Curve.constant(0.0), phi2=Curve.constant(0.0))
"""Mode ``mig`` needs no cost curves (every straggler migrates its whole share)."""


class Decisions:
    """The decisions of :class:`~semimig.controller.runtime.BalanceController` (a mixin of it)."""

    # ------------------------------------------------------------------ decisions
    def _decide(self, previous: GroupActions) -> GroupActions:
        """The next group-level actions from every rank's timing model (identical on every rank)."""
        mode = self.acting
        if mode.is_off:
            return previous
        decision = self.policy.decide(self.iteration, [t.estimate() for t in self.timings],
                                      [t.other_s for t in self.timings])
        if mode == "semi":
            decision = self._retry_resizing_only(decision, previous)
            if self._trial_events:
                decision = dataclasses.replace(decision, events=decision.events + tuple(self._trial_events))
                self._trial_events = []
        changed = previous.decision is None or decision.shed != previous.decision.shed or self._replan
        self._replan = False
        if mode.variant is not None:
            return GroupActions(prune=decision.shed, decision=decision)
        if not any(decision.shed):
            return GroupActions(prune=(0.0,) * self.size, decision=decision)
        if not changed and previous.plan is not None:
            return dataclasses.replace(previous, decision=decision)
        if mode == "semi" and self.curves is None and self._pretest_run is None:
            self._start_pretest()
        controller = self.config.controller_in_force()  # acting in the configured mode (semi or mig) here
        if (self.resize_only | self.trial_probing) & set(decision.flagged) or (mode == "semi" and self.curves is None):
            controller = dataclasses.replace(controller, max_receiver_load=0.0)  # Eq. 2 with no receiver capacity: β = 0
        plan = decide_plan(decision.unpruned_s, REFERENCE_COLUMNS, self.curves or _NO_COST,
                           controller, shed=decision.shed)
        logger.info("semimig plan at iteration %d: %s", self.iteration, plan.summary())
        return GroupActions(prune=tuple(a.gamma for a in plan.actions),
                            migrate={a.rank: a.migrate_share for a in plan.actions if a.migrate_share > 0},
                            receivers=tuple(sorted({r for a in plan.actions for r in a.receivers})) or None,
                            plan=plan, decision=decision)

    def _retry_resizing_only(self, decision: ShedDecision, previous: GroupActions) -> ShedDecision:
        """Mode semi: a rank that backs off while it migrates retries with resizing only.

        Migration adds the straggler's own operand hand-out and the receivers' synchronisation to
        its balanced path; where that makes shedding not pay (a fixed fraction above
        ``max_fixed_fraction``) resizing alone may still pay, since it has none of migration's
        hand-out or synchronisation.  So the first back-off of a
        migrating rank is forgiven, its fitted fixed fraction forgotten, and Eq. 2 splits its
        share with β = 0 from then on; if resizing does not pay either, it backs off as usual.
        Identical on every rank (the decision is)."""
        retried = [r for r in decision.backed_off if previous.migrate.get(r, 0.0) > 0.0 and r not in self.resize_only]
        for r in retried:
            self.resize_only.add(r)
            self.policy.forgive(r)
            self.timings[r].forget_reduced_work()
            logger.warning("iteration %d: rank %d: its back-off is lifted: shedding with migration does not pay, "
                           "so it resizes only from now on",
                           self.iteration, r)
        if not retried:
            return decision
        return dataclasses.replace(decision, backed_off=tuple(r for r in decision.backed_off if r not in retried))

    @property
    def trial_probing(self) -> set[int]:
        """Ranks the migration trial holds at resizing only right now (mode semi)."""
        return set(self.trial.probing) if self.trial is not None else set()

    def _run_trial(self, shortest_wall: float, wall: float, applied: Optional[GroupActions]) -> None:
        """Feed SEMI's migration trial the iteration's wall time (the slowest rank's, from the
        gathered rows: the same number on every rank) and what its applied plan did."""
        if self.trial is None or applied is None or self.forced or not shortest_wall > 0.0:
            return
        verdict = self.trial.observe(wall, {r for r, s in applied.migrate.items() if s > 0.0},
                                     {r for r, g in enumerate(applied.prune) if g > 0.0})
        if verdict.probe or verdict.restore or verdict.resize_only:
            self._replan = True
        self.resize_only.update(verdict.resize_only)
        if verdict.message:
            (logger.warning if verdict.resize_only else logger.info)("iteration %d: %s", self.iteration, verdict.message)
            self._trial_events.append(verdict.message)

    def _start_pretest(self) -> None:
        """Mode semi, first straggler: start measuring the cost curves (spread over the next steps)."""
        layers = self.binding.layers
        if not all(b.tokens for b in layers):
            raise RuntimeError("the SEMI pretest needs the token count of every layer: call step() after "
                               "a training forward/backward, not before")
        weight = layers[0].layer.weight
        self._pretest_run = PretestRun(self.binding.pretest_shapes(), self.group, gemm_timer=self.meter,
                                       device=weight.device, dtype=weight.dtype,
                                       repeats=self.config.controller.pretest_repeats)
        logger.info("iteration %d: SEMI pretest started (%d tasks, %s per step); stragglers resize only until "
                    "it ends", self.iteration, self._pretest_run.remaining,
                    self.config.controller.pretest_tasks_per_step or "all")

    def _advance_pretest(self) -> None:
        """Run this step's share of the pretest (collective: every rank, same tasks); fit once done."""
        run, per_step = self._pretest_run, self.config.controller.pretest_tasks_per_step
        samples = run.advance(per_step or run.remaining)
        self.restart_step()  # the pretest's GEMMs are not the next iteration's work
        if samples is not None:
            self.curves, self._pretest_run = fit_curves(samples), None
            self._replan = True  # Eq. 2 may now split the shed share between migration and resizing

