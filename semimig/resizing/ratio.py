"""Eq. 1 pruning ratio and keep-set sizes (paper III-A).

For rank ``i`` at iteration ``j``::

    gamma_i = clamp( (T_i - T_ref) / M_i , 0, gamma_max )          (Eq. 1)

``T_i`` the rank's busy time, ``M_i`` the time of its linear GEMMs, ``T_ref`` the group mean
(ZERO alone) or minimum (inside SEMI).  A keep set then has ``|S| = round(K * (1 - gamma))``
of the ``K`` columns.

On real time the controller evaluates Eq. 1 with a fixed cost separated from the work that
scales with the kept columns and with ``T_ref`` taken from the ranks' *unpruned* times; see
:mod:`semimig.controller.shedding`, which also replaced the on-demand ``T_ref`` refresh: one small
all-gather per iteration carries every rank's observation (:mod:`semimig.controller.agreement`).
"""
from __future__ import annotations

import math

__all__ = ["pruning_ratio", "columns_to_prune"]


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
