"""The span between the two layers of a paired MLP or attention, marked for the busy meter (DESIGN §3a).

The span (the attention core, the activation) is shardable work the pair's GEMMs do not time: the
meter's ``paired_gap_s`` (:mod:`semimig.straggler.busy`) counts it from the moment a column forward or a
row backward ends (:func:`mark_gap` opening) to the moment a row forward or a column backward starts
(closing).  A collective that runs inside it is no pair's own work and drops it (:func:`drop_pair_span`,
or in backward :func:`drop_pair_span_in_backward`).  Only a meter with ``marks_spans`` (the re-sharding
policy's) is marked; other modes run no mark at all.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from semimig.nn.directive import LayerDirective

__all__ = ["drop_pair_span", "drop_pair_span_in_backward", "mark_gap", "span_mark"]


def span_mark(d: Optional[LayerDirective], name: str) -> Optional[Callable]:
    """The timer's ``open_gap`` / ``close_gap`` / ``drop_gap``, or ``None`` (no directive, no timer,
    or a timer that does not mark the span between a pair's layers: ``marks_spans`` unset)."""
    timer = getattr(d, "timer", None)
    return getattr(timer, name, None) if getattr(timer, "marks_spans", False) else None


def mark_gap(d: LayerDirective, phase: str, *, opening: bool) -> None:
    """Mark the span between a pair's layers (module docstring); timers without marks ignore it."""
    mark = span_mark(d, "open_gap" if opening else "close_gap")
    if mark is not None:
        mark(phase)


def drop_pair_span(d: Optional[LayerDirective]) -> None:
    """A collective runs now, inside the span between a pair's layers: that span is not the pair's
    own work (a column layer's ``gather_output``)."""
    drop = span_mark(d, "drop_gap")
    if drop is not None:
        drop()


class _DropSpanInBackward(torch.autograd.Function):
    """Identity; its backward drops the span in progress (the op after it in forward runs a
    collective in backward: a row layer's ``parallel_input=False`` split)."""

    @staticmethod
    def forward(ctx, x, d):
        ctx.d = d
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        drop_pair_span(ctx.d)
        return dy, None


def drop_pair_span_in_backward(x: torch.Tensor, d: Optional[LayerDirective]) -> torch.Tensor:
    """``x`` itself; in backward, the pair span in progress is dropped when this point is reached."""
    if span_mark(d, "drop_gap") is None:
        return x
    return _DropSpanInBackward.apply(x, d)
