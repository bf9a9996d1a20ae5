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

from semimig._validate import check_int, check_number

__all__ = ["pruning_ratio", "columns_to_prune"]


def pruning_ratio(t_i: float, t_ref: float, m_i: float, gamma_max: float) -> float:
    """Eq. 1: ``clamp((t_i - t_ref) / m_i, 0, gamma_max)``; 0 when ``m_i <= 0`` (no GEMM time)."""
    check_number("t_i", t_i, minimum=0.0)
    check_number("t_ref", t_ref, minimum=0.0)
    check_number("m_i", m_i)
    check_number("gamma_max", gamma_max, minimum=0.0, maximum=1.0, high_open=True)
    if m_i <= 0:
        return 0.0
    return float(min(max((t_i - t_ref) / m_i, 0.0), gamma_max))


def columns_to_prune(num_columns: int, gamma: float) -> int:
    """``|P| = K - round(K * (1 - gamma))`` columns of ``K`` pruned at ratio ``gamma`` in [0, 1].

    ``round`` is Python's (half to even), as for every keep-set size in DESIGN.md section 1.
    """
    check_int("num_columns", num_columns, minimum=0)
    check_number("gamma", gamma, minimum=0.0, maximum=1.0)
    return num_columns - round(num_columns * (1.0 - gamma))
