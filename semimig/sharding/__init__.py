"""Exact uneven tensor-parallel shards for a device that stays slow (DESIGN §8): pure plans and solver.

:class:`ShardPlan` says how many units of a paired dimension (MLP blocks, attention KV groups)
each rank holds; :func:`solve_plan` finds the plan minimising the step from measured speeds;
:mod:`semimig.sharding.split` cuts full weights at a plan's offsets and gathers them back.
"""
from semimig.sharding.plan import ShardPlan, kv_group_unit, units_of
from semimig.sharding.solver import (
    StepModel,
    continuous_shares,
    fit_step_model,
    predicted_step,
    slowest_per_position,
    solve_plan,
    speeds_from_times,
)

__all__ = ["ShardPlan", "units_of", "kv_group_unit", "StepModel", "continuous_shares", "fit_step_model", "solve_plan",
           "predicted_step", "speeds_from_times", "slowest_per_position"]
