"""Plan agreement: the ranks of a group check, every iteration, that they applied the same plan.

Every rank computes the plan from the same all-gathered numbers, so the plans agree by
construction — unless a bug, a non-deterministic measurement or a caller's mistake (a ``force``
called with different arguments on two ranks) breaks that; then migration layouts no longer
match and training silently computes garbage or hangs.  DESIGN §3a: verify it anyway, cheaply.

The plan a rank applied is described by a flat dict of fields (:func:`describe`), hashed to a
48-bit integer (exact in a float64) by :func:`plan_digest`, and the digest travels in the one
small all-gather each iteration performs anyway (:class:`ObservationExchange`, a ``[size, 6]``
float64 all-gather, asynchronous: work fraction, busy time, the digests of the plan applied in the
iteration and of the plan decided for later, validity, and the iteration's wall time, which SEMI's
migration trial reads).  The runtime applies a decided plan only after its
digest was found equal on every rank, so a plan that differs never reaches a layer.  Only on a mismatch are the
described plans gathered (``all_gather_object``) to name the ranks and the differing fields; then
every rank raises :class:`semimig.errors.PlanDisagreement` with the same message.
"""
from __future__ import annotations

import hashlib
import math
from typing import Any, Mapping, Optional, Sequence

import torch
import torch.distributed as dist

from semimig.errors import PlanDisagreement

__all__ = ["ObservationExchange", "describe", "plan_digest", "exchange_observations", "check_agreement",
           "difference_report", "first_refusal", "gather_verdicts", "ranks_by_value"]

_DIGEST_BYTES = 6  # 48 bits: exactly representable in a float64


def describe(**fields: object) -> dict[str, str]:
    """A plan as ``{field: repr(value)}`` with sorted mapping keys, so equal plans describe equally."""
    out = {}
    for name, value in fields.items():
        if isinstance(value, Mapping):
            value = tuple(sorted(value.items()))
        out[name] = repr(value)
    return out


def plan_digest(description: Mapping[str, str]) -> int:
    """48-bit digest of a :func:`describe` dict (blake2b of its canonical text)."""
    text = "\n".join(f"{k}={description[k]}" for k in sorted(description))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=_DIGEST_BYTES).digest(), "big")


def exchange_observations(work: float, busy_s: float, digests: tuple[int, int], valid: bool, group,
                          device: torch.device) -> list[tuple[float, float, int, int, bool]]:
    """One float64 all-gather of ``(work, busy, applied digest, pending digest, valid)``, rank order.

    Collective: every rank of ``group`` calls it once per iteration.  A size-1 group gathers
    nothing.
    """
    mine = (float(work), float(busy_s), int(digests[0]), int(digests[1]), bool(valid))
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return [mine]
    row = torch.tensor([mine[0], mine[1], float(mine[2]), float(mine[3]), 1.0 if valid else 0.0],
                       dtype=torch.float64, device=device)
    rows = [torch.empty_like(row) for _ in range(dist.get_world_size(group))]
    dist.all_gather(rows, row, group=group)
    return [(float(r[0]), float(r[1]), int(r[2]), int(r[3]), bool(r[4] > 0.5)) for r in (t.cpu() for t in rows)]


class ObservationExchange:
    """The per-iteration all-gather of :func:`exchange_observations`, posted asynchronously.

    ``post`` starts the gather at the end of iteration ``j``; ``collect`` at the end of iteration
    ``j + 1`` waits for it — by then it has long finished in the background, overlapped with the
    iteration's compute, so the controller adds no collective latency to the critical path (a
    synchronous gather of a few floats costs ~0.5 ms on gloo, 1 % of a 50 ms iteration).  The
    price is one iteration more between a measurement and the decision that uses it.
    Collective: every rank posts and collects in the same order.
    """

    def __init__(self, group, device: torch.device) -> None:
        self.group, self.device = group, device
        self.size = dist.get_world_size(group) if dist.is_initialized() else 1
        self._pending = None

    def post(self, work: float, busy_s: float, digests: tuple[int, int], valid: bool, wall_s: float = 0.0,
             sudden: bool = False, other_s: float = math.nan) -> None:
        """Start gathering this rank's row; ``wall_s``: the iteration's wall time (0 = unknown);
        ``sudden``: the rank's step reflex fired in the iteration (``RankTiming.observe``); ``other_s``:
        the seconds of its own work outside the timed GEMMs (NaN = unknown)."""
        if self._pending is not None:
            raise RuntimeError("collect() the previous observations before posting new ones")
        mine = (float(work), float(busy_s), int(digests[0]), int(digests[1]), bool(valid), float(wall_s),
                bool(sudden), float(other_s))
        if self.size == 1:
            self._pending = ([mine], None)
            return
        row = torch.tensor([mine[0], mine[1], float(mine[2]), float(mine[3]), 1.0 if valid else 0.0, mine[5],
                            1.0 if sudden else 0.0, mine[7]], dtype=torch.float64, device=self.device)
        rows = [torch.empty_like(row) for _ in range(self.size)]
        self._pending = (rows, dist.all_gather(rows, row, group=self.group, async_op=True))

    def collect(self) -> Optional[list[tuple[float, float, int, int, bool, float, bool, float]]]:
        """The rows posted last, in rank order (``None`` if nothing was posted):
        ``(work, busy_s, applied digest, pending digest, valid, wall_s, sudden, other_s)``."""
        if self._pending is None:
            return None
        rows, work = self._pending
        self._pending = None
        if work is None:
            return rows
        work.wait()
        return [(float(r[0]), float(r[1]), int(r[2]), int(r[3]), bool(r[4] > 0.5), float(r[5]), bool(r[6] > 0.5),
                 float(r[7])) for r in (t.cpu() for t in rows)]


def difference_report(descriptions: Sequence[Mapping[str, str]]) -> str:
    """Which ranks hold which value of every field on which they disagree (one line per field)."""
    lines = []
    for name in sorted(set().union(*descriptions)):
        values: dict[str, list[int]] = {}
        for rank, d in enumerate(descriptions):
            values.setdefault(d.get(name, "<missing>"), []).append(rank)
        if len(values) > 1:
            lines.append(f"  {name}: " + "; ".join(f"ranks {ranks} hold {value}" for value, ranks in values.items()))
    return "\n".join(lines)


def ranks_by_value(values: Sequence[object], ranks: Optional[Sequence[int]] = None) -> str:
    """``"ranks [0, 2] vs ranks [1]"``: the ranks that hold each distinct value, in first-seen order.

    ``values[i]`` belongs to ``ranks[i]`` (default: rank ``i``); the text names the groups of a
    disagreement in every message that reports one.
    """
    groups: dict[object, list[int]] = {}
    for rank, value in zip(range(len(values)) if ranks is None else ranks, values):
        groups.setdefault(value, []).append(rank)
    return " vs ".join(f"ranks {r}" for r in groups.values())


def first_refusal(refusals: Sequence[Optional[str]], me: int, where: str) -> Optional[str]:
    """The first refusal (not ``None``) among those gathered from every rank, as rank ``me`` raises it:
    its own verbatim, another's with where it came from (``"... (on {where} {r}; every rank refuses it)"``).

    A rank that refuses a collective call alone would leave the others waiting in the next
    collective; gathering the refusals and raising the same one on every rank fails them all.
    """
    for r, refusal in enumerate(refusals):
        if refusal is not None:
            return refusal if r == me else f"{refusal} (on {where} {r}; every rank refuses it)"
    return None


def gather_verdicts(mine: Any, refusal: Optional[str], group, where: str) -> tuple[list, Optional[str]]:
    """One ``all_gather_object`` over ``group`` of ``(mine, refusal)``: every rank's ``mine`` and the
    refusal every rank raises (:func:`first_refusal`), so a call refused on one rank fails on all."""
    every: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, (mine, refusal), group=group)
    return [theirs for theirs, _ in every], first_refusal([r for _, r in every], dist.get_rank(group), where)


def check_agreement(digests: Sequence[int], description: Mapping[str, str], group, *, what: str,
                    global_ranks: Optional[Sequence[int]] = None) -> None:
    """Raise :class:`PlanDisagreement` on every rank if the gathered ``digests`` differ.

    Collective only on a mismatch (every rank sees the same ``digests``, so either all call the
    ``all_gather_object`` below or none does).  ``what`` names the plan in the message.
    """
    if len(set(digests)) <= 1:
        return
    gathered: list = [None] * len(digests)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_gather_object(gathered, dict(description), group=group)
    else:
        gathered = [dict(description)]
    raise PlanDisagreement(
        f"the ranks of the group disagree on the {what}: " + ranks_by_value(digests, global_ranks) +
        " hold different plans (every rank must call the controller identically); differing fields "
        f"(group ranks):\n{difference_report(gathered)}")
