"""The data-parallel gradient all-reduce's wait, timed as communication on the step clock (DESIGN §3b).

Under torch DDP (HybridParallelPlugin's data parallelism at ``zero_stage=0``) the gradients are
all-reduced inside ``loss.backward()``: DDP launches one all-reduce per bucket as the bucket becomes
ready and, at the end of the backward pass, its reducer's ``finalize_backward`` waits for all of them
(on CUDA: makes the current stream wait on the collectives' work) and copies the means back into the
gradients.  A replica faster than another waits there for the slower one.  :func:`install` registers
:func:`timed_allreduce` as the DDP's communication hook, which

- reduces exactly as DDP's built-in reduction does, bit for bit: without a hook the reducer scales each
  gradient while copying it into its bucket (``at::mul_out(bucket_view, grad, 1/size)``, or, with
  ``batched_grad_copy``, one ``div_(size)`` of the flat bucket) and all-reduces the sum; with a hook the
  bucket holds the raw gradients, so the hook scales the bucket the same way (``mul_(1/size)`` or
  ``div_(size)``: the same scalar, rounded the same) and all-reduces its sum asynchronously, its future's
  value the bucket tensor;
- times the wait: at the last bucket (``bucket.is_last()``) it opens a ``"comm"`` region on the clock (and
  a ``"dp"`` one inside it, which tells this wait apart from the layers' own collectives) and
  queues an autograd final callback that itself queues a second one, which closes the region.  DDP queues
  its ``finalize_backward`` callback right after launching the last bucket's reduction, so after the
  first one; the engine runs final callbacks in the order queued, including those queued while it runs
  them, so the second runs after DDP's finalize, and the region holds the wait for every bucket (and for
  the final callbacks queued earlier in the backward: under per-replica plans, the cross-layout reduction
  of the paired gradients, :mod:`semimig.shardformer.replicas`).

On the host the region's end is the time finalize returned; on CUDA the clock's markers are events on
the current stream (the final callbacks run on the stream ``backward()`` was called on), so the region is
the time the compute stream stalled for the reductions: device time, and no host synchronisation.  The
rank's compute (``wall − comm``) is then its own work: a fast replica's wait for a slow one is
communication on every rank of the fast replica.

One hook per DDP, which torch allows once per reducer: a DDP with a hook of its own (a user's), DDP's
mixed precision or the Python reducer gets none (the wait stays in compute; one warning), nor does one
with ``gradient_as_bucket_view`` over a group whose size is not a power of two without
``batched_grad_copy`` (DDP divides a gradient that aliases its bucket and multiplies one it copies, two
roundings no one hook reproduces; for a power of two they agree).  :func:`is_ours` tells semimig's hook
from any other, :func:`reregister` puts it back on a rebuilt reducer (a re-plan,
:func:`semimig.shardformer.replan._rebuild_ddp`), and :func:`release` leaves it reducing without
timing (the balancer's ``close``).
"""
import functools
import logging
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from semimig.straggler.clock import StepClock

__all__ = ["DDPWait", "hook_state", "install", "is_ours", "release", "reregister", "timed_allreduce"]

logger = logging.getLogger(__name__)


class DDPWait:
    """The state :func:`timed_allreduce` gets: the DDP's process group, how its reducer scales, the clock.

    ``divide``: scale by ``div_(size)`` (DDP's ``batched_grad_copy``), else by ``mul_(1/size)``.
    ``clock``: the step clock the wait goes to; ``None``: reduce only."""

    def __init__(self, group: Any, *, divide: bool, clock: Optional[StepClock]) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.divide = divide
        self.clock = clock
        self.buckets = 0
        """Buckets reduced through the hook."""
        self.waits = 0
        """Waits opened on the clock (one per synchronised backward)."""


def _bucket_tensor(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()[0]


def _close(clock: StepClock) -> None:
    clock.stop("dp")
    clock.stop("comm")


def _close_after(clock: StepClock) -> None:
    """First final callback: queue the one that closes the regions (it runs after DDP's finalize)."""
    torch.autograd.Variable._execution_engine.queue_callback(functools.partial(_close, clock))


def timed_allreduce(state: DDPWait, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's reduction of ``bucket`` (the mean over the group, bit for bit DDP's own) with the wait for
    the last bucket timed as ``"comm"`` and ``"dp"`` on ``state.clock`` (module docstring)."""
    buffer = bucket.buffer()
    if state.divide:
        buffer.div_(state.size)
    else:
        buffer.mul_(1.0 / state.size)
    clock = state.clock
    last = clock is not None and bucket.is_last()
    if last:
        clock.start("comm")
        clock.start("dp")
    work = dist.all_reduce(buffer, group=state.group, async_op=True)
    if last:
        torch.autograd.Variable._execution_engine.queue_callback(functools.partial(_close_after, clock))
        state.waits += 1
    state.buckets += 1
    return work.get_future().then(_bucket_tensor)


def is_ours(hook: Any, state: Any) -> bool:
    """Whether ``(hook, state)`` (an entry of a DDP's ``_comm_hooks``) is semimig's timed reduction."""
    return hook is timed_allreduce and isinstance(state, DDPWait)


def hook_state(ddp: nn.parallel.DistributedDataParallel) -> Optional[DDPWait]:
    """The state of semimig's hook on ``ddp`` (``None``: it has none)."""
    hooks = getattr(ddp, "_comm_hooks", None) or []
    return next((state for hook, state in hooks if is_ours(hook, state)), None)


def _why_not(ddp: nn.parallel.DistributedDataParallel, size: int) -> Optional[str]:
    if getattr(ddp, "_comm_hooks", None):
        return "it has a communication hook of its own"
    if getattr(ddp, "mixed_precision", None) is not None:
        return "it runs DDP's own mixed precision"
    if getattr(ddp, "_use_python_reducer", False) or getattr(ddp, "reducer", None) is None:
        return "it runs without the C++ reducer"
    if ddp.gradient_as_bucket_view and not getattr(ddp, "batched_grad_copy", False) and size & (size - 1):
        return (f"gradient_as_bucket_view=True over {size} ranks (not a power of two): DDP divides an aliased "
                "gradient and multiplies a copied one, which no hook reproduces bit for bit")
    return None


def install(model: nn.Module, clock: StepClock) -> list[DDPWait]:
    """Register :func:`timed_allreduce` on every torch DDP inside ``model`` whose process group has more
    than one rank, its wait timed on ``clock``; a DDP that already has semimig's hook gets ``clock``.
    Returns the hooks' states (empty: no such DDP, or none could take the hook: one warning each)."""
    if not isinstance(clock, StepClock):
        raise TypeError(f"clock must be a StepClock, got {clock!r}")
    states = []
    for ddp in model.modules():
        if not isinstance(ddp, nn.parallel.DistributedDataParallel):
            continue
        size = dist.get_world_size(ddp.process_group)
        if size < 2:
            continue
        state = hook_state(ddp)
        if state is None:
            why = _why_not(ddp, size)
            if why is not None:
                logger.warning("semimig: the data-parallel all-reduce's wait is not timed as communication (%s): "
                               "a replica waiting for a slower one reads the wait as compute", why)
                continue
            state = DDPWait(ddp.process_group, divide=bool(getattr(ddp, "batched_grad_copy", False)), clock=clock)
            ddp.register_comm_hook(state, timed_allreduce)
        state.clock = clock
        states.append(state)
    return states


def reregister(ddp: nn.parallel.DistributedDataParallel) -> bool:
    """Put semimig's hook back on ``ddp``'s reducer after the reducer was rebuilt (the hook stays listed in
    ``ddp._comm_hooks``; a new reducer has none).  Whether there was one to put back."""
    for hook, state in getattr(ddp, "_comm_hooks", None) or []:
        if is_ours(hook, state):
            dist._register_comm_hook(ddp.reducer, state, hook)
            if ddp.logger is not None:
                ddp.logger._set_comm_hook_name(hook.__qualname__)
            return True
    return False


def release(model: nn.Module) -> None:
    """Every semimig hook inside ``model`` reduces without timing from now on (torch cannot unregister a hook)."""
    for ddp in model.modules():
        if isinstance(ddp, nn.parallel.DistributedDataParallel):
            state = hook_state(ddp)
            if state is not None:
                state.clock = None
