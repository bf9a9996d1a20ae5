"""A rank holding no unit of any kind takes no part in the step (DESIGN §8).

Under a plan that gives a tensor-parallel rank no MLP block and no KV group, that rank's share of every
paired layer's sum is zero (:mod:`semimig.comm.holders`).  What it still runs in a step is its
vocabulary rows' share of the embedding, the head and the loss, and its copy of what every rank
computes alike: the replicated layers (norms, a row layer's bias) and their optimizer update.  A slow
rank emptied of units so still sets a floor under the step: its own copy of that work at its own
speed, and its seat in the vocabulary's collectives.  With :func:`configure` such an *idle* rank skips
the step instead:

- the vocabulary (the embedding's and the head's rows, with their optimizer state) is split over the
  holders alone, in Colossal-AI's own even split of ``V`` rows over ``H`` ranks (``⌈V/H⌉`` each, the last
  the rest), so the embedding, the head and the vocabulary-parallel cross-entropy run Colossal-AI's code
  unchanged on the holders' own process group; the rows move like a plan's columns
  (:mod:`semimig.shardformer.replan`);
- the paired layers' holder sums send nothing to a rank that skips
  (:func:`semimig.comm.holders.set_skipping`);
- the model's forward on an idle rank runs no layer: it receives the loss the first holder computed (a
  scalar, so every rank reads the step's loss) and returns an output holding it alone, a leaf: backward
  has nothing to do and the optimizer finds no gradient, so it updates nothing;
- after every optimizer step the first holder sends the replicated parameters' new values to the idle
  ranks (:func:`after_step`), so an idle rank's model is the holders' at every step (evaluation,
  checkpoints); when it holds units again, those parameters' optimizer state comes from the first
  holder as well (:func:`configure`).

Every holder computes exactly what it computed before (the sums over the holders are the whole sums),
so the step is the same function.  With data-parallel replicas an idle rank takes no part in the
gradient reduction either: where every replica leaves the same TP positions idle, those positions' DP
groups are idle whole and DDP reduces over the others as before; where the replicas' idle ranks
differ, :mod:`semimig.shardformer.replicas` reduces every gradient across the layouts itself (the
vocabulary's rows like a plan's columns, the replicated parameters from each replica's first holder)
and DDP is set aside.  What skipping needs (:func:`blocker`): no pipeline, no ZeRO, no sequence
parallelism, no gradient clipping (its norm's all-reduce counts the replicated parameters on every
rank), and a model whose only tensor-parallel layers are semimig's paired layers and one untied
vocabulary-parallel embedding and head.  Otherwise an idle rank runs its step as before — the same
numbers, at its own pace — and one INFO line says why.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

from semimig.comm import holders as H
from semimig.comm import primitives as P
from semimig.sharding.move import move_schedule
from semimig.sharding.plan import ShardPlan
from semimig.shardformer.carriers import carriers_of, optimizer_parts

logger = logging.getLogger(__name__)

__all__ = ["SkipState", "after_step", "before_move", "blocker", "configure", "idle_ranks", "install", "release",
           "replica_idle", "replicated_parameters", "skipping_ranks", "uninstall", "vocab_layout",
           "vocab_parameters", "vocab_rows", "vocab_sizes"]

_ATTR = "_semimig_skip"  # on the boosted model: its SkipState


@dataclass
class SkipState:
    """What :func:`configure` set up on one rank: the TP ``group``, this rank's ``rank`` in it, the idle
    ranks that skip (``idle``, group ranks) and the ``holders``, the ``vocab`` rows per rank, the
    ``holder_group`` (on a holder), the shard config whose TP group the loss reads, and why skipping is
    off (``blocked``, ``None`` when it may run)."""

    model: nn.Module
    optimizer: Any
    group: Any
    rank: int
    tp: int
    shard_config: Any
    blocked: Optional[str]
    idle: Tuple[int, ...] = ()
    holders: Tuple[int, ...] = ()
    vocab: Optional[Tuple[int, ...]] = None
    holder_group: Any = None
    tp_group_of_loss: Any = None
    replicated: Tuple[nn.Parameter, ...] = ()
    """The parameters every rank holds whole (found at :func:`configure`), in the same order on every rank."""
    own_forward: Any = None
    """The model's own instance-level ``forward`` before :func:`install` wrapped it (``None``: its class's)."""
    probe: Optional[Callable[[], None]] = None
    """Run on an idle rank while it waits for the holders: how the re-shard policy reads its speed
    (:meth:`semimig.resharder.idle.IdleReader.probe`)."""

    @property
    def root(self) -> int:
        """The holder that sends the loss and the replicated parameters to the idle ranks."""
        return self.holders[0]

    @property
    def skips(self) -> bool:
        """Whether this rank skips its steps."""
        return self.rank in self.idle


# ----------------------------------------------------------------------------- pure parts
def idle_ranks(resolved: Any, tp: int) -> Tuple[int, ...]:
    """The ranks holding no MLP block, no query head and no KV group under ``resolved``."""
    return tuple(r for r in range(tp) if not (resolved.mlp.sizes[r] or resolved.q.sizes[r] or resolved.kv.sizes[r]))


def vocab_sizes(rows: int, holders: Sequence[int], tp: int) -> Tuple[int, ...]:
    """Rows of a ``rows``-row vocabulary per rank: Colossal-AI's even split (``⌈rows/H⌉`` each, the last
    holder the rest) over the ``H`` holders in rank order, none for the others."""
    if not holders:
        raise ValueError("vocab_sizes: no holder")
    delta = math.ceil(rows / len(holders))
    sizes = [0] * tp
    left = rows
    for r in holders:
        sizes[r] = min(delta, left)
        left -= sizes[r]
    return tuple(sizes)


def vocab_layout(rows: int, idle: Sequence[int], tp: int) -> Tuple[int, ...]:
    """Rows per rank of a TP group whose ranks ``idle`` skip: :func:`vocab_sizes` over the others, or
    Colossal-AI's even split when none skips."""
    if not idle:
        return (rows // tp,) * tp
    return vocab_sizes(rows, [r for r in range(tp) if r not in idle], tp)


def replica_idle(model: nn.Module, resolved: Sequence[Any], tp: int) -> Optional[Tuple[Tuple[int, ...], ...]]:
    """Per data-parallel replica, the TP ranks that skip under its resolved plan (``resolved[d]``) — what
    :func:`configure` sets on that replica's ranks — or ``None`` when no rank of ``model`` may skip."""
    state = getattr(model, _ATTR, None)
    if state is None or state.blocked is not None:
        return None
    out = []
    for plan in resolved:
        idle = idle_ranks(plan, tp)
        out.append(() if len(idle) == tp else idle)
    return tuple(out)


def vocab_rows(model: nn.Module) -> int:
    """The vocabulary's rows over the whole TP group (padded: a multiple of its size)."""
    state = getattr(model, _ATTR)
    embedding = _vocab_modules(model)[0][0]
    return embedding.weight.shape[0] * state.tp if state.vocab is None else sum(state.vocab)


def vocab_parameters(model: nn.Module) -> Tuple[nn.Parameter, nn.Parameter]:
    """The vocabulary-parallel embedding's and head's weights (their rows split like a plan's columns)."""
    embedding, head = (m[0] for m in _vocab_modules(model))
    return embedding.weight, head.weight


def replicated_parameters(model: nn.Module) -> List[nn.Parameter]:
    """The parameters every rank of a TP group holds whole, in the same order on every rank."""
    return _parts(model)[2]


def skipping_ranks(model: nn.Module) -> Tuple[int, ...]:
    """The TP ranks that skip their steps under ``model``'s current plan (none when skipping is off)."""
    state = getattr(model, _ATTR, None)
    return () if state is None else state.idle


# ----------------------------------------------------------------------------- the model's parts
def _vocab_modules(model: nn.Module) -> Tuple[List[nn.Module], List[nn.Module]]:
    from colossalai.shardformer.layer import VocabParallelEmbedding1D, VocabParallelLMHead1D

    embeddings = [m for m in model.modules() if isinstance(m, VocabParallelEmbedding1D)]
    heads = [m for m in model.modules() if isinstance(m, VocabParallelLMHead1D)]
    return embeddings, heads


def _is_sharded(param: nn.Parameter) -> bool:
    from colossalai.tensor.d_tensor import is_customized_distributed_tensor, is_distributed_tensor

    return is_distributed_tensor(param) or is_customized_distributed_tensor(param)


def _parts(model: nn.Module) -> Tuple[List[nn.Parameter], List[Tuple[nn.Parameter, nn.Parameter]], List[nn.Parameter]]:
    """``(paired layers' parameters, [(embedding weight, head weight)], replicated parameters)``."""
    from semimig.shardformer.replan import _layers

    _, layers = _layers(model)
    paired = [p for layer in layers for p in layer.module.parameters()]
    (embedding,), (head,) = _vocab_modules(model)
    seen = {id(p) for p in paired} | {id(embedding.weight), id(head.weight)}
    replicated = [p for p in model.parameters() if id(p) not in seen]
    return paired, [(embedding.weight, head.weight)], replicated


def blocker(model: nn.Module, plugin: Any, optimizer: Any) -> Optional[str]:
    """Why an idle rank cannot skip its steps in this job (``None``: it can)."""
    from semimig.shardformer.replan import _layers

    if plugin.pp_size > 1:
        return f"pp_size={plugin.pp_size} (a stage's idle rank still relays the pipeline)"
    if getattr(plugin, "zero_stage", 0):
        return f"zero_stage={plugin.zero_stage}"
    if plugin.shard_config.enable_sequence_parallelism:
        return "sequence parallelism"
    if getattr(plugin, "max_norm", 0.0):
        return f"max_norm={plugin.max_norm} (the clip norm counts the replicated parameters on every rank)"
    if not plugin.shard_config.parallel_output:
        return "parallel_output=False (the head gathers its output over the whole group)"
    try:
        config, _ = _layers(model)
        optimizer_parts(optimizer)
    except Exception as err:  # noqa: BLE001 - any refusal is a reason not to skip
        return str(err)
    if getattr(config, "model_type", None) not in ("llama", "qwen2", "mistral"):
        return f"model_type={getattr(config, 'model_type', None)!r} (skipping serves the Llama family)"
    if getattr(config, "tie_word_embeddings", False):
        return "tied word embeddings"
    embeddings, heads = _vocab_modules(model)
    if len(embeddings) != 1 or len(heads) != 1:
        return f"{len(embeddings)} vocabulary-parallel embeddings and {len(heads)} heads (one of each is served)"
    if embeddings[0].weight is heads[0].weight or heads[0].bias is not None:
        return "a head that shares its weight or has a bias"
    _, _, replicated = _parts(model)
    sharded = [p.shape for p in replicated if _is_sharded(p)]
    if sharded:
        return f"tensor-parallel parameters outside semimig's layers (shapes {sharded[:3]})"
    return None


# ----------------------------------------------------------------------------- set-up
def install(model: nn.Module, optimizer: Any, plugin: Any) -> SkipState:
    """Attach the skip state to the boosted ``model`` and wrap its forward (module docstring); idle ranks
    skip from the next :func:`configure` on."""
    group = plugin.tp_group
    state = SkipState(model=model, optimizer=optimizer, group=group, rank=P.group_rank(group),
                      tp=P.group_size(group), shard_config=plugin.shard_config,
                      blocked=blocker(model, plugin, optimizer))
    state.tp_group_of_loss = plugin.shard_config.tensor_parallel_process_group
    state.own_forward = model.__dict__.get("forward")
    setattr(model, _ATTR, state)
    original = model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not state.idle:
            return original(*args, **kwargs)
        if state.skips:
            if state.probe is not None:
                state.probe()
            return _received_loss(state)
        out = original(*args, **kwargs)
        if state.rank == state.root:
            loss = getattr(out, "loss", None)
            device = P.collective_device(state.group)  # sent where it is: no host synchronisation
            value = torch.full((1,), math.nan, device=device) if loss is None else loss.detach().float().reshape(1)
            _send(value.to(device), state)
        return out

    model.forward = forward
    return state


def _send(tensor: torch.Tensor, state: SkipState) -> None:
    payload = tensor.detach().clone(memory_format=torch.contiguous_format)
    for peer in state.idle:
        H._post(P.isend(payload, peer, state.group))


def _received_loss(state: SkipState) -> Any:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    value = torch.empty(1, device=P.collective_device(state.group))
    P.wait(P.irecv_(value, state.root, state.group))
    loss = None if math.isnan(float(value)) else value.reshape(()).requires_grad_(torch.is_grad_enabled())
    return CausalLMOutputWithPast(loss=loss)


def after_step(model: nn.Module) -> None:
    """After an optimizer step: the first holder sends the replicated parameters to the idle ranks, which
    take them (module docstring); nothing without idle ranks."""
    state = getattr(model, _ATTR, None)
    if state is None or not state.idle:
        return
    if state.skips:
        works = [P.irecv_(p.data, state.root, state.group) for p in state.replicated]
        for work in works:
            P.wait(work)
    elif state.rank == state.root:
        for p in state.replicated:
            _send(p.data, state)


def configure(model: nn.Module, resolved: Any) -> Optional[SkipState]:
    """Set the idle ranks of ``resolved`` (the plan now in force) skipping, or none: a collective over the
    TP group, called by every rank after the layers moved to that plan (module docstring).  ``None`` when
    :func:`install` was not called."""
    state = getattr(model, _ATTR, None)
    if state is None:
        return None
    idle = () if state.blocked is not None else idle_ranks(resolved, state.tp)
    if len(idle) == state.tp:
        idle = ()
    if idle == state.idle:
        return state
    holders = tuple(r for r in range(state.tp) if r not in idle)
    _prepare_groups(state, resolved, holders)
    embedding, head = (m[0] for m in _vocab_modules(model))
    rows = vocab_rows(model)
    old = state.vocab or vocab_layout(rows, (), state.tp)
    new = vocab_layout(rows, idle, state.tp)
    _move_rows(state, [embedding.weight, head.weight], old, new)
    state.idle, state.holders, state.vocab = idle, holders, (None if not idle else new)
    state.replicated = tuple(replicated_parameters(model))
    state.holder_group = H.holder_group(state.group, holders) if idle else None
    group = state.holder_group if idle else state.tp_group_of_loss
    _set_vocab(embedding, head, new, group, state, idle)
    H.set_skipping(state.group, idle)
    from semimig.shardformer.replan import _rebuild_ddp

    _rebuild_ddp(model)
    if state.rank == 0 and idle:
        logger.info("semimig: TP ranks %s skip their steps (they hold no unit); vocabulary rows %s", list(idle),
                    list(new))
    elif state.rank == 0:
        logger.info("semimig: every TP rank runs its steps again; vocabulary rows %s", list(new))
    return state


def _prepare_groups(state: SkipState, resolved: Any, holders: Tuple[int, ...]) -> None:
    """Make, on every rank at once, the holder groups the layers will use under ``resolved`` and the
    holders' own group: an idle rank runs no layer, so it would never make its part of them there."""
    sets = [H.holders_of([plan.sizes]) for plan in (resolved.mlp, resolved.q, resolved.kv)]
    for held in sets:
        if 1 < len(held) < state.tp:
            H._holder_group(state.group, held)
    if len(holders) < state.tp:
        H.holder_group(state.group, holders)


def _move_rows(state: SkipState, params: Sequence[nn.Parameter], old: Tuple[int, ...], new: Tuple[int, ...]) -> None:
    """Move the rows of ``params`` (dim 0) and of their optimizer state from the ``old`` rows per rank to ``new``."""
    from semimig.shardformer.replan import _exchange

    if old == new:
        return
    inner, masters, _ = optimizer_parts(state.optimizer)
    schedule = move_schedule([ShardPlan(units=old)], [ShardPlan(units=new)])
    for param in params:
        carriers = carriers_of(param, inner, masters)
        job = []
        for tensor, _ in carriers:
            shape = list(tensor.shape)
            shape[0] = new[state.rank]
            job.append((tensor, 0, shape))
        fresh, _, _ = _exchange([(schedule, job)], state.rank, state.group)
        for (_, put), tensor in zip(carriers, fresh):
            put(tensor)
        param.grad = None


_EVEN = "_semimig_skip_even_attrs"  # on a vocabulary parameter: its attributes under the even layout


def _set_vocab(embedding: nn.Module, head: nn.Module, sizes: Tuple[int, ...], group: Any, state: SkipState,
               idle: Tuple[int, ...]) -> None:
    """The embedding's and the head's rows ``sizes`` per rank: their index range, the group their sums run
    over, the valid rows of the head and how checkpoints gather them."""
    from semimig.shardformer.replan import _DIST_ATTRS, relayout_param

    start, size = sum(sizes[:state.rank]), sizes[state.rank]
    pad = getattr(getattr(state.model.unwrap(), "config", None), "pad_token_id", None)
    embedding.vocab_start_index, embedding.vocab_end_index = start, start + size
    embedding.num_embeddings_per_partition = size
    embedding.padding_idx = pad - start if pad is not None and start <= pad < start + size else None
    head.num_valid_embeddings_local = max(0, min(size, head.old_num_embeddings - start))
    if state.rank not in idle:
        embedding.process_group = head.process_group = group
        state.shard_config.tensor_parallel_process_group = group
    for param in (embedding.weight, head.weight):
        saved = param.__dict__.get(_EVEN)
        if saved is None:
            saved = param.__dict__[_EVEN] = {k: param.__dict__[k] for k in _DIST_ATTRS if k in param.__dict__}
        if not idle:
            del param.__dict__[_EVEN]
        relayout_param(param, None if idle else saved, [sum(sizes)], [ShardPlan(units=sizes)], state.rank, dim=0,
                       group=state.group)


def _broadcast(tensor: torch.Tensor, state: SkipState) -> None:
    device = P.collective_device(state.group)
    if tensor.device == device:
        P.broadcast_(tensor, state.root, state.group)
        return
    carried = tensor.to(device)
    P.broadcast_(carried, state.root, state.group)
    tensor.copy_(carried)


def before_move(model: nn.Module) -> None:
    """Before a move of the plan (a collective over the TP group): the ranks that skip take from the first
    holder what their optimizer holds for every parameter (module docstring); nothing while none skips."""
    state = getattr(model, _ATTR, None)
    if state is not None and state.idle:
        _state_from_root(state)


def _state_from_root(state: SkipState) -> None:
    """From the first holder to every rank of the group: the replicated parameters (and their masters)
    with their optimizer state, and every other parameter's scalar state (AdamW's ``step``); a state
    tensor laid out like a sharded parameter is made, zero, where a rank has none (a rank that skipped
    holds no row of it)."""
    inner, masters, _ = optimizer_parts(state.optimizer)
    params = list(state.model.parameters())  # the same order on every rank
    whole = {id(p) for p in state.replicated}
    layout: List[Any] = [None]
    if state.rank == state.root:
        layout = [[{k: (tuple(v.shape), v.dtype, v.device.type != "cpu")
                    for k, v in inner.state.get(masters.get(p, p), {}).items() if torch.is_tensor(v)}
                   for p in params]]
    dist.broadcast_object_list(layout, src=dist.get_global_rank(state.group, state.root), group=state.group)
    for param, entries in zip(params, layout[0]):
        key = masters.get(param, param)
        if id(param) in whole:
            _broadcast(param.data, state)
            if key is not param:
                _broadcast(key.data, state)
        if not entries:
            continue
        target = inner.state.setdefault(key, {})
        for k, (shape, dtype, on_device) in sorted(entries.items(), key=lambda kv: str(kv[0])):
            device = key.device if on_device else torch.device("cpu")
            tensor = target.get(k)
            if shape == () or id(param) in whole:
                if tensor is None or tuple(tensor.shape) != shape or tensor.dtype != dtype:
                    tensor = target[k] = torch.empty(shape, dtype=dtype, device=device)
                _broadcast(tensor, state)
            elif tensor is None:
                target[k] = torch.zeros(key.shape, dtype=dtype, device=device)


def release(model: nn.Module, resolved: Any) -> None:
    """No rank skips any more (a collective over the TP group, every rank at once — over every rank under
    per-replica plans): the vocabulary back to the even split, an idle rank's optimizer state taken from the
    first holder, the forward unwrapped."""
    state = getattr(model, _ATTR, None)
    if state is None:
        return
    from semimig.shardformer.replicas import after_release

    H.drain_sends()
    before_move(model)
    state.blocked = "released"
    configure(model, resolved)
    uninstall(model)
    after_release(model)  # replicas whose idle ranks differed: their reduction without skipping


def uninstall(model: nn.Module) -> None:
    """Take the skip state and the forward's wrapper off ``model`` (no rank may be skipping)."""
    state = getattr(model, _ATTR, None)
    if state is None:
        return
    delattr(model, _ATTR)
    model.__dict__.pop("forward", None)
    if state.own_forward is not None:
        model.forward = state.own_forward

