"""Batch-plan agreement: every rank checks that all ranks hold the same Poplar plan.

Every rank computes the plan from the same all-gathered numbers, so the plans agree by
construction, unless a bug or a non-deterministic input breaks that; then the data-parallel
groups would take overlapping or missing samples, or (ZeRO-2/3) different numbers of micro-steps
and hang in a reduce-scatter.  The check (DESIGN §3a):

- what is compared: the plan's integer fields (:func:`describe_batch_plan`: ZeRO stage, global
  batch, and per group the micro-batch size, micro-steps and last batch), the only ones that
  decide which samples a rank takes; model times are left out;
- when: whenever the plan changes, one all-gather of a 48-bit digest over all ranks
  (:func:`verify_batch_plan`, an int64 per rank), and, while a re-plan trigger runs, every
  iteration the digest of the plan actually used rides in the all-gather of busy times the
  balancer does for the trigger anyway (:mod:`.balancer`);
- on a mismatch: the plans are gathered (only then) and every rank raises
  :class:`semimig.errors.PlanDisagreement` naming the ranks and the differing fields
  (:func:`semimig.controller.agreement.check_agreement`, the same wording as the TP plan check).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from semimig.allocation.plan import AllocationPlan
from semimig.comm import primitives as P
from semimig.controller.agreement import check_agreement, describe, plan_digest

__all__ = ["batch_plan_digest", "describe_batch_plan", "verify_batch_plan"]


def describe_batch_plan(plan: AllocationPlan) -> dict[str, str]:
    """The plan's sample-deciding fields as a flat ``{field: repr}`` dict (group ``g`` = DP rank ``g``)."""
    fields: dict[str, object] = {"zero_stage": plan.zero_stage, "global_batch_size": plan.global_batch_size,
                                 "groups": plan.num_devices}
    for g, device in enumerate(plan.devices):
        fields[f"group{g}.micro_batch_size"] = device.micro_batch_size
        fields[f"group{g}.accumulation_steps"] = device.accumulation_steps
        fields[f"group{g}.last_batch_size"] = device.last_batch_size
    return describe(**fields)


def batch_plan_digest(plan: AllocationPlan) -> int:
    """48-bit digest of :func:`describe_batch_plan` (exact in a float64)."""
    return plan_digest(describe_batch_plan(plan))


def verify_batch_plan(plan: AllocationPlan, group: Optional[dist.ProcessGroup] = None) -> int:
    """Collective over ``group`` (default: all ranks): raise PlanDisagreement unless every rank holds ``plan``.

    One int64 all-gather; the plans themselves are gathered only on a mismatch.  Returns the digest.
    """
    digest = batch_plan_digest(plan)
    size = P.group_size(group)
    if size == 1:
        return digest
    mine = torch.tensor([digest], dtype=torch.int64, device=P.collective_device(group))
    gathered = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(gathered, mine, group=group)
    ranks = list(range(size)) if group is None else [dist.get_global_rank(group, r) for r in range(size)]
    check_agreement([int(t.item()) for t in gathered], describe_batch_plan(plan), group,
                    what="Poplar batch plan", global_ranks=ranks)
    return digest
