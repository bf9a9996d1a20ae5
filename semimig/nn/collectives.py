"""The collectives of semimig's 1D tensor-parallel layers (:mod:`semimig.nn.functional`), Colossal-AI's own.

Without sequence parallelism a row layer all-reduces its output and a column layer its input gradient,
over the TP group or, where some rank holds no column, over the holders (:mod:`semimig.comm.holders`).
Under ``split_gather`` (``seq_dim``) the column layer all-gathers the sequence in forward and
reduce-scatters ``dx`` in backward, the row layer reduce-scatters ``y`` and all-gathers ``dy``.
"""
from __future__ import annotations

import torch
from torch.distributed import ProcessGroup

from semimig.comm import primitives as P
from semimig.errors import ConfigError

__all__ = ["gather_sequence", "reduce_input_grad_start", "reduce_output", "reduce_scatter_start"]


def gather_sequence(x: torch.Tensor, dim: int, group: ProcessGroup) -> torch.Tensor:
    """Every rank's chunk of the sequence concatenated along ``dim`` (Colossal-AI's ``_gather``)."""
    x = x.contiguous()
    pieces = [torch.empty_like(x) for _ in range(P.group_size(group))]
    P.all_gather_(pieces, x, group)
    return torch.cat(pieces, dim=dim).contiguous()


def reduce_scatter_start(full: torch.Tensor, dim: int, group: ProcessGroup):
    """Start the group's sum of ``full`` keeping this rank's chunk along ``dim`` (Colossal-AI's
    reduce-scatter): ``(chunk, handle)``; :func:`P.wait` the handle before reading the chunk."""
    size = P.group_size(group)
    if full.shape[dim] % size:
        raise ConfigError(f"split_gather: the sequence dimension {dim} of size {full.shape[dim]} is not a multiple "
                          f"of the tensor-parallel size {size}")
    pieces = [piece.contiguous() for piece in torch.chunk(full, size, dim=dim)]
    out = torch.empty_like(pieces[0])
    return out, P.reduce_scatter_start(out, pieces, group)


def reduce_output(y: torch.Tensor, ctx) -> torch.Tensor:
    """A row layer's forward collective: all-reduce (over the holders when some rank holds no column,
    :mod:`semimig.comm.holders`), or reduce-scatter along the sequence (``split_gather``)."""
    if ctx.seq_dim is None:
        return P.all_reduce_(y, ctx.group) if ctx.holders is None else ctx.holders.all_reduce_(y)
    out, handle = reduce_scatter_start(y, ctx.seq_dim, ctx.group)
    P.wait(handle)
    return out


def reduce_input_grad_start(dx: torch.Tensor, ctx):
    """A column layer's backward collective on ``dx`` (shaped as the gathered input): all-reduce, or
    reduce-scatter back to this rank's sequence chunk (``split_gather``); ``(result, handle)``."""
    if ctx.seq_dim is None:
        return dx, P.all_reduce_start(dx, ctx.group) if ctx.holders is None else ctx.holders.start(dx)
    return reduce_scatter_start(dx, ctx.seq_dim, ctx.group)
