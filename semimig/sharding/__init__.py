"""Exact uneven tensor-parallel shards for a device that stays slow (DESIGN §8): pure plans and solver.

:class:`ShardPlan` says how many units of a paired dimension (MLP blocks, attention KV groups)
each rank holds; :func:`solve_plan` finds the plan minimising the step from measured speeds;
:mod:`semimig.sharding.split` cuts full weights at a plan's offsets and gathers them back;
:mod:`semimig.sharding.move` lists the slices that change owner between two plans,
:mod:`semimig.sharding.exchange` plans the data-parallel gradient reduction across replicas whose
plans differ (:func:`reduction_plan`; carried out by :mod:`semimig.shardformer.replicas`), and
:func:`apply_plan` / :func:`current_plan` (:mod:`semimig.shardformer.replan`) re-plan a built model and its
optimizer between training steps.  Those two read the ShardFormer policy's tables and move the layers of
:mod:`semimig.nn`, so they live in the policy's layer (DESIGN §7) and this package only re-exports them
on first use (importing this package stays pure; the one upward import is declared in ``.importlinter``).
"""
from semimig.sharding.plan import ShardPlan, kv_group_unit, units_of
from semimig.sharding.solver import (
    StepModel,
    continuous_shares,
    fit_step_model,
    predicted_step,
    solve_plan,
    speeds_from_times,
)

from semimig.sharding.move import Piece, move_schedule
from semimig.sharding.exchange import ReductionPlan, reduction_plan

_REPLAN = ("apply_plan", "current_plan", "MoveReport")

__all__ = ["apply_plan", "current_plan", "MoveReport", "Piece", "move_schedule", "ReductionPlan", "reduction_plan",
           "ShardPlan", "units_of", "kv_group_unit", "StepModel", "continuous_shares", "fit_step_model", "solve_plan",
           "predicted_step", "speeds_from_times"]


def __getattr__(name: str):
    if name in _REPLAN:
        from semimig.shardformer import replan  # declared compatibility re-export (.importlinter)

        return getattr(replan, name)
    raise AttributeError(f"module 'semimig.sharding' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_REPLAN))
