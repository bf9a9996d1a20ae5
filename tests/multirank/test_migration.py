"""Lightweight migration is loss-free: outputs and gradients equal the unmigrated layer.

For every case the same layer runs twice on a fresh gloo group — once plain, once with a
:class:`LayerDirective` that migrates columns — and outputs, input grads, weight and bias
grads must agree to fp32 atol 1e-5 (the migrated partial products are summed in a different
order; nothing else differs).  With migration *and* resizing the reference is the plain layer
whose straggler has its pruned weight columns set to zero, with those gradient columns zeroed:
the dense result restricted to kept ∪ migrated columns.
"""
import copy
import dataclasses
from collections import Counter

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from dist_harness import run_pooled  # the test run's pool of ranks: many cases per spawn

ATOL = 1e-5
IN_COL, OUT = 12, 8  # column layer: K = 12 on every rank


def _build(kind, world, seed=0):
    import semimig.nn as snn

    torch.manual_seed(seed)
    in_f = IN_COL if kind == "col" else 12 * world  # row layer: K = 12 per rank
    dense = nn.Linear(in_f, OUT * world if kind == "col" else OUT)
    x = torch.randn(2, 3, in_f)
    cls = snn.Linear1D_Col if kind == "col" else snn.Linear1D_Row
    extra = {} if kind == "col" else {"parallel_input": False}
    return dense, x, lambda d: cls.from_native_module(copy.deepcopy(d), dist.group.WORLD, **extra)


def _grads(layer, x, directive=None, repeats=1):
    layer.directive = directive
    xi = x.clone().requires_grad_(True)
    y = None
    for _ in range(repeats):  # several forwards of one iteration reuse the broadcast weights
        y = layer(xi)
        (y * torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape).cos()).sum().backward()
    return y.detach(), xi.grad, layer.weight.grad, layer.bias.grad


def _directive(world, k, migrate, policy, keep=None):
    from semimig.migration.exchange import make_exchange
    from semimig.migration.layout import MigrationLayout
    from semimig.nn import LayerDirective

    layout = MigrationLayout.build(world, k, migrate)
    return LayerDirective(iteration=0, keep=keep, layout=layout, exchange=make_exchange(policy, dist.group.WORLD))


def _migration_body(rank, world, kind, policy, scenarios):
    dense, x, make = _build(kind, world)
    reference = _grads(make(dense), x, repeats=2)
    for migrate in scenarios:
        got = _grads(make(dense), x, _directive(world, 12, migrate, policy), repeats=2)
        for name, a, b in zip(("y", "dx", "dw", "db"), got, reference):
            torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=lambda m: f"{migrate} {name}: {m}")


SCENARIOS = {
    2: [{1: 5}, {0: 12}, {1: 1}],
    3: [{1: 5}, {0: 12}, {0: 4, 2: 7}],
    4: [{2: 5}, {3: 12}, {0: 4, 2: 7}],
}


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("kind", ["col", "row"])
@pytest.mark.parametrize("policy", ["broadcast-reduce", "scatter-gather"])
def test_migration_is_loss_free(world, kind, policy):
    run_pooled(_migration_body, world, kind, policy, SCENARIOS[world])


def _mixed_body(rank, world, kind, policy):
    straggler, migrate, keep_list = 1, 4, [0, 2, 3, 6, 7]  # own = [0, 8); pruned = {1, 4, 5}
    pruned = [c for c in range(12 - migrate) if c not in keep_list]
    dense, x, make = _build(kind, world)
    masked = make(dense)
    if rank == straggler:
        with torch.no_grad():
            masked.weight[:, pruned] = 0.0
    ref = list(_grads(masked, x))
    if rank == straggler:
        ref[2] = ref[2].clone()
        ref[2][:, pruned] = 0.0
    keep = torch.tensor(keep_list) if rank == straggler else None
    got = _grads(make(dense), x, _directive(world, 12, {straggler: migrate}, policy, keep=keep))
    for name, a, b in zip(("y", "dx", "dw", "db"), got, ref):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=lambda m: f"{name}: {m}")
    if rank == straggler:
        assert torch.count_nonzero(got[2][:, pruned]) == 0  # zero policy: exactly zero


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", ["col", "row"])
@pytest.mark.parametrize("policy", ["broadcast-reduce", "scatter-gather"])
def test_migration_with_resizing_equals_dense_restricted(world, kind, policy):
    run_pooled(_mixed_body, world, kind, policy)


def _count_body(rank, world, kind):
    """Counts the collectives of one forward/backward with rank 1 migrating 6 columns."""
    counts = Counter()
    originals = {name: getattr(dist, name) for name in ("all_reduce", "reduce", "broadcast", "send", "recv")}

    def counting(name):
        def call(*args, **kwargs):
            counts[(phase, name)] += 1
            return originals[name](*args, **kwargs)
        return call

    dense, x, make = _build(kind, world)
    layer = make(dense)
    layer.directive = _directive(world, 12, {1: 6}, "broadcast-reduce")
    xi = x.clone().requires_grad_(True)
    try:
        for name in originals:
            setattr(dist, name, counting(name))
        phase = "fwd"
        y = layer(xi)
        phase = "bwd"
        y.sum().backward()
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
    return dict(counts)


def test_merged_directions_issue_no_separate_reduce():
    col = run_pooled(_count_body, 2, "col")
    # forward: broadcast W_k[:, mig], reduce the partial outputs to k
    assert col == {("fwd", "broadcast"): 1, ("fwd", "reduce"): 1,
                   # backward: broadcast dY_k, reduce dW_k[:, mig]; dX rides on the all-reduce
                   ("bwd", "broadcast"): 1, ("bwd", "reduce"): 1, ("bwd", "all_reduce"): 1}, col
    row = run_pooled(_count_body, 2, "row")
    # forward: broadcast X_k[:, mig] and W_k[:, mig]; receivers' products ride on the all-reduce
    assert row == {("fwd", "broadcast"): 2, ("fwd", "all_reduce"): 1,
                   # backward: dX_k[:, mig] and dW_k[:, mig] stacked into one reduce to k
                   ("bwd", "reduce"): 1}, row


def test_layout_spreads_the_remainder_and_renumbers_from_the_straggler():
    from semimig.migration.layout import MigrationLayout

    layout = MigrationLayout.build(4, 12, {1: 5})
    (share,) = layout.shares
    assert share.receivers == (2, 3, 0)  # r' = (r + e - k) % e = 1, 2, 3
    assert share.ranges == ((0, 2), (2, 4), (4, 5))
    assert layout.own_columns(1) == 7 and layout.own_columns(0) == 12
    two = MigrationLayout.build(4, 12, {0: 4, 2: 7})
    assert [s.receivers for s in two.shares] == [(1, 3), (3, 1)]
    with pytest.raises(ValueError, match="cannot migrate 13 of its 12 columns"):
        MigrationLayout.build(4, 12, {1: 13})
    with pytest.raises(ValueError, match="outside the group of size 4"):
        MigrationLayout.build(4, 12, {4: 1})
    with pytest.raises(ValueError, match="no receiver is left"):
        MigrationLayout.build(2, 12, {0: 1, 1: 1})


def test_layout_takes_the_plans_receivers():
    """``receivers="normal"`` plans hand migrated columns only to non-stragglers."""
    from semimig.migration.layout import MigrationLayout

    layout = MigrationLayout.build(4, 12, {0: 6}, receivers=[3, 2])  # rank 1 resizes: not a receiver
    (share,) = layout.shares
    assert share.receivers == (2, 3) and share.ranges == ((0, 3), (3, 6))
    assert share.range_of(1) is None
    with pytest.raises(ValueError, match="rank 0 cannot both migrate 6 columns and receive"):
        MigrationLayout.build(4, 12, {0: 6}, receivers=[0, 2])
    with pytest.raises(ValueError, match="receiver rank 5 is outside the group of size 4"):
        MigrationLayout.build(4, 12, {0: 6}, receivers=[5])
    with pytest.raises(ValueError, match="no receiver is left"):
        MigrationLayout.build(4, 12, {0: 6}, receivers=[])


def _order_body(rank, world, kind):
    """Records, on the straggler (rank 0, whose result run_pooled returns), the order of its
    own GEMMs and its shares."""
    dense, x, make = _build(kind, world)
    layer = make(dense)
    directive = _directive(world, 12, {0: 6}, "broadcast-reduce")
    events = []

    class Recorder:
        def timed(self, fn, *, flops, full_flops):
            events.append("own" if full_flops else "theirs")
            return fn()

    layer.directive = dataclasses.replace(directive, timer=Recorder())
    original = dist.broadcast

    def broadcast(tensor, src, *args, **kwargs):
        events.append("share")
        return original(tensor, src, *args, **kwargs)

    dist.broadcast = broadcast
    try:
        y = layer(x.clone().requires_grad_(True))
        events.append("|")
        y.sum().backward()
    finally:
        dist.broadcast = original
    return events


@pytest.mark.parametrize("kind", ["col", "row"])
def test_straggler_shares_before_its_own_gemms(kind):
    """Receivers must not wait for the straggler's slow GEMM before they can start on its columns."""
    events = run_pooled(_order_body, 2, kind)
    forward, backward = " ".join(events).split(" | ")
    assert forward.index("share") < forward.index("own"), events
    if kind == "col":  # dY_k travels before the straggler's dgrad/wgrad (row: dY is replicated)
        assert backward.index("share") < backward.index("own"), events


def _traffic_body(rank, world):
    from semimig.comm import primitives as P
    from semimig.comm.traffic import count_traffic, current

    group = dist.group.WORLD
    t = torch.ones(10)  # 40 bytes
    assert current() is None
    with count_traffic() as counter:
        P.broadcast_(t, 1, group)
        P.reduce_(t, 1, group)
        P.all_reduce_(t, group)
        P.wait(P.all_reduce_start(t, group))
        if rank == 0:
            P.send(t, 1, group)
        elif rank == 1:
            P.recv_(t, 0, group)
    assert current() is None
    return counter.totals()


def test_traffic_counter_counts_payload_and_link_bytes_by_role():
    """Rank 1 is the root: its link carries B out for the broadcast, B in for the reduce and the recv."""
    world = 2
    totals = run_pooled(_traffic_body, world)  # rank 0's view: a peer and the sender
    assert totals["broadcast"]["payload_bytes"] == 40 and totals["broadcast"]["in_bytes"] == 40
    assert totals["reduce"]["out_bytes"] == 40 and totals["reduce"]["in_bytes"] == 0
    ring = 2 * 40 * (world - 1) / world
    assert totals["all_reduce"] == pytest.approx({"calls": 2, "payload_bytes": 80, "out_bytes": 2 * ring,
                                                  "in_bytes": 2 * ring, "seconds": totals["all_reduce"]["seconds"]})
    assert totals["send"]["out_bytes"] == 40 and "recv" not in totals
