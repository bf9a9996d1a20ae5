"""Busy time covers a rank's own work; the column backward overlaps its dX all-reduce with dW.

Every aten op that runs during a balanced layer's forward and backward is logged through a
``TorchDispatchMode``, together with whether it ran inside ``directive.timer.timed``.  On the
balanced path nothing that computes may run outside the timer (gathers, index copies, GEMMs,
imputation, zero fills, plan building); only views, collectives and the module's own bias add
(Colossal-AI's, identical with or without balancing) may.  With migration, every GEMM a rank
runs is timed, the receivers' ones with ``full_flops = 0``.
"""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from dist_harness import run_on_ranks

# Ops that compute nothing (metadata, aliasing, allocation without a fill).
VIEWS = {"view", "_unsafe_view", "reshape", "t", "transpose", "slice", "select", "as_strided", "alias",
         "detach", "expand", "empty", "new_empty", "lift_fresh"}
GEMMS = {"mm", "addmm", "bmm", "matmul", "linear"}


def _name(func) -> str:
    return str(func).split(".")[1] if str(func).startswith("aten.") else str(func)


class _Timer:
    """A GemmTimer that counts nesting (so the op log knows what ran inside) and the FLOP accounting."""

    def __init__(self):
        self.depth, self.flops, self.full_flops = 0, 0, 0

    def timed(self, fn, *, flops, full_flops):
        self.depth += 1
        self.flops, self.full_flops = self.flops + flops, self.full_flops + full_flops
        try:
            return fn()
        finally:
            self.depth -= 1


class _OpLog(TorchDispatchMode):
    def __init__(self, timer):
        super().__init__()
        self.timer, self.outside, self.inside = timer, [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        (self.inside if self.timer.depth else self.outside).append(_name(func))
        return func(*args, **(kwargs or {}))


def _layer(kind, world):
    import semimig.nn as snn

    torch.manual_seed(0)
    dense = nn.Linear(16, 8 * world)
    group = dist.group.WORLD
    if kind == "col":
        return snn.Linear1D_Col.from_native_module(copy.deepcopy(dense), group), torch.randn(2, 3, 16)
    return snn.Linear1D_Row.from_native_module(copy.deepcopy(dense), group, parallel_input=True), torch.randn(2, 3, 16 // world)


def _ops_body(rank, world, kind, impute, migrate):
    import semimig.nn as snn
    from semimig.migration.exchange import make_exchange
    from semimig.migration.layout import MigrationLayout

    layer, x = _layer(kind, world)
    k = layer.weight.shape[1]
    timer = _Timer()
    layout = MigrationLayout.build(world, k, {0: k // 4}) if migrate else None
    own = k - (k // 4 if migrate and rank == 0 else 0)
    keep = torch.tensor([c for c in range(own) if c % 3])  # prune every third own column
    layer.directive = snn.LayerDirective(iteration=0, keep=keep, impute=impute, timer=timer, layout=layout,
                                         exchange=make_exchange("broadcast-reduce", dist.group.WORLD) if migrate else None)
    x.requires_grad_(True)
    dy = torch.ones(*x.shape[:-1], layer.weight.shape[0])
    inputs = [x] + [p for p in layer.parameters() if p.requires_grad]
    with _OpLog(timer) as log:
        # the gradients returned, not accumulated into .grad: a leaf's AccumulateGrad may clone an
        # incoming gradient that another reference still holds (autograd's bookkeeping, not the layer's
        # work), depending on when the collective's handle lets go of it
        torch.autograd.grad(layer(x), inputs, dy)
    return sorted(set(log.outside)), sorted(set(log.inside)), timer.flops, timer.full_flops


@pytest.mark.parametrize("kind", ["col", "row"])
@pytest.mark.parametrize("impute", ["zero", "same", "average"])
def test_every_piece_of_own_work_is_timed(kind, impute):
    outside, inside, flops, full_flops = run_on_ranks(_ops_body, 2, kind, impute, False)
    module_bias = {"add", "sum"} if kind == "row" else set()  # Linear1D_Row adds its bias after the reduce
    computing = {op for op in outside if op not in VIEWS | module_bias and not op.startswith("c10d")}
    assert not computing, f"ran outside the timer: {computing}"
    assert GEMMS & set(inside) and "index_select" in inside, inside
    assert 0 < flops < full_flops  # a third of the own columns pruned


@pytest.mark.parametrize("kind", ["col", "row"])
def test_migration_gemms_are_timed_and_receivers_count_no_full_flops(kind):
    outside, inside, flops, full_flops = run_on_ranks(_ops_body, 2, kind, "zero", True)
    assert not GEMMS & set(outside), outside
    # rank 0 (returned) migrates a quarter of K and prunes a third of the rest: it did less than its full work
    assert 0 < flops < full_flops


def _dense_order_body(rank, world):
    """The ops of the dense column backward in order (no directive: Colossal-AI's schedule)."""
    layer, x = _layer("col", world)
    x.requires_grad_(True)
    y = layer(x)
    dy, timer, calls = torch.ones_like(y), _Timer(), []
    original = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        calls.append(kwargs.get("async_op", False))
        return original(tensor, *args, **kwargs)

    dist.all_reduce = all_reduce
    try:
        with _OpLog(timer) as log:
            y.backward(dy)
    finally:
        dist.all_reduce = original
    return log.outside, calls


def test_dense_column_backward_overlaps_the_dx_all_reduce_with_dw():
    """As Colossal-AI's LinearWithAsyncCommunication: dx GEMM, start the all-reduce, dw GEMM, wait."""
    ops, async_flags = run_on_ranks(_dense_order_body, 2)
    assert async_flags == [True]
    gemms = [i for i, op in enumerate(ops) if op in GEMMS]
    reduce_at = next(i for i, op in enumerate(ops) if op.startswith("c10d") and "allreduce" in op)
    assert len(gemms) == 2 and gemms[0] < reduce_at < gemms[1], ops


def test_keep_plan_is_rebuilt_only_when_the_keep_set_changes():
    """One validated plan per keep set: equal values reuse it, new values or an in-place edit rebuild it."""
    from semimig.nn import LayerState

    state, cpu = LayerState(), torch.device("cpu")
    keep = torch.tensor([0, 2, 5])
    plan = state.own_plan(keep, 8, 6, cpu, 1)
    assert plan.keep.tolist() == [0, 2, 5] and plan.k == 8
    assert state.own_plan(keep, 8, 6, cpu, 1) is plan
    assert state.own_plan(torch.tensor([0, 2, 5]), 8, 6, cpu, 1) is plan  # a new tensor, same values
    keep[2] = 4  # edited in place: the version counter moves
    assert state.own_plan(keep, 8, 6, cpu, 1).keep.tolist() == [0, 2, 4]
    prefix = state.own_plan(None, 8, 6, cpu, 1)  # a migrating rank's own prefix [0, 6)
    assert prefix.span == (0, 6) and state.own_plan(None, 8, 6, cpu, 1) is prefix
    assert state.own_plan(None, 8, 5, cpu, 1).span == (0, 5)


class _Sleep(torch.autograd.Function):
    """Work that is not a GEMM: ``seconds`` of wall time in forward and again in backward."""

    @staticmethod
    def forward(ctx, x, seconds):
        import time

        ctx.seconds = seconds
        time.sleep(seconds)
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        import time

        time.sleep(ctx.seconds)
        return dy.clone(), None


def _pair_gap_body(rank, world, inner_s, outer_s, gathered=False, marks=True):
    """sleep(outer) → Col → sleep(inner) → Row → sleep(outer), forward and backward, under a real
    meter; ``gathered``: the column gathers its output and the row splits its input (collectives
    inside the span); ``marks``: the meter's ``marks_spans`` (a re-sharding run's)."""
    import semimig.nn as snn
    from semimig.straggler.busy import BusyMeter

    torch.manual_seed(0)
    group = dist.group.WORLD
    col = snn.Linear1D_Col.from_native_module(nn.Linear(16, 8 * world), group, gather_output=gathered)
    row = snn.Linear1D_Row.from_native_module(nn.Linear(8 * world, 16), group, parallel_input=not gathered)
    meter = BusyMeter(marks_spans=marks)
    for layer in (col, row):
        layer.directive = snn.LayerDirective(iteration=0, timer=meter)
    x = torch.randn(2, 3, 16, requires_grad=True)
    y = _Sleep.apply(row(_Sleep.apply(col(_Sleep.apply(x, outer_s)), inner_s)), outer_s)
    y.sum().backward()
    stats = meter.snapshot()
    meter.reset()
    return stats.paired_gap_s, stats.busy_s, meter.snapshot().paired_gap_s


def test_the_span_between_a_pairs_layers_is_counted_apart_and_nothing_around_the_pair():
    """The attention core / activation between a column and a row layer is measured (forward and
    backward) as ``paired_gap_s``; the work before the column and after the row (norms, residuals:
    replicated) is not, nor is any of it in ``busy_s``; ``reset`` clears it."""
    inner, outer = 0.05, 0.1
    gap, busy, after_reset = run_on_ranks(_pair_gap_body, 2, inner, outer)  # rank 0's
    assert 2 * inner <= gap < 2 * inner + outer, gap  # outer spans would add 4 x 0.1 s
    assert busy < inner, busy  # tiny GEMMs only
    assert after_reset == 0.0


def test_a_span_with_a_collective_inside_is_dropped():
    """A column layer that gathers its output and a row layer that splits its input (its backward
    gathers) put collectives inside the span: nothing of it is counted, forward or backward."""
    gap, _, _ = run_on_ranks(_pair_gap_body, 2, 0.05, 0.0, True)
    assert gap == 0.0, gap


def test_a_meter_that_does_not_mark_spans_is_never_told():
    """Outside re-sharding (``marks_spans`` unset: the resizing modes' meter) the layers run no span
    mark at all — on CUDA each would synchronise the device — so the same pair counts nothing."""
    gap, busy, _ = run_on_ranks(_pair_gap_body, 2, 0.05, 0.0, False, False)
    assert gap == 0.0, gap
    assert busy < 0.05, busy


def test_a_gap_is_counted_only_within_its_phase():
    """A span opened by a column forward and closed by a column backward (a head with
    ``gather_output`` before the loss) is dropped, as is a close with nothing open."""
    import time

    from semimig.straggler.busy import BusyMeter

    meter = BusyMeter()
    meter.close_gap("forward")  # nothing open
    meter.open_gap("forward")
    time.sleep(0.02)
    meter.close_gap("backward")  # another phase: dropped
    meter.close_gap("backward")
    assert meter.snapshot().paired_gap_s == 0.0
    meter.open_gap("backward")
    time.sleep(0.02)
    meter.close_gap("backward")
    assert meter.snapshot().paired_gap_s >= 0.02
