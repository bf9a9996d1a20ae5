"""Pure parts of ZERO-resizing: config, Eq. 1, lineage table, priority statistics (Alg. 1), PriDiff."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semimig.errors import ConfigError
from semimig.resizing.config import ResizingConfig
from semimig.resizing.lineage import LineageTable
from semimig.resizing.pridiff import (
    achieved_savings,
    candidate_shares,
    layer_thresholds,
    pridiff_ratios,
    pridiff_ratios_for_savings,
)
from semimig.resizing.priority import ColumnVariationTracker, PriorityList, column_variation, select_pruned
from semimig.resizing.ratio import columns_to_prune, pruning_ratio

# ---------------------------------------------------------------- config


def test_config_defaults_are_the_papers():
    c = ResizingConfig()
    assert (c.variant, c.gamma_max, c.impute, c.alpha, c.theta_iter) == ("pri", 0.9, "zero", 0.8, 1e-3)
    assert (c.empirical_gamma, c.period, c.theta_mode, c.theta_rel) == (0.5, None, "relative", 0.5)
    assert c.theta(200) == pytest.approx(0.2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(gamma_max=1.0), r"gamma_max must be a finite number >= 0 and < 1, got 1.0"),
        (dict(gamma_max=-0.1), r"gamma_max must be .*, got -0.1"),
        (dict(gamma_max=float("nan")), r"gamma_max must be .*, got nan"),
        (dict(gamma_max="0.5"), r"gamma_max must be .*, got '0.5'"),
        (dict(alpha=0.0), r"alpha must be a finite number > 0 and <= 1, got 0.0"),
        (dict(alpha=1.5), r"alpha must be .*, got 1.5"),
        (dict(theta_iter=-1e-3), "theta_iter must be a finite number >= 0, got -0.001"),
        (dict(theta_rel=0.0), "theta_rel must be a finite number > 0 and <= 10, got 0.0"),
        (dict(theta_mode="auto"), "theta_mode must be one of .* got 'auto'"),
        (dict(variant="prio"), "variant must be one of .* got 'prio'"),
        (dict(variant="pridiff_e"), "variant must be one of .* got 'pridiff_e'"),
        (dict(impute="mean"), "impute must be one of .* got 'mean'"),
        (dict(period=0), "period must be an int >= 1 or None, got 0"),
        (dict(period=2.5), "period must be an int >= 1 or None, got 2.5"),
        (dict(empirical_gamma=1.0), r"empirical_gamma must be .*, got 1.0"),
        (dict(seed=-1), "seed must be an int >= 0 .*, got -1"),
        (dict(seed=True), "seed must be an int >= 0 .*, got True"),
    ],
)
def test_config_rejects_bad_fields(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ResizingConfig(**kwargs)


# ---------------------------------------------------------------- Eq. 1


@pytest.mark.parametrize(
    "t_i, t_ref, m_i, gamma_max, expected",
    [
        (5.0, 3.0, 4.0, 0.9, 0.5),  # (5 - 3) / 4
        (4.0, 2.5, 4.0, 0.9, 0.375),  # chi = 4 vs 1 on two ranks, T_ref = mean = 2.5
        (4.0, 1.0, 4.0, 0.9, 0.75),  # the same against T_ref = min
        (10.0, 1.0, 4.0, 0.9, 0.9),  # 2.25 clamped to gamma_max
        (2.0, 3.0, 4.0, 0.9, 0.0),  # faster than the reference: no pruning
        (5.0, 3.0, 0.0, 0.9, 0.0),  # no GEMM time: nothing to prune
        (5.0, 3.0, -1.0, 0.9, 0.0),
        (5.0, 3.0, 4.0, 0.0, 0.0),  # gamma_max = 0 disables pruning
    ],
)
def test_pruning_ratio_matches_hand_computation(t_i, t_ref, m_i, gamma_max, expected):
    assert pruning_ratio(t_i, t_ref, m_i, gamma_max) == pytest.approx(expected)


def test_pruning_ratio_rejects_bad_inputs():
    with pytest.raises(ConfigError, match=r"gamma_max must be a finite number >= 0 and < 1, got 1"):
        pruning_ratio(1.0, 1.0, 1.0, 1)
    with pytest.raises(ValueError, match="t_i must be a finite number >= 0, got -1.0"):
        pruning_ratio(-1.0, 1.0, 1.0, 0.5)
    with pytest.raises(ConfigError, match="m_i must be a finite number, got nan"):
        pruning_ratio(1.0, 1.0, float("nan"), 0.5)
    with pytest.raises(ConfigError, match="gamma must be a finite number >= 0 and <= 1, got True"):
        pridiff_ratios([0.5], gamma=True, alpha=0.5, gamma_max=0.9)  # a bool is no ratio (PriDiff read it as 1)


@pytest.mark.parametrize("k, gamma, expected", [(10, 0.0, 0), (10, 0.5, 5), (10, 0.26, 3), (7, 0.9, 6), (0, 0.5, 0)])
def test_columns_to_prune_keeps_round_k_times_one_minus_gamma(k, gamma, expected):
    assert columns_to_prune(k, gamma) == expected


# ---------------------------------------------------------------- T_ref refresh


# ---------------------------------------------------------------- lineage


def test_lineage_records_looks_up_and_drops_old_iterations():
    table = LineageTable()
    p_q = torch.tensor([1, 4])
    p_fc = torch.tensor([0, 2, 3])
    table.record("attn", "query", p_q, 0, num_columns=8)
    table.record("mlp", "fc1", p_fc, 0, num_columns=6)
    assert torch.equal(table.lookup("attn", "query"), p_q)
    assert [(e.layer, e.matrix, e.iteration, e.pruned.tolist()) for e in table.entries()] == [
        ("attn", "query", 0, [1, 4]),
        ("mlp", "fc1", 0, [0, 2, 3]),
    ]
    table.record("attn", "query", torch.tensor([4, 5]), 1, num_columns=8)
    # bounded: iteration 0's index tensors are gone, only iteration 1's entry is held
    assert [(e.layer, e.iteration) for e in table.entries()] == [("attn", 1)]
    with pytest.raises(KeyError, match="no lineage entry for mlp.fc1 at iteration 1"):
        table.lookup("mlp", "fc1")
    # counts over the period: column 4 pruned in both iterations
    assert table.prune_counts("attn", "query").tolist() == [0, 1, 0, 0, 2, 1, 0, 0]
    assert table.period_iterations("attn", "query") == 2
    table.reset_period()
    assert table.prune_counts("attn", "query").sum() == 0
    assert table.lookup("attn", "query").tolist() == [4, 5]  # the current entry survives a period reset


def test_lineage_rerecord_in_the_same_iteration_replaces():
    table = LineageTable()
    table.record("l", "w", torch.tensor([0, 1]), 5, num_columns=4)
    table.record("l", "w", torch.tensor([2]), 5, num_columns=4)  # e.g. activation recompute
    assert table.lookup("l", "w").tolist() == [2]
    assert table.prune_counts("l", "w").tolist() == [0, 0, 1, 0]
    assert table.period_iterations("l", "w") == 1
    table.reset_period()
    table.record("l", "w", torch.tensor([3]), 5, num_columns=4)  # after a reset it counts afresh
    assert table.prune_counts("l", "w").tolist() == [0, 0, 0, 1]


@pytest.mark.parametrize(
    "pruned, iteration, num_columns, match",
    [
        (torch.tensor([0, 4]), 1, 4, r"must lie in \[0, 4\), got range \[0, 4\]"),
        (torch.tensor([2, 1]), 1, 4, "must be sorted and unique"),
        (torch.tensor([1, 1]), 1, 4, "must be sorted and unique"),
        (torch.tensor([[1]]), 1, 4, "must be a 1-D tensor"),
        (torch.tensor([1.0]), 1, 4, "must be integers, got dtype torch.float32"),
        (torch.tensor([1]), 0, 4, "iteration 0 for l.w is older than the table's iteration 1"),
        (torch.tensor([1]), 1, 5, "l.w was recorded with 4 columns, now 5"),
    ],
)
def test_lineage_rejects_bad_records(pruned, iteration, num_columns, match):
    table = LineageTable()
    table.record("l", "w", torch.tensor([0]), 1, num_columns=4)
    with pytest.raises(ValueError, match=match):
        table.record("l", "w", pruned, iteration, num_columns=num_columns)


# ---------------------------------------------------------------- selection


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.integers(0, 5), min_size=1, max_size=40),  # small ints: many ties
    frac=st.floats(0, 1),
    with_tie_break=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_pri_picks_exactly_the_smallest_deltas(values, frac, with_tie_break, seed):
    k = len(values)
    n = int(frac * k)
    delta = torch.tensor(values, dtype=torch.float64) / 7
    tie = torch.randint(0, 3, (k,), generator=torch.Generator().manual_seed(seed)) if with_tie_break else None
    got = select_pruned(delta, n, "pri", tie_break=tie)
    # independent reference: numpy lexsort on (delta, tie, index), last key is primary
    tie_np = tie.numpy() if tie is not None else np.zeros(k, dtype=np.int64)
    order = np.lexsort((np.arange(k), tie_np, delta.numpy()))
    assert got.tolist() == sorted(order[:n].tolist())
    assert got.dtype == torch.int64


def test_rd_is_a_seeded_uniform_subset():
    delta = torch.zeros(10)
    a = select_pruned(delta, 4, "rd", torch.Generator().manual_seed(3))
    b = select_pruned(delta, 4, "rd", torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.tolist() == sorted(set(a.tolist())) and len(a) == 4
    # over many draws every column gets pruned with frequency ~ 4/10 (binomial, 2000 draws: sd ~ 0.011)
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(10)
    for _ in range(2000):
        counts[select_pruned(delta, 4, "rd", g)] += 1
    assert ((counts / 2000 - 0.4).abs() < 0.05).all()


def test_select_pruned_rejects_bad_inputs():
    with pytest.raises(ValueError, match=r"n_prune must be an int >= 0 and <= 3, got 4"):
        select_pruned(torch.zeros(3), 4, "pri")
    with pytest.raises(ValueError, match="variant must be one of .* got 'best'"):
        select_pruned(torch.zeros(3), 1, "best")
    with pytest.raises(ValueError, match="delta contains NaN"):
        select_pruned(torch.tensor([0.0, float("nan")]), 1, "pri")


# ---------------------------------------------------------------- variation statistics


def test_column_variation_matches_a_float64_loop():
    """float32 on the weight's device: within float32's rounding of the exact (float64) mean."""
    g = torch.Generator().manual_seed(0)
    old, new = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    expected = [sum(abs(float(new[n, c]) - float(old[n, c])) for n in range(5)) / 5 for c in range(7)]
    variation = column_variation(new, old)
    assert variation.dtype == torch.float32
    assert variation.tolist() == pytest.approx(expected, rel=1e-6)


def test_tracker_methods_and_incremental_update():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(4, 6, generator=g)
    snap = ColumnVariationTracker(w, method="snapshot")
    step = ColumnVariationTracker(w, method="per_step")
    assert torch.isinf(snap.delta).all()  # never measured: never preferred for pruning
    history = [w.clone()]
    for _ in range(3):
        w = w + 0.1 * torch.randn(4, 6, generator=g)
        history.append(w.clone())
        snap.observe_step(w)
        step.observe_step(w)
    d_snap = snap.end_period(w)
    d_step = step.end_period(w)
    assert d_snap.tolist() == pytest.approx(column_variation(history[-1], history[0]).tolist())
    per_step = sum(column_variation(history[t + 1], history[t]) for t in range(3))
    assert d_step.tolist() == pytest.approx(per_step.tolist())
    assert all(t.device == w.device for t in snap.storage())  # everything where the weight lives
    # second period: columns 1 and 4 were pruned -> keep their old delta, the rest is re-measured
    w2 = w + 0.3
    pruned = torch.tensor([False, True, False, False, True, False])
    d2 = snap.end_period(w2, pruned)
    assert d2[pruned].tolist() == d_snap[pruned].tolist()
    assert d2[~pruned].tolist() == pytest.approx([0.3] * 4)


def _simulate(periods: int, *, incremental: bool, tie_break: bool) -> torch.Tensor:
    """Equal variations: every kept column moves by the same step, pruned (zero-imputed) ones do not.

    The step is a power of two, so the variations tie exactly and the tie-break (past prune
    counts) decides.  Returns ``[periods, K]`` bool: column kept in that period.
    """
    k, n_prune, steps = 8, 3, 4
    w = torch.zeros(2, k)
    tracker = ColumnVariationTracker(w)
    counts = torch.zeros(k, dtype=torch.int64)
    kept_log = []
    for _ in range(periods):
        pruned = select_pruned(tracker.delta, n_prune, "pri", tie_break=counts if tie_break else None)
        mask = torch.zeros(k, dtype=torch.bool)
        mask[pruned] = True
        for _ in range(steps):
            w = w + torch.where(mask, 0.0, 2.0**-6)  # zero imputation: pruned ones do not move; exact in fp32
            tracker.observe_step(w)
        tracker.end_period(w, mask if incremental else None)
        counts += mask
        kept_log.append(~mask)
    return torch.stack(kept_log)


def test_every_column_is_kept_over_several_periods():
    kept = _simulate(6, incremental=True, tie_break=True)
    assert kept.any(dim=0).all()  # no "once pruned, always pruned"
    pruned_counts = (~kept).sum(dim=0)
    assert int(pruned_counts.max() - pruned_counts.min()) <= 1  # equal variation -> round-robin
    # Control: a full (non-incremental) update re-prunes the same columns forever.
    stuck = _simulate(6, incremental=False, tie_break=True)
    assert not stuck[1:].any(dim=0).all()


# ---------------------------------------------------------------- PriDiff


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 20), min_size=1, max_size=5),
    gamma=st.floats(0, 1),
    alpha=st.floats(0.01, 1),
    theta=st.floats(0, 1),
    gamma_max=st.floats(0, 0.99),
    seed=st.integers(0, 2**16),
)
def test_pridiff_ratios_respect_the_floor_and_the_clamp(sizes, gamma, alpha, theta, gamma_max, seed):
    g = torch.Generator().manual_seed(seed)
    deltas = [torch.rand(n, generator=g, dtype=torch.float64) for n in sizes]
    shares = candidate_shares(deltas, [theta] * len(deltas))
    got = pridiff_ratios(shares, gamma=gamma, alpha=alpha, gamma_max=gamma_max)
    for delta, gk in zip(deltas, got):
        if gamma == 0:
            assert gk == 0.0
            continue
        share = sum(1 for d in delta.tolist() if d < theta) / len(delta)
        assert gk == pytest.approx(min(max(share, alpha * gamma), gamma_max))
        assert gk >= min(alpha * gamma, gamma_max) - 1e-12 and gk <= gamma_max


def test_pridiff_hand_example_and_savings():
    deltas = [torch.tensor([0.0, 0.1, 0.5, 0.9]), torch.tensor([0.5, 0.6, 0.7, 0.8])]
    # theta = 0.2: layer 0 has 2/4 columns below, layer 1 none; alpha * gamma = 0.8 * 0.5 = 0.4
    shares = candidate_shares(deltas, [0.2, 0.2])
    assert shares == [0.5, 0.0]
    assert pridiff_ratios(shares, gamma=0.5, alpha=0.8, gamma_max=0.9) == pytest.approx([0.5, 0.4])
    assert pridiff_ratios(shares, gamma=0.5, alpha=0.8, gamma_max=0.45) == pytest.approx([0.45, 0.4])
    # savings weighted by FLOPs: (0.5 * 3 + 0.4 * 1) / 4
    assert achieved_savings([0.5, 0.4], [3.0, 1.0]) == pytest.approx(0.475)
    assert achieved_savings([0.5], [0.0]) == 0.0
    with pytest.raises(ValueError, match="got 2 ratios for 1 layers"):
        achieved_savings([0.5, 0.4], [1.0])
    with pytest.raises(ValueError, match=r"alpha must be a finite number > 0 and <= 1, got 0"):
        pridiff_ratios(shares, gamma=0.5, alpha=0, gamma_max=0.9)


@settings(max_examples=80, deadline=None)
@given(shares=st.lists(st.floats(0, 1), min_size=1, max_size=6), gamma=st.floats(0.01, 0.9),
       alpha=st.floats(0.1, 1), seed=st.integers(0, 100))
def test_pridiff_r_savings_follow_eq1_above_the_floor(shares, gamma, alpha, seed):
    """PriDiff-R: savings reach the Eq. 1 share whenever gamma_max allows, never below the paper's ratios."""
    flops = [float(1 + (seed * (i + 3)) % 7) for i in range(len(shares))]
    paper = pridiff_ratios(shares, gamma=gamma, alpha=alpha, gamma_max=0.9)
    got = pridiff_ratios_for_savings(shares, flops, gamma=gamma, alpha=alpha, gamma_max=0.9)
    assert all(g >= p - 1e-12 and g <= 0.9 for g, p in zip(got, paper))
    assert achieved_savings(got, flops) >= min(gamma, 0.9) - 1e-9
    if achieved_savings(paper, flops) < gamma:  # raised just enough: one common floor, candidates above it
        floor = min(g for g, s in zip(got, shares) if g > s) if any(g > s for g, s in zip(got, shares)) else None
        assert floor is None or achieved_savings(got, flops) == pytest.approx(gamma, abs=1e-6)


def test_relative_threshold_is_scale_free():
    from semimig.resizing import ResizingConfig

    delta = torch.tensor([0.1, 0.2, 0.4, 0.8, 1.6], dtype=torch.float64)
    cfg = ResizingConfig()  # relative, 0.5 x median = 0.2: one column (0.1) below
    for scale in (1e-6, 1.0, 1e3):
        thetas = layer_thresholds([delta * scale], cfg, period=10)
        assert thetas[0] == pytest.approx(0.2 * scale)
        assert candidate_shares([delta * scale], thetas) == [0.2]
    absolute = ResizingConfig(theta_mode="absolute", theta_iter=1e-3)
    assert layer_thresholds([delta], absolute, period=10) == [pytest.approx(0.01)]
    never = torch.full((4,), float("inf"), dtype=torch.float64)  # no measured column: no candidate
    assert candidate_shares([never], layer_thresholds([never], cfg, period=10)) == [0.0]


def test_algorithm1_measures_every_column_within_bounded_periods():
    """A straggler pruning 7/8 of its columns from the first period (no statistics yet).

    With one list per period and ties broken by *earlier* periods' counts, the never-measured
    columns take turns across periods and every column is measured within K/(K - |P|) + 1
    periods; pruned columns keep their old delta (incremental update).
    """
    k, n_prune, steps = 16, 14, 3
    w = torch.zeros(4, k)
    plist = PriorityList(w)
    bound = k // (k - n_prune) + 1
    for period in range(bound):
        pruned = plist.select(k, n_prune)
        assert torch.equal(pruned, plist.select(k, n_prune))  # one list for the whole period
        mask = torch.zeros(k, dtype=torch.bool)
        mask[pruned] = True
        for _ in range(steps):
            w = w + torch.where(mask, 0.0, 2.0**-5 * (1 + torch.arange(k)))  # unequal moves, pruned ones frozen
        plist.end_period(w, mask.to(torch.int64) * steps)
    assert torch.isfinite(plist.delta).all(), plist.delta
    # a list restricted to own columns (migration) keeps the order
    assert plist.select(8, 3).max() < 8

    # Control: ties broken by *this* period's counts (the old rotation) prune every never-measured
    # column at some iteration of every period, so none of them is ever measured.
    tracker, w = ColumnVariationTracker(torch.zeros(4, k)), torch.zeros(4, k)
    for period in range(bound):
        counts = torch.zeros(k, dtype=torch.int64)
        for _ in range(steps):
            pruned = select_pruned(tracker.delta, n_prune, "pri", tie_break=counts)
            counts[pruned] += 1
            w = w + torch.where(counts > 0, 0.0, 2.0**-5)
        tracker.end_period(w, counts > 0)
    assert torch.isinf(tracker.delta).sum() >= n_prune - 2


@pytest.mark.parametrize("revisit", [True, False])
def test_pruned_columns_are_revisited_instead_of_staying_pruned_on_an_old_delta(revisit):
    """A learning rate that drops 10x between periods: the columns pruned in period 2 keep their
    period-1 delta (incremental update), which is smaller than any fresh one.  The paper's list
    (``revisit=False``, the control) prunes the same columns again, period after period; with
    ``revisit`` the columns computed in period 2 go first and the pruned ones are computed again."""
    k, n_prune = 8, 3
    moves_1 = torch.tensor([0.01, 0.02, 0.03, 0.5, 0.6, 0.7, 0.8, 0.9], dtype=torch.float64)
    w = torch.zeros(2, k, dtype=torch.float64)
    plist = PriorityList(w, revisit=revisit)
    w = w + moves_1
    plist.end_period(w, None)  # period 1: nobody pruned, every column measured
    first = plist.select(k, n_prune)
    assert first.tolist() == [0, 1, 2]
    counts = torch.zeros(k, dtype=torch.int64)
    counts[first] = 5
    w = w + torch.where(counts > 0, 0.0, moves_1 / 10)  # period 2: the others move 10x less
    plist.end_period(w, counts)
    assert plist.delta[:3].tolist() == pytest.approx([0.01, 0.02, 0.03])  # the paper's incremental delta is kept
    second = plist.select(k, n_prune).tolist()
    assert second == ([3, 4, 5] if revisit else [0, 1, 2])
    # a rank that must prune more than it computed last period prunes some of the old ones again
    assert plist.select(k, 6).tolist() == ([0, 3, 4, 5, 6, 7] if revisit else [0, 1, 2, 3, 4, 5])


def test_revisit_must_be_a_bool():
    from semimig.errors import ConfigError

    with pytest.raises(ValueError, match="revisit must be a bool, got 1"):
        PriorityList(torch.zeros(2, 4), revisit=1)
    with pytest.raises(ConfigError, match="revisit_pruned must be a bool, got 'yes'"):
        ResizingConfig(revisit_pruned="yes")


@pytest.mark.parametrize("optimizer_name", ["SGD", "AdamW"])
def test_relative_threshold_selects_a_proper_share_under_sgd_and_adamw(optimizer_name):
    """A real training run (linear regression on fresh mini-batches, 25 steps = one
    period) in which the target depends on 3/4 of the input columns: those weights move steadily,
    the other quarter only random-walks, so the columns move unequally.  Under both optimizers
    the relative threshold makes some but not all columns candidates (share strictly in (0, 1):
    the random-walking quarter), while the paper's absolute θ (25 × 1e-3) calls every column
    unchanged under AdamW, which moves a weight by about lr per step whatever its gradient."""
    from semimig.resizing import ResizingConfig
    from semimig.resizing.priority import ColumnVariationTracker

    torch.manual_seed(0)
    n, k, steps = 16, 64, 25
    informative = 3 * k // 4
    w_true = torch.randn(informative, n)
    layer = torch.nn.Linear(k, n, bias=False)
    opt = (torch.optim.SGD(layer.parameters(), lr=1e-2) if optimizer_name == "SGD"
           else torch.optim.AdamW(layer.parameters(), lr=1e-3, weight_decay=0.0))
    tracker = ColumnVariationTracker(layer.weight)
    for _ in range(steps):
        x = torch.randn(64, k)
        opt.zero_grad()
        torch.nn.functional.mse_loss(layer(x), x[:, :informative] @ w_true).backward()
        opt.step()
        tracker.observe_step(layer.weight)
    delta = tracker.end_period(layer.weight)
    assert torch.isfinite(delta).all() and float(delta.max()) > 4 * float(delta.min()) > 0  # unequal moves

    share = candidate_shares([delta], layer_thresholds([delta], ResizingConfig(), period=steps))[0]
    assert 0.0 < share < 1.0
    assert 0.15 <= share <= 0.3  # the random-walking quarter, not the steadily trained columns
    absolute = ResizingConfig(theta_mode="absolute", theta_iter=1e-3)
    share_abs = candidate_shares([delta], layer_thresholds([delta], absolute, period=steps))[0]
    if optimizer_name == "AdamW":
        assert share_abs == 1.0
