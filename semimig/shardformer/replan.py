"""Re-plan uneven tensor-parallel shards between training steps (DESIGN §8), in process.

:func:`current_plan` reads the plan a model runs under from its layers (each semimig paired layer
keeps its shard sizes: ``shard_plans``, ``None`` for the even layout).  :func:`apply_plan` is a
collective over the tensor-parallel group (and, with data-parallel replicas, over the data-parallel
group too: the replicas move together), called by every rank between steps (after
``optimizer.step()`` and ``zero_grad()``), that moves the model to another plan:

1. every rank resolves the new plan against the model and the ranks (the TP group's, then each TP
   position's replicas) all-gather a digest (plan, resolved sizes, old sizes, what their optimizers hold): a plan that
   does not fit the model, or ranks that disagree, raise :class:`~semimig.errors.ConfigError` on
   every rank (never a hang);
2. for each paired layer whose sizes change, one layer at a time (its old and new tensors are the
   move's only extra memory), the slices of its weight (and a column layer's bias;
   each part of a packed ``[Q, K, V]``; GPT-2's ``Conv1D`` stores ``[in, out]``, so its split
   dimension is the other one) that change owner go from the old owner to the new one, once,
   by point-to-point send/receive of one byte buffer per pair of ranks (the overlap of the
   source's old interval with the destination's new one, :mod:`semimig.sharding.move`): an exact
   copy.  The same slices of the optimizer state go with them: every per-parameter state tensor
   of the parameter's shape (AdamW's ``exp_avg``, ``exp_avg_sq``; the scalar ``step`` stays) and,
   under Colossal-AI's mixed precision (``MixedPrecisionOptimizer``: bf16/fp16), the fp32 master
   parameter with its state;
3. the same ``Parameter`` (and master) objects get the new tensors (``param.data = new``, state
   dict entries replaced), so the optimizer, the booster's wrappers and hooks keep their
   references; gradients become ``None``;
4. the layers' ``shard_plans``, the attention modules' per-rank head counts and widths
   (:func:`semimig.shardformer.uneven.attention_attributes`) and the parameters' ``shard_fn`` /
   ``gather_fn`` (Colossal-AI's customised distributed tensors,
   :func:`semimig.sharding.split.packed_shard_functions`) follow the new plan, so ``state_dict`` and
   checkpoints gather the full tensors.  A layer moved back to the even
   plan gets the attributes it had under Colossal-AI's even layout back (``dist_layout`` for the
   plain layers), so the even layout stays today's, bit for bit.

A torch DDP wrapper (HybridParallelPlugin uses one even at dp=1) gets its reducer rebuilt for the
new shapes, as DDP's own ``__setstate__`` does, with semimig's own communication hook (the timed
all-reduce of :mod:`semimig.straggler.ddp_wait`) registered on it again.  Under ZeRO-1/2 (Colossal-AI's ``LowLevelZeroOptimizer``,
``HybridParallelPlugin(zero_stage=1|2)``) every working parameter is whole on each data-parallel rank
but its fp32 master and the master's optimizer state are cut per parameter into DP shards (flattened,
padded to a multiple of the DP size): for a layer that moves, those shards are all-gathered over the
parameter's DP group into full tensors laid out like the parameter, moved between the TP ranks like
everything else, and cut again for the new shape (the same master objects keep their optimizer
state's keys); the padded all-gather buffer of each working parameter and its padding are rebuilt,
and ZeRO's gradient stores are cleared (the step has consumed them).  Refused by name: a model
without semimig's paired layers (stock Colossal-AI layers: build it with ``SemiMigPolicy``), Gemini
(chunks: re-plan by checkpoint and resume), ZeRO with ``master_weights=False``, ``overlap_allgather``
or ``cpu_offload``, a DDP with a communication hook other than semimig's or DDP's own mixed precision,
optimizer state of another shape (factored).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

from semimig.comm import primitives as P
from semimig.errors import ConfigError
from semimig.shardformer.carriers import carriers_of, materialise, optimizer_parts, zero_carriers
from semimig.shardformer.plan_agreement import digest, replica_verdict, tp_verdict
from semimig.sharding.move import move_schedule
from semimig.sharding.plan import ShardPlan, kv_group_unit
from semimig.sharding.split import packed_shard_functions
from semimig.straggler import ddp_wait
from semimig.straggler.clock import Span

logger = logging.getLogger(__name__)

__all__ = ["MoveReport", "current_plan", "apply_plan"]

Plans = Tuple[ShardPlan, ...]
_DIST_ATTRS = ("dist_layout", "shard_fn", "gather_fn", "_old_detach", "_old_clone", "detach", "clone")
_EVEN_ATTRS = "_semimig_even_attrs"  # on a layer: its parameters' attributes under the even layout


@dataclass(frozen=True)
class MoveReport:
    """What one :func:`apply_plan` did on this rank.

    ``old_plan``, ``new_plan``  the plans before and after (``UnevenPlan``);
    ``bytes_sent``, ``bytes_received``  bytes this rank sent to / received from other TP ranks;
    ``seconds``  wall time of the whole call (agreement, move, bookkeeping) on this rank;
    ``tensors_moved``  tensors this rank rebuilt (weights, biases, masters, state tensors);
    ``layers_changed``  paired layers whose shard sizes changed.
    """

    old_plan: Any
    new_plan: Any
    bytes_sent: int
    bytes_received: int
    seconds: float
    tensors_moved: int
    layers_changed: int


# ----------------------------------------------------------------------------- the model's paired layers
@dataclass
class _Layer:
    name: str
    module: nn.Module
    kind: str                # "q", "kv" or "mlp": which plan of a ResolvedPlan sizes it
    parts: Tuple[int, ...]   # full columns of each packed part along the split dimension
    tp: int

    @property
    def plans(self) -> Plans:
        """The layer's current plans, one per part, in columns (unit 1)."""
        current = getattr(self.module, "shard_plans", None)
        if current is not None:
            return tuple(current)
        return tuple(ShardPlan(units=(part // self.tp,) * self.tp) for part in self.parts)

    def params(self) -> List[Tuple[str, nn.Parameter, int]]:
        """``(name, parameter, split dim)`` of the sharded parameters: weight, a column layer's bias."""
        module = self.module
        weight_dim = (0 if module.matrix_kind == "column" else 1) ^ int(module.weight_transposed)
        out = [("weight", module.weight, weight_dim)]
        if module.matrix_kind == "column" and module.bias is not None:
            out.append(("bias", module.bias, 0))
        return out


def _config(model: nn.Module) -> Any:
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "model_type", None) is not None:
            return config
    raise ConfigError(f"{type(model).__name__} has no Hugging Face config (config.model_type): semimig re-plans "
                      "Hugging Face models built with SemiMigPolicy")


def _layers(model: nn.Module) -> Tuple[Any, List[_Layer]]:
    """The model's config and paired layers; :class:`ConfigError` naming what cannot be re-planned."""
    from colossalai.shardformer.layer.parallel_module import ParallelModule

    from semimig.nn.balanced import BalancedLinearMixin
    from semimig.shardformer.policy import PLANNED
    from semimig.shardformer.uneven import model_dims

    config = _config(model)
    dims = model_dims(config)
    table = PLANNED[dims.family]
    for module in model.modules():
        if isinstance(module, nn.parallel.DistributedDataParallel) and \
                (any(not ddp_wait.is_ours(hook, state) for hook, state in getattr(module, "_comm_hooks", None) or [])
                 or getattr(module, "mixed_precision", None) is not None):
            raise ConfigError(f"apply_plan: {type(model).__name__} is wrapped in torch DDP with a communication hook "
                              "or DDP's own mixed precision, which semimig cannot rebuild for new shapes")
    found, stock = [], []
    for name, module in model.named_modules():
        kind = next((k for suffix, k in table.items() if name == suffix or name.endswith("." + suffix)), None)
        if kind is None:
            continue
        if not isinstance(module, BalancedLinearMixin):
            if isinstance(module, ParallelModule):
                stock.append(f"{name} ({type(module).__module__}.{type(module).__name__})")
            continue
        group = module.process_group
        tp = dist.get_world_size(group) if dist.is_initialized() else 1
        size = module.in_features if module.matrix_kind == "row" else module.out_features
        split_sizes = getattr(module, "split_sizes", None)
        parts = tuple(split_sizes) if split_sizes else (size,)
        found.append(_Layer(name, module, kind, parts, tp))
    if stock:
        raise ConfigError(f"apply_plan: {type(model).__name__} has Colossal-AI's own tensor-parallel layers "
                          f"({stock[0]}{' and %d more' % (len(stock) - 1) if len(stock) > 1 else ''}), which cannot "
                          "change their shards; build the model with semimig.shardformer.SemiMigPolicy")
    if not found:
        raise ConfigError(f"apply_plan: {type(model).__name__} has no semimig tensor-parallel layers for "
                          f"{', '.join(table)}; build it with semimig.shardformer.SemiMigPolicy")
    groups = {id(layer.module.process_group) for layer in found}
    if len(groups) != 1:
        raise ConfigError(f"apply_plan: the paired layers of {type(model).__name__} use {len(groups)} different "
                          "process groups; one tensor-parallel group is needed")
    return config, found


# ----------------------------------------------------------------------------- reading the plan
def _agreed_sizes(layers: List[_Layer], kind: str) -> Tuple[int, ...]:
    seen: Dict[Tuple[int, ...], str] = {}
    for layer in layers:
        if layer.kind == kind:
            for plan in layer.plans:
                seen.setdefault(plan.sizes, layer.name)
    if len(seen) != 1:
        detail = "; ".join(f"{where}: {list(sizes)}" for sizes, where in seen.items())
        raise ConfigError(f"the paired layers disagree on their shard sizes ({kind}): {detail}")
    return next(iter(seen))


def _plan_from_layers(config: Any, layers: List[_Layer], block_size: Optional[int]):
    from semimig.shardformer.uneven import DEFAULT_BLOCK_SIZE, UnevenPlan, model_dims

    dims = model_dims(config)
    q_cols, kv_cols = kv_group_unit(num_heads=dims.num_heads, num_kv_heads=dims.num_kv_heads, head_dim=dims.head_dim)
    mlp = _agreed_sizes(layers, "mlp")
    q = _agreed_sizes(layers, "q")
    kv_units = tuple(n // q_cols for n in q)
    if any(n % q_cols for n in q):
        raise ConfigError(f"the attention shard sizes {list(q)} are not whole KV groups of {q_cols} columns")
    if any(layer.kind == "kv" for layer in layers):
        kv = _agreed_sizes(layers, "kv")
        if kv != tuple(n * kv_cols for n in kv_units):
            raise ConfigError(f"the k/v shard sizes {list(kv)} do not match the q shard sizes {list(q)}")
    block = block_size if block_size is not None else DEFAULT_BLOCK_SIZE
    if any(n % block for n in mlp):
        block = math.gcd(*mlp)
    return UnevenPlan(mlp_units=tuple(n // block for n in mlp), kv_units=kv_units, block_size=block)


def current_plan(model: nn.Module, *, block_size: Optional[int] = None):
    """The :class:`~semimig.shardformer.UnevenPlan` the model's layers hold (explicit units for both
    dimensions), MLP units in blocks of ``block_size`` (default ``DEFAULT_BLOCK_SIZE``; the sizes'
    greatest common divisor when that does not divide them).  :class:`ConfigError` for a model
    without semimig's paired layers, or layers that disagree."""
    config, layers = _layers(model)
    return _plan_from_layers(config, layers, block_size)


# ----------------------------------------------------------------------------- the move
def _exchange(jobs, rank: int, group) -> Tuple[List[torch.Tensor], int, int]:
    """``jobs``: ``(schedule, [(old tensor, dim, new shape)])``.  Returns the new tensors (in job, carrier
    order), bytes sent and received.  One uint8 buffer per peer each way (pieces in schedule order, then
    carrier order: every rank derives the same order), all sends and receives posted at once."""
    new_tensors: List[torch.Tensor] = []
    outgoing: Dict[int, List[torch.Tensor]] = {}
    incoming: Dict[int, List[torch.Tensor]] = {}
    for schedule, carriers in jobs:
        fresh = [old.new_empty(shape) for old, _, shape in carriers]
        new_tensors.extend(fresh)
        for piece in schedule:
            if rank not in (piece.src, piece.dst):
                continue
            for (old, dim, _), new in zip(carriers, fresh):
                if piece.src == rank:
                    source = old.narrow(dim, piece.src_offset, piece.length)
                if piece.dst == rank:
                    target = new.narrow(dim, piece.dst_offset, piece.length)
                if not piece.crosses:
                    target.copy_(source)
                elif piece.src == rank:
                    outgoing.setdefault(piece.dst, []).append(source)
                else:
                    incoming.setdefault(piece.src, []).append(target)
    sent_bytes, recv_bytes = P.swap_packed(outgoing, incoming, group)
    return new_tensors, sent_bytes, recv_bytes


def relayout_param(param: nn.Parameter, saved: Optional[dict], parts: Sequence[int] = (), plans: Sequence[ShardPlan] = (),
                   rank: int = 0, *, dim: int = 0, group: Any = None, keys: Tuple[str, ...] = _DIST_ATTRS) -> None:
    """``param``'s distributed-tensor attributes (``keys``) for a layout: the even layout's, ``saved``, back
    when ``saved`` is given; else packed shard functions for ``plans`` over ``parts`` along ``dim``
    (:func:`~semimig.sharding.split.packed_shard_functions`), ``detach``/``clone`` hijacked as Colossal-AI
    does for its own distributed tensors, so ``state_dict`` gathers the full tensor."""
    from colossalai.tensor.d_tensor.api import _hijack_detach_and_clone_for_customized_distributed_tensor

    for key in keys:
        param.__dict__.pop(key, None)
    if saved is not None:
        param.__dict__.update(saved)
        return
    param.shard_fn, param.gather_fn = packed_shard_functions(parts, plans, rank, dim=dim, group=group)
    _hijack_detach_and_clone_for_customized_distributed_tensor(param)


def _reattach(layer: _Layer, plans: Plans, rank: int, group) -> None:
    """The parameters' distributed-tensor attributes and the layer's ``shard_plans`` for ``plans``."""
    from semimig.shardformer import uneven_norm

    module = layer.module
    even = all(plan.is_even for plan in plans)
    keys = _DIST_ATTRS + (uneven_norm.MARK,)
    saved = module.__dict__.get(_EVEN_ATTRS)
    if module.__dict__.get("shard_plans") is None and saved is None:  # leaving the even layout: remember it
        saved = {name: {k: p.__dict__[k] for k in keys if k in p.__dict__} for name, p, _ in layer.params()}
        module.__dict__[_EVEN_ATTRS] = saved
    parts = [plan.dimension for plan in plans]
    for name, param, dim in layer.params():
        back = saved[name] if even and saved is not None else None
        relayout_param(param, back, parts, plans, rank, dim=dim, group=group, keys=keys)
        if back is None:
            setattr(param, uneven_norm.MARK, True)  # counted once by the grad norm (semimig.shardformer.uneven_norm)
    module.shard_plans = None if even else plans
    if not even:
        uneven_norm.install()


def _rebuild_ddp(model: nn.Module) -> int:
    """Rebuild the reducer of every torch DDP inside ``model`` for the parameters' new shapes (its gradient
    buckets are sized at construction; HybridParallelPlugin wraps the model in DDP even at dp=1).  The
    recipe is DDP's own ``__setstate__``; the old reducer's autograd hooks go with it, and semimig's own
    communication hook (:mod:`semimig.straggler.ddp_wait`) is registered on the new one."""
    count = 0
    for ddp in model.modules():
        if not isinstance(ddp, nn.parallel.DistributedDataParallel):
            continue
        parameters, expect_sparse_gradient = ddp._build_params_for_reducer()
        mapping = ddp._build_debug_param_to_name_mapping(parameters)
        # drop the old reducer (its logger holds it too) before building the new one: it keeps the parameters'
        # gradient accumulators alive, and a new reducer would take those, with the old shapes in their metadata
        ddp.logger = None
        ddp.reducer = None
        ddp._ddp_init_helper(parameters, expect_sparse_gradient, mapping, ddp.static_graph)
        if ddp.static_graph:
            ddp.reducer._set_static_graph()
            ddp.logger._set_static_graph()
        ddp_wait.reregister(ddp)  # semimig's own communication hook, on the new reducer
        count += 1
    return count


def _set_attention(model: nn.Module, layers: List[_Layer], resolved, rank: int) -> None:
    """This rank's head counts and width on each attention module (what SemiMigPolicy sets at build)."""
    from semimig.shardformer.policy import query_layer
    from semimig.shardformer.uneven import attention_attributes

    heads, kv_heads = resolved.heads(rank)
    update = attention_attributes(resolved.dims.family, width=resolved.q.sizes[rank], heads=heads, kv_heads=kv_heads)
    query = query_layer(resolved.dims.family)  # its parent module is the attention
    modules = dict(model.named_modules())
    for layer in layers:
        if layer.name == query or layer.name.endswith("." + query):
            attention = modules[layer.name.rsplit(".", 1)[0]]
            for key, value in update.items():
                setattr(attention, key, value)


def _zero_stage(optimizer: Any) -> int:
    """The ZeRO stage of a Colossal-AI optimizer (1 or 2; 0 when it names none)."""
    current = optimizer
    while current is not None:
        stage = getattr(current, "zero_stage", None) or getattr(current, "_partition_grads", None)
        if isinstance(stage, bool):
            return 2 if stage else 1
        if isinstance(stage, int):
            return stage
        current = getattr(current, "optim", None)
    return 0


def _device(model: nn.Module) -> torch.device:
    """The device the model's parameters live on (the CPU for a model without any)."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def _replica_group(model: nn.Module, zero: Any, layers: List[_Layer]):
    """The data-parallel group whose replicas must move with this one: torch DDP's (HybridParallelPlugin
    wraps the model in it at ZeRO 0) or ZeRO's (the layers' parameters' DP group); ``None`` at dp = 1.
    Not the world: pipeline stages hold other layers, and a world may hold ranks outside the model."""
    for ddp in model.modules():
        if isinstance(ddp, nn.parallel.DistributedDataParallel) and dist.get_world_size(ddp.process_group) > 1:
            return ddp.process_group
    if zero is not None:
        for _, param, _ in layers[0].params():
            store = zero.pid_to_bucket_store.get(id(param))
            if store is not None and store.world_size > 1:
                return store.torch_pg
    return None


@torch.no_grad()
def apply_plan(model: nn.Module, optimizer: Any, new_plan: Any, *, group=None,
               replica_plans: Optional[Sequence[Any]] = None) -> MoveReport:
    """Move ``model`` (built with :class:`~semimig.shardformer.SemiMigPolicy`) and ``optimizer`` to
    ``new_plan`` (an :class:`~semimig.shardformer.UnevenPlan`): a collective over the tensor-parallel
    group (the layers' group, or ``group``, which must hold the same ranks) — and over the data-parallel
    group when there are replicas — called by every rank between steps with the same plan.  See the module docstring; returns this rank's :class:`MoveReport`.

    ``replica_plans`` (one plan per data-parallel replica, in DP rank order, the same on every rank):
    the replicas may hold different plans, ``new_plan`` being this replica's; the replicas then agree on
    the whole tuple instead of one plan (:func:`semimig.shardformer.replicas.apply_replica_plans` serves
    it and takes over the gradient reduction of the paired parameters).  Refused under ZeRO when the
    plans differ (its flat buffers need equal shapes across the DP group).
    """
    from semimig.shardformer.uneven import UnevenPlan

    span = Span(_device(model))  # the move's time on the device: its collectives run after the host issues them
    not_a_plan = None if isinstance(new_plan, UnevenPlan) else \
        f"new_plan must be a semimig.shardformer.UnevenPlan, got {type(new_plan).__name__}"
    try:
        config, layers = _layers(model)
    except ConfigError:
        if not_a_plan is not None:  # nothing to agree over: name the plan first, as before
            raise ConfigError(f"apply_plan: {not_a_plan}") from None
        raise
    from semimig.shardformer import skip

    inner, masters, zero = optimizer_parts(optimizer)
    skip.before_move(model)  # a rank that skipped its steps takes the optimizer state it lacks
    if replica_plans is None and getattr(model, "_semimig_replica_reduction", None) is not None:
        raise ConfigError("apply_plan: the replicas hold different plans (semimig.shardformer.replicas."
                          "apply_replica_plans); move them with apply_replica_plans, which keeps their gradient "
                          "reduction in step")
    layer_group = layers[0].module.process_group
    tp = layers[0].tp
    if group is None:
        group = layer_group
    elif dist.get_process_group_ranks(group) != dist.get_process_group_ranks(layer_group):
        raise ConfigError(f"apply_plan: group has ranks {dist.get_process_group_ranks(group)}, the layers' "
                          f"tensor-parallel group {dist.get_process_group_ranks(layer_group)}")
    rank = dist.get_rank(group) if tp > 1 else 0
    old_plan = _plan_from_layers(config, layers, new_plan.block_size if isinstance(new_plan, UnevenPlan) else None)
    resolved, problem = None, None
    if not_a_plan is not None:  # refused on every rank after the gather, not here alone (a hang)
        problem = not_a_plan
    else:
        try:
            resolved = new_plan.resolve(config, tp)
        except ConfigError as err:
            problem = str(err)

    carriers = {layer.name: [(name, carriers_of(p, inner, masters) if zero is None else zero_carriers(p, inner, zero))
                             for name, p, _ in layer.params()]
                for layer in layers}
    signature = digest([(n, [[c.dtype for c, _ in cs] for _, cs in v]) for n, v in carriers.items()])
    old_sizes = tuple(layer.plans[0].sizes for layer in layers)
    new_sizes = None if resolved is None else (resolved.mlp.sizes, resolved.q.sizes, resolved.kv.sizes)
    mine = (str(new_plan), new_sizes, problem, digest(old_sizes), signature)
    verdict = tp_verdict(mine, rank, tp, group)
    replicas = _replica_group(model, zero, layers)
    if replica_plans is not None:  # replicas agree on every replica's plan; their old shards may differ
        if zero is not None and len({str(p) for p in replica_plans}) > 1:
            verdict = verdict or (f"apply_plan: a plan per replica needs zero_stage=0 (got zero_stage="
                                  f"{_zero_stage(optimizer)}): ZeRO-1/2's flat gradient buckets and master shards "
                                  "need equal shapes across the data-parallel group; give every replica one plan")
        if replicas is not None:
            mine = (str(tuple(str(p) for p in replica_plans)), None, problem, "", signature)
    if replicas is not None:  # the move is a collective over the replicas too (ZeRO's gathers, DDP's rebuild)
        verdict = replica_verdict(mine, verdict, replicas)
    if verdict is not None:
        raise ConfigError(verdict)

    sizes = {"q": resolved.q.sizes, "kv": resolved.kv.sizes, "mlp": resolved.mlp.sizes}
    changed, sent, received, moved = [], 0, 0, 0
    for layer in layers:  # one layer at a time: its old and new tensors (ZeRO: gathered in full) are all it holds
        old = layer.plans
        new = tuple(ShardPlan(units=sizes[layer.kind]) for _ in layer.parts)
        if tuple(p.sizes for p in old) == tuple(p.sizes for p in new):
            continue
        changed.append((layer, new))
        schedule = move_schedule(old, new)
        width = sum(plan.sizes[rank] for plan in new)
        jobs, puts = [], []
        for (_, _, dim), (_, tensors) in zip(layer.params(), carriers.pop(layer.name)):
            job = []
            for tensor, put in tensors:
                tensor = materialise(tensor)  # ZeRO: the DP shards gathered (same order on every rank)
                shape = list(tensor.shape)
                shape[dim] = width
                job.append((tensor, dim, shape))
                puts.append(put)
            jobs.append((schedule, job))
        new_tensors, layer_sent, layer_received = _exchange(jobs, rank, group)
        for put, tensor in zip(puts, new_tensors):
            put(tensor)
        sent, received, moved = sent + layer_sent, received + layer_received, moved + len(new_tensors)
        del jobs, puts, new_tensors, tensors, tensor, job  # the old tensors and the gathered ones go now
    for layer, new in changed:
        for _, param, _ in layer.params():
            param.grad = None
            master = masters.get(param)
            if master is not None:
                master.grad = None
        _reattach(layer, new, rank, group)
    if changed and zero is not None:
        zero.zero_grad()  # the gradient stores and buckets hold the old shapes (the step has consumed them)
    if changed:
        _set_attention(model, layers, resolved, rank)
        _rebuild_ddp(model)
    skip.configure(model, resolved)  # the ranks the new plan leaves idle skip their steps (when enabled)
    seconds = span.seconds()
    report = MoveReport(old_plan=old_plan, new_plan=new_plan, bytes_sent=sent, bytes_received=received,
                        seconds=seconds, tensors_moved=moved, layers_changed=len(changed))
    logger.info("apply_plan: %s -> %s on TP rank %d: %d layer(s), %d tensor(s), sent %d B, received %d B, %.3f s",
                old_plan, new_plan, rank, len(changed), moved, sent, received, seconds)
    return report
