"""The sum a tensor-parallel layer reduces when its plan leaves some ranks without a column (DESIGN §8).

A row layer's partial output is ``y_r = x_r @ w[:, S_r]^T`` and a column layer's partial input
gradient ``dx_r = dy_r @ w[S_r, :]``; the layer's result is ``Σ_r`` of them over the group.  A rank
whose shard ``S_r`` is empty contributes exactly zero, so the sum over the *holders* (the ranks with
``|S_r| > 0``) is the whole sum.  :class:`HolderSum` computes it that way:

- the holders all-reduce among themselves (a process group of the holders alone; none when one
  rank holds everything);
- the first holder sends the sum to every rank holding nothing, and goes on at once: the send
  completes while it computes (at most :data:`IN_FLIGHT` sends of this process are left open; the
  oldest is waited for beyond that);
- a rank holding nothing receives the sum.

Every rank ends with the same tensor (the holders' all-reduce gives each holder the same sum, and
the idle ranks receive the first holder's).  What it buys: no holder waits inside the layer for a
rank that holds nothing of it, so a slow rank given no units leaves the layers' critical path; it
still takes part in what no plan splits (the vocabulary-parallel embedding and head, the loss).
One holder sends, not each a slice: a send is paced by its receiver, and an idle rank is typically
the slow one, so every holder that sends to it is tied to its pace (the transport's buffers fill);
one sender ties one holder.  With every rank holding columns the group's own all-reduce runs, the
even layout's bit for bit.

Holder groups are made once per set of global ranks, within the tensor-parallel group alone
(``new_group(..., use_local_synchronization=True)``: the other replicas and pipeline stages take no
part), the first time a layer with that set runs.  torch names such a group by its ranks and the
number of process groups the creating process knows of, so its members must know equally many, or
they meet under different names and wait for each other forever.  A plan with two holder sets (MLP
blocks on seven ranks of eight, KV groups on five) would break that: the ranks holding both kinds
would know one group more.  So every rank of the tensor-parallel group makes one group per holder
set: the holders their group, the others the group of the rest (which nothing uses).  Every rank of
the group runs the layers in the same order, so each set is made at the same point on every rank, and
the counts stay equal.

A rank that holds no unit of any kind may skip the step altogether (:mod:`semimig.shardformer.skip`):
then it runs no layer and receives nothing, so :func:`set_skipping` names it for its group and the
first holder sends to the other idle ranks only.
"""
from __future__ import annotations

import collections
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from semimig.comm import primitives as P

__all__ = ["IN_FLIGHT", "HolderSum", "drain_sends", "holder_group", "holders_of", "pending_sends", "set_skipping",
           "skipping"]

IN_FLIGHT = 256
"""Sends to idle ranks this process leaves open before it waits for the oldest."""

_GROUPS: dict[tuple[int, ...], ProcessGroup] = {}
_SENDS: collections.deque = collections.deque()
_SKIPPING: dict[tuple[int, ...], tuple[int, ...]] = {}


def _ranks(group: ProcessGroup) -> tuple[int, ...]:
    return tuple(dist.get_process_group_ranks(group)) if group is not None else tuple(range(dist.get_world_size()))


def set_skipping(group: ProcessGroup, ranks: Sequence[int]) -> None:
    """Name the group ranks of ``group`` that skip whole steps (none: ``()``); every rank of the group
    sets the same."""
    _SKIPPING[_ranks(group)] = tuple(sorted(ranks))


def skipping(group: ProcessGroup) -> tuple[int, ...]:
    """The group ranks of ``group`` that skip whole steps (:func:`set_skipping`)."""
    return _SKIPPING.get(_ranks(group), ())


def holders_of(sizes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The group ranks holding at least one column of a layer whose parts have per-rank ``sizes``."""
    tp = len(sizes[0])
    return tuple(r for r in range(tp) if any(part[r] > 0 for part in sizes))


def pending_sends() -> int:
    """Sends to idle ranks posted by this process and not yet waited for."""
    return len(_SENDS)


def drain_sends(keep: int = 0) -> None:
    """Wait for this process's oldest sends until at most ``keep`` are open.  With none kept: before the idle
    ranks stop receiving (no rank skips any more) and before a process group is destroyed, no send of it may
    still be open."""
    while len(_SENDS) > keep:
        _SENDS.popleft().wait()


def _post(work: Optional[dist.Work]) -> None:
    if work is not None:
        _SENDS.append(work)
        drain_sends(IN_FLIGHT)


def holder_group(group: ProcessGroup, holders: Sequence[int]) -> Optional[ProcessGroup]:
    """The holders' own process group (one rank's own group when one rank holds everything) on a holder,
    ``None`` on any other rank: made, or found made, by every rank of ``group`` at the same point."""
    return _holder_group(group, tuple(holders), single=True)


def _holder_group(group: ProcessGroup, holders: tuple[int, ...], *, single: bool = False
                  ) -> Optional[ProcessGroup]:
    """The holders' own group on a holder, ``None`` on any other rank: called by every rank of ``group``
    at the same point (module docstring: the holders make their group, the others the group of the rest).
    One holder has a group of its own only with ``single``."""
    if len(holders) < (1 if single else 2):
        return None
    size, me = P.group_size(group), P.group_rank(group)
    key = tuple(dist.get_global_rank(group, r) for r in holders)
    part = holders if me in holders else tuple(r for r in range(size) if r not in holders)
    found = _GROUPS.get(key)
    if found is None or found not in dist.distributed_c10d._world.pg_map:  # none yet, or of a world since destroyed
        ranks = [dist.get_global_rank(group, r) for r in part]
        found = dist.new_group(ranks, backend=dist.get_backend(group), use_local_synchronization=True)
        _GROUPS[key] = found
    return found if me in holders else None


class _Pending:
    """The handle :meth:`HolderSum.start` returns: :func:`semimig.comm.primitives.wait` completes the
    holders' sum and posts the sends, or completes an idle rank's receive."""

    def __init__(self, owner: "HolderSum", tensor: torch.Tensor, works: Sequence[Optional[dist.Work]],
                 landing: Optional[torch.Tensor] = None) -> None:
        self.owner, self.tensor, self.works, self.landing = owner, tensor, works, landing

    def wait(self) -> None:
        for work in self.works:
            if work is not None:
                work.wait()
        if self.owner.me in self.owner.holders:
            self.owner._send(self.tensor)
        elif self.landing is not None:
            self.tensor.copy_(self.landing)


class HolderSum:
    """The group sum of a layer held by ``holders`` (group ranks) only (module docstring)."""

    def __init__(self, group: ProcessGroup, holders: Sequence[int], skip: Sequence[int] = ()) -> None:
        self.group = group
        self.holders = tuple(holders)
        size = P.group_size(group)
        if not self.holders or any(not 0 <= r < size for r in self.holders):
            raise ValueError(f"holders {self.holders} must be a non-empty set of ranks of a group of {size}")
        self.me = P.group_rank(group)
        self.root = self.holders[0]
        if set(skip) & set(self.holders):
            raise ValueError(f"ranks {tuple(skip)} skip the step but hold columns ({self.holders})")
        self.idle = tuple(r for r in range(size) if r not in self.holders and r not in skip)
        self._group = _holder_group(group, self.holders)

    def _send(self, tensor: torch.Tensor) -> None:
        if self.me != self.root or not self.idle:
            return
        # a copy: the caller may write into its tensor before the send is done
        payload = tensor.detach().clone(memory_format=torch.contiguous_format)
        for peer in self.idle:
            _post(P.isend(payload, peer, self.group))

    def _receive(self, tensor: torch.Tensor) -> _Pending:
        """Post the receive of the first holder's sum (into ``tensor`` itself when it is contiguous)."""
        contiguous = torch.contiguous_format
        landing = None if tensor.is_contiguous() else torch.empty_like(tensor, memory_format=contiguous)
        return _Pending(self, tensor, [P.irecv_(tensor if landing is None else landing, self.root, self.group)],
                        landing)

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """The group's sum into ``tensor`` (in place), as ``all_reduce`` over the group."""
        if self.me in self.holders:
            if self._group is not None:
                P.all_reduce_(tensor, self._group)
            self._send(tensor)
        else:
            P.wait(self._receive(tensor))
        return tensor

    def start(self, tensor: torch.Tensor) -> _Pending:
        """Start the group's sum into ``tensor``; :func:`semimig.comm.primitives.wait` the handle before
        reading it."""
        if self.me in self.holders:
            work = None if self._group is None else P.all_reduce_start(tensor, self._group)
            return _Pending(self, tensor, [work])
        return self._receive(tensor)
