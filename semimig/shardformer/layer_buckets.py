"""The cross-layout reduction of the paired gradients overlapped with the backward, one bucket per TP layer.

:class:`LayerBuckets` carries out :func:`~semimig.shardformer.crosslayout.reduce_across_layouts` for
the paired parameters (:mod:`semimig.shardformer.replicas`) the way torch DDP overlaps its all-reduce:

- a bucket is one TP layer's paired parameters (weight, a column layer's bias), with its layer's
  :class:`~semimig.sharding.exchange.ReductionPlan`; the buckets are numbered in the reverse of the
  model's layer order, the order in which a backward completes them;
- in a backward that DDP would synchronise, each paired parameter's post-accumulate hook
  (:meth:`ready`) marks it; once every parameter of the next bucket in that numbering is marked, its
  outgoing slices are packed per peer (a copy: the gradient's later use changes nothing sent) and its
  phase 0 sends and receives are posted, asynchronously, under the bucket's own tag
  (:data:`TAG` + its number), and so on for every following bucket already complete.  The autograd
  engine runs a parameter's gradient accumulation once per backward and the hook after it, so a
  marked gradient is final for this backward;
- at the end of the backward (:meth:`finish`, the autograd callback) every bucket not yet posted is
  posted, in that numbering: one whose parameter took no gradient in this backward (unused) gets a
  zero gradient (``torch.zeros_like``) first.  Then the waits for every bucket (in the comm region),
  the sums in replica order in each gradient's dtype over ``D``, and phase 1 of ``reduce`` plans
  (``D > 2``) for all buckets together, synchronous: bit for bit the one-shot reduction's result,
  since each column's sum reads only that column's slices.

Every rank posts every bucket it exchanges anything in exactly once per synchronised backward, and all of
them before it waits for any, so no rank waits for a message a peer has not posted.  Every rank posts
them in the same order (a bucket waits for the buckets numbered before it), so the messages between
two ranks are posted in one order on both: NCCL, which matches point-to-point messages in posting
order, pairs them as gloo does by tag.  A rank holding no column of a layer (a plan giving it no unit
of that kind) exchanges nothing in that bucket: it never posts it, and no bucket waits for it, whether
its zero-width parameters' hooks fire or not.  A bucket whose parameters complete out of the
numbering's order is held until those before it are posted, at worst until the end of the backward.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Sequence, Set, Tuple

import torch
import torch.nn as nn

from semimig.sharding.exchange import ReductionPlan
from semimig.shardformer.crosslayout import Posted, exchanges, finish_across_layouts, post_across_layouts

logger = logging.getLogger(__name__)

__all__ = ["TAG", "LayerBuckets"]

TAG = 0x5E0000
"""The first bucket's point-to-point tag; bucket ``b`` uses ``TAG + b`` and phase 1 ``TAG + len(buckets)``
(tags no other exchange of semimig's uses)."""


class LayerBuckets:
    """The paired parameters' reduction in per-layer buckets posted during the backward (module docstring).

    ``buckets``: ``(plan, [(parameter, split dim), …])`` per TP layer in the model's layer order; ``grid``,
    ``replica`` and ``tp_rank`` as :func:`~semimig.shardformer.crosslayout.reduce_across_layouts` takes them."""

    def __init__(self, buckets: Sequence[Tuple[ReductionPlan, Sequence[Tuple[nn.Parameter, int]]]], *,
                 replica: int, tp_rank: int, grid: Sequence[Sequence[int]]) -> None:
        self.buckets = [(plan, list(params)) for plan, params in reversed(buckets)]
        self.replica, self.tp_rank, self.grid = replica, tp_rank, grid
        self._exchanges = [exchanges(plan, replica, tp_rank) for plan, _ in self.buckets]
        self._index: Dict[int, int] = {}
        self._needed: List[int] = []  # parameters whose gradient completes each bucket
        for b, (_, params) in enumerate(self.buckets):
            trained = [p for p, _ in params if p.requires_grad]
            self._index.update((id(p), b) for p in trained)
            self._needed.append(len(trained))
        self.from_hooks = self.at_end = 0
        """Buckets posted from the parameters' hooks, and at the end of the backward, over every reduction."""
        self.last: Tuple[int, int] = (0, 0)
        """``(from hooks, at the end)`` of the latest reduction."""
        self._reset()

    def _reset(self) -> None:
        self._marked: List[Set[int]] = [set() for _ in self.buckets]
        self._next = 0
        self._posted: List[Posted] = []
        self._hooked = 0

    def ready(self, param: torch.Tensor) -> None:
        """``param``'s gradient is accumulated for a synchronised backward: post every bucket now complete
        whose predecessors are posted."""
        b = self._index.get(id(param))
        if b is None or b < self._next:
            return
        self._marked[b].add(id(param))
        while self._next < len(self.buckets) and (not self._exchanges[self._next]
                                                  or len(self._marked[self._next]) == self._needed[self._next]):
            if self._post(self._next):
                self._hooked += 1
            self._next += 1

    def _post(self, b: int) -> bool:
        """Post bucket ``b``'s phase 0 (its unused parameters' gradients zero); whether it exchanges anything."""
        if not self._exchanges[b]:
            return False
        plan, params = self.buckets[b]
        tensors = []
        for param, dim in params:
            if param.grad is None:  # unused in this backward: its gradient is zero on this rank
                param.grad = torch.zeros_like(param)
            tensors.append((param.grad, dim))
        self._posted.append(post_across_layouts([(plan, tensors)], replica=self.replica, tp_rank=self.tp_rank,
                                                grid=self.grid, tag=TAG + b))
        return True

    def finish(self) -> Tuple[int, int]:
        """Post every bucket left, wait for them all and sum (module docstring): the end of a synchronised
        backward.  Returns this rank's ``(bytes sent, bytes received)``."""
        left = 0
        try:
            while self._next < len(self.buckets):
                left += self._post(self._next)
                self._next += 1
            for _, params in self.buckets:  # the buckets this rank exchanges nothing in: zero gradients, as above
                for param, _ in params:
                    if param.grad is None:
                        param.grad = torch.zeros_like(param)
            moved = finish_across_layouts(self._posted, replica=self.replica, tp_rank=self.tp_rank, grid=self.grid,
                                          tag=TAG + len(self.buckets))
        finally:
            self.last = (self._hooked, left)
            self._reset()
        self.from_hooks, self.at_end = self.from_hooks + self.last[0], self.at_end + self.last[1]
        if left:
            logger.debug("cross-layout reduction: %d buckets posted during the backward, %d at its end",
                         self.last[0], left)
        return moved
