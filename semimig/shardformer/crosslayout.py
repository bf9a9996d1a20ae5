"""Carry out a :class:`~semimig.sharding.exchange.ReductionPlan` on gradients over a real process group.

:func:`reduce_across_layouts` is a collective over every rank of the ``replicas x tp`` grid (each
rank calls it with the same plans and its own tensors).  Per phase of the plans it posts one
point-to-point message per pair of ranks that exchange anything (every piece of every tensor of
every job for that peer packed into one byte buffer, in an order both sides derive from the plans:
job, transfer, tensor), waits for all of them, then:

- phase 0: every segment this rank reduces becomes ``(g_0 + g_1 + … + g_{D-1}) / D``, summed in
  replica order from its own slice and the received ones, in the gradient's own dtype (as the DP
  all-reduce sums), written in place;
- phase 1 (``reduce`` plans): the reducers' sums, received, are copied into place.

Every holder of a column so ends with the same bits.  The same exchange splits in two for a caller that
overlaps it with the backward (:mod:`semimig.shardformer.replicas`): :func:`post_across_layouts` packs
and posts phase 0 of some jobs (a bucket) and returns at once, under a tag of the bucket's own, so
buckets posted in any order never match each other's messages; :func:`finish_across_layouts` waits for
every posted bucket, sums each exactly as above (each segment's sum reads only its own tensor's slices,
so which jobs share a bucket changes no bit), then runs phase 1 of them all, posted and waited for at
once.  :func:`reduce_across_layouts` is the two back to back.  Every wait is in the comm region
(:func:`semimig.comm.primitives.comm_region`).  Inside :func:`semimig.comm.traffic.count_traffic` the
bytes of one finish are counted as one ``send`` / ``recv`` (exact: they are point-to-point messages),
beside the DP all-reduces they stand for.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from semimig.comm import primitives as P
from semimig.comm import traffic
from semimig.errors import ConfigError
from semimig.sharding.exchange import ReductionPlan

__all__ = ["Job", "Posted", "exchanges", "finish_across_layouts", "post_across_layouts",
           "reduce_across_layouts"]

Job = Tuple[ReductionPlan, Sequence[Tuple[torch.Tensor, int]]]
"""A plan and the tensors it lays out: ``(tensor, split dim)``, each this rank's packed shard."""


def _check(jobs: Sequence[Job], replica: int, tp_rank: int, grid: Sequence[Sequence[int]]) -> None:
    for plan, tensors in jobs:
        if len(grid) != plan.replicas or any(len(row) != plan.tp for row in grid):
            raise ConfigError(f"reduce_across_layouts: grid has {[len(r) for r in grid]} ranks per replica, the plan "
                              f"{plan.replicas} replicas of tp {plan.tp}")
        width = sum(p.sizes[tp_rank] for p in plan.plans[replica])
        for tensor, dim in tensors:
            if tensor.shape[dim] != width:
                raise ConfigError(f"reduce_across_layouts: a tensor of shape {tuple(tensor.shape)} has {tensor.shape[dim]} "
                                  f"columns along dim {dim}, replica {replica}'s TP rank {tp_rank} holds {width}")


@torch.no_grad()
def reduce_across_layouts(jobs: Sequence[Job], *, replica: int, tp_rank: int,
                          grid: Sequence[Sequence[int]]) -> Tuple[int, int]:
    """Reduce every job's tensors in place (module docstring); ``grid[d][t]`` is the global rank of replica
    ``d``'s TP rank ``t``.  Returns this rank's ``(bytes sent, bytes received)``."""
    posted = post_across_layouts(jobs, replica=replica, tp_rank=tp_rank, grid=grid, timed=True)
    return finish_across_layouts([posted], replica=replica, tp_rank=tp_rank, grid=grid)


class Posted:
    """Phase 0 of some jobs in flight (:func:`post_across_layouts`): the jobs, where each received slice
    lands, and the messages."""

    def __init__(self, jobs: Sequence[Job], landed: Dict[Tuple[int, int, int, int], torch.Tensor],
                 swap: P.PackedSwap) -> None:
        self.jobs, self.landed, self.swap = list(jobs), landed, swap


@torch.no_grad()
def post_across_layouts(jobs: Sequence[Job], *, replica: int, tp_rank: int, grid: Sequence[Sequence[int]],
                        tag: int = 0, timed: bool = False) -> Posted:
    """Post phase 0 of ``jobs`` (this rank's slices packed per peer now, so the tensors may change after
    it returns until :func:`finish_across_layouts` sums into them) with ``tag`` on every message; returns
    at once.  Every rank posts the same jobs with the same tag (a rank with nothing to exchange posts
    nothing).  ``timed``: the posting in the comm region."""
    _check(jobs, replica, tp_rank, grid)
    outgoing, incoming, landed = _messages(jobs, 0, (replica, tp_rank), grid)
    return Posted(jobs, landed, P.post_packed(outgoing, incoming, tag=tag, timed=timed))  # peers: global ranks


@torch.no_grad()
def finish_across_layouts(posted: Sequence[Posted], *, replica: int, tp_rank: int, grid: Sequence[Sequence[int]],
                          tag: int = 0) -> Tuple[int, int]:
    """Wait for every posted phase 0 (in the comm region), sum each in place, then run phase 1 of all their
    jobs together (``tag``), posted and waited for here.  Returns this rank's ``(bytes sent, bytes received)``
    over both phases, counted as one exchange."""
    me = (replica, tp_rank)
    with P.comm_region():
        for part in posted:
            part.swap.wait()
    sent = sum(part.swap.sent for part in posted)
    received = sum(part.swap.received for part in posted)
    for part in posted:
        part.swap.unpack()
        _sum(part.jobs, part.landed, me)
    jobs = [job for part in posted for job in part.jobs]
    outgoing, incoming, _ = _messages(jobs, 1, me, grid)
    if outgoing or incoming:
        out_b, in_b = P.swap_packed(outgoing, incoming, tag=tag, timed=True)
        sent, received = sent + out_b, received + in_b
    counter = traffic.current()
    if counter is not None:
        counter.count("send", "cross-layout", sent, 2, lambda: None, timed=False, link=(sent, 0))
        counter.count("recv", "cross-layout", received, 2, lambda: None, timed=False, link=(0, received))
    return sent, received


def _messages(jobs: Sequence[Job], phase: int, me: Tuple[int, int], grid: Sequence[Sequence[int]]
              ) -> Tuple[Dict[int, List[torch.Tensor]], Dict[int, List[torch.Tensor]],
                         Dict[Tuple[int, int, int, int], torch.Tensor]]:
    """One phase's pieces per peer (global rank), out and in, in the order both ends derive from the plans
    (job, transfer, tensor); phase 0's incoming slices land in fresh tensors, ``landed[(job, tensor,
    segment, src replica)]``, phase 1's straight in place."""
    outgoing: Dict[int, List[torch.Tensor]] = {}
    incoming: Dict[int, List[torch.Tensor]] = {}
    landed: Dict[Tuple[int, int, int, int], torch.Tensor] = {}
    for j, (plan, tensors) in enumerate(jobs):
        for tr in plan.transfers:
            if tr.phase != phase:
                continue
            seg = plan.segments[tr.segment]
            src, dst = (tr.src, seg.owners[tr.src]), (tr.dst, seg.owners[tr.dst])
            for k, (tensor, dim) in enumerate(tensors):
                if src == me:
                    outgoing.setdefault(grid[dst[0]][dst[1]], []).append(
                        tensor.narrow(dim, seg.offsets[tr.src], seg.length))
                elif dst == me:
                    if phase == 0:
                        shape = list(tensor.shape)
                        shape[dim] = seg.length
                        target = tensor.new_empty(shape)
                        landed[(j, k, tr.segment, tr.src)] = target
                    else:
                        target = tensor.narrow(dim, seg.offsets[tr.dst], seg.length)
                    incoming.setdefault(grid[src[0]][src[1]], []).append(target)
    return outgoing, incoming, landed


def exchanges(plan: ReductionPlan, replica: int, tp_rank: int) -> bool:
    """Whether this rank sends or receives anything under ``plan`` (no: it holds none of its columns)."""
    return any((t.src, plan.segments[t.segment].owners[t.src]) == (replica, tp_rank)
               or (t.dst, plan.segments[t.segment].owners[t.dst]) == (replica, tp_rank) for t in plan.transfers)


def _sum(jobs: Sequence[Job], landed: Dict[Tuple[int, int, int, int], torch.Tensor], me: Tuple[int, int]) -> None:
    """Every segment this rank reduces: the replicas' slices summed in replica order, over ``D``, in place."""
    replica = me[0]
    for j, (plan, tensors) in enumerate(jobs):
        for s, seg in enumerate(plan.segments):
            if replica not in seg.reducers or seg.owners[replica] != me[1]:
                continue
            for k, (tensor, dim) in enumerate(tensors):
                own = tensor.narrow(dim, seg.offsets[replica], seg.length)
                parts = [own if d == replica else landed[(j, k, s, d)] for d in range(plan.replicas)]
                if len(parts) == 1:
                    continue  # one replica: its own gradient is the mean
                # in replica order; into ``own`` itself unless a later term still reads it (replica >= 2)
                acc = own if replica < 2 else torch.empty_like(own)
                torch.add(parts[0], parts[1], out=acc)
                for part in parts[2:]:
                    acc.add_(part)
                acc.div_(plan.replicas)
                if acc is not own:
                    own.copy_(acc)
