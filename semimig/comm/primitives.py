"""Raw collectives on an explicit tensor-parallel group (no autograd).

Every function takes the group explicitly, addresses peers by their rank *inside* the group and
returns early when the group has one rank, so single-process runs issue no collective at all.
Inside :func:`semimig.comm.traffic.count_traffic` every call is counted (bytes, link model,
seconds); outside it the count costs one check.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from semimig.comm import traffic


def group_size(group: ProcessGroup | None) -> int:
    """Ranks in ``group`` (1 when torch.distributed is not initialised)."""
    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def group_rank(group: ProcessGroup | None) -> int:
    """This process's rank inside ``group`` (0 when torch.distributed is not initialised)."""
    if not dist.is_available() or not dist.is_initialized():
        return 0
    return dist.get_rank(group)


def collective_device(group: ProcessGroup | None) -> torch.device:
    """Where small bookkeeping tensors for collectives on ``group`` must live (CUDA for NCCL)."""
    if dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_floats(value: float, group: ProcessGroup | None) -> list[float]:
    """Every rank's ``value``, in group-rank order (one float64 all-gather)."""
    if group_size(group) == 1:
        return [float(value)]
    mine = torch.tensor([float(value)], dtype=torch.float64, device=collective_device(group))
    out = [torch.empty_like(mine) for _ in range(group_size(group))]
    dist.all_gather(out, mine, group=group)
    return [float(t) for t in out]


def _global(group: ProcessGroup | None, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def _counted(op: str, tensor: torch.Tensor, group: ProcessGroup | None, call, *, root: int | None = None,
             timed: bool = True):
    """``call()``, counted when a :func:`~semimig.comm.traffic.count_traffic` block is active."""
    counter = traffic.current()
    if counter is None:
        return call()
    role = "root" if root is not None and group_rank(group) == root else "peer"
    return counter.count(op, role, tensor.numel() * tensor.element_size(), group_size(group), call, timed=timed)


def all_reduce_(tensor: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
    """In-place sum over the group."""
    if group_size(group) > 1:
        _counted("all_reduce", tensor, group, lambda: dist.all_reduce(tensor, group=group))
    return tensor


def all_reduce_start(tensor: torch.Tensor, group: ProcessGroup | None) -> dist.Work | None:
    """Start an in-place sum over the group; :func:`wait` before reading ``tensor`` (None: nothing to wait for).

    Lets a backward overlap the ``dX`` all-reduce with its weight-gradient GEMM, as
    Colossal-AI's ``LinearWithAsyncCommunication`` does.
    """
    if group_size(group) > 1:
        return _counted("all_reduce", tensor, group, lambda: dist.all_reduce(tensor, group=group, async_op=True),
                        timed=False)
    return None


def wait(handle: dist.Work | None) -> None:
    """Complete a collective started by :func:`all_reduce_start`."""
    if handle is not None:
        handle.wait()


def broadcast_(tensor: torch.Tensor, src: int, group: ProcessGroup | None) -> torch.Tensor:
    """In-place broadcast from group rank ``src`` (tree-based in NCCL/Gloo)."""
    if group_size(group) > 1:
        _counted("broadcast", tensor, group, lambda: dist.broadcast(tensor, src=_global(group, src), group=group),
                 root=src)
    return tensor


def reduce_(tensor: torch.Tensor, dst: int, group: ProcessGroup | None) -> torch.Tensor:
    """Sum over the group into ``tensor`` on group rank ``dst``; other ranks' buffers are scratch."""
    if group_size(group) > 1:
        _counted("reduce", tensor, group, lambda: dist.reduce(tensor, dst=_global(group, dst), group=group), root=dst)
    return tensor


def send(tensor: torch.Tensor, dst: int, group: ProcessGroup | None) -> None:
    """Point-to-point send to group rank ``dst``."""
    tensor = tensor.contiguous()
    _counted("send", tensor, group, lambda: dist.send(tensor, dst=_global(group, dst), group=group))


def recv_(tensor: torch.Tensor, src: int, group: ProcessGroup | None) -> torch.Tensor:
    """Point-to-point receive from group rank ``src`` into ``tensor``."""
    _counted("recv", tensor, group, lambda: dist.recv(tensor, src=_global(group, src), group=group))
    return tensor
