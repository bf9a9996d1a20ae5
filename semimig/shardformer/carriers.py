"""The optimizer's view of a parameter whose shard changes shape (DESIGN §8): every tensor laid out like it.

A re-plan (:mod:`semimig.shardformer.replan`) and an idle rank's return (:mod:`semimig.shardformer.skip`)
move a parameter's slices together with everything laid out like it: the parameter, its fp32 master under
Colossal-AI's mixed precision, and every per-parameter optimizer state tensor of its shape (AdamW's
``exp_avg``, ``exp_avg_sq``; the scalar ``step`` stays).  :func:`carriers_of` lists them with how to put
each replacement in place, keeping the same ``Parameter`` and master objects (the optimizer, the booster's
wrappers and hooks keep their references).  Under ZeRO-1/2 (``LowLevelZeroOptimizer``) the master and its
state are this data-parallel rank's flat shard: :func:`zero_carriers` gathers them over the parameter's DP
group only when its layer moves (:class:`Gathered`) and cuts the new tensor again as ZeRO does
(:func:`dp_split`).  :func:`optimizer_parts` unwraps the optimizer and refuses by name what cannot be
re-sliced in process (Gemini's chunks, ZeRO without masters, with ``overlap_allgather`` or CPU offload).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

from semimig.errors import ConfigError

__all__ = ["Gathered", "Setter", "carriers_of", "dp_split", "forget_grad_accumulator", "materialise",
           "optimizer_parts", "sliced_state", "zero_carriers"]


def optimizer_parts(optimizer: Any) -> Tuple[Any, Dict[Any, Any], Optional[Any]]:
    """``(torch optimizer holding the state, working -> master map, the ZeRO optimizer or None)``;
    refuses Gemini, and the ZeRO options whose buffers are not per parameter, by name."""
    from colossalai.interface import OptimizerWrapper
    from colossalai.zero.gemini.gemini_optimizer import GeminiOptimizer
    from colossalai.zero.low_level.low_level_optim import LowLevelZeroOptimizer

    masters: Dict[Any, Any] = {}
    current = optimizer
    while current is not None:
        if isinstance(current, GeminiOptimizer):
            raise ConfigError(f"apply_plan: {type(current).__name__} (Gemini) keeps parameters and optimizer state in "
                              "chunks sized by the old plan; re-plan by checkpoint and resume (HybridParallelPlugin "
                              "with zero_stage 0, 1 or 2 re-plans in process)")
        if isinstance(current, LowLevelZeroOptimizer):
            problems = [(not current._master_weights, "master_weights=False (the masters are views of the working "
                         "parameters)"), (current._overlap_allgather, "overlap_allgather=True (pending all-gather "
                         "handles on the parameters)"), (current._cpu_offload, "cpu_offload=True")]
            for problem, why in problems:
                if problem:
                    raise ConfigError(f"apply_plan: {type(current).__name__} with {why} cannot be re-planned in "
                                      "process; re-plan by checkpoint and resume")
            return current.optim, masters, current
        masters.update(getattr(current, "working_to_master_map", None) or {})
        if isinstance(current, OptimizerWrapper):
            current = current.optim
            continue
        break
    if not isinstance(current, torch.optim.Optimizer):
        raise ConfigError(f"apply_plan: optimizer must be a torch.optim.Optimizer or a Colossal-AI wrapper of one, "
                          f"got {type(optimizer).__name__}")
    return current, masters, None


Setter = Callable[[torch.Tensor], None]


def forget_grad_accumulator(tensor: torch.Tensor) -> None:
    """Make autograd build a new gradient accumulator for ``tensor`` at its next use.

    A leaf's accumulator records the leaf's shape when it is made and lives as long as anyone holds it
    (DDP's reducer does); ``tensor.data = new`` keeps it unless the dtype or the device changes, so a new
    shape would meet the old metadata in backward.  Passing through an empty tensor of another dtype
    drops it (``VariableHooks::set_data``).  Hooks put on the old accumulator node go with it (DDP's are
    rebuilt, :func:`_rebuild_ddp`); hooks registered on the tensor itself stay."""
    other = torch.float64 if tensor.dtype != torch.float64 else torch.float32
    tensor.data = torch.empty(0, dtype=other, device=tensor.device)


def carriers_of(param: nn.Parameter, inner: torch.optim.Optimizer, masters: Dict[Any, Any]
              ) -> List[Tuple[torch.Tensor, Setter]]:
    """Every tensor laid out like ``param``'s shard, with how to put its replacement in place."""
    def data_setter(t: torch.Tensor) -> Setter:
        def put(new: torch.Tensor) -> None:
            forget_grad_accumulator(t)
            t.data = new
        return put

    def state_setter(state: dict, key: Any) -> Setter:
        def put(new: torch.Tensor) -> None:
            state[key] = new
        return put

    out: List[Tuple[torch.Tensor, Setter]] = [(param.data, data_setter(param))]
    master = masters.get(param, param)
    if master is not param:
        out.append((master.data, data_setter(master)))
    for state, key, value in sliced_state(inner, master, param.shape, "its parameter's"):
        out.append((value, state_setter(state, key)))
    return out


def sliced_state(inner: torch.optim.Optimizer, key: Any, shape: torch.Size, whose: str
                  ) -> List[Tuple[dict, Any, torch.Tensor]]:
    """``(state dict, key, tensor)`` of every per-parameter state tensor of ``key`` (the parameter or its
    master) laid out like it, ``shape``; a scalar (AdamW's ``step``) is the same for every slice and
    stays; any other shape (factored state, e.g. Adafactor's) cannot be re-sliced and is refused."""
    state = inner.state.get(key, {})
    out = []
    for name in sorted(state, key=str):
        value = state[name]
        if not torch.is_tensor(value) or value.dim() == 0:
            continue
        if value.shape != shape:
            raise ConfigError(f"apply_plan: {type(inner).__name__} state {name!r} has shape {tuple(value.shape)}, "
                              f"not {whose} {tuple(shape)} (factored state cannot be re-sliced)")
        out.append((state, name, value))
    return out


class Gathered:
    """A ZeRO carrier: the data-parallel shards of a tensor laid out like the parameter, gathered into
    the full tensor only when its layer moves (a collective over the parameter's DP group)."""

    def __init__(self, shard: torch.Tensor, param: nn.Parameter, zero: Any) -> None:
        self.shard, self.param, self.zero = shard, param, zero
        self.dtype = shard.dtype

    def get(self) -> torch.Tensor:
        store = self.zero.pid_to_bucket_store[id(self.param)]
        if store.world_size == 1:
            flat = self.shard
        else:
            parts = [torch.empty_like(self.shard) for _ in range(store.world_size)]
            dist.all_gather(parts, self.shard.contiguous(), group=store.torch_pg)
            flat = torch.cat(parts)
        return flat[:self.param.numel()].view(self.param.shape)


def dp_split(zero: Any, param: nn.Parameter, full: torch.Tensor) -> Tuple[torch.Tensor, int]:
    """``(this DP rank's shard of full, the padding)``, as LowLevelZero cuts a parameter: flattened, padded to a
    multiple of the DP size, split evenly (``_create_master_param_current_rank``)."""
    store = zero.pid_to_bucket_store[id(param)]
    padding = (store.world_size - full.numel() % store.world_size) % store.world_size
    flat = full.reshape(-1)
    if padding:
        flat = torch.nn.functional.pad(flat, [0, padding])
    return flat.split(flat.numel() // store.world_size)[store.local_rank].clone(), padding


def zero_carriers(param: nn.Parameter, inner: torch.optim.Optimizer, zero: Any) -> List[Tuple[Any, Setter]]:
    """:func:`carriers_of` under LowLevelZero (ZeRO-1/2): the working parameter is whole on every DP rank
    (padded into the buffer its all-gather writes); its fp32 master and the master's optimizer state are
    this DP rank's shard, gathered when the layer moves and cut again (:func:`dp_split`) when put.  A
    frozen parameter (``requires_grad=False``) has no master and no state: only its data moves."""
    master = zero.working_to_master_param.get(id(param))
    if master is None:
        return carriers_of(param, inner, {})

    def put_working(new: torch.Tensor) -> None:
        forget_grad_accumulator(param)
        flat = new.reshape(-1)
        padding = (-flat.numel()) % zero.pid_to_bucket_store[id(param)].world_size
        padded = torch.nn.functional.pad(flat, [0, padding]) if padding else flat
        param.data = padded[:flat.numel()].view(new.shape)  # shares the padded buffer, as ZeRO builds it
        zero.record_param_padding_size(param, padding)
        zero._working_param_to_padded_working_param[param] = padded

    def put_master(new: torch.Tensor) -> None:
        master.data = dp_split(zero, param, new)[0]  # the same object: param groups and state keep their key

    def put_state(state: dict, key: Any) -> Setter:
        def put(new: torch.Tensor) -> None:
            state[key] = dp_split(zero, param, new)[0]
        return put

    out: List[Tuple[Any, Setter]] = [(param.data, put_working), (Gathered(master.data, param, zero), put_master)]
    for state, key, value in sliced_state(inner, master, master.shape, "its ZeRO master shard's"):
        out.append((Gathered(value, param, zero), put_state(state, key)))
    return out


def materialise(tensor: Any) -> torch.Tensor:
    return tensor.get() if isinstance(tensor, Gathered) else tensor
