"""Re-sharding during training: the thin distributed layer over :mod:`semimig.controller.reshard`.

It serves ``semimig.enable(..., mode="reshard")`` and the re-sharding half of ``mode="semi"``
(:mod:`semimig.balancer`), laid out as it flows:

| module | what it does |
|---|---|
| :mod:`.observe` | each step's split of every rank's work, gathered over the TP group (and a step late over the DP group); work shed by resizing scaled back to full work; the device probe before the first step |
| :mod:`.core` | :class:`Resharder`: feeds the pure policy (which decides), moves on its decision, tells the policy the measured cost |
| :mod:`.events` | a re-plan as the run reports it, and its log lines |
| :mod:`.plans` | the plan a model can re-plan from, and what one unit weighs |
| :mod:`.enable` | what a mode needs (refused by name), and the re-sharder ``semimig.enable`` gets |

Before the first step :meth:`Resharder.probe` times the same fixed work on every rank and moves at
once for a large, consistent slowdown (a device slow from the start is not run at its full
slowdown for the launch steps).  With data-parallel replicas under plain DP (``zero_stage=0``)
each replica's TP group plans for itself: every rank keeps one policy per replica, fed that
replica's rows, and a decision of any replica moves every replica to its plan at once
(:func:`semimig.shardformer.replicas.apply_replica_plans`, whose gradient reduction stays exact
across the differing layouts).  Under ZeRO the replicas share one plan, planned for the slowest
rank at each TP position: its flat gradient buckets and master shards need equal shapes across the
data-parallel group.  One INFO line per re-plan (plan, predicted step, move cost) and one when a
full window under it has been measured.
"""
from semimig.resharder.core import Resharder
from semimig.resharder.enable import check_reshard, make_resharder
from semimig.resharder.events import ReplanEvent
from semimig.resharder.observe import gemm_baseline, probe_times, slowest_per_position, unshed
from semimig.resharder.plans import even_reshardable_plan, reshardable_plan

__all__ = ["Resharder", "ReplanEvent", "probe_times", "unshed", "slowest_per_position", "reshardable_plan",
           "even_reshardable_plan", "check_reshard", "make_resharder", "gemm_baseline"]
