"""Paired pruning of an MLP: the row layer keeps units ``S`` and receives them compact,
the column layers compute only rows ``S``.

Oracles: the same MLP with the column layers dense and the row layer pruned to ``S`` the usual way
(gather path), and a dense single-process MLP whose pruned units' down-projection columns are
zeroed — both from the same seed.  The paired path must give the same output, input gradient and
weight gradients (the pruned rows' and columns' gradients exact zeros).
"""
import contextlib
import copy
import logging
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dist_harness import run_pooled

ATOL = 1e-5  # fp32: the same sums over the kept units, associated differently (sharded, fewer terms)


def _keep(units: int, rank: int, empty_rank=None) -> torch.Tensor:
    """A rank's kept units: a fixed draw of about half, sorted (seeded by the rank); none on ``empty_rank``."""
    if rank == empty_rank:
        return torch.empty(0, dtype=torch.long)
    gen = torch.Generator().manual_seed(11 + rank)
    return torch.sort(torch.randperm(units, generator=gen)[: units // 2 + rank]).values


def _forward(gate, up, down, x, gated: bool):
    h = F.silu(gate(x)) * up(x) if gated else F.gelu(gate(x))
    return down(h)


class _MarkingReflex:
    """The step reflex's hook as a paired layer sees it: every call is marked, none may be pruned further."""

    def __init__(self):
        self.marks = 0

    def mark_call(self):
        self.marks += 1

    def keep(self, planned_kept, forward):
        raise AssertionError("a paired call asked the reflex for a keep set")


def _paired_body(rank, world, gated: bool, impute: str, empty_rank=None):
    import semimig.nn as snn
    from semimig.nn.directive import LayerDirective

    torch.manual_seed(0)
    hidden, inter = 8, 16
    fc_gate, fc_up = nn.Linear(hidden, inter, bias=not gated), nn.Linear(hidden, inter, bias=not gated)
    fc_down = nn.Linear(inter, hidden, bias=not gated)
    x = torch.randn(3, 5, hidden)
    group = dist.group.WORLD

    def build():
        return (snn.Linear1D_Col.from_native_module(copy.deepcopy(fc_gate), group),
                snn.Linear1D_Col.from_native_module(copy.deepcopy(fc_up), group),
                snn.Linear1D_Row.from_native_module(copy.deepcopy(fc_down), group))

    local = inter // world
    keep = _keep(local, rank, empty_rank)
    runs = {}
    for paired in (True, False):
        gate, up, down = build()
        if paired:
            reflex = _MarkingReflex()
            gate.directive = LayerDirective(iteration=0, rows=keep, impute=impute, reflex=reflex)
            up.directive = LayerDirective(iteration=0, rows=keep, impute=impute, reflex=reflex)
            down.directive = LayerDirective(iteration=0, keep=keep, compact_input=True, impute=impute, reflex=reflex)
            assert gate(x).shape == (3, 5, keep.numel())  # compact: only the kept units
        else:  # the oracle: column layers dense, the row layer pruned to the same units (gather path)
            down.directive = LayerDirective(iteration=0, keep=keep, impute=impute)
        xi = x.clone().requires_grad_(True)
        y = _forward(gate, up if gated else None, down, xi, gated)
        y.square().sum().backward()
        if paired:  # the shape check's forward, then the pair's forwards and backwards: each call marked once
            assert reflex.marks == 1 + 2 * (3 if gated else 2), reflex.marks
        runs[paired] = (y.detach(), xi.grad, gate.weight.grad, up.weight.grad if gated else None, down.weight.grad,
                        None if gated else (gate.bias.grad, down.bias.grad))
    (y, dx, dgate, dup, ddown, biases), (y_o, dx_o, dgate_o, dup_o, ddown_o, biases_o) = runs[True], runs[False]
    torch.testing.assert_close(y, y_o, atol=ATOL, rtol=0)
    torch.testing.assert_close(dx, dx_o, atol=ATOL, rtol=0)
    torch.testing.assert_close(ddown, ddown_o, atol=ATOL, rtol=0)
    torch.testing.assert_close(dgate, dgate_o, atol=ATOL, rtol=0)
    if gated:
        torch.testing.assert_close(dup, dup_o, atol=ATOL, rtol=0)
    else:
        for a, b in zip(biases, biases_o):
            torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    pruned = sorted(set(range(local)) - set(keep.tolist()))
    assert dgate[pruned].abs().sum() == 0 and (keep.numel() == 0 or dgate[keep].abs().sum() > 0)  # zeros pruned
    if impute == "zero":
        assert ddown[:, pruned].abs().sum() == 0

    # The dense single-process reference: the pruned units' down columns zeroed, every rank's units.
    kept_global = torch.cat([_keep(local, r, empty_rank) + r * local for r in range(world)])
    mask = torch.zeros(inter)
    mask[kept_global] = 1.0
    ref_down = copy.deepcopy(fc_down)
    with torch.no_grad():
        ref_down.weight.mul_(mask)
    xr = x.clone().requires_grad_(True)
    yr = _forward(fc_gate, fc_up if gated else None, ref_down, xr, gated)
    yr.square().sum().backward()
    torch.testing.assert_close(y, yr.detach(), atol=ATOL, rtol=0)
    torch.testing.assert_close(dx, xr.grad, atol=ATOL, rtol=0)
    torch.testing.assert_close(dgate, fc_gate.weight.grad.chunk(world, 0)[rank], atol=ATOL, rtol=0)
    if impute == "zero":
        expected = (ref_down.weight.grad * mask).chunk(world, 1)[rank]
        torch.testing.assert_close(ddown, expected, atol=ATOL, rtol=0)
    return True


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("gated,impute", [(True, "zero"), (False, "zero"), (True, "average")])
def test_paired_mlp_equals_the_row_layer_pruned_alone_and_the_dense_mlp_of_the_kept_units(world, gated, impute):
    assert run_pooled(_paired_body, world, gated, impute)


@pytest.mark.parametrize("world", [1, 2])
def test_a_rank_that_keeps_no_unit_of_a_pair_computes_nothing_and_stays_exact(world):
    """A full prune (γ = 1, e.g. ``force(prune={1: 1.0})``): the last rank's pair keeps no unit, its
    activation is ``[M, 0]``; its outputs and gradients still equal the oracle and the dense reference
    (the row layer's flattening of a zero-width input failed here once pairing became the default)."""
    assert run_pooled(_paired_body, world, True, "zero", world - 1)


def test_a_paired_directive_refuses_what_it_cannot_serve():
    from semimig.errors import ConfigError
    from semimig.nn.directive import LayerDirective

    keep = torch.tensor([0, 2])
    with pytest.raises(ConfigError, match="keeps its whole K"):
        LayerDirective(iteration=0, rows=keep, keep=keep)
    with pytest.raises(ConfigError, match="compact_input needs the keep set"):
        LayerDirective(iteration=0, compact_input=True)
    with pytest.raises(ConfigError, match=r"rows must be a 1-D int32/int64 tensor, got torch.float32"):
        LayerDirective(iteration=0, rows=torch.tensor([0.0, 1.0]))
    with pytest.raises(ConfigError, match="cannot migrate"):
        LayerDirective(iteration=0, keep=keep, compact_input=True, layout=object())


def _wrong_width_body(rank, world):
    import semimig.nn as snn
    from semimig.errors import ConfigError
    from semimig.nn.directive import LayerDirective

    torch.manual_seed(0)
    down = snn.Linear1D_Row.from_native_module(nn.Linear(8, 4), dist.group.WORLD)
    down.directive = LayerDirective(iteration=0, keep=torch.tensor([0, 1, 5]), compact_input=True)
    try:
        down(torch.randn(2, 8 // world))  # the full input: the column layers were not paired
    except ConfigError as err:
        return str(err)
    return "no error"


def test_a_paired_row_layer_given_its_full_input_names_the_width():
    message = run_pooled(_wrong_width_body, 2)
    assert "expects inputs of width 3" in message and "(2, 4)" in message, message


@contextlib.contextmanager
def _records(logger_name: str):
    """The records ``logger_name`` emits at INFO and above inside the block."""
    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    records, logger, handler = [], logging.getLogger(logger_name), Keep(logging.INFO)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _binding_body(rank, world, name):
    """A tiny Llama / Qwen2 / Mistral / GPT-2 under HybridParallelPlugin(tp=2) with SemiMigPolicy, three
    AdamW steps with every layer's directive from a real LayerBinding: paired (uniform γ) against the unpaired binding
    with the MLP's column layers at γ 0 (the oracle: the row layers pruned alone, to the same units)."""
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    from semimig.controller.binding import LayerBinding
    from semimig.resizing.config import ResizingConfig
    from semimig.shardformer import SemiMigPolicy
    from tiny_lms import tiny_lm, token_batch, train_steps

    gamma, runs = 0.5, {}
    for paired in (True, False):
        plugin = HybridParallelPlugin(tp_size=world, pp_size=1, precision="fp32", custom_policy=SemiMigPolicy())
        booster = Booster(plugin=plugin)
        model = tiny_lm(name)
        model, optimizer, *_ = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
        with _records("semimig.controller.binding") as said:
            binding = LayerBinding(model, ResizingConfig(paired=paired), (), prioritized=True, rank=rank)
            columns = {b.name for p in LayerBinding(model, ResizingConfig(paired=True), (), prioritized=True,
                                                    rank=rank).pairs for b in p.columns}
        # the pairing is said once per model: paired, both bindings pair it (a re-plan rebuilds the binding)
        messages = [r.getMessage() for r in said]
        assert len(messages) == 1 and messages[0].startswith("paired pruning: 2 MLPs prune as pairs ("), messages
        if paired:
            assert [p.name.rsplit(".", 2)[-2:] for p in binding.pairs] == [["0", "mlp"], ["1", "mlp"]], binding.pairs
        gammas = [0.0 if (not paired and b.name in columns) else gamma for b in binding.layers]

        def step_with_directives(step):
            binding.apply(iteration=step, gammas=gammas, migrate={}, receivers=None, group_size=world, rank=rank,
                          exchange=None, meter=None)
            return step

        losses = [train_steps(booster, model, optimizer, [step_with_directives(s)], lambda _: token_batch(0))[0]
                  for s in range(3)]  # one batch: the loss must fall
        kinds = {b.name: (b.layer.directive.rows is not None, b.layer.directive.compact_input) for b in binding.layers}
        # the SEMI pretest times each layer on the path it prunes along
        paths = {name.rsplit(".", 1)[-1]: path for name, (*_, path) in zip((b.name for b in binding.layers),
                                                                           binding.pretest_shapes())}
        expected = {"gather"} if not paired else ({"rows", "compact", "gather"})
        assert set(paths.values()) == expected, paths
        if paired:
            assert paths[min(columns).rsplit(".", 1)[-1]] == "rows", (paths, columns)
        runs[paired] = (losses, kinds, columns)
    (paired_losses, kinds, columns), (oracle_losses, _, _) = runs[True], runs[False]
    assert all(kinds[c] == (True, False) for c in columns), kinds  # the MLP's column layers computed rows only
    assert sum(compact for _, compact in kinds.values()) == 2, kinds  # one compact row layer per MLP
    torch.testing.assert_close(paired_losses, oracle_losses, atol=1e-5, rtol=1e-5)
    return paired_losses


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral", "gpt2"])
def test_a_binding_prunes_each_mlp_as_a_pair_and_trains_like_its_row_layers_pruned_alone(name):
    losses = run_pooled(_binding_body, 2, name, timeout_s=120)
    assert len(losses) == 3 and losses[-1] < losses[0]


def _reflex_body(rank, world):
    """Once the step reflex has fired before an MLP starts, the MLP runs the rest of the step paired at
    the fired γ (its pre-hook swaps the pair's dense directives): the losses equal a plan that pairs
    every MLP at that γ from the start (the attention layers prune their own K alike in both: the
    reflex's keep sets are the plan's), and the next apply restores the dense directives."""
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    from semimig.controller.binding import LayerBinding
    from semimig.controller.reflex import ReflexConfig, StepReflex
    from semimig.resizing.config import ResizingConfig
    from semimig.shardformer import SemiMigPolicy
    from semimig.straggler.busy import BusyMeter
    from tiny_lms import tiny_lm, token_batch, train_steps

    gamma, runs = 0.5, {}
    for how in ("reflex", "planned"):
        plugin = HybridParallelPlugin(tp_size=world, pp_size=1, precision="fp32", custom_policy=SemiMigPolicy())
        booster = Booster(plugin=plugin)
        model = tiny_lm("llama")
        model, optimizer, *_ = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
        binding = LayerBinding(model, ResizingConfig(paired=True), (), prioritized=True, rank=rank)
        reflex, meter = StepReflex(ReflexConfig(), gamma_max=0.9), BusyMeter()
        binding.attach_reflex(reflex, meter)
        losses, kinds = [], []
        for step in range(2):
            gammas = [gamma if how == "planned" else 0.0] * len(binding.layers)
            binding.apply(iteration=step, gammas=gammas, migrate={}, receivers=None, group_size=world, rank=rank,
                          exchange=None, meter=meter)
            reflex.begin_step(armed=True)
            if how == "reflex":
                reflex.gamma = gamma  # fired before the first MLP (what a slow attention call would do)
            losses += train_steps(booster, model, optimizer, [step], lambda _: token_batch(0))
            kinds.append(sorted(b.name.rsplit(".", 1)[-1] for b in binding.layers if b.layer.directive.rows is not None
                                or b.layer.directive.compact_input))
            reflex.end_step(meter.busy_s)
            meter.reset()
        binding.apply(iteration=2, gammas=[0.0] * len(binding.layers), migrate={}, receivers=None, group_size=world,
                      rank=rank, exchange=None, meter=meter)
        restored = all(b.layer.directive is b.timed_only for b in binding.layers)
        rows = [e.matrix for e in binding.lineage.entries()]
        runs[how] = (losses, kinds, restored, rows)
    (reflex_losses, kinds, restored, rows), (planned_losses, planned_kinds, _, _) = runs["reflex"], runs["planned"]
    assert kinds == planned_kinds == [["down_proj", "down_proj", "gate_proj", "gate_proj", "up_proj", "up_proj"]] * 2
    assert restored and "weight.rows" in rows
    torch.testing.assert_close(reflex_losses, planned_losses, atol=1e-5, rtol=1e-5)
    return True


def test_a_fired_reflex_pairs_the_mlps_it_reaches_like_a_planned_paired_prune():
    assert run_pooled(_reflex_body, 2, timeout_s=120)


# --------------------------------------------------------------------------- the pair's functions, the pretest
def test_the_pair_functions_equal_the_dense_products_of_the_kept_rows_and_columns():
    from semimig.kernels import plan_keep
    from semimig.kernels.reference import compact_linear_fwd, compact_linear_wgrad, rows_linear_fwd, rows_linear_wgrad

    gen = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(6, 10, generator=gen), torch.randn(8, 10, generator=gen), torch.randn(8, generator=gen)
    rows = torch.tensor([1, 2, 6])
    w_rows, y = rows_linear_fwd(x, w, b, rows)
    torch.testing.assert_close(y, F.linear(x, w, b)[:, rows], atol=ATOL, rtol=0.0)
    torch.testing.assert_close(w_rows, w[rows], atol=0.0, rtol=0.0)
    dy = torch.randn(6, 3, generator=gen)
    expected = torch.zeros(8, 10)
    expected[rows] = dy.t() @ x
    torch.testing.assert_close(rows_linear_wgrad(dy, x, rows, 8), expected, atol=ATOL, rtol=0.0)
    for keep in (torch.tensor([0, 3, 4, 9]), torch.tensor([2, 3, 4])):  # scattered, and a contiguous run (a view)
        plan = plan_keep(keep, 10, torch.device("cpu"), group=1)
        w_kept, y = compact_linear_fwd(x[:, keep], w, plan)
        torch.testing.assert_close(y, x[:, keep] @ w[:, keep].t(), atol=ATOL, rtol=0.0)
        dy = torch.randn(6, 8, generator=gen)
        expected = torch.zeros(8, 10)
        expected[:, keep] = dy.t() @ x[:, keep]
        torch.testing.assert_close(compact_linear_wgrad(dy, x[:, keep], plan), expected, atol=ATOL, rtol=0.0)
        torch.testing.assert_close(dy @ w_kept, dy @ w[:, keep], atol=ATOL, rtol=0.0)


def _paired_pretest_body(rank, world):
    from semimig.controller.pretest import PretestRun
    from semimig.straggler.busy import BusyMeter

    meter = BusyMeter()
    # N 10 against K 16: a rows task prunes round(10 (1 - s)) of N, not K; the gather shape is the compact one's
    shapes = [(8, 10, 16, "rows"), (8, 10, 16, "rows"), (8, 16, 10, "compact"), (8, 16, 10)]
    run = PretestRun(shapes, dist.group.WORLD, repeats=1, gemm_timer=meter)
    work = {}
    while run.remaining:
        kind, share, _, shape = run.tasks[run.position]
        meter.reset()
        samples = run.advance(1)
        done = meter.snapshot()
        work[kind, share, run.tensors[shape][4]] = (done.gemm_count, done.work_fraction)
    return len(run.tasks), work, samples


def test_the_pretest_times_a_paired_mlp_on_its_own_path_with_the_same_work():
    tasks, work, samples = run_pooled(_paired_pretest_body, 1, timeout_s=120)
    assert tasks == 4 * 3 * 3  # kinds x shares x distinct (shape, path): the compact and gather shapes apart
    for share in (0.25, 0.5, 0.75):
        for path in ("rows", "compact", "gather"):
            units, k = (10, 16) if path == "rows" else (10, 10)
            # three GEMMs charged the work of what they keep: rows (1 - s) N, the others (1 - s) K
            assert work["pruned", share, path] == (3, pytest.approx(round(units * (1 - share)) / units)), \
                (share, path, work["pruned", share, path])
            assert work["kept", share, path] == (3, pytest.approx(round(k * (1 - share)) / k)), (share, path)
    assert all(v >= 0.0 for v in samples["omega2"][1]) and samples["omega1"][0] >= 0.0


@pytest.mark.parametrize("shape, named", [((8, 16, 16, "paired"), "'paired'"), ((8, 16), "(8, 16)")])
def test_a_pretest_shape_with_a_bad_path_names_it(shape, named):
    from semimig.controller.pretest import PretestRun

    with pytest.raises(ValueError, match=re.escape(named)):
        PretestRun([shape], None)
