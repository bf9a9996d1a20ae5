"""The joint planner's moves of the re-sharder (DESIGN §8): when a replica's policy decided
(:meth:`JointMoves._policy_move`) or none did yet the job would gain (:meth:`JointMoves._job_gain`), and carrying
out the planner's answer for every replica at once (:meth:`JointMoves._take_joint`).  The planner says *what*
(:func:`~semimig.sharding.joint.plan_job`); the replicas' policies, and the job's gain read here with the
policies' own gain test, say *when*.

Either way the answer is moved to only when the job's gain test passes on it (:meth:`JointMoves._job_test`): a
policy's decision says that its replica's speeds or its step model changed, not that the planner's answer
pays.  The answer is chosen for the whole job, and where two layouts are priced within the noise of each
other the planner may swap one replica between them, or the split with it, on each new reading, while the
policy that called it is answered by neither (its replica's plan kept): without the test every window of
that policy would move the job.  A reading the test held back is repeated on the job's reading schedule
(:func:`~semimig.resharder.joint.reading_due`) while the speeds the planner reads stay within the least gain
acted on of those it was read at (:func:`~semimig.resharder.joint.same_speeds`), and at once when they move.

:class:`JointMoves` is that part of :class:`~semimig.resharder.core.Resharder` (a mixin of it).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

from semimig.comm import primitives as P
from semimig.controller.policy.gain import gain_test
from semimig.controller.policy.states import HOLDING, expected_life
from semimig.controller.reshard import ReshardDecision
from semimig.resharder.joint import (as_policy_plans, joint_problem, noise_blocked, reading_due, same_speeds,
                                     search_root)
from semimig.sharding.joint import job_step, plan_job

__all__ = ["JointMoves"]

logger = logging.getLogger("semimig.resharder.core")


class JointMoves:
    """The joint planner's moves of :class:`~semimig.resharder.core.Resharder` (a mixin of it)."""

    def _job_gain(self, decisions: list[ReshardDecision], *, step: int) -> Optional[Any]:
        """No replica's policy decided, yet the job may gain: a replica balanced within itself can still
        run slower than the others (its slow rank's replicated work, a split that no longer fits).  Once
        every policy holds a measured plan, the job's step under the plans and split in force is set
        against the joint planner's, with the policies' own gain test: the least gain ``ε`` the noisiest
        replica's window allows, the moves' cost and their way back, over a life of the steps since
        the job last moved (at least ``life_floor``).  A change of split alone moves no weights.  Read when
        :func:`reading_due` says so, not every step: the planner's search is host work (on the fastest rank,
        :meth:`_search`) that every rank waits for; a gain only the noise held back is read again once the
        windows' noise allows it (:func:`noise_blocked`)."""
        if any(policy.state != HOLDING for policy in self.policies):
            self._job_read, self._job_blocked = None, 0.0
            if self._tells(logging.DEBUG):
                logger.debug("semimig job gain at step %d: not read, the policies are %s", step,
                             [policy.state for policy in self.policies])
            return None
        age, needed = step - self._job_moved, max(policy.needed_gain() for policy in self.policies)
        scheduled = reading_due(age, self._job_read)  # by age; at most one read more between two of those
        if not scheduled and not reading_due(age, self._job_read, needed=needed, blocked=self._job_blocked):
            return None
        self._job_read, self._job_blocked = age, 0.0
        problem = joint_problem(self.joint, self.policies, self.samples, self._seats)
        if problem is None:
            return None
        remaining = self._remaining(step)
        life = expected_life(age, (), floor=self.policy.config.life_floor, remaining=remaining)
        return self._read_job(decisions, problem, step=step, life=life, remaining=remaining, scheduled=scheduled,
                              trigger="job gain")

    def _policy_move(self, decisions: list[ReshardDecision], *, step: int) -> Optional[Any]:
        """A replica's policy decided: the planner's answer for every replica and the split, taken when the
        job's gain test passes on it over the deciding policies' expected life of the state in force (module
        docstring).  Where a reading since the job last moved held the plans at speeds the planner still
        reads within ``ε`` of each rank's (:func:`same_speeds`), the decision is read only when
        :func:`reading_due` says so: the search is host work every rank waits for, and a policy whose
        replica's plan the planner keeps may decide again at every step."""
        problem = joint_problem(self.joint, self.policies, self.samples, self._seats)
        if problem is None:
            return None
        age, needed = step - self._job_moved, max(policy.needed_gain() for policy in self.policies)
        if same_speeds(problem.speeds, self._job_held, needed) and not reading_due(
                age, self._job_read, needed=needed, blocked=self._job_blocked):
            if self._tells(logging.DEBUG):
                logger.debug("semimig joint plan at step %d: a policy decided at the speeds of the reading held at "
                             "age %s; read again when due", step, self._job_read)
            return None
        self._job_read, self._job_blocked = age, 0.0
        remaining = self._remaining(step)
        lives = [d.horizon for d in decisions if d.replan and d.horizon]
        life = max(lives) if lives else expected_life(age, (), floor=self.policy.config.life_floor,
                                                      remaining=remaining)
        return self._read_job(decisions, problem, step=step, life=life, remaining=remaining, scheduled=True,
                              trigger="policy decision")

    def _remaining(self, step: int) -> Optional[int]:
        """Steps the run has left after ``step`` (``ReshardConfig.horizon``), ``None`` where it is not told."""
        horizon = self.policy.config.horizon
        return None if horizon is None else max(horizon - step, 1)

    def _read_job(self, decisions: list[ReshardDecision], problem: Any, *, step: int, life: float,
                  remaining: Optional[int], scheduled: bool, trigger: str) -> Optional[Any]:
        """The planner's answer on ``problem`` (every replica's window), moved to when the job's gain test
        passes on it over ``life`` steps (:meth:`_job_test`); else the reading is held at the speeds read
        (``scheduled``: the noise that held it back is kept, so it is read again once the windows allow it,
        :func:`noise_blocked`)."""
        age = step - self._job_moved
        self._job_held = problem.speeds
        current = tuple(policy.plans for policy in self.policies)
        answer = self._search(problem, current)
        plans = tuple(as_policy_plans(row, now) for row, now in zip(answer.plans, current))
        if plans == current and answer.samples == self.samples:
            if self._tells(logging.DEBUG):
                logger.debug("semimig %s at step %d (age %d): the plans in force are the planner's (%.4g s) "
                             "from %r", trigger, step, age, answer.step, problem)
            return None
        now_s, test = self._job_test(problem, answer, plans, current, life=life, remaining=remaining)
        if self._tells(logging.DEBUG):
            logger.debug("semimig %s at step %d (age %d): %.4g s in force, %.4g s for samples %s plans %s; "
                         "life %.3g, moves %.3g s: %s; from %r", trigger, step, age, now_s, answer.step,
                         list(answer.samples), [[p.units for p in row] for row in plans], life, test.cost_s, test,
                         problem)
        if not test.passed:
            self._job_blocked = noise_blocked(test, now_s) if scheduled else 0.0  # once the noise allows it
            return None
        return self._take_joint(decisions, step=step, answer=answer, problem=problem)

    def _job_test(self, problem: Any, answer: Any, plans: tuple, current: tuple, *, life: float,
                  remaining: Optional[int]) -> tuple[float, Any]:
        """The job's step in force and the policies' gain test on ``answer`` (its ``plans`` per replica):
        the job's step under the plans and split in force against the answer's, both priced by the
        planner's model; the least gain ``ε`` the noisiest replica's window allows; the moves' cost and,
        unless the state outlives the run, their way back.  The replicas move at once, so the moves cost the
        slowest replica's: its bytes at its policy's measured rate, or before any move was measured the
        policies' prior in steps of a healthy job's step (every rank at the fastest one's speed), each at
        its movers' pace."""
        now_s = job_step(problem, self.samples, current)
        needed = max(policy.needed_gain() for policy in self.policies)
        top = max(map(max, problem.speeds))
        healthy = dataclasses.replace(problem, speeds=tuple((top,) * len(row) for row in problem.speeds),
                                      lone_speeds=None)
        healthy_s = job_step(healthy, self.samples, current)
        cost = max(policy.move_cost_s(row, healthy_s) for policy, row in zip(self.policies, plans))
        return now_s, gain_test(now_s, answer.step, needed=needed, life=life, move_s=cost,
                                way_back=life != remaining)

    def _carry_out(self, step: int, plans: tuple, changed: list[bool]) -> tuple[tuple, list[tuple[int, float]]]:
        """Every replica whose ``changed`` moved to its ``plans`` (the policies' per kind) at once: the layers'
        plans now in force, and each replica's ``(bytes, seconds)``, the same on every rank."""
        uneven = tuple(self._uneven(ReshardDecision(step, plans=row)) if moved else old
                       for row, moved, old in zip(plans, changed, self.plans))
        costs = self._replica_costs(*self._move_replicas(uneven)) if any(changed) else [(0, 0.0)] * self.replicas
        return uneven, costs

    def _tells(self, level: int) -> bool:
        """Whether this rank logs the job's decisions at ``level``: one rank of the job speaks (the first of
        replica 0's TP group), and only where the level is enabled."""
        return self._speaks and self.dp_rank == 0 and logger.isEnabledFor(level)

    def _search(self, problem: Any, reference: tuple) -> Any:
        """:func:`plan_job` on ``problem``, searched by the fastest rank of the job alone (``problem.speeds``;
        ties: the lowest replica, then TP rank) and broadcast to the rest (collective over the world group).
        The answer depends on the problem only, so it is the one every rank would find; the search is host
        work, and where a slow device's host is slow too (a shared or throttled node) searching there would
        hold every rank at the next collective for the slow host's time."""
        if self._world_seats is None:  # (dp rank, TP rank) of every rank of the world group, in its order
            rows = P.all_gather_rows([self.dp_rank, self.rank], self.world_group)
            self._world_seats = [(int(d), int(r)) for d, r in rows]
        root = search_root(problem.speeds, self._world_seats)
        mine = plan_job(problem, reference=reference) if P.group_rank(self.world_group) == root else None
        return P.broadcast_object(mine, root, self.world_group)

    def _take_joint(self, decisions: list[ReshardDecision], *, step: int, answer: Any, problem: Any) -> Optional[Any]:
        """The job's gain test passed on ``answer`` (:func:`plan_job` on ``problem``, every replica's window;
        plans in force kept where they meet the job's step): every replica moved at once, every policy told
        its replica's plans (its window, measured under the old plans or split, dropped); this replica's
        new plan, or ``None`` when it kept its plan."""
        current = tuple(policy.plans for policy in self.policies)
        plans = tuple(as_policy_plans(row, now) for row, now in zip(answer.plans, current))
        self._job_moved, self._job_read, self._job_blocked, self._job_held = step, None, 0.0, None
        if self._tells(logging.DEBUG):
            logger.debug("semimig joint plan at step %d from %r", step, problem)
        if answer.memory_bound and self._tells(logging.INFO):
            logger.info("semimig joint plan at step %d: %s", step, answer.memory_bound)
        changed = [row != now for row, now in zip(plans, current)]
        uneven, costs = self._carry_out(step, plans, changed)
        if self._lagged is not None:
            self._lagged.collect()  # measured under the old plans and split: dropped
        before = [d.current_s for d in decisions]
        if self._tells(logging.INFO):
            logger.info("semimig joint plan at step %d: samples %s -> %s, plans %s, predicted step %.4g s "
                        "(replicas %s; the plans in force: modelled %.4g s, measured %s)", step, list(self.samples),
                        list(answer.samples), [[p.units for p in row] for row in plans], answer.step,
                        [round(t, 4) for t in answer.replica_steps], job_step(problem, self.samples, current),
                        [round(t, 4) for t in before])
        for d, (policy, row) in enumerate(zip(self.policies, plans)):
            bytes_moved, seconds = costs[d]
            policy.moved_to(row, seconds=seconds, bytes_moved=int(bytes_moved))
            if changed[d]:
                per_mean = self.joint.global_batch / self.replicas / answer.samples[d]  # the policies' time base
                decision = ReshardDecision(step, plans=row, predicted_s=answer.replica_steps[d] * per_mean,
                                           current_s=before[d], reason=f"joint plan: samples "
                                           f"{list(answer.samples)}, job step {answer.step:.4g} s; steps per "
                                           "mean batch")
                self._record(decision, uneven[d], step=step, bytes_moved=bytes_moved, seconds=seconds, replica=d)
        self.samples = answer.samples
        self.joint_replans.append({"step": step, "samples": list(answer.samples), "step_s": answer.step,
                                   "memory_bound": answer.memory_bound})
        self.plans, self.plan = uneven, uneven[self.dp_rank]
        return self.plan if changed[self.dp_rank] else None
