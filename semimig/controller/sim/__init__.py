"""A simulator of the re-shard decision core (DESIGN §9): the real policy objects, fed per-rank
observations from a step-time model over a family of scenarios, scored against each scenario's oracle.

:mod:`~semimig.controller.sim.stepmodel` (what a step and a move cost), :mod:`~semimig.controller.sim.scenarios`
(the family), :mod:`~semimig.controller.sim.simulate` (a policy's run), :mod:`~semimig.controller.sim.oracle`
(the best schedule, the even plan, the limit), :mod:`~semimig.controller.sim.score` (the table) and
:mod:`~semimig.controller.sim.recorded` (a recorded run's constants) with
:mod:`~semimig.controller.sim.replay` (recorded runs through the model).  Pure: no torch, no process group.
"""
from semimig.controller.sim.oracle import (best_plans, candidate_plans, fixed_time, limit_time, oracle_time,
                                          reactive_time)
from semimig.controller.sim.scenarios import CATEGORIES, Scenario, family, make_scenario
from semimig.controller.sim.simulate import RunResult, ratio, run_policy
from semimig.controller.sim.stepmodel import Workload

__all__ = ["Workload", "Scenario", "CATEGORIES", "family", "make_scenario", "RunResult", "run_policy", "ratio",
           "best_plans", "candidate_plans", "oracle_time", "reactive_time", "fixed_time",
           "limit_time"]
