"""An all-gather of a row of floats issued at one step and read at the next.

Per-step statistics that only decide (a batch re-plan, a re-shard) need not stop every rank at the
step they were measured: :class:`LaggedRows` starts the all-gather asynchronously over its group
and hands the rows over at the next call, one step later, when the collective has long completed.
Every rank of the group posts at every step and reads the same rows, so decisions taken on them
agree across the group.  The rows travel as float64 (exact for the ints the callers send: digests
below 2**53, ranks and counts) on the group's collective device; reading them back is the one host
read per step, of a collective issued a step earlier.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from semimig.comm import primitives as P

__all__ = ["LaggedRows"]


class LaggedRows:
    """``exchange(values, tag)`` posts this step's ``values`` and returns the previous step's rows
    (group-rank order) with the ``tag`` posted beside them, or ``None`` at the first step."""

    def __init__(self, group: Optional[ProcessGroup]) -> None:
        self.group = group
        self._pending: Optional[tuple[Any, list[torch.Tensor], Any]] = None

    def exchange(self, values: Sequence[float], tag: Any = None) -> Optional[tuple[list[list[float]], Any]]:
        previous = self.collect()
        mine = torch.tensor([float(v) for v in values], dtype=torch.float64, device=P.collective_device(self.group))
        if P.group_size(self.group) == 1:
            self._pending = (None, [mine], tag)
        else:
            out = [torch.empty_like(mine) for _ in range(P.group_size(self.group))]
            self._pending = (dist.all_gather(out, mine, group=self.group, async_op=True), out, tag)
        return previous

    def collect(self) -> Optional[tuple[list[list[float]], Any]]:
        """The rows in flight and their tag (waiting for them), or ``None``; nothing stays in flight."""
        if self._pending is None:
            return None
        handle, out, tag = self._pending
        self._pending = None
        P.wait(handle)
        return [t.cpu().tolist() for t in out], tag
