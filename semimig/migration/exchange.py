"""How migrated operands travel: broadcast-reduce (semimig) or scatter-gather (baseline).

Three movements make up migration (DESIGN §2), each with a straggler ``k`` and its receivers:

``share_block``   straggler -> receivers: a column block ``[*, L_k]`` (``W_k[:, mig]``, ``X_k[:, mig]``).
``share_whole``   straggler -> receivers: a whole tensor (``dY_k`` of the column layer).
``return_block``  receivers -> straggler: each receiver's columns of a ``[*, L_k]`` result block.
``return_sum``    receivers -> straggler: full-shape partial sums added into the straggler's buffer.
``merge_sum`` / ``merge_block``  a partial result that, under broadcast-reduce, a receiver adds
                  into its *own* buffer right before an all-reduce that follows anyway (the reduce
                  disappears); the scatter-gather baseline sends it to the straggler instead.

Scatter-gather uses point-to-point ``send``/``recv`` between the straggler and each receiver:
the straggler's link carries ``share_whole``'s tensor and ``return_sum``'s buffer once per
receiver, and the merged partials too.  Broadcast-reduce has two algorithms (``algorithm``):

``direct`` (default)  the straggler's link carries each byte once, the minimum
                      (:mod:`semimig.comm.primitives`' direct movements): ``share_block`` and
                      ``return_block`` send each receiver's slice only (as scatter-gather does),
                      ``share_whole`` scatters chunks that the receivers all-gather among
                      themselves, ``return_sum`` lets the receivers reduce-scatter among
                      themselves and gathers the summed chunks; inactive receivers (empty range)
                      take no part.  A group of two ranks keeps the ``tree`` path: with one
                      receiver both move the same single message and the collective is one call.
``tree``              the library's ``broadcast``/``reduce`` over the whole group (gloo: the
                      root sends a broadcast block ``ceil(log2 e)`` times); kept for comparison.

The algorithms give equal results: the same copies, and sums that differ only in fp32 order
(``return_sum``: the straggler's own buffer plus the receivers' parts summed in receiver order;
exact for integer-valued data).  Every algorithm executes the same
:class:`~semimig.migration.layout.StragglerShare`, and every rank of the group must call the
same methods in the same order.
"""
from __future__ import annotations

import torch
from torch.distributed import ProcessGroup

from semimig.comm import primitives as P
from semimig.migration.layout import StragglerShare

EXCHANGE_POLICIES = ("broadcast-reduce", "scatter-gather")
EXCHANGE_ALGORITHMS = ("direct", "tree")
"""How broadcast-reduce moves its blocks (see the module docstring); scatter-gather has one way."""


class Exchange:
    """Base: the policy-independent bookkeeping.  Use :func:`make_exchange`."""

    policy: str
    algorithm: str

    def __init__(self, group: ProcessGroup | None) -> None:
        self.group = group
        self.rank = P.group_rank(group)


class BroadcastReduceExchange(Exchange):
    """Broadcast-reduce on the library's tree collectives (``algorithm = "tree"``)."""

    policy = "broadcast-reduce"
    algorithm = "tree"

    def share_block(self, block: torch.Tensor | None, share: StragglerShare, shape: tuple[int, ...],
                    dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, int]:
        """Returns ``(tensor, offset)``: ``tensor[..., j]`` is block column ``offset + j``."""
        buf = block.contiguous() if self.rank == share.straggler else torch.empty(shape, dtype=dtype, device=device)
        return P.broadcast_(buf, share.straggler, self.group), 0

    def share_whole(self, tensor: torch.Tensor, share: StragglerShare) -> torch.Tensor:
        buf = tensor.contiguous() if self.rank == share.straggler else torch.empty_like(tensor)
        return P.broadcast_(buf, share.straggler, self.group)

    def return_block(self, part: torch.Tensor | None, share: StragglerShare, shape: tuple[int, ...],
                     dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """``part`` is this receiver's ``[*, width]`` slice; the straggler gets the whole block."""
        buf = torch.zeros(shape, dtype=dtype, device=device)
        span = share.range_of(self.rank)
        if span is not None and part is not None:
            buf[..., span[0]:span[1]] = part
        P.reduce_(buf, share.straggler, self.group)
        return buf if self.rank == share.straggler else None

    def return_sum(self, buffer: torch.Tensor, share: StragglerShare) -> torch.Tensor:
        """Sum every rank's ``buffer`` into the straggler's (its own buffer holds its own part)."""
        return P.reduce_(buffer, share.straggler, self.group)

    def merge_sum(self, own: torch.Tensor, part: torch.Tensor | None, share: StragglerShare) -> None:
        """Receivers add their full-shape ``part`` into ``own`` before the all-reduce (no reduce)."""
        if part is not None:
            own.add_(part)

    def merge_block(self, own_block: torch.Tensor, part: torch.Tensor | None, share: StragglerShare) -> None:
        """Receivers add their ``[*, width]`` ``part`` into their own ``own_block[..., start:stop]``."""
        span = share.range_of(self.rank)
        if span is not None and part is not None:
            own_block[..., span[0]:span[1]].add_(part)


class ScatterGatherExchange(Exchange):
    """Point-to-point baseline; receivers with an empty range take no part."""

    policy = "scatter-gather"
    algorithm = "point-to-point"

    @staticmethod
    def _active(share: StragglerShare) -> list[tuple[int, tuple[int, int]]]:
        return [(r, span) for r, span in zip(share.receivers, share.ranges) if span[1] > span[0]]

    def _is_active_receiver(self, share: StragglerShare) -> bool:
        span = share.range_of(self.rank)
        return span is not None and span[1] > span[0]

    def share_block(self, block: torch.Tensor | None, share: StragglerShare, shape: tuple[int, ...],
                    dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, int]:
        if self.rank == share.straggler:
            for receiver, (start, stop) in self._active(share):
                P.send(block[..., start:stop], receiver, self.group)
            return block, 0
        if not self._is_active_receiver(share):
            return torch.empty(shape[:-1] + (0,), dtype=dtype, device=device), 0
        start, stop = share.range_of(self.rank)
        buf = torch.empty(shape[:-1] + (stop - start,), dtype=dtype, device=device)
        return P.recv_(buf, share.straggler, self.group), start

    def share_whole(self, tensor: torch.Tensor, share: StragglerShare) -> torch.Tensor:
        if self.rank == share.straggler:
            for receiver, _ in self._active(share):
                P.send(tensor, receiver, self.group)
            return tensor
        if not self._is_active_receiver(share):
            return torch.empty_like(tensor)
        return P.recv_(torch.empty_like(tensor), share.straggler, self.group)

    def return_block(self, part: torch.Tensor | None, share: StragglerShare, shape: tuple[int, ...],
                     dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        if self.rank != share.straggler:
            if self._is_active_receiver(share):
                P.send(part, share.straggler, self.group)
            return None
        buf = torch.zeros(shape, dtype=dtype, device=device)
        for receiver, (start, stop) in self._active(share):
            tmp = torch.empty(shape[:-1] + (stop - start,), dtype=dtype, device=device)
            buf[..., start:stop] = P.recv_(tmp, receiver, self.group)
        return buf

    def return_sum(self, buffer: torch.Tensor, share: StragglerShare) -> torch.Tensor:
        if self.rank != share.straggler:
            if self._is_active_receiver(share):
                P.send(buffer, share.straggler, self.group)
            return buffer
        tmp = torch.empty_like(buffer)
        for receiver, _ in self._active(share):
            buffer.add_(P.recv_(tmp, receiver, self.group))
        return buffer

    def merge_sum(self, own: torch.Tensor, part: torch.Tensor | None, share: StragglerShare) -> None:
        """Receivers send ``part`` to the straggler, which adds it into its ``own``."""
        self.return_sum(own if self.rank == share.straggler else part, share)

    def merge_block(self, own_block: torch.Tensor, part: torch.Tensor | None, share: StragglerShare) -> None:
        """Receivers send ``part`` to the straggler, which adds the assembled block into ``own_block``."""
        block = self.return_block(part, share, tuple(own_block.shape), own_block.dtype, own_block.device)
        if block is not None:
            own_block.add_(block)


class DirectBroadcastReduceExchange(ScatterGatherExchange):
    """Broadcast-reduce whose straggler link carries each byte once (``algorithm = "direct"``).

    Slices travel as scatter-gather's do, but as counted scatter/gather movements; whole tensors
    and full-shape sums go through one chunk per receiver, relayed among the receivers; merged
    partials stay on the receivers (added before the all-reduce that follows), as in the tree path.
    """

    policy = "broadcast-reduce"
    algorithm = "direct"

    def share_block(self, block: torch.Tensor | None, share: StragglerShare, shape: tuple[int, ...],
                    dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, int]:
        active = self._active(share)
        if not active:
            return (block if self.rank == share.straggler else torch.empty(shape[:-1] + (0,), dtype=dtype,
                                                                            device=device)), 0
        ranks = [r for r, _ in active]
        if self.rank == share.straggler:
            P.scatter_([block[..., a:b] for _, (a, b) in active], None, share.straggler, ranks, self.group,
                       payload=block)
            return block, 0
        if not self._is_active_receiver(share):
            return torch.empty(shape[:-1] + (0,), dtype=dtype, device=device), 0
        start, stop = share.range_of(self.rank)
        buf = torch.empty(shape[:-1] + (stop - start,), dtype=dtype, device=device)
        payload = torch.empty(shape, dtype=dtype, device="meta")  # counted: the block it replaces broadcasting
        P.scatter_(None, buf, share.straggler, ranks, self.group, payload=payload)
        return buf, start

    def share_whole(self, tensor: torch.Tensor, share: StragglerShare) -> torch.Tensor:
        ranks = [r for r, _ in self._active(share)]
        if self.rank == share.straggler:
            return P.broadcast_direct_(tensor, share.straggler, ranks, self.group) if ranks else tensor
        buf = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        if self.rank not in ranks:
            return buf
        return P.broadcast_direct_(buf, share.straggler, ranks, self.group)

    def return_block(self, part: torch.Tensor | None, share: StragglerShare, shape: tuple[int, ...],
                     dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        active = self._active(share)
        ranks = [r for r, _ in active]
        payload = torch.empty(shape, dtype=dtype, device="meta")
        if self.rank != share.straggler:
            if self.rank in ranks:
                P.gather_(part, None, share.straggler, ranks, self.group, payload=payload)
            return None
        buf = torch.zeros(shape, dtype=dtype, device=device)
        if active:
            parts = [torch.empty(shape[:-1] + (b - a,), dtype=dtype, device=device) for _, (a, b) in active]
            P.gather_(None, parts, share.straggler, ranks, self.group, payload=payload)
            for (_, (a, b)), got in zip(active, parts):
                buf[..., a:b] = got
        return buf

    def return_sum(self, buffer: torch.Tensor, share: StragglerShare) -> torch.Tensor:
        """The straggler's ``buffer`` += the active receivers' (others, and inactive receivers: no-op)."""
        ranks = [r for r, _ in self._active(share)]
        if ranks and (self.rank == share.straggler or self.rank in ranks):
            P.reduce_direct_(buffer, share.straggler, ranks, self.group)
        return buffer

    merge_sum = BroadcastReduceExchange.merge_sum
    merge_block = BroadcastReduceExchange.merge_block


def make_exchange(policy: str, group: ProcessGroup | None, *, algorithm: str = "direct") -> Exchange:
    """The exchange for ``policy`` in :data:`EXCHANGE_POLICIES`; ``algorithm`` (one of
    :data:`EXCHANGE_ALGORITHMS`) picks broadcast-reduce's (a group of two ranks always takes ``tree``)."""
    if algorithm not in EXCHANGE_ALGORITHMS:
        raise ValueError(f"exchange algorithm must be one of {EXCHANGE_ALGORITHMS}, got {algorithm!r}")
    if policy == "broadcast-reduce":
        if algorithm == "direct" and P.group_size(group) > 2:
            return DirectBroadcastReduceExchange(group)
        return BroadcastReduceExchange(group)
    if policy == "scatter-gather":
        return ScatterGatherExchange(group)
    raise ValueError(f"exchange policy must be one of {EXCHANGE_POLICIES}, got {policy!r}")
