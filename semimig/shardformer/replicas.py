"""A shard plan per data-parallel replica (DESIGN §8), exact: :func:`apply_replica_plans`.

Each replica's TP group may hold its own :class:`~semimig.shardformer.UnevenPlan` (replica 0 even,
replica 1 at 3:1, …).  Then the ranks of one DP group (one per replica at one TP position) hold
different columns of the paired parameters, and the data-parallel all-reduce, which adds the
gradients element by element, would add unrelated columns (or, as torch DDP does, refuse the shapes).
So, while the replicas' plans differ:

- torch DDP (HybridParallelPlugin's data parallelism at ``zero_stage=0``) leaves the paired
  parameters out (``parameters_to_ignore``, its reducer rebuilt on every rank at once: the reducer's
  first-iteration bucket sync is a collective over the DP group) and keeps all-reducing the
  replicated ones (norms, embeddings, the row layers' biases) exactly as Colossal-AI does;
- the paired parameters' gradients are reduced in unit coordinates
  (:func:`semimig.sharding.exchange.reduction_plan`, carried out by
  :func:`semimig.shardformer.crosslayout.reduce_across_layouts` over the world): every holder of a
  column ends with the replicas' mean of that column's gradient, the global-batch mean, as the DP
  all-reduce gives it.  It overlaps the backward as DDP's buckets do, one bucket per TP layer
  (:mod:`semimig.shardformer.layer_buckets`): in every backward that DDP would synchronise, a layer's
  sends and receives are posted from its paired parameters' post-accumulate hooks once their gradients
  are accumulated, and an autograd callback queued by the first of those hooks posts any layer left
  (a parameter unused in this backward), waits for them all and sums, before the optimizer's gradient
  clipping and step (inside ``no_sync`` — gradient accumulation — nothing moves).  The result is bit
  for bit that of one reduction of every paired gradient at the end of the backward.

Where a plan leaves a rank idle and idle ranks skip their steps (:mod:`semimig.shardformer.skip`), an
idle rank computes no gradient and must take part in no reduction.  Replicas leaving the same TP
positions idle need nothing more (those positions' DP groups are idle whole).  Where the replicas' idle
ranks differ, DDP is set aside (its forward runs the module alone, its reducer is never armed) and the
cross-layout reduction covers every parameter: the paired parameters' in the same per-layer buckets,
overlapped with the backward (an idle rank holds no column of any layer: it exchanges nothing in any
bucket, and no bucket waits for it), then, in the end-of-backward callback, the vocabulary's rows as
one more plan (each replica's rows per rank) and the replicated parameters (norms), whose gradient
every holder of a replica holds alike, summed between the replicas' first holders in replica order,
over ``D``, each first holder then sending the means to its replica's other holders.  Those two run
whole: the replicated parameters' sum is one flat tensor of every norm's gradient, complete only when
the backward is.  The callback's wait is timed on the step clock as DDP's would be.

When every replica holds the same plan nothing of this is installed and DDP is Colossal-AI's, bit
for bit.  ZeRO-1/2 cut the gradients into flat DP buckets of equal shapes: a plan per replica is
refused there by name (``zero_stage``).  Checkpoints need nothing more: each replica's layers gather
their full tensors by their own plan (:mod:`semimig.shardformer.uneven_ckpt`), and the replicas hold
the same values.
"""
from __future__ import annotations

import logging
import math
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

from semimig.comm import primitives as P
from semimig.errors import ConfigError
from semimig.sharding.exchange import ReductionPlan, even_allreduce_columns, reduction_plan
from semimig.sharding.plan import ShardPlan
from semimig.shardformer.carriers import optimizer_parts
from semimig.shardformer.crosslayout import reduce_across_layouts
from semimig.shardformer.layer_buckets import LayerBuckets

logger = logging.getLogger(__name__)

__all__ = ["ReplicaReduction", "after_release", "apply_replica_plans", "replica_reduction"]

_ATTR = "_semimig_replica_reduction"


def _ddp(model: nn.Module) -> Optional[nn.parallel.DistributedDataParallel]:
    return next((m for m in model.modules() if isinstance(m, nn.parallel.DistributedDataParallel)), None)


class ReplicaReduction:
    """The DP gradient reduction under differing replica plans: the paired parameters', and every
    parameter's while the replicas' idle ranks differ (module docstring)."""

    def __init__(self, model: nn.Module, ddp: nn.parallel.DistributedDataParallel, plans: Sequence[Any], *,
                 replica: int, grid: Sequence[Sequence[int]], idle: Optional[Sequence[Sequence[int]]] = None) -> None:
        from semimig.shardformer.replan import _layers

        config, layers = _layers(model)
        tp = layers[0].tp
        tp_rank = dist.get_rank(layers[0].module.process_group) if tp > 1 else 0
        resolved = [p.resolve(config, tp) for p in plans]
        self.plans, self.idle = tuple(plans), None if idle is None else tuple(tuple(i) for i in idle)
        cache: dict = {}
        self.jobs: List[Tuple[ReductionPlan, List[Tuple[nn.Parameter, int]]]] = []
        self.params: List[nn.Parameter] = []
        """The paired parameters (DDP leaves them out)."""
        by_plan: dict = {}
        buckets = []  # one per layer: the overlapped reduction's
        for layer in layers:
            key = (layer.kind, len(layer.parts))
            if key not in cache:
                per_replica = [tuple(ShardPlan(units=getattr(r, layer.kind).sizes) for _ in layer.parts)
                               for r in resolved]
                cache[key] = reduction_plan(per_replica)
                by_plan[key] = []
            buckets.append((cache[key], [(param, dim) for _, param, dim in layer.params()]))
            for _, param, dim in layer.params():
                by_plan[key].append((param, dim))
                self.params.append(param)
        self.jobs = [(cache[key], by_plan[key]) for key in cache]
        self.replica, self.tp_rank, self.grid, self.ddp = replica, tp_rank, [list(r) for r in grid], ddp
        self.overlap: Optional[LayerBuckets] = LayerBuckets(buckets, replica=replica, tp_rank=tp_rank, grid=self.grid)
        """The paired parameters' per-layer buckets, posted during the backward (``None``: every job at once
        at the end of the backward, the reference the buckets are bit for bit)."""
        self.rest: list = []
        """The jobs run whole at the end of the backward while DDP is set aside: the vocabulary's rows."""
        self.replicated: List[nn.Parameter] = []
        self.replicated_plan: Optional[ReductionPlan] = None
        self.shares: List[int] = []  # global ranks the first holder of this replica sends the replicated means to
        if self.idle is not None:
            self._cover_the_rest(model, tp)
        self.bytes_sent = self.bytes_received = 0
        self.reductions = 0
        self._queued = False
        hooked = list(model.parameters()) if self.idle is not None else self.params
        self._handles = [p.register_post_accumulate_grad_hook(self._ready) for p in hooked if p.requires_grad]

    def _cover_the_rest(self, model: nn.Module, tp: int) -> None:
        """While the replicas' idle ranks differ (DDP set aside): the vocabulary's rows join the reduction as
        one more plan (each replica's rows per rank, :func:`~semimig.shardformer.skip.vocab_layout`), and the
        replicated parameters are reduced between the replicas' first holders, each then sending the means
        to its replica's other holders."""
        from semimig.shardformer import skip

        rows = skip.vocab_rows(model)
        vocab = reduction_plan([(ShardPlan(units=skip.vocab_layout(rows, idle, tp)),) for idle in self.idle])
        self.rest = [(vocab, [(weight, 0) for weight in skip.vocab_parameters(model)])]
        self.jobs.extend(self.rest)
        roots = [next(t for t in range(tp) if t not in idle) for idle in self.idle]
        self.root = roots[self.replica]
        self.replicated = [p for p in skip.replicated_parameters(model) if p.requires_grad]
        width = sum(p.numel() for p in self.replicated)
        if not width:
            return
        self.replicated_plan = reduction_plan([(ShardPlan(units=tuple(width if t == root else 0 for t in range(tp))),)
                                               for root in roots])
        if self.tp_rank == self.root:
            self.shares = [self.grid[self.replica][t] for t in range(tp)
                           if t != self.root and t not in self.idle[self.replica]]

    def _ready(self, param: torch.Tensor) -> None:
        if not self.ddp.require_backward_grad_sync:
            return
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.reduce)
        if self.overlap is not None:
            self.overlap.ready(param)

    def reduce(self) -> None:
        """Finish the reduction of the gradients now (collective over the grid; the autograd callback): post
        the buckets not yet posted, wait for every one and sum; with DDP set aside, then the vocabulary's
        rows and the replicated parameters, all of it timed as the step clock's ``"comm"`` and ``"dp"``, as
        DDP's hook times its own (:mod:`semimig.straggler.ddp_wait`): the re-shard policy tells a replica's
        own step from it.
        With DDP in place the callback runs before DDP's finalize, inside the wait semimig's DDP hook times
        (its last bucket, posted before the backward ends, opens it), and its own waits are in the comm region."""
        clock = None
        if self.idle is not None:
            from semimig.straggler import ddp_wait

            hook = ddp_wait.hook_state(self.ddp)
            clock = None if hook is None else hook.clock
        if clock is None:
            self._reduce()
            return
        clock.start("comm")
        clock.start("dp")
        try:
            self._reduce()
        finally:
            clock.stop("dp")
            clock.stop("comm")

    def _reduce(self) -> None:
        self._queued = False
        sent = received = 0
        if self.overlap is not None:
            sent, received = self.overlap.finish()
        if self.overlap is None or self.idle is not None:
            rest = self._reduce_whole(self.rest if self.overlap is not None else self.jobs)
            sent, received = sent + rest[0], received + rest[1]
        self.bytes_sent, self.bytes_received = self.bytes_sent + sent, self.bytes_received + received
        self.reductions += 1

    def _reduce_whole(self, whole: Sequence[Tuple[ReductionPlan, List[Tuple[nn.Parameter, int]]]]) -> Tuple[int, int]:
        """``whole`` (and the replicated parameters, DDP set aside) reduced at once."""
        jobs = []
        for plan, params in whole:
            tensors = []
            for param, dim in params:
                if param.grad is None:  # unused in this backward: its gradient is zero on this rank
                    param.grad = torch.zeros_like(param)
                tensors.append((param.grad, dim))
            jobs.append((plan, tensors))
        flat = None
        if self.replicated_plan is not None:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.replicated]
            flat = torch.cat([g.reshape(-1) for g in grads]) if self.tp_rank == self.root else None
            jobs.append((self.replicated_plan, [] if flat is None else [(flat, 0)]))
        sent, received = reduce_across_layouts(jobs, replica=self.replica, tp_rank=self.tp_rank, grid=self.grid)
        if self.replicated_plan is not None:
            shared = self._share(flat, grads)
            sent, received = sent + shared[0], received + shared[1]
        return sent, received

    def _share(self, flat: Optional[torch.Tensor], grads: List[torch.Tensor]) -> Tuple[int, int]:
        """The replicated parameters' means from this replica's first holder to its other holders, into
        every holder's gradients."""
        if flat is None:  # a holder other than the first: receives the means
            flat = torch.empty(sum(g.numel() for g in grads), dtype=grads[0].dtype, device=grads[0].device)
            moved = P.swap_packed({}, {self.grid[self.replica][self.root]: [flat]}, timed=True)
        else:
            moved = P.swap_packed({peer: [flat] for peer in self.shares}, {}, timed=True)
        offset = 0
        for param, grad in zip(self.replicated, grads):
            grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
            param.grad = grad
            offset += grad.numel()
        return moved

    def ratio_to_even(self) -> float:
        """Bytes of this reduction over the even layout's DP all-reduce of the same parameters (all ranks)."""
        moved = even = 0.0
        for plan, params in self.jobs:
            for param, dim in params:
                others = math.prod(n for i, n in enumerate(param.shape) if i != dim)  # the same on every rank
                moved += plan.total_columns() * others
                even += even_allreduce_columns(plan.plans[0], plan.replicas) * others
        return moved / even if even else 1.0

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def replica_reduction(model: nn.Module) -> Optional[ReplicaReduction]:
    """The cross-layout reduction installed on ``model`` (``None`` while every replica holds one plan)."""
    return getattr(model, _ATTR, None)


def _rebuild_ignoring(ddp: nn.parallel.DistributedDataParallel, params: Sequence[nn.Parameter]) -> None:
    """DDP's reducer rebuilt with ``params`` left out (added to, or restored from, its original ignore set)."""
    from semimig.shardformer.replan import _rebuild_ddp

    base = ddp.__dict__.setdefault("_semimig_ignore_base", set(ddp.parameters_to_ignore))
    wanted = {id(p) for p in params}
    names = {name for name, p in ddp.module.named_parameters() if id(p) in wanted}
    ddp.parameters_to_ignore = set(base) | names
    _rebuild_ddp(ddp)


def _grid(replica: int, tp_rank: int, replicas: int, tp: int) -> List[List[int]]:
    """``grid[d][t]``: the global rank of replica ``d``'s TP rank ``t`` (one all-gather over the world)."""
    world = dist.get_world_size()
    if world != replicas * tp:
        raise ConfigError(f"a plan per replica needs the world to be tp x dp ({tp} x {replicas}), got {world} ranks "
                          "(pipeline stages plan each for itself)")
    every: list = [None] * world
    dist.all_gather_object(every, (replica, tp_rank))
    grid = [[-1] * tp for _ in range(replicas)]
    for rank, (d, t) in enumerate(every):
        grid[d][t] = rank
    return grid


def apply_replica_plans(model: nn.Module, optimizer: Any, plans_by_replica: Sequence[Any]):
    """Move this replica to ``plans_by_replica[d]`` (``d`` its DP rank) and set the gradient reduction
    for the replicas' plans: a collective over every rank (tp x dp), called between steps (after
    ``optimizer.step()`` and ``zero_grad()``) with the same tuple of :class:`~semimig.shardformer.UnevenPlan`
    on every rank.  Returns this rank's :class:`~semimig.shardformer.replan.MoveReport`.

    :class:`ConfigError` (on every rank) for a tuple whose length is not the DP size, a ZeRO optimizer
    with differing plans (``zero_stage``), or anything :func:`~semimig.shardformer.replan.apply_plan` refuses.
    """
    from semimig.shardformer.replan import _layers, apply_plan

    plans = tuple(plans_by_replica)
    ddp = _ddp(model)
    replicas = dist.get_world_size(ddp.process_group) if ddp is not None else None
    _, layers = _layers(model)
    if replicas is None:  # ZeRO (no DDP): its own DP group
        from semimig.shardformer.replan import _replica_group

        group = _replica_group(model, optimizer_parts(optimizer)[2], layers)
        replicas = dist.get_world_size(group) if group is not None else 1
        replica = dist.get_rank(group) if group is not None else 0
    else:
        replica = dist.get_rank(ddp.process_group)
    if len(plans) != replicas:
        raise ConfigError(f"plans_by_replica must hold one plan per data-parallel replica ({replicas}), got "
                          f"{len(plans)}")
    report = apply_plan(model, optimizer, plans[replica], replica_plans=plans)
    _set_reduction(model, ddp, plans, replica, replicas)
    return report


def _set_reduction(model: nn.Module, ddp: Optional[nn.parallel.DistributedDataParallel], plans: Sequence[Any],
                   replica: int, replicas: int) -> None:
    """The DP gradient reduction for the replicas' ``plans`` now in force (module docstring), on every rank."""
    from semimig.shardformer import skip
    from semimig.shardformer.replan import _layers

    old = replica_reduction(model)
    if old is not None:
        old.close()
        model.__dict__.pop(_ATTR, None)
    config, layers = _layers(model)
    tp = layers[0].tp
    idle = skip.replica_idle(model, [p.resolve(config, tp) for p in plans], tp)
    aside = idle is not None and len(set(idle)) > 1  # an idle rank's DP group holds a rank that is not idle
    if ddp is not None:
        _set_aside(ddp, aside)
    differ = len({str(p) for p in plans}) > 1
    if ddp is None or (not differ and old is None):
        return  # one plan everywhere and nothing installed: Colossal-AI's own DP all-reduce, untouched
    if not differ:
        _rebuild_ignoring(ddp, [])
        logger.info("replica plans: every replica holds %s; the DP all-reduce covers every parameter again", plans[0])
        return
    tp_rank = dist.get_rank(layers[0].module.process_group) if tp > 1 else 0
    reduction = ReplicaReduction(model, ddp, plans, replica=replica, grid=_grid(replica, tp_rank, replicas, tp),
                                 idle=idle if aside else None)
    _rebuild_ignoring(ddp, reduction.params)  # set aside, it keeps the others, unreduced: it may not hold none
    model.__dict__[_ATTR] = reduction
    logger.info("replica plans %s: %s gradients are reduced across layouts (%.2fx the even DP all-reduce's "
                "bytes)%s", [str(p) for p in plans], "every parameter's" if aside else "the paired parameters'",
                reduction.ratio_to_even(), f"; idle ranks {list(idle)} skip, DDP set aside" if aside else "")


def _set_aside(ddp: nn.parallel.DistributedDataParallel, aside: bool) -> None:
    """DDP's forward runs its module alone (``aside``): no buffer broadcast, and its reducer, never prepared
    for a backward, ignores its autograd hooks; or DDP's own forward again."""
    if aside:
        module = ddp.module
        ddp.forward = lambda *args, **kwargs: module(*args, **kwargs)
    else:
        ddp.__dict__.pop("forward", None)


def after_release(model: nn.Module) -> None:
    """No rank skips any more (:func:`semimig.shardformer.skip.release`): the reduction again for the replicas'
    plans alone, DDP's forward its own (a collective over every rank)."""
    reduction = replica_reduction(model)
    if reduction is not None and reduction.idle is not None:
        _set_reduction(model, reduction.ddp, reduction.plans, reduction.replica, len(reduction.plans))
