"""Imputation of the pruned weight-gradient columns (paper Fig. 3).

For a weight gradient ``dw [N, K]`` whose kept columns ``S`` were computed and whose pruned
columns ``P`` hold zeros:

    zero   : dw[:, P] = 0                                  (default; nothing to do)
    same   : dw[:, P] = previous[:, P]                     (previous iteration's gradient; zeros if none)
    average: dw[n, P] = mean_{j in S} dw[n, j]  per row n  (zeros when S is empty)
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from semimig.errors import ConfigError

from .keep import KeepPlan, plan_keep

__all__ = ["IMPUTE_POLICIES", "ImputePolicy", "check_policy", "impute_"]

ImputePolicy = Literal["zero", "same", "average"]
IMPUTE_POLICIES: tuple[str, ...] = ("zero", "same", "average")


def check_policy(policy: str) -> str:
    """Return ``policy`` if it is one of ``IMPUTE_POLICIES``, else raise ConfigError."""
    if policy not in IMPUTE_POLICIES:
        raise ConfigError(f"impute policy must be one of {IMPUTE_POLICIES}, got {policy!r}")
    return policy


def impute_(
    dw: Tensor, keep: Tensor | KeepPlan | None, policy: ImputePolicy, previous: Tensor | None = None
) -> Tensor:
    """Fill the pruned columns of ``dw [N, K]`` in place according to ``policy``; return ``dw``.

    ``keep`` is the keep set (tensor, plan or None for dense).  ``previous`` is used only by
    ``"same"`` and must then be ``None`` (first iteration: zeros) or a tensor shaped like ``dw``.
    """
    check_policy(policy)
    if not isinstance(dw, Tensor) or dw.dim() != 2:
        raise ConfigError(f"dw must be a 2-D tensor [N, K], got {getattr(dw, 'shape', type(dw).__name__)}")
    plan = plan_keep(keep, dw.shape[1], dw.device)
    if policy == "zero" or plan.n_pruned == 0:
        return dw
    pruned = plan.pruned.long()
    if policy == "same":
        if previous is None:
            return dw.index_fill_(1, pruned, 0)
        if previous.shape != dw.shape or previous.device != dw.device:
            raise ConfigError(
                f"previous gradient has shape {tuple(previous.shape)} on {previous.device}, "
                f"expected {tuple(dw.shape)} on {dw.device}"
            )
        return dw.index_copy_(1, pruned, previous.index_select(1, pruned).to(dw.dtype))
    if plan.n_kept == 0:
        return dw.index_fill_(1, pruned, 0)
    row_mean = dw.index_select(1, plan.keep).to(torch.float32).mean(dim=1, keepdim=True)  # [N, 1]
    return dw.index_copy_(1, pruned, row_mean.to(dw.dtype).expand(-1, plan.n_pruned))
