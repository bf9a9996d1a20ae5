"""Public launchers: check the operands, plan the keep set, dispatch to Triton or torch.

Every launcher takes a keep set as a sorted unique int32/int64 tensor, ``None`` (dense) or a
:class:`~semimig.kernels.keep.KeepPlan` (made by :func:`~semimig.kernels.keep.plan_keep`, the
only way to make one, so already validated: no further checks or host synchronisation), and an
optional ``group`` granularity (``None`` detects it; see :mod:`semimig.kernels.keep`).
Operands are 2-D and may be non-contiguous.

The backend comes from :mod:`semimig.kernels.backend`.  Whatever it is, a dense keep set runs
the dense torch products (cuBLAS on a GPU: nothing to gather, and bit-for-bit ``F.linear``), as
do empty dimensions and a keep set that is one contiguous run (strided slices: cuBLAS reads
them in place, better than any gather).
"""
from __future__ import annotations

from types import ModuleType

from torch import Tensor

from semimig.errors import ConfigError

from . import choice, reference
from .backend import resolve_backend
from .keep import KeepPlan, plan_keep

__all__ = [
    "check_linear_operands",
    "gather_linear_dgrad",
    "gather_linear_fwd",
    "gather_linear_wgrad",
]

KeepArg = Tensor | KeepPlan | None


def _triton_gather() -> ModuleType:
    from . import triton_gather  # imported on first use: importing triton is slow

    return triton_gather


def _check_matrix(name: str, t: object) -> Tensor:
    if not isinstance(t, Tensor):
        raise ConfigError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ConfigError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        raise ConfigError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    return t


def _check_alike(name: str, t: Tensor, ref_name: str, ref: Tensor) -> None:
    if t.dtype != ref.dtype:
        raise ConfigError(f"{name} has dtype {t.dtype} but {ref_name} has dtype {ref.dtype}")
    if t.device != ref.device:
        raise ConfigError(f"{name} is on {t.device} but {ref_name} is on {ref.device}")


def _check_dim(what: str, got: int, expected: int) -> None:
    if got != expected:
        raise ConfigError(f"mismatched {what}: {got} != {expected}")


def check_linear_operands(x: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    """Check x [M, K], weight [N, K], bias [N] or None: 2-D, floating, same dtype and device."""
    _check_matrix("x", x)
    _check_matrix("weight", weight)
    _check_alike("weight", weight, "x", x)
    _check_dim("K (x.shape[1] vs weight.shape[1])", x.shape[1], weight.shape[1])
    if bias is not None:
        if not isinstance(bias, Tensor) or bias.dim() != 1:
            raise ConfigError(f"bias must be None or a 1-D tensor [N], got {getattr(bias, 'shape', bias)}")
        _check_alike("bias", bias, "x", x)
        _check_dim("N (bias.shape[0] vs weight.shape[0])", bias.shape[0], weight.shape[0])


# -- dispatch on checked operands (also used by the autograd function) --------------------------


def _measured(kernel: str, m: int, n: int, plan: KeepPlan, like: Tensor, fused, gathered) -> Tensor:
    """The faster of the fused kernel and the torch gather path for this launch's key
    (:mod:`semimig.kernels.choice`)."""
    key = (kernel, like.device, like.dtype, _triton_gather().tune_key(kernel, m, n, plan.k, plan.n_kept, plan.group))
    return choice.fastest(key, like.device, {"triton": fused, "torch": gathered})


def fwd(backend: str, x: Tensor, weight: Tensor, bias: Tensor | None, plan: KeepPlan) -> Tensor:
    """``y = x[:, S] @ w[:, S]^T (+ bias)`` with a resolved backend; operands checked."""
    if backend == "torch" or plan.dense or plan.span is not None or x.shape[0] == 0 or weight.shape[0] == 0:
        return reference.gather_linear_fwd(x, weight, bias, plan)
    if backend == "measured":
        return _measured("fwd", x.shape[0], weight.shape[0], plan, x,
                         lambda: _triton_gather().gather_linear_fwd(x, weight, bias, plan),
                         lambda: reference.gather_linear_fwd(x, weight, bias, plan))
    return _triton_gather().gather_linear_fwd(x, weight, bias, plan)


def dgrad(backend: str, dy: Tensor, weight: Tensor, plan: KeepPlan, *, column_major: bool = False) -> Tensor:
    """``dx[:, S] = dy @ w[:, S]``, zeros on P, with a resolved backend; operands checked.

    ``column_major``: the forward input was column-major; the dense product then follows
    ``F.linear``'s autograd for such inputs (see :func:`reference.gather_linear_dgrad`).
    """
    if backend == "torch" or plan.dense or plan.span is not None or dy.numel() == 0 or plan.k == 0:
        return reference.gather_linear_dgrad(dy, weight, plan, column_major=column_major)
    if backend == "measured":
        return _measured("dgrad", dy.shape[0], dy.shape[1], plan, dy,
                         lambda: _triton_gather().gather_linear_dgrad(dy, weight, plan),
                         lambda: reference.gather_linear_dgrad(dy, weight, plan, column_major=column_major))
    return _triton_gather().gather_linear_dgrad(dy, weight, plan)


def wgrad(backend: str, dy: Tensor, x: Tensor, plan: KeepPlan) -> Tensor:
    """``dw[:, S] = dy^T @ x[:, S]``, zeros on P, with a resolved backend; operands checked."""
    if backend == "torch" or plan.dense or plan.span is not None or dy.shape[1] == 0 or plan.k == 0:
        return reference.gather_linear_wgrad(dy, x, plan)
    if dy.shape[0] == 0:  # empty reduction: the sum over no tokens is zero
        return dy.new_zeros(dy.shape[1], plan.k)
    if backend == "measured":
        return _measured("wgrad", dy.shape[0], dy.shape[1], plan, dy,
                         lambda: _triton_gather().gather_linear_wgrad(dy, x, plan),
                         lambda: reference.gather_linear_wgrad(dy, x, plan))
    return _triton_gather().gather_linear_wgrad(dy, x, plan)


# -- public launchers ---------------------------------------------------------------------------


def gather_linear_fwd(
    x: Tensor, weight: Tensor, bias: Tensor | None, keep: KeepArg, *, group: int | None = None
) -> Tensor:
    """``y = x[:, S] @ w[:, S]^T (+ bias)``: x [M, K], weight [N, K], bias [N] -> y [M, N].

    ``|S| = 0`` gives the bias broadcast over the rows (zeros without bias).
    """
    check_linear_operands(x, weight, bias)
    plan = plan_keep(keep, weight.shape[1], weight.device, group=group)
    return fwd(resolve_backend(x.device, x.dtype), x, weight, bias, plan)


def _grad_plan(dy: Tensor, name: str, operand: Tensor, shared: str, dy_dim: int, keep: KeepArg,
               group: int | None) -> tuple[str, KeepPlan]:
    """Check ``dy`` against the gathered ``operand`` (sharing dimension ``shared``); backend and plan."""
    _check_matrix("dy", dy)
    _check_matrix(name, operand)
    _check_alike(name, operand, "dy", dy)
    _check_dim(f"{shared} (dy.shape[{dy_dim}] vs {name}.shape[0])", dy.shape[dy_dim], operand.shape[0])
    return resolve_backend(dy.device, dy.dtype), plan_keep(keep, operand.shape[1], operand.device, group=group)


def gather_linear_dgrad(dy: Tensor, weight: Tensor, keep: KeepArg, *, group: int | None = None) -> Tensor:
    """``dx[:, S] = dy @ w[:, S]``, exact zeros on P: dy [M, N], weight [N, K] -> dx [M, K]."""
    backend, plan = _grad_plan(dy, "weight", weight, "N", 1, keep, group)
    return dgrad(backend, dy, weight, plan)


def gather_linear_wgrad(dy: Tensor, x: Tensor, keep: KeepArg, *, group: int | None = None) -> Tensor:
    """``dw[:, S] = dy^T @ x[:, S]``, exact zeros on P: dy [M, N], x [M, K] -> dw [N, K]."""
    backend, plan = _grad_plan(dy, "x", x, "M", 0, keep, group)
    return wgrad(backend, dy, x, plan)
