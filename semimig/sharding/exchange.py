"""The data-parallel gradient reduction across replicas whose shard plans differ (DESIGN §8): a pure plan.

Under a plan per replica, replica ``d``'s TP rank ``t`` holds columns ``[a_dt, a_dt + m_dt)`` of each
part of a paired dimension (:class:`~semimig.sharding.plan.ShardPlan`), and the ranks holding one
column in two replicas may sit at different TP positions, so the DP group's all-reduce (one rank per
TP position) no longer lines the shards up.  The reduction is done in the unsharded coordinates:

- a *segment* is a maximal column range of one part over which every replica's owner is the same
  rank (the boundaries are the union of every replica's offsets), so every segment has exactly one
  owner in each replica and the segments of a part tile it once;
- each segment's gradient is summed over the replicas, always in replica order
  ``g_0 + g_1 + … + g_{D-1}``, then divided by ``D`` (the global-batch mean, as the DP all-reduce's
  average), by its *reducers*; every holder then holds the same bits whoever summed them;
- ``direct`` (one phase): every owner is a reducer; it sends its partial to the owners in the other
  replicas and sums what it receives.  ``reduce`` (two phases, a reduce-scatter and an all-gather
  in unit coordinates): the segment is cut into ``D`` near-equal chunks, each summed by another
  replica's owner, which sends the sum back to the other owners.

Bytes (columns times the other dimension): ``direct`` sends ``D(D−1)`` copies of the dimension,
``reduce`` ``2(D−1)`` — exactly what a ring all-reduce over each DP group of the even layout carries
(every rank ``2(D−1)/D`` of its shard), so :func:`reduction_plan` takes ``direct`` only at
``D ≤ 2``, where the two are equal and one phase is cheaper.  A rank's own bytes follow its share:
a rank holding ``p`` of a part carries ``2(D−1)/D·p`` of it each way against the even rank's
``2(D−1)/D·(1/tp)`` (``p·tp`` times; 1.5 for three quarters at tp 2).  When every replica holds the
same plan each segment's owners share one TP position and the exchange stays inside the DP groups:
it is the even layout's all-reduce in another order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from semimig.errors import ConfigError
from semimig.sharding.move import local_offsets
from semimig.sharding.plan import ShardPlan

__all__ = ["MODES", "Segment", "Transfer", "ReductionPlan", "reduction_plan", "even_allreduce_columns"]

MODES = ("direct", "reduce")


@dataclass(frozen=True)
class Segment:
    """``length`` columns of part ``part`` from column ``start``: per replica its owner's TP rank and the
    columns' offset in that owner's packed shard; ``reducers``: the replicas whose owner sums it."""

    part: int
    start: int
    length: int
    owners: Tuple[int, ...]
    offsets: Tuple[int, ...]
    reducers: Tuple[int, ...]


@dataclass(frozen=True)
class Transfer:
    """Segment ``segment``'s columns from replica ``src``'s owner to replica ``dst``'s owner: in phase 0 the
    source's partial gradient (to a reducer), in phase 1 the reducer's sum (to an owner that does not sum)."""

    phase: int
    segment: int
    src: int
    dst: int


@dataclass(frozen=True)
class ReductionPlan:
    """The segments and transfers of one packed dimension's reduction (module docstring)."""

    plans: Tuple[Tuple[ShardPlan, ...], ...]
    """Per replica, one plan per part."""
    mode: str
    segments: Tuple[Segment, ...]
    transfers: Tuple[Transfer, ...]

    @property
    def replicas(self) -> int:
        return len(self.plans)

    @property
    def tp(self) -> int:
        return self.plans[0][0].tp

    def rank_of(self, segment: Segment, replica: int) -> Tuple[int, int]:
        """``(replica, TP rank)`` of the segment's owner in ``replica``."""
        return replica, segment.owners[replica]

    def columns(self, replica: int, tp_rank: int) -> Tuple[int, int]:
        """``(out, in)`` columns this rank's link carries (every transfer crosses ranks)."""
        out = into = 0
        for t in self.transfers:
            seg = self.segments[t.segment]
            if (t.src, seg.owners[t.src]) == (replica, tp_rank):
                out += seg.length
            if (t.dst, seg.owners[t.dst]) == (replica, tp_rank):
                into += seg.length
        return out, into

    def total_columns(self) -> int:
        """Columns sent by all ranks together."""
        return sum(self.segments[t.segment].length for t in self.transfers)

    def ratio_to_even(self) -> float:
        """:meth:`total_columns` over the even layout's DP all-reduce (:func:`even_allreduce_columns`)."""
        even = even_allreduce_columns(self.plans[0], self.replicas)
        return self.total_columns() / even if even else 1.0

    def max_rank_ratio(self) -> float:
        """The most any rank's link carries out, over what an even-layout rank's carries (ring model)."""
        d, tp = self.replicas, self.tp
        dimension = sum(p.dimension for p in self.plans[0])
        even = 2 * (d - 1) / d * dimension / tp
        most = max(self.columns(r, t)[0] for r in range(d) for t in range(tp))
        return most / even if even else 1.0


def even_allreduce_columns(parts: Sequence[ShardPlan], replicas: int) -> float:
    """Columns sent by all ranks in the even layout's DP all-reduce (ring model of :mod:`semimig.comm.traffic`):
    each of ``tp`` DP groups all-reduces a ``dimension/tp`` shard, every rank sending ``2(D−1)/D`` of it."""
    dimension = sum(p.dimension for p in parts)
    return 2.0 * (replicas - 1) * dimension


def _check(plans: Sequence[Sequence[ShardPlan]]) -> Tuple[Tuple[ShardPlan, ...], ...]:
    plans = tuple(tuple(parts) for parts in plans)
    if not plans or not plans[0]:
        raise ConfigError(f"reduction_plan: need one or more replicas with one or more part plans, got {plans!r}")
    first = plans[0]
    for d, parts in enumerate(plans):
        if any(not isinstance(p, ShardPlan) for p in parts):
            raise ConfigError(f"reduction_plan: replica {d}'s parts must be ShardPlans, got {parts!r}")
        if len(parts) != len(first):
            raise ConfigError(f"reduction_plan: replica {d} has {len(parts)} parts, replica 0 has {len(first)}")
        for i, (p, q) in enumerate(zip(parts, first)):
            if p.tp != q.tp or p.dimension != q.dimension:
                raise ConfigError(f"reduction_plan: replica {d}'s part {i} plan {p} (tp {p.tp}, {p.dimension} columns) "
                                  f"does not cover what replica 0's {q} does (tp {q.tp}, {q.dimension} columns)")
    return plans


def _owner(plan: ShardPlan, column: int) -> int:
    """The rank holding ``column`` (the last rank whose range starts at or before it and is not empty)."""
    for rank, (start, size) in enumerate(zip(plan.offsets(), plan.sizes)):
        if start <= column < start + size:
            return rank
    raise ConfigError(f"column {column} is held by no rank of {plan}")


def _chunks(length: int, count: int) -> list[Tuple[int, int]]:
    """``(offset, length)`` of ``count`` near-equal chunks of ``length`` (the first ones one longer)."""
    out, start = [], 0
    for i in range(count):
        size = length // count + (1 if i < length % count else 0)
        out.append((start, size))
        start += size
    return out


def reduction_plan(plans: Sequence[Sequence[ShardPlan]], *, mode: Optional[str] = None) -> ReductionPlan:
    """The reduction of one packed dimension, ``plans[d][i]`` replica ``d``'s plan of part ``i``.

    ``mode``: ``"direct"`` or ``"reduce"`` (module docstring); ``None`` takes ``direct`` at two replicas
    or fewer and ``reduce`` above.  Every rank derives the same plan from the plans alone.
    """
    plans = _check(plans)
    replicas = len(plans)
    if mode is None:
        mode = "direct" if replicas <= 2 else "reduce"
    if mode not in MODES:
        raise ConfigError(f"reduction_plan: mode must be one of {MODES}, got {mode!r}")
    tp = plans[0][0].tp
    bases = [[local_offsets(parts, t) for t in range(tp)] for parts in plans]
    segments: list[Segment] = []
    for i in range(len(plans[0])):
        bounds = sorted({0, plans[0][i].dimension} | {o for parts in plans for o in parts[i].offsets()})
        for lo, hi in zip(bounds, bounds[1:]):
            if lo == hi:
                continue
            owners = tuple(_owner(parts[i], lo) for parts in plans)
            first = len(segments)  # the longer chunks of uneven cuts rotate over the replicas
            pieces = [(lo, hi - lo, tuple(range(replicas)))] if mode == "direct" or replicas == 1 else \
                [(lo + off, size, ((r + first) % replicas,))
                 for r, (off, size) in enumerate(_chunks(hi - lo, replicas)) if size]
            for start, length, reducers in pieces:
                offsets = tuple(bases[d][owners[d]][i] + start - parts[i].offsets()[owners[d]]
                                for d, parts in enumerate(plans))
                segments.append(Segment(part=i, start=start, length=length, owners=owners, offsets=offsets,
                                        reducers=reducers))
    transfers: list[Transfer] = []
    for s, seg in enumerate(segments):
        for r in seg.reducers:
            transfers.extend(Transfer(phase=0, segment=s, src=d, dst=r) for d in range(replicas) if d != r)
    for s, seg in enumerate(segments):
        if len(seg.reducers) == 1:
            (r,) = seg.reducers
            transfers.extend(Transfer(phase=1, segment=s, src=r, dst=d) for d in range(replicas) if d != r)
    return ReductionPlan(plans=plans, mode=mode, segments=tuple(segments), transfers=tuple(transfers))
