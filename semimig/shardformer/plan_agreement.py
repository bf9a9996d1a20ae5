"""Every rank's agreement on a re-plan before anything moves (DESIGN §8): a plan that does not fit the model,
or ranks that hold another plan, other shard sizes or other optimizer state, raise the same
:class:`~semimig.errors.ConfigError` on every rank instead of a hang inside the move's collectives.

Each rank's :data:`Digest` is gathered twice: over its tensor-parallel group (:func:`tp_verdict`), then over
the ranks at its TP position in every data-parallel replica (:func:`replica_verdict`), where any replica's
refusal becomes everyone's so no replica moves alone.
"""
from __future__ import annotations

import hashlib
from typing import Any, List, Optional, Tuple

import torch.distributed as dist

from semimig.controller.agreement import gather_verdicts

__all__ = ["Digest", "digest", "first_disagreement", "replica_verdict", "tp_verdict"]


def digest(*items: Any) -> str:
    return hashlib.sha256(repr(items).encode()).hexdigest()[:16]


Digest = Tuple[str, Any, Optional[str], str, str]
"""A rank's ``(new plan, resolved sizes, problem resolving it, digest of old sizes, digest of what its
optimizer holds)``."""


def first_disagreement(mine: Digest, every: List[Digest], me: int, peer: str) -> Optional[str]:
    """The refusal for the first of ``every`` (gathered digests, indexed like ``me``) that holds another
    plan (fields ``[:2]``) or another model or optimizer state (fields ``[3:]``) than ``mine``, or ``None``.
    ``peer`` names one of them: ``"TP rank"`` or ``"data-parallel replica"``."""
    for r, theirs in enumerate(every):
        if theirs[:2] != mine[:2]:
            return (f"apply_plan: {peer} {me} and {peer} {r} disagree on the new plan: {peer} {me} has {mine[0]}, "
                    f"{peer} {r} has {theirs[0]}; every rank (tensor- and data-parallel) must pass the same plan")
        if theirs[3:] != mine[3:]:
            return (f"apply_plan: {peer} {r}'s model or optimizer state differs from {peer} {me}'s (shard sizes "
                    "or optimizer state kinds); re-plan only between steps, after optimizer.step() on every rank")
    return None


def tp_verdict(mine: Digest, rank: int, tp: int, group) -> Optional[str]:
    """Phase 1 of the agreement (a collective over the TP group): the refusal every TP rank reaches
    from the gathered digests, or ``None``."""
    every = [mine] * tp
    if tp > 1:
        every = [None] * tp
        dist.all_gather_object(every, mine, group=group)
    for r, theirs in enumerate(every):
        if theirs[2] is not None:
            return f"apply_plan: {theirs[0]} does not fit the model (TP rank {r}): {theirs[2]}"
    return first_disagreement(mine, every, rank, "TP rank")


def replica_verdict(mine: Digest, verdict: Optional[str], replicas) -> Optional[str]:
    """Phase 2 (a collective over the DP group, reached by every rank: phase 1 raised nothing yet): the
    rank at this TP position in every replica must hold the same digest; any replica's phase-1 refusal
    is everyone's, so no replica moves alone (it would hang in ZeRO's gathers or mix shapes)."""
    every, refusal = gather_verdicts(mine, verdict, replicas, "data-parallel replica")
    if refusal is not None:
        return refusal
    return first_disagreement(mine, every, dist.get_rank(replicas), "data-parallel replica")
