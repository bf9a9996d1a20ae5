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

Every holder of a column so ends with the same bits.  Inside
:func:`semimig.comm.traffic.count_traffic` the bytes are counted as ``send`` / ``recv`` (exact: they
are point-to-point messages), beside the DP all-reduces they stand for.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from semimig.comm import primitives as P
from semimig.comm import traffic
from semimig.errors import ConfigError
from semimig.sharding.exchange import ReductionPlan

__all__ = ["Job", "reduce_across_layouts"]

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
    _check(jobs, replica, tp_rank, grid)
    me = (replica, tp_rank)
    sent = received = 0
    for phase in (0, 1):
        outgoing: Dict[int, List[torch.Tensor]] = {}
        incoming: Dict[int, List[torch.Tensor]] = {}
        landed: Dict[Tuple[int, int, int, int], torch.Tensor] = {}  # (job, tensor, segment, src replica)
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
        if not outgoing and not incoming and phase == 1:
            break
        out_b, in_b = P.swap_packed(outgoing, incoming, timed=True)  # peers: global ranks
        sent, received = sent + out_b, received + in_b
        if phase == 0:
            _sum(jobs, landed, me)
    counter = traffic.current()
    if counter is not None:
        counter.count("send", "cross-layout", sent, 2, lambda: None, timed=False, link=(sent, 0))
        counter.count("recv", "cross-layout", received, 2, lambda: None, timed=False, link=(0, received))
    return sent, received


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
