"""Raw collectives on an explicit tensor-parallel group (no autograd).

Every function takes the group explicitly, addresses peers by their rank *inside* the group and
returns early when the group has one rank, so single-process runs issue no collective at all.
Inside :func:`semimig.comm.traffic.count_traffic` every call is counted (bytes, link model,
seconds); outside it the count costs one check.

Migration's one-to-many and many-to-one movements have two implementations here:

- the library collectives, :func:`broadcast_` and :func:`reduce_` (gloo: a binomial-tree
  broadcast whose root sends the block once per tree level, ``ceil(log2 e)`` times, and a
  reduce whose root sends and receives parts of it; NCCL: pipelined rings/trees);
- *direct* ones in which the root's link carries each byte exactly once, the minimum, while the
  other ranks' links do the relaying: :func:`broadcast_direct_` (the root scatters ``n`` chunks
  to the ``n`` receivers, which all-gather them among themselves), :func:`reduce_direct_` (the
  senders reduce-scatter among themselves, then each sends its summed chunk to the root, which
  adds the assembled sum into its own tensor), :func:`scatter_` and :func:`gather_` (each
  receiver needs, or has, only its own slice: one message each).  With ``B`` the tensor's bytes
  and ``n`` receivers the root sends (or receives) ``B``; receiver ``i`` receives ``B`` and sends
  ``(n - 1) |chunk_i|`` (broadcast), or sends ``B`` and receives ``(n - 1) |chunk_i|`` (reduce).
  Ranks outside ``{root} U receivers`` take no part and must not call.  Messages are batched
  point-to-point (``batch_isend_irecv``), one per rank pair and direction per phase, so each
  phase is one round of concurrent messages.  Copies are exact; the direct reduce sums in a
  fixed order, ``root + ((s_0 + s_1) + ... + s_{n-1})`` element-wise, which may differ from a
  library reduce's order in the last bits (fp32 reassociation), never more.

The direct movements are counted as the collective they replace (``broadcast`` / ``reduce``,
one call, the whole tensor as payload) with the bytes this rank's link really carries.

Timing.  Every function here that communicates runs inside the region of the step clock registered
with :func:`time_collectives` (the balancing runtime registers its meter's ``comm``), so what
semimig's own collectives block the compute stream for is the step's communication
(:mod:`semimig.straggler.clock`); nothing in :mod:`torch.distributed` is wrapped for it.  The one
exception is :func:`post_packed`, which posts an exchange and returns without waiting: its caller waits
(:meth:`PackedSwap.wait`) inside :func:`comm_region`, where the wait for a slower peer is communication.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Callable, ContextManager, Sequence

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from semimig.comm import traffic


_REGIONS: list[weakref.WeakMethod] = []
"""Registered comm regions, the latest in force (weak: a dropped runtime times nothing)."""


def time_collectives(region: Callable[[], ContextManager[None]]) -> Callable[[], None]:
    """Run every collective of this module inside ``region()`` (a bound method, e.g. a
    :class:`~semimig.straggler.busy.BusyMeter`'s ``comm``) until the returned function is called."""
    ref = weakref.WeakMethod(region)
    _REGIONS.append(ref)

    def stop() -> None:
        if ref in _REGIONS:
            _REGIONS.remove(ref)

    return stop


def comm_region() -> ContextManager[None]:
    """The comm region in force (:func:`time_collectives`), for a collective run outside this module (the
    vocabulary's, :mod:`semimig.shardformer.vocab_clock`); a null context when none is registered."""
    return _region()


def _region() -> ContextManager[None]:
    while _REGIONS:
        region = _REGIONS[-1]()
        if region is not None:
            return region()
        _REGIONS.pop()
    return contextlib.nullcontext()


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


def all_gather_rows(values: Sequence[float], group: ProcessGroup | None) -> list[list[float]]:
    """Every rank's ``values`` (the same length on every rank), in group-rank order (one float64
    all-gather; none on a group of one)."""
    if group_size(group) == 1:
        return [[float(v) for v in values]]
    mine = torch.tensor([float(v) for v in values], dtype=torch.float64, device=collective_device(group))
    out = [torch.empty_like(mine) for _ in range(group_size(group))]
    with _region():
        dist.all_gather(out, mine, group=group)
    return [t.cpu().tolist() for t in out]


def broadcast_object(value: object, src: int, group: ProcessGroup | None) -> object:
    """Group rank ``src``'s ``value`` (a picklable object; the others pass anything) on every rank of
    ``group``, in the comm region (the root's own ``value`` with a group of one)."""
    if group_size(group) == 1:
        return value
    box = [value]
    with _region():
        dist.broadcast_object_list(box, src=_global(group, src), group=group, device=collective_device(group))
    return box[0]


def all_gather_floats(value: float, group: ProcessGroup | None) -> list[float]:
    """Every rank's ``value``, in group-rank order (one float64 all-gather)."""
    return [row[0] for row in all_gather_rows([value], group)]


def _global(group: ProcessGroup | None, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def _counted(op: str, tensor: torch.Tensor, group: ProcessGroup | None, call, *, root: int | None = None,
             timed: bool = True):
    """``call()`` in the comm region, counted when a :func:`~semimig.comm.traffic.count_traffic` block is active."""
    counter = traffic.current()
    with _region():
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
        with _region():
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


def isend(tensor: torch.Tensor, dst: int, group: ProcessGroup | None) -> dist.Work | None:
    """Post a point-to-point send of ``tensor`` to group rank ``dst``; the caller keeps ``tensor`` unchanged
    until the returned work is waited for."""
    return _counted("send", tensor, group, lambda: dist.isend(tensor, dst=_global(group, dst), group=group),
                    timed=False)


def irecv_(tensor: torch.Tensor, src: int, group: ProcessGroup | None) -> dist.Work | None:
    """Post a point-to-point receive from group rank ``src`` into ``tensor``; :func:`wait` before reading it."""
    return _counted("recv", tensor, group, lambda: dist.irecv(tensor, src=_global(group, src), group=group),
                    timed=False)


# ----------------------------------------------------------------------------- direct movements
def _post_p2p(sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]],
              group: ProcessGroup | None, tag: int = 0) -> list[dist.Work]:
    """Post every ``(tensor, group rank)`` send and receive as one batch (one NCCL group: a pair of ranks that
    send to each other cannot deadlock), each with ``tag``; the works to wait for."""
    ops = [dist.P2POp(dist.isend, t, _global(group, peer), group, tag) for t, peer in sends if t.numel()]
    ops += [dist.P2POp(dist.irecv, t, _global(group, peer), group, tag) for t, peer in recvs if t.numel()]
    return list(dist.batch_isend_irecv(ops)) if ops else []


def _p2p(sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]],
         group: ProcessGroup | None) -> None:
    """Post every ``(tensor, group rank)`` send and receive as one batch and wait for all of them."""
    for work in _post_p2p(sends, recvs, group):
        work.wait()


class PackedSwap:
    """A packed exchange in flight (:func:`post_packed`): :meth:`wait` for its messages, then :meth:`unpack`
    the received buffers into their targets.  ``sent`` / ``received``: its bytes."""

    def __init__(self, works: list[dist.Work], sends: list[torch.Tensor], buffers: dict[int, torch.Tensor],
                 incoming: dict[int, list[torch.Tensor]]) -> None:
        self.works, self.sends, self.buffers, self.incoming = works, sends, buffers, incoming
        self.sent = sum(b.numel() for b in sends)
        self.received = sum(b.numel() for b in buffers.values())

    def wait(self) -> None:
        """Wait for every message (the send buffers are free, the receive buffers full after it)."""
        works, self.works = self.works, []
        for work in works:
            work.wait()
        self.sends = []

    def unpack(self) -> None:
        """Copy the received buffers into their targets (after :meth:`wait`)."""
        for peer, targets in self.incoming.items():
            unpack_into(self.buffers[peer], targets)


def post_packed(outgoing: dict[int, list[torch.Tensor]], incoming: dict[int, list[torch.Tensor]],
                group: ProcessGroup | None = None, *, tag: int = 0, timed: bool = False) -> PackedSwap:
    """Post what :func:`swap_packed` exchanges, without waiting: the outgoing pieces are copied into their
    byte buffers now (the caller may change them once this returns), the received ones land in buffers of
    the returned :class:`PackedSwap`.  ``tag``: every message's, so exchanges posted with distinct tags
    between the same ranks match by tag (gloo), whatever order each rank posted or completes them in;
    NCCL matches in posting order, so every rank must post its exchanges in one order.  ``timed``: the
    posting in the comm region (as :func:`swap_packed`'s)."""
    sends = [(torch.cat([p.contiguous().view(-1).view(torch.uint8) for p in pieces]), peer)
             for peer, pieces in sorted(outgoing.items())]
    buffers = {peer: targets[0].new_empty(sum(_nbytes(t) for t in targets), dtype=torch.uint8)
               for peer, targets in sorted(incoming.items())}
    with _region() if timed else contextlib.nullcontext():
        works = _post_p2p(sends, [(buffer, peer) for peer, buffer in buffers.items()], group, tag)
    return PackedSwap(works, [b for b, _ in sends], buffers, incoming)


def swap_packed(outgoing: dict[int, list[torch.Tensor]], incoming: dict[int, list[torch.Tensor]],
                group: ProcessGroup | None = None, *, tag: int = 0, timed: bool = False) -> tuple[int, int]:
    """Send each peer (group rank) its ``outgoing`` pieces and receive into its ``incoming`` tensors: one byte
    buffer each way per peer, packed and unpacked in list order (both ends derive the lists from one plan),
    all posted as one batch and waited for.  ``timed``: in the comm region (a rank waiting here for a slower
    peer is communicating on the step clock); ``tag`` as :func:`post_packed`'s.  Returns ``(bytes sent, bytes
    received)``."""
    swap = post_packed(outgoing, incoming, group, tag=tag, timed=timed)
    with _region() if timed else contextlib.nullcontext():
        swap.wait()
    swap.unpack()
    return swap.sent, swap.received


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _direct(op: str, payload: torch.Tensor, link: tuple[int, int], group: ProcessGroup | None, call, *,
            root: bool) -> None:
    counter = traffic.current()
    with _region():
        if counter is None:
            call()
            return
        counter.count(op, "root" if root else "peer", _nbytes(payload), group_size(group), call, link=link)


def _check_peers(root: int, peers: Sequence[int], me: int) -> int:
    """This rank's index in ``peers`` (-1 for the root); raises for a rank that takes no part."""
    if root in peers or len(set(peers)) != len(peers) or not peers:
        raise ValueError(f"direct movement needs distinct peers without the root {root}, got {list(peers)}")
    if me == root:
        return -1
    if me not in peers:
        raise ValueError(f"group rank {me} is neither the root {root} nor one of {list(peers)}")
    return list(peers).index(me)


def broadcast_direct_(tensor: torch.Tensor, src: int, receivers: Sequence[int],
                      group: ProcessGroup | None) -> torch.Tensor:
    """``src``'s ``tensor`` into every receiver's (contiguous) ``tensor``: scatter, then all-gather among receivers."""
    me = group_rank(group)
    i = _check_peers(src, receivers, me)
    n = len(receivers)
    if me == src:
        chunks = torch.tensor_split(tensor.contiguous().reshape(-1), n)
        _direct("broadcast", tensor, (_nbytes(tensor), 0), group,
                lambda: _p2p(list(zip(chunks, receivers)), [], group), root=True)
        return tensor
    if not tensor.is_contiguous():
        raise ValueError("a receiver's buffer must be contiguous")
    chunks = torch.tensor_split(tensor.reshape(-1), n)

    def call():
        _p2p([], [(chunks[i], src)], group)
        others = [(chunks[j], r) for j, r in enumerate(receivers) if j != i]
        _p2p([(chunks[i], r) for _, r in others], others, group)

    _direct("broadcast", tensor, ((n - 1) * _nbytes(chunks[i]), _nbytes(tensor)), group, call, root=False)
    return tensor


def reduce_direct_(tensor: torch.Tensor, dst: int, senders: Sequence[int], group: ProcessGroup | None) -> torch.Tensor:
    """``dst``'s ``tensor += s_0 + ... + s_{n-1}`` (the senders' tensors): reduce-scatter among senders, then gather.

    Senders' tensors are left unchanged.
    """
    me = group_rank(group)
    i = _check_peers(dst, senders, me)
    n = len(senders)
    if me == dst:
        total = torch.empty(tensor.numel(), dtype=tensor.dtype, device=tensor.device)
        chunks = torch.tensor_split(total, n)

        def gather_sum():
            _p2p([], list(zip(chunks, senders)), group)
            tensor.add_(total.view(tensor.shape))

        _direct("reduce", tensor, (0, _nbytes(tensor)), group, gather_sum, root=True)
        return tensor
    mine = torch.tensor_split(tensor.contiguous().reshape(-1), n)

    def call():
        incoming = {j: torch.empty_like(mine[i]) for j in range(n) if j != i}
        _p2p([(mine[j], r) for j, r in enumerate(senders) if j != i], [(incoming[j], senders[j]) for j in incoming],
             group)
        acc = (mine[i] if i == 0 else incoming[0]).clone()
        for j in range(1, n):
            acc.add_(mine[i] if j == i else incoming[j])
        _p2p([(acc, dst)], [], group)

    _direct("reduce", tensor, (_nbytes(tensor), (n - 1) * _nbytes(mine[i])), group, call, root=False)
    return tensor


def scatter_(pieces: Sequence[torch.Tensor] | None, buf: torch.Tensor | None, src: int, receivers: Sequence[int],
             group: ProcessGroup | None, *, payload: torch.Tensor) -> torch.Tensor | None:
    """``src`` sends ``pieces[i]`` to ``receivers[i]``, which receives it into its ``buf``; counted as the
    broadcast of ``payload`` (the block the pieces come from) it replaces."""
    me = group_rank(group)
    _check_peers(src, receivers, me)
    if me == src:
        pieces = [p.contiguous() for p in pieces]
        _direct("broadcast", payload, (sum(_nbytes(p) for p in pieces), 0), group,
                lambda: _p2p(list(zip(pieces, receivers)), [], group), root=True)
        return None
    _direct("broadcast", payload, (0, _nbytes(buf)), group, lambda: _p2p([], [(buf, src)], group), root=False)
    return buf


def gather_(piece: torch.Tensor | None, bufs: Sequence[torch.Tensor] | None, dst: int, senders: Sequence[int],
            group: ProcessGroup | None, *, payload: torch.Tensor) -> None:
    """``senders[i]`` sends its ``piece`` to ``dst``, which receives it into ``bufs[i]``; counted as the
    reduce of ``payload`` (the block the pieces make up) it replaces."""
    me = group_rank(group)
    _check_peers(dst, senders, me)
    if me == dst:
        _direct("reduce", payload, (0, sum(_nbytes(b) for b in bufs)), group,
                lambda: _p2p([], list(zip(bufs, senders)), group), root=True)
        return
    piece = piece.contiguous()
    _direct("reduce", payload, (_nbytes(piece), 0), group, lambda: _p2p([(piece, dst)], [], group), root=False)


# ----------------------------------------------------------------------------- sequence parallelism
def _counted_bytes(op: str, nbytes: int, group: ProcessGroup | None, call, *, timed: bool = True):
    """``call()`` in the comm region, counted with ``nbytes`` of payload (the whole tensor the collective
    reduces or assembles)."""
    counter = traffic.current()
    with _region():
        if counter is None:
            return call()
        return counter.count(op, "peer", nbytes, group_size(group), call, timed=timed)


def reduce_scatter_start(out: torch.Tensor, pieces: Sequence[torch.Tensor],
                         group: ProcessGroup | None) -> dist.Work | None:
    """Start ``out = sum over the group of pieces[rank]`` (``pieces``: one contiguous tensor per rank,
    each ``out``'s shape); :func:`wait` before reading ``out``.  A group of one copies its piece."""
    if group_size(group) == 1:
        out.copy_(pieces[0])
        return None
    nbytes = sum(_nbytes(p) for p in pieces)
    return _counted_bytes("reduce_scatter", nbytes, group,
                          lambda: dist.reduce_scatter(out, list(pieces), group=group, async_op=True), timed=False)


def all_gather_(pieces: Sequence[torch.Tensor], tensor: torch.Tensor, group: ProcessGroup | None) -> None:
    """``pieces[r] = tensor of rank r`` over the group (each piece ``tensor``'s shape)."""
    if group_size(group) == 1:
        pieces[0].copy_(tensor)
        return
    _counted_bytes("all_gather", sum(_nbytes(p) for p in pieces), group,
                   lambda: dist.all_gather(list(pieces), tensor, group=group))


def unpack_into(buffer: torch.Tensor, targets: Sequence[torch.Tensor]) -> None:
    """Copy consecutive byte ranges of the uint8 ``buffer`` (one received message) into ``targets``, in
    order, each in its own dtype and shape: the receiving end of a packed point-to-point exchange."""
    start = 0
    for target in targets:
        nbytes = target.numel() * target.element_size()
        chunk = buffer[start:start + nbytes].clone()  # clone: aligned for the dtype view
        target.copy_(chunk.view(target.dtype).view(target.shape))
        start += nbytes
