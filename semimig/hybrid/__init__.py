"""Heterogeneous 2-D training: Poplar's batch allocation across data-parallel groups, SEMI inside each TP group.

A cluster with mixed accelerators has two problems at once: replicas of different speed (give
the faster ones more samples: Poplar, :mod:`semimig.allocation`) and a slow accelerator inside a
tensor-parallel group (rebalance its GEMMs: SEMI, :mod:`semimig.controller`).  Here one
``HybridParallelPlugin(tp_size=t, zero_stage=z)`` runs both: every TP group is one Poplar device
(its ranks take the same samples; its speed is its slowest member's after SEMI balancing), and
the batch plan is re-computed when a group's speed moves.

    layout   GridLayout.from_plugin(plugin)              which rank is in which group (layout)
    profile  profile_group_curves(layout, probe, ...)    a speed curve per TP group (balancer)
    run      HybridBalancer(plugin, curves=..., controller=semi_controller, ...)
             .micro_batches(global_batch) / .step()      plan, SEMI step, re-plan, agreement
    decide   ReplanTrigger / ReplanConfig                 when to re-plan, pure (replan)
    verify   verify_batch_plan(plan)                      every rank holds the same plan (agreement)
    enable   BatchSplit(global_batch_size=...)            the user's entry: semimig.enable(..., batch=...)

The benchmark that trains it, ``semimig bench --dp D --allocation poplar``, is the bench harness's
2-D mode: its run config is the harness's one, :class:`semimig.bench.config.BenchConfig` with
``allocation`` set (the 2-D modes :data:`semimig.bench.config.MODES_2D`), trained by
:mod:`semimig.bench.train2d` on the harness's one training loop.  This package keeps the pure 2-D
machinery below it (layout, balancer, re-plan trigger, agreement, split) and imports nothing of the bench.

Gradients stay exactly the global-batch mean (each micro-step's loss scaled by ``m·D/G``, SEMI's
migration exact); tests/multirank/test_hybrid_*.py compare with one process on the whole batch.
"""
from semimig.hybrid.agreement import batch_plan_digest, describe_batch_plan, verify_batch_plan
from semimig.hybrid.balancer import ALLOCATIONS, HybridBalancer, HybridStepReport, profile_group_curves
from semimig.hybrid.layout import GridLayout, group_maxima
from semimig.hybrid.replan import ReplanConfig, ReplanDecision, ReplanTrigger, scale_curve
from semimig.hybrid.split import BatchSplit

__all__ = [
    "ALLOCATIONS",
    "BatchSplit", "GridLayout", "HybridBalancer", "HybridStepReport",
    "ReplanConfig", "ReplanDecision", "ReplanTrigger",
    "batch_plan_digest", "describe_batch_plan", "group_maxima", "profile_group_curves",
    "scale_curve", "verify_batch_plan",
]

