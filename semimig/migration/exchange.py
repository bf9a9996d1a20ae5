"""How migrated operands travel: broadcast-reduce (semimig) or scatter-gather (baseline).

Three movements make up migration (DESIGN §2), each with a straggler ``k`` and its receivers:

``share_block``   straggler -> receivers: a column block ``[*, L_k]`` (``W_k[:, mig]``, ``X_k[:, mig]``).
``share_whole``   straggler -> receivers: a whole tensor (``dY_k`` of the column layer).
``return_block``  receivers -> straggler: each receiver's columns of a ``[*, L_k]`` result block.
``return_sum``    receivers -> straggler: full-shape partial sums added into the straggler's buffer.
``merge_sum`` / ``merge_block``  a partial result that, under broadcast-reduce, a receiver adds
                  into its *own* buffer right before an all-reduce that follows anyway (the reduce
                  disappears); the scatter-gather baseline sends it to the straggler instead.

Broadcast-reduce uses ``broadcast``/``reduce`` collectives (tree-based, receivers relay);
scatter-gather uses point-to-point ``send``/``recv`` between the straggler and each receiver.
Both execute the same :class:`~semimig.migration.layout.StragglerShare`, and every rank of the
group must call the same methods in the same order.
"""
from __future__ import annotations

import torch
from torch.distributed import ProcessGroup

from semimig.comm import primitives as P
from semimig.migration.layout import StragglerShare

EXCHANGE_POLICIES = ("broadcast-reduce", "scatter-gather")


class Exchange:
    """Base: the policy-independent bookkeeping.  Use :func:`make_exchange`."""

    policy: str

    def __init__(self, group: ProcessGroup | None) -> None:
        self.group = group
        self.rank = P.group_rank(group)


class BroadcastReduceExchange(Exchange):
    policy = "broadcast-reduce"

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


def make_exchange(policy: str, group: ProcessGroup | None) -> Exchange:
    """The exchange for ``policy`` in :data:`EXCHANGE_POLICIES`."""
    if policy == "broadcast-reduce":
        return BroadcastReduceExchange(group)
    if policy == "scatter-gather":
        return ScatterGatherExchange(group)
    raise ValueError(f"exchange policy must be one of {EXCHANGE_POLICIES}, got {policy!r}")
