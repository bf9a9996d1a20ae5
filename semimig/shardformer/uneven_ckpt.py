"""Portable checkpoints under uneven tensor-parallel shards (DESIGN §8): Colossal-AI's files, any plan.

Model files need nothing new.  An uneven shard is a Colossal-AI customised distributed tensor
(``shard_fn``/``gather_fn``, :func:`semimig.nn.uneven.presharded`), so ``ParallelModule``'s own
``state_dict`` writes the full tensor and its ``load_state_dict`` cuts this rank's slice out of a
full one: the model file is the dense model's, whatever the plan.

Optimizer files.  ``HybridParallelCheckpointIO`` gathers a state tensor (``exp_avg``, ``exp_avg_sq``;
``step`` is never sharded) of a TP-sharded parameter by finding the split dimension with
``search_tp_partition_dim`` — which asserts ``full = tp · shard`` — then all-gathering and
concatenating equal shards; it cuts one by ``split(full / tp)[tp_rank]``.  Uneven shards fail the
assertion.  :func:`install` (idempotent) replaces two methods of the class:

- ``gather_from_sharded_optimizer_state`` (save, sharded and unsharded);
- ``load_states_into_optimizer`` (load, sharded and unsharded);

and for a parameter whose shard functions are semimig's (:func:`is_semimig_shard`: defined in a
``semimig`` module) gathers with the parameter's *current* ``gather_fn`` and cuts with its
current ``shard_fn`` — read at save/load time, so a re-plan that re-attaches new functions is
followed.  Every other parameter (Colossal-AI's even ``dist_layout`` shards, its own customised
GPT-2 shards, replicated tensors) goes to Colossal-AI's code unchanged, bit for bit.  ZeRO's
flattening along the data-parallel group is done as Colossal-AI does it, before the TP gather
and after the TP cut.  Under mixed precision the states live on the fp32 masters and keep their
dtype; the masters themselves are not in Colossal-AI's checkpoints (they are rebuilt from the
model's weights on load), with or without a plan.

File order.  Colossal-AI writes a TP-sharded state as the ranks' even shards concatenated along
the split dimension.  For a plain parameter that is the full tensor.  For a packed one (GPT-2's
``c_attn`` = parts ``[Q, K, V]``, rank ``r`` holding ``[Q_r, K_r, V_r]``) it is rank-major,
``[Q_0 K_0 V_0 Q_1 K_1 V_1]``, unlike its model file (``[Q, K, V]``).  So that stock Colossal-AI
at the same ``tp`` reads our optimizer files (and we read its), the state is written in that
order: with parts ``P_i`` split into ``tp`` even chunks ``c_{i,r}`` of ``P_i / tp``,

    file = cat_r cat_i c_{i,r}        (one part: file = full tensor)

The parts are read from the current ``gather_fn`` (:func:`packed_parts`: each rank's rank number
along the split dimension, gathered; a part starts where the number drops).  If a part does not
divide by ``tp`` no even layout exists to be compatible with, and the file holds the full tensor
in true order.  Like Colossal-AI's, a packed state's order depends on ``tp``: load at the ``tp``
it was saved with (model files have no such limit).

Unreadable files.  A truncated or corrupted checkpoint file makes ``torch.load``/safetensors raise
deep inside Colossal-AI without naming the file; the readers the class uses are wrapped to raise
one :class:`~semimig.errors.ConfigError` naming the file and the reader's own first line: the
shard readers, the index file, and the optimizer's param-group file (read once more, first).
"""
from __future__ import annotations

import copy
import functools
import logging
import os
import stat
from collections import defaultdict
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

from semimig.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["install", "is_semimig_shard", "packed_parts", "to_file_order", "from_file_order", "split_dim"]

_FLAG = "semimig_uneven_ckpt"  # set on every function install() put in place (idempotence)


# --------------------------------------------------------------------------- pure parts
def is_semimig_shard(param: Any) -> bool:
    """A customised distributed tensor whose ``shard_fn`` and ``gather_fn`` are semimig's."""
    shard_fn, gather_fn = getattr(param, "shard_fn", None), getattr(param, "gather_fn", None)
    return all(callable(fn) and str(getattr(fn, "__module__", "") or "").startswith("semimig.")
               for fn in (shard_fn, gather_fn))


def split_dim(shard_shape: Sequence[int], full_shape: Sequence[int]) -> Optional[int]:
    """The one dimension along which ``shard_shape`` is smaller than ``full_shape`` (None: not split)."""
    if len(shard_shape) != len(full_shape):
        raise ConfigError(f"a shard of shape {tuple(shard_shape)} cannot come from a tensor of shape "
                          f"{tuple(full_shape)}")
    dims = [d for d, (s, f) in enumerate(zip(shard_shape, full_shape)) if s != f]
    if len(dims) > 1:
        raise ConfigError(f"a shard of shape {tuple(shard_shape)} differs from its full shape {tuple(full_shape)} "
                          "in more than one dimension")
    return dims[0] if dims else None


def _even_chunks(parts: Sequence[int], tp: int) -> Optional[List[int]]:
    """``P_i / tp`` per part, or None when a part does not divide (no even layout to match)."""
    if any(part % tp for part in parts):
        return None
    return [part // tp for part in parts]


def to_file_order(full: torch.Tensor, parts: Sequence[int], tp: int, *, dim: int) -> torch.Tensor:
    """True order ``[P_0, P_1, …]`` -> Colossal-AI's rank-major ``cat_r cat_i c_{i,r}`` (see module doc)."""
    chunks = _even_chunks(parts, tp)
    if chunks is None or len(parts) == 1:
        return full
    pieces = [torch.split(part, size, dim=dim) for part, size in zip(torch.split(full, list(parts), dim=dim), chunks)]
    return torch.cat([pieces[i][r] for r in range(tp) for i in range(len(parts))], dim=dim)


def from_file_order(saved: torch.Tensor, parts: Sequence[int], tp: int, *, dim: int) -> torch.Tensor:
    """The inverse of :func:`to_file_order`."""
    chunks = _even_chunks(parts, tp)
    if chunks is None or len(parts) == 1:
        return saved
    per_rank = [torch.split(block, chunks, dim=dim) for block in torch.split(saved, sum(chunks), dim=dim)]
    return torch.cat([per_rank[r][i] for i in range(len(parts)) for r in range(tp)], dim=dim)


def packed_parts(param: torch.Tensor, dim: int, tp_group) -> List[int]:
    """The part lengths of ``param`` along ``dim``, read from its current ``gather_fn``: the lengths it
    carries (:data:`semimig.sharding.split.PARTS`, set on every semimig shard function; no
    communication), else a collective on the TP group: every rank sends its rank number at each of
    its positions (other dimensions 1); in the gathered full order each part runs ranks ``0, 1, …``
    and the next part starts where the number drops (this needs every rank to hold at least one unit
    of every part, which the carried lengths do not)."""
    from semimig.sharding.split import PARTS

    carried = getattr(param.gather_fn, PARTS, None)
    if carried is not None:
        return list(carried)
    rank = dist.get_rank(tp_group) if dist.is_initialized() else 0
    shape = [1] * param.dim()
    shape[dim] = param.shape[dim]
    probe = torch.full(shape, float(rank), dtype=torch.float32, device=param.device)
    owners = param.gather_fn(probe).reshape(-1).tolist()
    parts, start = [], 0
    for j in range(1, len(owners)):
        if owners[j] < owners[j - 1]:
            parts.append(j - start)
            start = j
    parts.append(len(owners) - start)
    return parts


def _our_split_dim(param: torch.Tensor, original_shape) -> Optional[int]:
    """The split dimension of one of semimig's shards; None for every other parameter (Colossal-AI's).

    Read from the shard functions where they carry it (:data:`semimig.sharding.split.SPLIT_DIM`): a rank
    holding every unit of a plan has a shard of the full shape, and its peers (holding none) still
    gather, so it must take the same path as they do."""
    from semimig.sharding.split import SPLIT_DIM

    if not is_semimig_shard(param):
        return None
    carried = getattr(param.gather_fn, SPLIT_DIM, None)
    if carried is not None:
        return carried % param.dim()
    return split_dim(param.shape, original_shape)


# --------------------------------------------------------------------------- gather (save)
def _gather_state(original: Callable, state, param: torch.Tensor, original_shape, dp_group, tp_group, use_zero: bool,
                  inplace: bool, device: torch.device = torch.device("cpu"),
                  pinned_state_dicts: Optional[Dict[str, torch.Tensor]] = None):
    """Colossal-AI's ``gather_from_sharded_optimizer_state``, by ``param.gather_fn`` for semimig's shards."""
    dim = _our_split_dim(param, original_shape)
    if dim is None:
        return original(state, param, original_shape=original_shape, dp_group=dp_group, tp_group=tp_group,
                        use_zero=use_zero, inplace=inplace, device=device, pinned_state_dicts=pinned_state_dicts)
    from colossalai.utils import get_current_device

    tp = dist.get_world_size(tp_group)
    parts = packed_parts(param, dim, tp_group)
    state_ = state if inplace else copy.deepcopy(state)
    for key, value in state_.items():
        if not isinstance(value, torch.Tensor) or key == "step":
            continue
        if use_zero:  # Colossal-AI's own ZeRO gather: flat dp shards -> this TP rank's shard
            dp_size = dist.get_world_size(dp_group)
            value = value.to(get_current_device())
            gathered = [torch.zeros_like(value) for _ in range(dp_size)]
            dist.all_gather(gathered, value, group=dp_group)
            value = torch.stack(gathered).view(-1)[: param.numel()].reshape_as(param)
        full = to_file_order(param.gather_fn(value), parts, tp, dim=dim)
        if pinned_state_dicts is not None:
            if key not in pinned_state_dicts:
                pinned_state_dicts[key] = torch.empty_like(full, pin_memory=True, device="cpu")
            pinned_state_dicts[key].copy_(full)
            state_[key] = pinned_state_dicts[key]
        else:
            state_[key] = full.detach().clone().to(device)
    return state_


# --------------------------------------------------------------------------- cut (load)
def _cut_state(io, state: dict, param_id: int, working: torch.Tensor, original_shape, dim: int, device,
               dtype) -> dict:
    """This rank's part of a full (file-order) state of ``working``, cut by its current ``shard_fn``."""
    parts = packed_parts(working, dim, io.tp_group)
    for key, value in state.items():
        if not isinstance(value, torch.Tensor) or key == "step":
            continue
        if tuple(value.shape) != tuple(original_shape):
            raise ConfigError(f"optimizer checkpoint: state {key!r} of parameter {param_id} has shape "
                              f"{tuple(value.shape)}, the model's full parameter is {tuple(original_shape)}")
        value = working.shard_fn(from_file_order(value, parts, io.tp_size, dim=dim))
        if io.use_zero:  # Colossal-AI's own ZeRO split of this TP rank's shard along the dp group
            size = io.global_dp_size
            with torch.no_grad():
                value = value.flatten()
                padding = (size - value.numel() % size) % size
                if padding > 0:
                    value = torch.nn.functional.pad(value, [0, padding])
                value = value.split(value.numel() // size, dim=0)[io.dp_rank]
        state[key] = value.detach().clone().to(device=device, dtype=dtype)
    return state


def _load_states(original: Callable, io, optimizer, state_dict: dict, id_map: dict) -> None:
    """Colossal-AI's ``load_states_into_optimizer``; semimig's shards are cut by :func:`_cut_state`."""
    state_dict = {int(k): v for k, v in state_dict.items()}
    master_to_working = optimizer.get_master_to_working_map()
    ours, theirs = {}, {}
    for param_id, state in state_dict.items():
        param = id_map.get(param_id)
        dim = None
        if param is not None:
            working = param if master_to_working is None else master_to_working[id(param)]
            dim = _our_split_dim(working, optimizer.param_info["param2shape"][id(working)])
        if dim is None:
            theirs[param_id] = state
        else:
            ours[param_id] = (state, working, dim)
    if theirs:
        original(io, optimizer, theirs, id_map)
    new_states: Dict[torch.Tensor, dict] = defaultdict(dict)
    for param_id, (state, working, dim) in ours.items():
        param = id_map[param_id]
        original_shape = optimizer.param_info["param2shape"][id(working)]
        new_states[param] = _cut_state(io, state, param_id, working, original_shape, dim, param.device, param.dtype)
    optimizer.optim.state.update(new_states)


# --------------------------------------------------------------------------- unreadable files
def _named_reader(reader: Callable) -> Callable:
    @functools.wraps(reader)
    def read(path, *args: Any, **kwargs: Any):
        try:
            mode = os.stat(path).st_mode if isinstance(path, (str, os.PathLike)) else None
        except (OSError, ValueError):
            mode = None  # missing or unnamed: the reader's own error is named below
        if mode is not None and not stat.S_ISREG(mode):  # a FIFO would block the reader forever
            raise ConfigError(f"checkpoint file {str(path)!r} is not a regular file (a directory, FIFO or device)")
        try:
            return reader(path, *args, **kwargs)
        except Exception as err:  # torch.load / safetensors / pickle: name the file in one line
            first = (str(err).strip().splitlines() or [""])[0].split(". ")[0][:200]
            raise ConfigError(f"checkpoint file {str(path)!r} cannot be read (truncated or corrupted?): "
                              f"{type(err).__name__}: {first}") from None

    setattr(read, _FLAG, True)
    return read


def _named_index_file(index_cls: type) -> type:
    """``CheckpointIndexFile`` whose ``from_file`` names an unreadable index (a JSON error otherwise)."""
    if getattr(index_cls, _FLAG, False):
        return index_cls
    read = _named_reader(index_cls.from_file)
    return type(index_cls.__name__, (index_cls,), {"from_file": staticmethod(read), _FLAG: True,
                                                   "__module__": __name__})


def _group_file_checked(load_sharded_optimizer: Callable) -> Callable:
    """Read the optimizer's param-group file first (Colossal-AI reads it with a bare ``torch.load``)."""
    @functools.wraps(load_sharded_optimizer)
    def load(self, optimizer, checkpoint_index_file, *args: Any, **kwargs: Any):
        from colossalai.checkpoint_io import hybrid_parallel_checkpoint_io as hpcio

        group_file = hpcio.CheckpointIndexFile.from_file(checkpoint_index_file).get_param_group_filename()
        if group_file is not None:
            _named_reader(torch.load)(group_file)  # as Colossal-AI reads it: any error named here
        return load_sharded_optimizer(self, optimizer, checkpoint_index_file, *args, **kwargs)

    setattr(load, _FLAG, True)
    return load


# --------------------------------------------------------------------------- install
def install() -> None:
    """Put the methods and readers above into Colossal-AI's ``HybridParallelCheckpointIO`` (idempotent).

    Parameters that are not semimig's shards take Colossal-AI's code unchanged."""
    from colossalai.checkpoint_io import hybrid_parallel_checkpoint_io as hpcio

    cls = hpcio.HybridParallelCheckpointIO
    if getattr(cls.__dict__["load_states_into_optimizer"], _FLAG, False):
        return
    gather_original = cls.gather_from_sharded_optimizer_state  # a staticmethod: the plain function
    load_original = cls.load_states_into_optimizer

    @functools.wraps(gather_original)
    def gather_from_sharded_optimizer_state(state, param, original_shape, dp_group, tp_group, use_zero, inplace,
                                            device=torch.device("cpu"), pinned_state_dicts=None):
        return _gather_state(gather_original, state, param, original_shape, dp_group, tp_group, use_zero, inplace,
                             device=device, pinned_state_dicts=pinned_state_dicts)

    @functools.wraps(load_original)
    def load_states_into_optimizer(self, optimizer, state_dict: dict, id_map: dict):
        return _load_states(load_original, self, optimizer, state_dict, id_map)

    for fn in (gather_from_sharded_optimizer_state, load_states_into_optimizer):
        setattr(fn, _FLAG, True)
    cls.gather_from_sharded_optimizer_state = staticmethod(gather_from_sharded_optimizer_state)
    cls.load_states_into_optimizer = load_states_into_optimizer
    for name in ("load_shard_state_dict", "load_state_dict", "load_flat"):
        reader = getattr(hpcio, name)
        if not getattr(reader, _FLAG, False):
            setattr(hpcio, name, _named_reader(reader))
    hpcio.CheckpointIndexFile = _named_index_file(hpcio.CheckpointIndexFile)
    cls.load_sharded_optimizer = _group_file_checked(cls.load_sharded_optimizer)
    logger.debug("semimig: HybridParallelCheckpointIO saves/loads semimig's uneven shards by their shard functions")
