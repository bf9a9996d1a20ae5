"""Keep layouts: the kept columns laid out as one contiguous slice, so pruned GEMMs need no gather.

A keep set ``S ⊂ [0, K)`` is scattered over ``K``; the gather path (:mod:`.reference`,
:mod:`.triton_gather`) pays, on every call, a gather of ``x[:, S]`` and ``w[:, S]`` and a
full-size scatter with zero fill of ``dx`` / ``dw``.  A :class:`KeepLayout` instead fixes a
permutation ``π`` of the reduction dimension once per plan change,

    π = [S (ascending) | P (ascending)]            x̃ = x[:, π]    w̃ = w[:, π]

after which the kept columns are the prefix ``[0, K')`` of the laid-out operands, ``K' = |S|``,
and the three GEMMs are narrow slices read in place (cuBLAS / MKL take a leading dimension):

    fwd  : y            = x̃[:, :K'] @ w̃[:, :K']^T (+ b)
    dgrad: dx̃[:, :K']   = dy @ w̃[:, :K']            dx̃[:, K':] = 0
    wgrad: dw̃[:, :K']   = dy^T @ x̃[:, :K']          dw̃[:, K':] = 0

Exactness: column ``j`` of a laid-out result is column ``π[j]`` of the gather path's result
(same operands, same order of the ``K'`` reduction terms); ``from_layout`` (``t[:, π⁻¹]``)
gives it back in the original order.  Where ``π`` is applied: to tensors that live across
calls (parameters, optimizer state) once per plan change, and for free to an activation whose
columns are produced by the previous layer's rows (the *paired* dimension: a column-parallel
layer's output rows ``[N]`` are the next row-parallel layer's input columns ``[K]``; permuting
the first layer's weight rows and bias permutes the second layer's ``x`` columns).

Zero fill.  ``dx̃[:, K':]`` / ``dw̃[:, K':]`` must be exact zeros.  A fresh result zeroes only
that tail; :class:`GradBuffer` keeps one buffer whose tail was zeroed once and writes only the
kept slice per call (its tail is re-zeroed only when someone else wrote to the buffer, seen by
torch's version counter), so a call costs the GEMM at ``K'`` and nothing proportional to ``K``.

Blocks.  ``block`` (1, 8, 16, 32, ...) is the granularity of ``S``: a union of aligned blocks
``[b·g, b·g + g)``.  The layout itself works for any ``S``; blocks keep the permutation's
gathers (once per plan change) and the priority lists (:mod:`semimig.resizing.priority`,
``select_pruned_blocks``) coarse.
"""
from __future__ import annotations

import torch
from torch import Tensor

from semimig.errors import ConfigError

from .keep import KeepPlan, plan_keep

__all__ = ["GradBuffer", "KeepLayout", "layout_dgrad", "layout_fwd", "layout_keep", "layout_wgrad",
           "apply_paired_layout_", "permute_", "relative_permutation", "scatter_dgrad"]


class KeepLayout:
    """The permutation ``π = [S | P]`` of ``[0, k)`` and the prefix plan of the laid-out operands.

    Attributes:
        k: the full reduction size ``K``.
        n_kept: ``K' = |S|``.
        block: granularity ``g`` of ``S`` (1 = single columns).
        plan: the original keep set's :class:`KeepPlan` (gather path, imputation).
        prefix: a :class:`KeepPlan` of ``[0, K')`` (``span = (0, K')``): what the launchers of
            :mod:`.ops` take for laid-out operands (narrow slices on every backend).
        perm: ``[K] int64``, ``perm[j]`` = the original column at laid-out position ``j``.
        inverse: ``[K] int64``, ``inverse[c]`` = the laid-out position of original column ``c``.
    """

    __slots__ = ("k", "n_kept", "block", "plan", "prefix", "perm", "inverse")

    def __init__(self, plan: KeepPlan, block: int) -> None:
        self.k, self.n_kept, self.block, self.plan = plan.k, plan.n_kept, block, plan
        self.perm = torch.cat([plan.keep, plan.pruned]).long()
        self.inverse = torch.empty_like(self.perm)
        self.inverse[self.perm] = torch.arange(self.k, device=self.perm.device)
        self.prefix = plan_keep(torch.arange(self.n_kept, device=plan.device), self.k, plan.device, group=1)

    @property
    def identity(self) -> bool:
        """True when ``S`` is already the prefix ``[0, K')`` (no permutation needed)."""
        return self.plan.n_kept == 0 or self.plan.dense or self.plan.span == (0, self.n_kept)

    def to_layout(self, t: Tensor, dim: int = -1) -> Tensor:
        """``t`` with dimension ``dim`` (of size K) in laid-out order: ``t.index_select(dim, π)``."""
        return t if self.identity else t.index_select(dim, self.perm)

    def from_layout(self, t: Tensor, dim: int = -1) -> Tensor:
        """Inverse of :meth:`to_layout`: back to the original column order."""
        return t if self.identity else t.index_select(dim, self.inverse)

    def kept(self, t: Tensor) -> Tensor:
        """``t̃[:, :K']``: the kept columns of a laid-out ``[R, K]`` tensor, a view."""
        return t.narrow(1, 0, self.n_kept)

    def __repr__(self) -> str:
        return f"KeepLayout(k={self.k}, n_kept={self.n_kept}, block={self.block})"


def layout_keep(keep: Tensor | KeepPlan | None, k: int, device: torch.device | str, *, block: int = 1) -> KeepLayout:
    """Build the :class:`KeepLayout` of ``keep`` (validated as by :func:`plan_keep`); once per plan change.

    ``block``: ``S`` must be a union of aligned blocks of ``block`` columns with ``block | k``
    (1 accepts any keep set).  Raises :class:`~semimig.errors.ConfigError` naming the bad value.
    """
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ConfigError(f"block must be a positive int, got {block!r}")
    plan = plan_keep(keep, k, device, group=1)
    if block > 1:
        if k % block:
            raise ConfigError(f"block = {block} does not divide K = {k}")
        if plan.n_kept % block or (plan.n_kept and not bool(_aligned_blocks(plan.keep, block))):
            raise ConfigError(f"keep is not a union of aligned blocks of {block} columns")
    return KeepLayout(plan, block)


def _aligned_blocks(keep: Tensor, g: int) -> Tensor:
    blocks = keep.view(-1, g)
    return ((blocks[:, 0] % g == 0) & (blocks == blocks[:, :1] + torch.arange(g, device=keep.device)).all(1)).all()


class GradBuffer:
    """A persistent ``[R, K]`` result whose columns ``[K', K)`` are exact zeros; one per GEMM role.

    :meth:`get` returns the buffer for ``(rows, layout, dtype, device)``: every column the
    caller does not write is zero (zeroed when the buffer is made, and again only if the buffer
    changed since this object last wrote to it — torch bumps a tensor's version on every
    in-place write, views included).  The caller writes the kept columns in place (the slice
    ``[:, :K']`` in laid-out order, or ``S`` in the original order) and calls :meth:`written`.

    The result is overwritten by the next call: hand it only to a consumer that is done with it
    before then (autograd's next function, which reads a gradient and never writes to it while
    another reference exists).  Memory: one ``[R, K]`` tensor per buffer.
    """

    __slots__ = ("_buf", "_key", "_version")

    def __init__(self) -> None:
        self._buf: Tensor | None = None
        self._key: tuple | None = None
        self._version = -1

    def get(self, rows: int, layout: KeepLayout, like: Tensor) -> Tensor:
        key = (rows, layout.k, layout.n_kept, like.dtype, like.device)
        if self._key != key or self._buf is None:
            self._buf = like.new_zeros(rows, layout.k)
            self._key = key
        elif self._buf._version != self._version:  # someone else wrote to it: zero it again
            self._buf.zero_()
        return self._buf

    def written(self) -> None:
        """Record the buffer's version after the caller's own write of the kept slice."""
        if self._buf is not None:
            self._version = self._buf._version

    def release(self) -> None:
        """Drop the buffer (frees its memory)."""
        self._buf, self._key, self._version = None, None, -1


# -- the three GEMMs on laid-out operands ---------------------------------------------------------


def _mm_into(out: Tensor, a: Tensor, b: Tensor) -> None:
    """``out = a @ b`` in place (a strided view); through autograd (a copy) when an operand needs a gradient."""
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        out.copy_(a.mm(b))
    else:
        torch.mm(a, b, out=out)


def _result(rows: int, layout: KeepLayout, like: Tensor, buffer: GradBuffer | None) -> Tensor:
    """An ``[rows, K]`` result with exact zeros on ``[K', K)``: a persistent buffer, or fresh with only the tail zeroed."""
    if buffer is not None:
        return buffer.get(rows, layout, like)
    out = like.new_empty(rows, layout.k)
    out.narrow(1, layout.n_kept, layout.k - layout.n_kept).zero_()
    return out


def layout_fwd(x: Tensor, weight: Tensor, bias: Tensor | None, layout: KeepLayout) -> Tensor:
    """``y = x̃[:, :K'] @ w̃[:, :K']^T (+ bias)`` on laid-out x [M, K], weight [N, K]: slices, no copy."""
    if layout.n_kept == 0:
        y = x.new_zeros(x.shape[0], weight.shape[0])
        return y.add_(bias) if bias is not None else y
    return torch.nn.functional.linear(layout.kept(x), layout.kept(weight), bias)


def layout_dgrad(dy: Tensor, weight: Tensor, layout: KeepLayout, buffer: GradBuffer | None = None) -> Tensor:
    """``dx̃[:, :K'] = dy @ w̃[:, :K']``, exact zeros on ``[K', K)``; dy [M, N], laid-out weight [N, K] -> [M, K].

    With ``buffer`` the result is that persistent buffer (overwritten by its next use).
    """
    if layout.plan.dense and buffer is None:
        return dy.mm(weight)
    out = _result(dy.shape[0], layout, dy, buffer)
    if layout.n_kept:
        _mm_into(layout.kept(out), dy, layout.kept(weight))
    if buffer is not None:
        buffer.written()
    return out


def layout_wgrad(dy: Tensor, x: Tensor, layout: KeepLayout, buffer: GradBuffer | None = None) -> Tensor:
    """``dw̃[:, :K'] = dy^T @ x̃[:, :K']``, exact zeros on ``[K', K)``; dy [M, N], laid-out x [M, K] -> [N, K]."""
    if layout.plan.dense and buffer is None:
        return dy.t().mm(x)
    out = _result(dy.shape[1], layout, dy, buffer)
    if layout.n_kept:
        _mm_into(layout.kept(out), dy.t(), layout.kept(x))
    if buffer is not None:
        buffer.written()
    return out


def scatter_dgrad(dy: Tensor, weight: Tensor, layout: KeepLayout, buffer: GradBuffer | None = None) -> Tensor:
    """``dx[:, S] = dy @ w̃[:, :K']`` in the *original* column order, exact zeros on ``P``.

    For a layer whose input is not laid out (its ``x`` comes from outside: the forward gathers
    ``x[:, S]``, ``M K'`` elements, and backward returns ``dx`` in the order its producer
    expects), with the weight laid out.  With ``buffer`` only the ``|S|`` columns are written.
    """
    if layout.plan.dense and buffer is None:
        return dy.mm(weight)
    if buffer is not None:
        out = buffer.get(dy.shape[0], layout, dy)
    else:
        out = dy.new_zeros(dy.shape[0], layout.k)
    if layout.n_kept:
        out.index_copy_(1, layout.perm[: layout.n_kept], dy.mm(layout.kept(weight)))
    if buffer is not None:
        buffer.written()
    return out


# -- applying a layout to tensors that live across calls (once per plan change) -------------------


def relative_permutation(old: Tensor | None, new: Tensor) -> Tensor:
    """The permutation that takes storage laid out by ``old`` to storage laid out by ``new``.

    Storage laid out by ``p`` holds original column ``p[j]`` at position ``j`` (``None``: the
    original order).  ``t_new = t_old.index_select(dim, relative_permutation(old, new))``.
    """
    if old is None:
        return new
    inverse = torch.empty_like(old)
    inverse[old] = torch.arange(old.numel(), device=old.device)
    return inverse[new]


@torch.no_grad()
def permute_(param: Tensor, perm: Tensor, dim: int, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Reorder ``param`` along ``dim`` by ``perm`` in place, with its ``.grad`` and its optimizer state.

    Every tensor in ``optimizer.state[param]`` shaped like ``param`` (Adam's moments, SGD's
    momentum, ...) is reordered the same way, so the optimizer's elementwise update of the
    reordered parameter is the reordered update: training is unchanged up to the order of the
    reduction terms in the GEMMs.  One copy of each tensor, once per plan change.
    """
    perm = perm.to(param.device)
    targets = [param.data] + ([param.grad] if param.grad is not None else [])
    if optimizer is not None:
        targets += [v for v in optimizer.state.get(param, {}).values()
                    if isinstance(v, Tensor) and v.shape == param.shape]
    for t in targets:
        t.copy_(t.index_select(dim, perm))


def apply_paired_layout_(producer_weight: Tensor, producer_bias: Tensor | None, consumer_weight: Tensor,
                         perm: Tensor, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Lay out the dimension a producer's rows and a consumer's columns share (the paired dimension).

    ``producer_weight [I, H]`` (and ``producer_bias [I]``) are reordered along rows,
    ``consumer_weight [N, I]`` along columns, by ``perm`` (relative to their current order, see
    :func:`relative_permutation`).  With an elementwise function between them (GELU), the
    consumer's input then arrives laid out at no cost, and the composite function is unchanged:
    ``W2[:, π] σ(W1[π] x + b1[π]) = W2 σ(W1 x + b1)`` up to the order of the reduction terms.
    """
    permute_(producer_weight, perm, 0, optimizer)
    if producer_bias is not None:
        permute_(producer_bias, perm, 0, optimizer)
    permute_(consumer_weight, perm, 1, optimizer)
