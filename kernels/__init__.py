"""Gather-pruned GEMM kernels; shipped as ``semimig.kernels``.

The three GEMMs of a linear layer whose reduction columns ``K`` are pruned to a keep set ``S``
(``P`` the rest), gathering through an int32 index tensor instead of copying ``x[:, S]``:

    gather_linear_fwd  : y        = x[:, S] @ w[:, S]^T (+ bias)
    gather_linear_dgrad: dx[:, S] = dy @ w[:, S],     dx[:, P] = 0
    gather_linear_wgrad: dw[:, S] = dy^T @ x[:, S],   dw[:, P] = 0
    impute_            : dw[:, P] = zero / previous gradient / row mean of dw[:, S]
    pruned_linear      : the autograd function over the three GEMMs

Layout: ``keep`` (validation, plans, groups), ``backend`` (Triton or torch), ``reference``
(pure-torch twins), ``triton_common`` / ``triton_gather`` (kernels),
``ops`` (public launchers), ``impute``, ``autograd``, ``layout`` (keep sets laid out as a
contiguous prefix: slice GEMMs, persistent gradient buffers, the permutation applied once).  Triton is imported only when a Triton
kernel first runs.
"""
if __name__ == "kernels":  # imported as a top-level module from a source checkout
    raise ImportError(
        "the repository folder 'kernels' is semimig's subpackage 'semimig.kernels'; "
        "it is not a top-level module (a PyPI package named 'kernels' exists)"
    )

from .autograd import clear_imputation_state, pruned_linear
from .backend import get_backend, resolve_backend, set_backend, triton_available, use_backend
from .impute import IMPUTE_POLICIES, impute_
from .keep import GROUP_SIZES, KeepPlan, plan_keep, validate_keep
from .layout import GradBuffer, KeepLayout, layout_dgrad, layout_fwd, layout_keep, layout_wgrad
from .ops import gather_linear_dgrad, gather_linear_fwd, gather_linear_wgrad

__all__ = [
    "GROUP_SIZES",
    "GradBuffer",
    "IMPUTE_POLICIES",
    "KeepLayout",
    "KeepPlan",
    "clear_imputation_state",
    "gather_linear_dgrad",
    "gather_linear_fwd",
    "gather_linear_wgrad",
    "get_backend",
    "impute_",
    "layout_dgrad",
    "layout_fwd",
    "layout_keep",
    "layout_wgrad",
    "plan_keep",
    "pruned_linear",
    "resolve_backend",
    "set_backend",
    "triton_available",
    "use_backend",
    "validate_keep",
]
