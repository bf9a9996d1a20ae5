"""The three GEMMs of semimig's 1D tensor-parallel linear layers, as ``autograd.Function``s.

Notation (DESIGN §0): this rank's weight shard ``w`` is ``[N, K]``, the input ``x`` is
``[M, K]`` after flattening leading dimensions, ``S`` the columns this rank computes itself,
``P`` the pruned ones, ``mig`` the block ``[K-L, K)`` it hands to receivers (see
:mod:`semimig.nn.directive`).  ``g`` is the tensor-parallel group.

Column layer (``x`` replicated, ``w`` split along N)::

    y              = x[:, S] @ w[:, S]^T + b            (+ receivers' parts of x[:, mig] @ w[:, mig]^T, reduced to k)
    dx             = all_reduce_g( scatter_S(dy @ w[:, S]) + receivers' dy_k @ w_k[:, S_r] )
    dw[:, S]       = dy^T @ x[:, S] ;  dw[:, P] = impute ;  dw[:, mig] = from receivers
    db             = sum(dy)

Row layer (``x`` split along K, ``w`` split along K)::

    y_partial      = x[:, S] @ w[:, S]^T  + receivers' x_k[:, S_r] @ w_k[:, S_r]^T
    y              = all_reduce_g(y_partial)            (bias added by the module, as Colossal-AI does)
    dx[:, S]       = dy @ w[:, S] ;  dx[:, P] = 0 ;     dx[:, mig] = from receivers
    dw[:, S]       = dy^T @ x[:, S] ;  dw[:, P] = impute ;  dw[:, mig] = from receivers

Paired pruning (``directive.rows`` / ``directive.compact_input``, an MLP's column → elementwise →
row pair): the row layer keeps ``S`` of its K and its input arrives compact, ``x_S = x[:, S]``::

    column:  y_S = x @ w[S, :]^T + b[S]                 [M, |S|]  (its K whole)
             dx  = all_reduce(dy_S @ w[S, :]) ;  dw[S, :] = dy_S^T @ x ;  dw[P, :] = 0 ;  db likewise
    row:     y   = all_reduce(x_S @ w[:, S]^T)
             dx_S = dy @ w[:, S]  [M, |S|] ;  dw[:, S] = dy^T @ x_S ;  dw[:, P] = impute

exact against the column layer computed densely and the row layer pruned to ``S``: the rows ``P``
feed only the row layer's pruned columns, so their outputs are never read and their gradients are
exact zeros (``dy[:, P] = 0`` through the elementwise function).  Same FLOPs as pruning every
layer's K by the same share, no gather or scatter of the activation between the two.

With no directive both reduce to Colossal-AI's computation, formulated the same way
(``F.linear`` forward, ``dy.matmul(w)`` and ``dy^T.matmul(x)`` backward) and scheduled the same
way (the column backward starts the ``dx`` all-reduce, computes ``dw`` while it runs, then
waits), so results agree bit for bit.  Under ``split_gather`` sequence parallelism (``seq_dim``)
the collectives are Colossal-AI's too: the column layer all-gathers the sequence in forward and
reduce-scatters ``dx`` in backward, the row layer reduce-scatters ``y`` and all-gathers ``dy`` (:mod:`semimig.nn.collectives`).  Pruned GEMMs go through :mod:`semimig.kernels` with one
validated keep plan per layer, rebuilt only when the keep set changes.

Busy time (DESIGN §3a).  With a directive, every piece of a rank's own work runs inside
``directive.timer.timed``: plan building, the own GEMMs with their gathers and zero-filled
scatters, imputation and the ``same`` policy's copy, the bias gradient, receivers' GEMMs for a
straggler's columns (``full_flops = 0``: work a rank does on top of its own) and the straggler's
copy of returned blocks into its gradients.  Collectives are never busy time: each runs in the
step clock's communication region (:func:`semimig.comm.primitives.time_collectives`).  The span between the
two layers of a pair (the attention core, the activation) is marked for the meter's
``paired_gap_s`` (:mod:`semimig.straggler.busy`): opened when a column forward or a row backward
ends, closed when a row forward or a column backward starts — only for a meter with
``marks_spans`` (the re-sharding policy's; :mod:`semimig.nn.spans`); other modes run no mark at all.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch.distributed import ProcessGroup

from semimig.comm import primitives as P
from semimig.comm.holders import HolderSum
from semimig.errors import ConfigError
from semimig.kernels import KeepPlan, impute_
from semimig.kernels import ops as kernel_ops
from semimig.kernels.backend import resolve_backend
from semimig.kernels.reference import compact_linear_fwd, compact_linear_wgrad, rows_linear_fwd, rows_linear_wgrad
from semimig.nn.collectives import gather_sequence, reduce_input_grad_start, reduce_output
from semimig.nn.directive import LayerDirective
from semimig.nn.spans import mark_gap


# ----------------------------------------------------------------------------- own work, timed
def _timed(d: LayerDirective, fn: Callable[[], Any], flops: int, full_flops: int) -> Any:
    if d.timer is None:
        return fn()
    return d.timer.timed(fn, flops=flops, full_flops=full_flops)


def _own_plan(d: LayerDirective, rank: int, k: int, k_own: int, device: torch.device,
              backend: str, keep: Optional[torch.Tensor] = None) -> Optional[KeepPlan]:
    """The keep plan of this rank's own GEMMs, or None when it computes all K columns densely.

    ``keep``: the step reflex's keep set (the directive's own is ``d.keep``)."""
    keep = d.keep if keep is None else keep
    if keep is None and k_own == k:
        return None
    group = 1 if backend == "torch" else None  # the torch twins gather single columns anyway
    plan = _timed(d, lambda: d.state.own_plan(keep, k, k_own, device, group), 0, 0)
    if plan.last >= k_own:
        raise ConfigError(f"keep reaches column {plan.last}, but rank {rank} computes only [0, {k_own})")
    return plan


def _own_forward(x2d, w, bias, plan: Optional[KeepPlan], backend: str, d: LayerDirective):
    """``x[:, S] @ w[:, S]^T (+ b)``; S = all columns when ``plan`` is None."""
    m, (n, k) = x2d.shape[0], w.shape
    full = 2 * m * n * k
    if plan is None:
        return _timed(d, lambda: F.linear(x2d, w, bias), full, full)
    return _timed(d, lambda: kernel_ops.fwd(backend, x2d, w, bias, plan), 2 * m * n * plan.n_kept, full)


def _own_dgrad(dy2d, w, plan: Optional[KeepPlan], backend: str, d: LayerDirective):
    """``dx[:, S] = dy @ w[:, S]``, exact zeros elsewhere."""
    m, (n, k) = dy2d.shape[0], w.shape
    full = 2 * m * n * k
    if plan is None:
        return _timed(d, lambda: dy2d.matmul(w), full, full)
    return _timed(d, lambda: kernel_ops.dgrad(backend, dy2d, w, plan), 2 * m * n * plan.n_kept, full)


def _own_wgrad(dy2d, x2d, plan: Optional[KeepPlan], backend: str, d: LayerDirective, use_bias: bool,
               pruned: bool):
    """``(dw, db)``: ``dw[:, S] = dy^T @ x[:, S]``, pruned columns imputed (zero: exact zeros), ``db = sum(dy)``.

    ``pruned``: the plan's missing columns were pruned (imputed); otherwise they are a migrating
    rank's block, which its receivers compute."""
    m, n, k = dy2d.shape[0], dy2d.shape[1], x2d.shape[1]
    full = 2 * m * n * k

    def work():
        if plan is None:
            dw = dy2d.t().matmul(x2d)
        else:
            dw = kernel_ops.wgrad(backend, dy2d, x2d, plan)
            if pruned and d.impute != "zero":  # the prefix of a migrating rank has nothing to impute
                impute_(dw, plan, d.impute, d.state.previous_wgrad)
        return dw, (dy2d.sum(dim=0) if use_bias else None)

    return _timed(d, work, full if plan is None else 2 * m * n * plan.n_kept, full)


def _remember(dw: torch.Tensor, d: LayerDirective) -> None:
    """``same`` imputes from the previous iteration's complete gradient (migrated block included)."""
    if d.impute == "same":
        d.state.previous_wgrad = _timed(d, lambda: dw.detach().clone(), 0, 0)


def _span_cols(share, rank, offset, k_total):
    """For a receiver: (columns of the local x/w block, columns in the shared tensor, width)."""
    span = share.range_of(rank)
    if span is None or span[1] == span[0]:
        return None
    base = k_total - share.count
    a, b = span
    return slice(base + a, base + b), slice(a - offset, b - offset), b - a


def _shared_weight(weight: torch.Tensor, d: LayerDirective, share, rank: int):
    """``w_k[:, mig]`` on every rank (or this receiver's slice), once per iteration."""
    n, k = weight.shape

    def make():
        block = weight.detach()[:, k - share.count:] if rank == share.straggler else None
        return d.exchange.share_block(block, share, (n, share.count), weight.dtype, weight.device)

    key = (d.iteration, share.straggler, share.count, weight._version)
    return d.state.weight_block(key, make)


def _check_directive(d: LayerDirective, group: ProcessGroup, rank: int, k: int) -> int:
    """Validate a directive against the layer and group; returns ``k_own``."""
    if d.layout is not None and d.layout.group_size != P.group_size(group):
        raise ConfigError(f"migration layout is for a group of {d.layout.group_size} ranks, "
                          f"the layer's has {P.group_size(group)}")
    if d.exchange is not None and d.migrating and d.exchange.group is not group:
        raise ConfigError("the directive's exchange runs on another process group than the layer")
    return d.own_columns(rank, k)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``[..., K] -> [M, K]``, the leading size explicit: a paired row layer whose rank keeps no
    unit gets ``K = 0``, where ``reshape(-1, 0)`` is ambiguous."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def _open_forward(ctx, d: LayerDirective, group: ProcessGroup, x, weight):
    """Both layers' forward with a directive opens alike: lineage hook, checks, the keep plan.

    Returns ``(rank, K, x2d [M, K])`` and leaves ``rank``, ``k_own``, ``plan`` and ``backend``
    on ``ctx`` for backward.  The own GEMM is left to the caller so that a straggler hands its
    migrated operands out *before* its own (slow) GEMM: receivers then compute the migrated
    block while the straggler computes the rest, instead of after it.
    """
    if d.on_forward is not None:
        d.on_forward()
    rank, k = P.group_rank(group), weight.shape[1]
    ctx.rank, ctx.k_own = rank, _check_directive(d, group, rank, k)
    ctx.backend = resolve_backend(x.device, x.dtype)
    ctx.plan = _own_plan(d, rank, k, ctx.k_own, weight.device, ctx.backend)
    ctx.pruned = d.keep is not None
    _reflex(ctx, d, k, weight.device, forward=True)
    return rank, k, _flat(x)


def _mark_paired(d: LayerDirective) -> None:
    """A paired call's opening is marked for the step reflex (its marks follow every call of the
    step); its units are the pair's for the step, so the reflex never prunes it further."""
    if d.reflex is not None:
        d.reflex.mark_call()


def _reflex(ctx, d: LayerDirective, k: int, device: torch.device, forward: bool) -> None:
    """A call asks the step reflex (:mod:`semimig.controller.reflex`) whether the rank prunes from
    now on: a dense call takes its keep set (a layer whose forward ran dense so prunes its backward
    only); a pruned forward takes it where it keeps fewer columns than the plan, and its backward
    then keeps what its forward kept.  A paired row layer's call is only marked."""
    if d.compact_input:
        _mark_paired(d)
        return
    if d.reflex is None or (ctx.plan is not None and not (forward and d.keep is not None)):
        return
    keep = d.reflex.keep(None if ctx.plan is None else ctx.plan.n_kept, forward)
    if keep is not None:
        ctx.plan, ctx.pruned = _own_plan(d, ctx.rank, k, k, device, ctx.backend, keep), True


def _open_backward(ctx, d: LayerDirective, dy, x, k: int):
    """Both layers' backward with a directive opens alike: lineage read, the reflex;
    ``(dy2d [M, N], x2d [M, K])``."""
    if d.on_backward is not None:
        d.on_backward()
    _reflex(ctx, d, k, x.device, forward=False)
    return _flat(dy.contiguous()), _flat(x)


# ----------------------------------------------------------------------------- paired pruning
def _paired_rows(d: LayerDirective, n: int, device: torch.device) -> KeepPlan:
    """The validated plan of a paired column layer's output rows ``S ⊂ [0, N)`` (cached per keep set)."""
    return _timed(d, lambda: d.state.own_plan(d.rows, n, n, device, 1), 0, 0)


def _paired_column_forward(ctx, d: LayerDirective, x, weight, bias):
    """``y_S = x @ w[S, :]^T + b[S]``: only the rows ``S`` the paired row layer keeps, compact ``[M, |S|]``."""
    if d.on_forward is not None:
        d.on_forward()
    _mark_paired(d)
    (n, k), x2d = weight.shape, _flat(x)
    ctx.plan = _paired_rows(d, n, weight.device)
    rows = ctx.plan.keep.long()

    ctx.w_rows, y2d = _timed(d, lambda: rows_linear_fwd(x2d, weight, bias, rows),
                             2 * x2d.shape[0] * rows.numel() * k, 2 * x2d.shape[0] * n * k)
    mark_gap(d, "forward", opening=True)
    return y2d.reshape(*x.shape[:-1], rows.numel())


def _paired_column_backward(ctx, d: LayerDirective, dy, x, weight):
    """``dx = all_reduce(dy @ w[S, :])``; ``dw[S, :] = dy^T @ x``, ``db[S] = sum(dy)``, exact zeros on
    the other rows (their outputs fed only the row layer's pruned columns)."""
    mark_gap(d, "backward", opening=False)
    if d.on_backward is not None:
        d.on_backward()
    _mark_paired(d)
    dy2d, x2d = _flat(dy.contiguous()), _flat(x)
    (m, kept), (n, k) = dy2d.shape, weight.shape
    rows = ctx.plan.keep.long()
    dx2d = _timed(d, lambda: dy2d.matmul(ctx.w_rows), 2 * m * kept * k, 2 * m * n * k)
    dx, handle = reduce_input_grad_start(dx2d.reshape(x.shape), ctx)  # overlaps the weight gradient, as the dense layer

    def work():
        dw = rows_linear_wgrad(dy2d, x2d, rows, n)
        if not ctx.use_bias:
            return dw, None
        sums = dy2d.sum(dim=0)
        return dw, sums.new_zeros(n).index_copy_(0, rows, sums)

    dw, db = _timed(d, work, 2 * m * kept * k, 2 * m * n * k)
    _remember(dw, d)
    ctx.w_rows = None
    P.wait(handle)
    return dx, dw, db, None, None


def _paired_row_forward(ctx, d: LayerDirective, x2d, weight) -> torch.Tensor:
    """``y_partial = x_S @ w[:, S]^T`` for a compact input ``x_S [M, |S|]`` (no gather of ``x``)."""
    plan = ctx.plan
    if plan is None or x2d.shape[1] != plan.n_kept:
        raise ConfigError(f"a paired row layer's input must hold its {0 if plan is None else plan.n_kept} kept "
                          f"columns, got width {x2d.shape[1]}")
    (n, k), m = weight.shape, x2d.shape[0]

    ctx.w_kept, y2d = _timed(d, lambda: compact_linear_fwd(x2d, weight, plan), 2 * m * n * plan.n_kept, 2 * m * n * k)
    return y2d


def _paired_row_backward(ctx, d: LayerDirective, dy2d, x2d, weight):
    """``dx_S = dy @ w[:, S]`` (compact, as the input was); ``dw[:, S] = dy^T @ x_S``, ``P`` imputed."""
    plan, (m, n), k = ctx.plan, dy2d.shape, weight.shape[1]
    dx2d = _timed(d, lambda: dy2d.matmul(ctx.w_kept), 2 * m * n * plan.n_kept, 2 * m * n * k)

    def work():
        dw = compact_linear_wgrad(dy2d, x2d, plan)
        if d.impute != "zero":
            impute_(dw, plan, d.impute, d.state.previous_wgrad)
        return dw

    dw = _timed(d, work, 2 * m * n * plan.n_kept, 2 * m * n * k)
    ctx.w_kept = None
    return dx2d, dw


# ----------------------------------------------------------------------------- column layer
class _ColumnParallelLinear(torch.autograd.Function):
    """``y = x[:, S] @ w[:, S]^T + b``; backward ``dx = all_reduce(dy @ w[:, S])``, ``dw[:, S] = dy^T @ x[:, S]``."""

    @staticmethod
    def forward(ctx, x, weight, bias, group: ProcessGroup, d: Optional[LayerDirective], seq_dim: Optional[int],
                holders: Optional[HolderSum]):
        ctx.group, ctx.d, ctx.use_bias, ctx.seq_dim, ctx.holders = group, d, bias is not None, seq_dim, holders
        if seq_dim is not None:  # split_gather: the whole sequence, as Colossal-AI gathers it
            x = gather_sequence(x, seq_dim, group)
        ctx.save_for_backward(x, weight)
        if d is None:
            return F.linear(x, weight, bias)
        if d.rows is not None:
            return _paired_column_forward(ctx, d, x, weight, bias)
        rank, k, x2d = _open_forward(ctx, d, group, x, weight)
        shares = d.layout.shares if d.migrating else ()
        ctx.blocks = [_shared_weight(weight, d, share, rank) for share in shares]
        y2d = _own_forward(x2d, weight, bias, ctx.plan, ctx.backend, d)
        for share, (w_blk, off) in zip(shares, ctx.blocks):
            if rank == share.straggler:
                d.exchange.return_sum(y2d, share)
                continue
            cols = _span_cols(share, rank, off, k)
            part = None
            if cols is not None:
                xc, wc, width = cols
                part = _timed(d, lambda: x2d[:, xc].matmul(w_blk[:, wc].t()), 2 * x2d.shape[0] * weight.shape[0] * width, 0)
            if d.exchange.policy == "broadcast-reduce" or part is not None:
                d.exchange.return_sum(part if part is not None else y2d.new_zeros(y2d.shape), share)
        mark_gap(d, "forward", opening=True)
        return y2d.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        d = ctx.d
        if d is None:  # Colossal-AI's LinearWithAsyncCommunication, operation for operation
            dx = dy.matmul(weight)
            dy2d, x2d = dy.contiguous(), x.contiguous()
            if dy2d.dim() > 2:
                dy2d, x2d = _flat(dy2d), _flat(x2d)
            dx, handle = reduce_input_grad_start(dx, ctx)  # overlaps the weight gradient below
            dw = dy2d.t().matmul(x2d)
            db = dy2d.sum(dim=0) if ctx.use_bias else None
            P.wait(handle)
            return dx, dw, db, None, None, None, None
        if d.rows is not None:
            return (*_paired_column_backward(ctx, d, dy, x, weight), None, None)
        mark_gap(d, "backward", opening=False)
        rank, k = ctx.rank, weight.shape[1]
        dy2d, x2d = _open_backward(ctx, d, dy, x, k)
        shares = d.layout.shares if d.migrating else ()
        dys = [d.exchange.share_whole(dy2d, share) for share in shares]  # before the own GEMMs
        dx2d = _own_dgrad(dy2d, weight, ctx.plan, ctx.backend, d)
        m, n = dy2d.shape
        blocks = []
        for share, dy_k, (w_blk, off) in zip(shares, dys, ctx.blocks):
            cols = _span_cols(share, rank, off, k) if rank != share.straggler else None
            dx_part = None
            if cols is not None:
                xc, wc, width = cols
                dx_part = _timed(d, lambda: dy_k.matmul(w_blk[:, wc]), 2 * m * n * width, 0)
            d.exchange.merge_block(dx2d[:, k - share.count:], dx_part, share)
            blocks.append(cols)
        dx, handle = reduce_input_grad_start(dx2d.reshape(x.shape), ctx)  # dx complete: reduce it while the weight gradients run
        dw, db = _own_wgrad(dy2d, x2d, ctx.plan, ctx.backend, d, ctx.use_bias, ctx.pruned)
        for share, dy_k, cols in zip(shares, dys, blocks):
            dw_part = None
            if cols is not None:
                xc, _, width = cols
                dw_part = _timed(d, lambda: dy_k.t().matmul(x2d[:, xc]), 2 * m * n * width, 0)
            block = d.exchange.return_block(dw_part, share, (n, share.count), dw.dtype, dw.device)
            if rank == share.straggler:
                _timed(d, lambda: dw[:, k - share.count:].copy_(block), 0, 0)
        _remember(dw, d)
        P.wait(handle)
        return dx, dw, db, None, None, None, None


# ----------------------------------------------------------------------------- row layer
class _RowParallelLinear(torch.autograd.Function):
    """``y = all_reduce(x[:, S] @ w[:, S]^T)``; backward ``dx[:, S] = dy @ w[:, S]``, ``dw[:, S] = dy^T @ x[:, S]``."""

    @staticmethod
    def forward(ctx, x, weight, group: ProcessGroup, d: Optional[LayerDirective], seq_dim: Optional[int],
                holders: Optional[HolderSum]):
        ctx.group, ctx.d, ctx.seq_dim, ctx.holders = group, d, seq_dim, holders
        ctx.save_for_backward(x, weight)
        if d is None:
            return reduce_output(F.linear(x, weight), ctx)
        mark_gap(d, "forward", opening=False)
        rank, k, x2d = _open_forward(ctx, d, group, x, weight)
        shares = d.layout.shares if d.migrating else ()
        m, n = x2d.shape[0], weight.shape[0]
        ctx.blocks = []
        for share in shares:  # hand out x_k[:, mig] and w_k[:, mig] before the own GEMM
            x_send = x2d.detach()[:, k - share.count:] if rank == share.straggler else None
            x_blk, x_off = d.exchange.share_block(x_send, share, (m, share.count), x.dtype, x.device)
            ctx.blocks.append((x_blk, x_off) + _shared_weight(weight, d, share, rank))
        if d.compact_input:
            return reduce_output(_paired_row_forward(ctx, d, x2d, weight).reshape(*x.shape[:-1], weight.shape[0]), ctx)
        y2d = _own_forward(x2d, weight, None, ctx.plan, ctx.backend, d)
        for share, (x_blk, x_off, w_blk, w_off) in zip(shares, ctx.blocks):
            part = None
            if rank != share.straggler and _span_cols(share, rank, w_off, k) is not None:
                _, wc, width = _span_cols(share, rank, w_off, k)
                _, xc, _ = _span_cols(share, rank, x_off, k)
                part = _timed(d, lambda: x_blk[:, xc].matmul(w_blk[:, wc].t()), 2 * m * n * width, 0)
            d.exchange.merge_sum(y2d, part, share)
        return reduce_output(y2d.reshape(*x.shape[:-1], weight.shape[0]), ctx)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        d = ctx.d
        if ctx.seq_dim is not None:  # split_gather: the whole sequence's dy, as Colossal-AI gathers it
            dy = gather_sequence(dy, ctx.seq_dim, ctx.group)
        if d is None:  # Colossal-AI: autograd of F.linear after an identity-backward all-reduce
            dy2d, x2d = _flat(dy), _flat(x)
            return dy.matmul(weight), dy2d.t().matmul(x2d), None, None, None, None
        rank, k = ctx.rank, weight.shape[1]
        dy2d, x2d = _open_backward(ctx, d, dy, x, k)
        if d.compact_input:
            dx2d, dw = _paired_row_backward(ctx, d, dy2d, x2d, weight)
            _remember(dw, d)
            mark_gap(d, "backward", opening=True)
            return dx2d.reshape(x.shape), dw, None, None, None, None
        dx2d = _own_dgrad(dy2d, weight, ctx.plan, ctx.backend, d)
        dw, _ = _own_wgrad(dy2d, x2d, ctx.plan, ctx.backend, d, False, ctx.pruned)
        if d.migrating:
            m, n = dy2d.shape
            for share, (x_blk, x_off, w_blk, w_off) in zip(d.layout.shares, ctx.blocks):
                part = None
                if rank != share.straggler and _span_cols(share, rank, w_off, k) is not None:
                    _, wc, width = _span_cols(share, rank, w_off, k)
                    _, xc, _ = _span_cols(share, rank, x_off, k)
                    # dx_k[:, mig] ([M, L]) and dw_k[:, mig] ([N, L]) travel stacked: one return, not two
                    part = _timed(d, lambda: torch.cat([dy2d.matmul(w_blk[:, wc]), dy2d.t().matmul(x_blk[:, xc])]),
                                  4 * m * n * width, 0)
                block = d.exchange.return_block(part, share, (m + n, share.count), dw.dtype, dw.device)
                if rank == share.straggler:
                    _timed(d, lambda: (dx2d[:, k - share.count:].copy_(block[:m]), dw[:, k - share.count:].copy_(block[m:])), 0, 0)
        _remember(dw, d)
        mark_gap(d, "backward", opening=True)
        return dx2d.reshape(x.shape), dw, None, None, None, None


def column_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                           group: ProcessGroup, directive: Optional[LayerDirective] = None, *,
                           seq_dim: Optional[int] = None, holders: Optional[HolderSum] = None) -> torch.Tensor:
    """Column-parallel linear: no forward collective, ``dx`` all-reduced over ``group`` in backward.

    ``seq_dim`` (``split_gather`` sequence parallelism): ``x`` is this rank's chunk of the sequence
    along ``seq_dim``; the forward all-gathers it and the backward reduce-scatters ``dx`` back to the
    chunk, as Colossal-AI's ``linear_gather_forward_reducescatter_backward``.  ``holders``: the sum of a
    layer some rank holds no column of (:mod:`semimig.comm.holders`; without ``seq_dim`` only)."""
    return _ColumnParallelLinear.apply(x, weight, bias, group, directive, seq_dim, holders)


def row_parallel_linear(x: torch.Tensor, weight: torch.Tensor, group: ProcessGroup,
                        directive: Optional[LayerDirective] = None, *, seq_dim: Optional[int] = None,
                        holders: Optional[HolderSum] = None) -> torch.Tensor:
    """Row-parallel linear without bias: ``y`` all-reduced over ``group`` in forward, identity backward.

    ``seq_dim`` (``split_gather``): ``y`` is reduce-scattered along ``seq_dim`` instead (this rank keeps
    its chunk of the sequence) and the backward all-gathers ``dy``, as Colossal-AI's
    ``linear_reducescatter_forward_gather_backward``.  ``holders`` as :func:`column_parallel_linear`'s."""
    return _RowParallelLinear.apply(x, weight, group, directive, seq_dim, holders)
