"""What a rank's collectives carry, counted at the calls (benchmarks); off by default, and then free.

    from semimig.comm.traffic import count_traffic
    with count_traffic() as counter:
        ...                     # every semimig.comm.primitives call of this process is counted
    counter.totals()            # {op: {"calls", "payload_bytes", "out_bytes", "in_bytes", "seconds"}}

``payload_bytes`` is the tensor a call carries (once per call, whatever the algorithm).
``out_bytes`` / ``in_bytes`` are what this rank's own link carries under the model of a
link-bound cluster with pipelined collectives (NCCL's chains and rings), ``B`` the payload and
``e`` the group size::

    broadcast   root: out B                 others: in B
    reduce      root: in B                  others: out B
    all_reduce  every rank: out 2B(e-1)/e and in 2B(e-1)/e   (ring)
    reduce_scatter / all_gather   every rank: out B(e-1)/e and in B(e-1)/e   (ring; B the whole tensor)
    send / recv out B / in B

So the counter of a migrating straggler says how many bytes pass through its link under each
exchange policy.  It is a model of the link, not of gloo: gloo's unpipelined binomial-tree
broadcast makes its root send ``B`` once per tree level, and on one machine no byte crosses a
NIC at all.  The direct movements of :mod:`semimig.comm.primitives` (``broadcast_direct_``,
``reduce_direct_``, ``scatter_``, ``gather_``) are counted under the collective they replace with
the bytes they really send and receive (exact: they are point-to-point messages); for their
root these equal the model's.  ``seconds`` is the wall time inside synchronous calls (0 for started ones).
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator, TypeVar

__all__ = ["TrafficCounter", "count_traffic", "current"]

T = TypeVar("T")
_active: "TrafficCounter | None" = None


class TrafficCounter:
    """Per ``(op, role)``: calls, payload, link bytes out and in, seconds (see the module docstring)."""

    def __init__(self) -> None:
        self.ops: dict[tuple[str, str], list[float]] = {}

    def count(self, op: str, role: str, nbytes: int, group_size: int, call: Callable[[], T], *,
              timed: bool = True, link: tuple[float, float] | None = None) -> T:
        """Run ``call`` (the collective) and count it; ``link``: the ``(out, in)`` bytes this rank's
        link really carries, when known (the direct movements), else the model's."""
        out_b, in_b = _link_bytes(op, role, nbytes, group_size) if link is None else link
        start = time.perf_counter()
        result = call()
        seconds = time.perf_counter() - start if timed else 0.0
        entry = self.ops.setdefault((op, role), [0, 0, 0, 0, 0.0])
        for i, value in enumerate((1, nbytes, out_b, in_b, seconds)):
            entry[i] += value
        return result

    def totals(self) -> dict[str, dict[str, float]]:
        """``{op: {"calls", "payload_bytes", "out_bytes", "in_bytes", "seconds"}}`` summed over roles."""
        out: dict[str, dict[str, float]] = {}
        for (op, _), values in self.ops.items():
            entry = out.setdefault(op, dict.fromkeys(("calls", "payload_bytes", "out_bytes", "in_bytes", "seconds"), 0))
            for key, value in zip(entry, values):
                entry[key] += value
        return out

    def reset(self) -> dict[str, dict[str, float]]:
        """The totals so far; the counter starts afresh."""
        totals = self.totals()
        self.ops = {}
        return totals


def _link_bytes(op: str, role: str, nbytes: int, group_size: int) -> tuple[float, float]:
    if op == "all_reduce":
        share = 2 * nbytes * (group_size - 1) / group_size
        return share, share
    if op in ("reduce_scatter", "all_gather"):
        share = nbytes * (group_size - 1) / group_size
        return share, share
    if op == "broadcast":
        return (nbytes, 0) if role == "root" else (0, nbytes)
    if op == "reduce":
        return (0, nbytes) if role == "root" else (nbytes, 0)
    if op == "send":
        return nbytes, 0
    if op == "recv":
        return 0, nbytes
    raise ValueError(f"unknown collective {op!r}")


def current() -> "TrafficCounter | None":
    """The active counter, or None (then the primitives count nothing)."""
    return _active


@contextlib.contextmanager
def count_traffic() -> Iterator[TrafficCounter]:
    """Count every primitive call of this process inside the block (counters do not nest)."""
    global _active
    if _active is not None:
        raise RuntimeError("count_traffic() is already active in this process")
    _active = TrafficCounter()
    try:
        yield _active
    finally:
        _active = None
