"""Eq. 1 pruning ratio and the on-demand refreshed reference time (paper III-A).

For rank ``i`` at iteration ``j``::

    gamma_i = clamp( (T_i - T_ref) / M_i , 0, gamma_max )          (Eq. 1)

``T_i`` the rank's busy time, ``M_i`` the time of its linear GEMMs, ``T_ref`` the group mean
(ZERO alone) or minimum (inside SEMI).  A keep set then has ``|S| = round(K * (1 - gamma))``
of the ``K`` columns.

Refreshing ``T_ref`` costs collectives, so each rank watches its own ``T_i`` and the group
refreshes only when some rank's time moved by more than ``threshold`` (relative, either
direction) since the last refresh.  To keep every rank calling the same collectives in the same
order, the decision is itself collective::

    flag   = all_reduce_max( needs_refresh(T_i) )     one scalar, every iteration
    if flag: times = all_gather(T_i); T_ref = mean(times) or min(times)

:class:`ReferenceTime` is the pure part; :func:`refresh_reference` does the two collectives.
"""
from __future__ import annotations

import logging
import math
from typing import Literal, Optional, Sequence

import torch
import torch.distributed as dist

from semimig.comm.primitives import collective_device

__all__ = ["pruning_ratio", "columns_to_prune", "ReferenceTime", "refresh_reference"]

logger = logging.getLogger(__name__)


def _check_time(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def pruning_ratio(t_i: float, t_ref: float, m_i: float, gamma_max: float) -> float:
    """Eq. 1: ``clamp((t_i - t_ref) / m_i, 0, gamma_max)``; 0 when ``m_i <= 0`` (no GEMM time)."""
    _check_time("t_i", t_i)
    _check_time("t_ref", t_ref)
    if isinstance(m_i, bool) or not isinstance(m_i, (int, float)) or math.isnan(m_i):
        raise ValueError(f"m_i must be a number, got {m_i!r}")
    if isinstance(gamma_max, bool) or not isinstance(gamma_max, (int, float)) or not 0 <= gamma_max < 1:
        raise ValueError(f"gamma_max must be in [0, 1), got {gamma_max!r}")
    if m_i <= 0:
        return 0.0
    return float(min(max((t_i - t_ref) / m_i, 0.0), gamma_max))


def columns_to_prune(num_columns: int, gamma: float) -> int:
    """``|P| = K - round(K * (1 - gamma))`` columns of ``K`` pruned at ratio ``gamma`` in [0, 1].

    ``round`` is Python's (half to even), as for every keep-set size in DESIGN.md section 1.
    """
    if isinstance(num_columns, bool) or not isinstance(num_columns, int) or num_columns < 0:
        raise ValueError(f"num_columns must be an int >= 0, got {num_columns!r}")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    return num_columns - round(num_columns * (1.0 - gamma))


class ReferenceTime:
    """Pure tracker of ``T_ref`` with on-demand refresh.

    ``needs_refresh(t_i)`` is this rank's local vote; the group ORs the votes and, if any rank
    voted, every rank calls ``apply_refresh(t_i, gathered_times)`` with the same gathered times,
    so all ranks hold the same ``t_ref`` and refresh on the same iteration.
    """

    def __init__(self, *, threshold: float = 0.10, reduce: Literal["mean", "min"] = "mean") -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not (threshold > 0):
            raise ValueError(f"threshold must be a number > 0, got {threshold!r}")
        if reduce not in ("mean", "min"):
            raise ValueError(f"reduce must be 'mean' or 'min', got {reduce!r}")
        self.threshold = float(threshold)
        self.reduce = reduce
        self.t_ref: Optional[float] = None
        self.times: tuple[float, ...] = ()
        """The group's times gathered at the last refresh (rank order)."""
        self.refresh_count = 0
        self._t_at_refresh: Optional[float] = None

    def needs_refresh(self, t_i: float) -> bool:
        """True before the first refresh, or when ``|t_i - t_last| > threshold * t_last``."""
        _check_time("t_i", t_i)
        last = self._t_at_refresh
        if last is None:
            return True
        if last == 0:
            return t_i > 0
        return abs(t_i - last) > self.threshold * last

    def apply_refresh(self, t_i: float, times: Sequence[float]) -> float:
        """Refresh from the group's gathered ``times`` (this rank's own ``t_i`` among them)."""
        _check_time("t_i", t_i)
        if len(times) == 0:
            raise ValueError("times must hold one busy time per rank, got an empty sequence")
        for t in times:
            _check_time("gathered time", t)
        self.times = tuple(float(t) for t in times)
        self.t_ref = min(self.times) if self.reduce == "min" else math.fsum(self.times) / len(self.times)
        self._t_at_refresh = float(t_i)
        self.refresh_count += 1
        return self.t_ref


def refresh_reference(tracker: ReferenceTime, t_i: float, group: Optional[dist.ProcessGroup] = None) -> float:
    """Collective: every rank of ``group`` must call it each iteration, in the same order.

    One-scalar all-reduce MAX of the local refresh votes; if any rank voted, an all-gather of the
    busy times and :meth:`ReferenceTime.apply_refresh` on every rank.  Returns the (possibly
    unchanged) ``T_ref``.  A size-1 group (or no initialised process group) needs no collective.
    """
    vote = tracker.needs_refresh(t_i)
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size(group) == 1:
        if vote:
            tracker.apply_refresh(t_i, [t_i])
        assert tracker.t_ref is not None
        return tracker.t_ref
    # gloo and nccl both accept float64; the tensors live on the backend's device.
    device = collective_device(group)
    flag = torch.tensor([1.0 if vote else 0.0], dtype=torch.float64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if flag.item() > 0:
        mine = torch.tensor([float(t_i)], dtype=torch.float64, device=device)
        gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, mine, group=group)
        t_ref = tracker.apply_refresh(t_i, [g.item() for g in gathered])
        logger.debug("T_ref refreshed to %.6g from %s", t_ref, tracker.times)
    assert tracker.t_ref is not None
    return tracker.t_ref
