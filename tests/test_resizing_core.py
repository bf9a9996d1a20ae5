"""Pure parts of ZERO-resizing: config, Eq. 1, T_ref refresh, lineage table, priority statistics."""
from __future__ import annotations


import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_harness import run_on_ranks
from semimig.resizing.config import ResizingConfig
from semimig.resizing.lineage import LineageTable
from semimig.resizing.priority import (
    ColumnVariationTracker,
    achieved_savings,
    column_variation,
    pridiff_ratios,
    select_pruned,
)
from semimig.resizing.ratio import ReferenceTime, columns_to_prune, pruning_ratio, refresh_reference

# ---------------------------------------------------------------- config


def test_config_defaults_are_the_papers():
    c = ResizingConfig()
    assert (c.variant, c.gamma_max, c.impute, c.alpha, c.theta_iter) == ("pri", 0.9, "zero", 0.8, 1e-3)
    assert (c.refresh_threshold, c.t_ref, c.empirical_gamma, c.period) == (0.10, "mean", 0.5, None)
    assert c.theta(200) == pytest.approx(0.2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(gamma_max=1.0), r"gamma_max must be in \[0, 1\), got 1.0"),
        (dict(gamma_max=-0.1), r"gamma_max must be in \[0, 1\), got -0.1"),
        (dict(gamma_max=float("nan")), r"gamma_max must be in \[0, 1\), got nan"),
        (dict(alpha=0.0), r"alpha must be in \(0, 1\], got 0.0"),
        (dict(alpha=1.5), r"alpha must be in \(0, 1\], got 1.5"),
        (dict(theta_iter=-1e-3), "theta_iter must be a finite number >= 0, got -0.001"),
        (dict(variant="prio"), "variant must be one of .* got 'prio'"),
        (dict(variant="pridiff_e"), "variant must be one of .* got 'pridiff_e'"),
        (dict(impute="mean"), "impute must be one of .* got 'mean'"),
        (dict(t_ref="max"), "t_ref must be one of .* got 'max'"),
        (dict(period=0), "period must be an int >= 1 or None, got 0"),
        (dict(period=2.5), "period must be an int >= 1 or None, got 2.5"),
        (dict(refresh_threshold=0.0), "refresh_threshold must be a finite number > 0, got 0.0"),
        (dict(empirical_gamma=1.0), r"empirical_gamma must be in \[0, 1\), got 1.0"),
        (dict(seed=-1), "seed must be an int >= 0, got -1"),
        (dict(seed=True), "seed must be an int >= 0, got True"),
    ],
)
def test_config_rejects_bad_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
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
    with pytest.raises(ValueError, match=r"gamma_max must be in \[0, 1\), got 1"):
        pruning_ratio(1.0, 1.0, 1.0, 1)
    with pytest.raises(ValueError, match="t_i must be a finite number >= 0, got -1.0"):
        pruning_ratio(-1.0, 1.0, 1.0, 0.5)
    with pytest.raises(ValueError, match="m_i must be a number, got nan"):
        pruning_ratio(1.0, 1.0, float("nan"), 0.5)


@pytest.mark.parametrize("k, gamma, expected", [(10, 0.0, 0), (10, 0.5, 5), (10, 0.26, 3), (7, 0.9, 6), (0, 0.5, 0)])
def test_columns_to_prune_keeps_round_k_times_one_minus_gamma(k, gamma, expected):
    assert columns_to_prune(k, gamma) == expected


# ---------------------------------------------------------------- T_ref refresh


def test_reference_time_refreshes_on_relative_moves_only():
    ref = ReferenceTime(threshold=0.10, reduce="mean")
    assert ref.needs_refresh(1.0)  # never refreshed
    assert ref.apply_refresh(1.0, [1.0, 2.0, 4.0]) == pytest.approx(7 / 3)
    assert not ref.needs_refresh(1.09) and not ref.needs_refresh(0.91)
    assert ref.needs_refresh(1.11) and ref.needs_refresh(0.89)
    mins = ReferenceTime(reduce="min")
    assert mins.apply_refresh(2.0, [3.0, 2.0, 5.0]) == 2.0
    with pytest.raises(ValueError, match="reduce must be 'mean' or 'min', got 'max'"):
        ReferenceTime(reduce="max")
    with pytest.raises(ValueError, match="threshold must be a number > 0, got 0"):
        ReferenceTime(threshold=0)


def _times(rank: int, world_size: int, iteration: int) -> float:
    """Rank (world_size - 1) slows by 20 % from iteration 3; everybody else drifts by < 10 %."""
    base = 1.0 + rank
    if rank == world_size - 1 and iteration >= 3:
        return base * 1.2
    return base * (1.0 + 0.01 * iteration)


def _refresh_body(rank: int, world_size: int, reduce: str) -> list[list[tuple[float, int]]]:
    tracker = ReferenceTime(threshold=0.10, reduce=reduce)
    history = []
    for it in range(6):
        t_ref = refresh_reference(tracker, _times(rank, world_size, it), dist.group.WORLD)
        history.append((t_ref, tracker.refresh_count))
    out = [None] * world_size
    dist.all_gather_object(out, history)
    return out


@pytest.mark.parametrize("reduce", ["mean", "min"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_refresh_is_collective_and_agrees(world_size, reduce):
    per_rank = run_on_ranks(_refresh_body, world_size, reduce, timeout_s=60)
    assert all(h == per_rank[0] for h in per_rank)  # same T_ref, same refreshes, on every rank
    # Independent replay: refreshes at iteration 0 (first) and 3 (one rank moved by 20 %).
    agg = min if reduce == "min" else (lambda xs: sum(xs) / len(xs))
    expected, t_ref, count = [], None, 0
    for it in range(6):
        if it in (0, 3):
            t_ref, count = agg([_times(r, world_size, it) for r in range(world_size)]), count + 1
        expected.append((t_ref, count))
    got = per_rank[0]
    assert [c for _, c in got] == [c for _, c in expected]
    assert [t for t, _ in got] == pytest.approx([t for t, _ in expected])


def test_refresh_without_a_process_group_uses_the_own_time():
    tracker = ReferenceTime()
    assert refresh_reference(tracker, 2.0) == 2.0
    assert refresh_reference(tracker, 2.1) == 2.0  # within 10 %: no refresh
    assert tracker.refresh_count == 1


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
    with pytest.raises(ValueError, match=r"n_prune must be an int in \[0, 3\], got 4"):
        select_pruned(torch.zeros(3), 4, "pri")
    with pytest.raises(ValueError, match="variant must be one of .* got 'best'"):
        select_pruned(torch.zeros(3), 1, "best")
    with pytest.raises(ValueError, match="delta contains NaN"):
        select_pruned(torch.tensor([0.0, float("nan")]), 1, "pri")


# ---------------------------------------------------------------- variation statistics


def test_column_variation_matches_a_float64_loop():
    g = torch.Generator().manual_seed(0)
    old, new = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    expected = [sum(abs(float(new[n, c]) - float(old[n, c])) for n in range(5)) / 5 for c in range(7)]
    assert column_variation(new, old).tolist() == pytest.approx(expected, rel=1e-12)


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
    assert snap._host_ref.device.type == "cpu"  # the only full copy lives on the host
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
    got = pridiff_ratios(deltas, gamma=gamma, alpha=alpha, theta=theta, gamma_max=gamma_max)
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
    assert pridiff_ratios(deltas, gamma=0.5, alpha=0.8, theta=0.2, gamma_max=0.9) == pytest.approx([0.5, 0.4])
    assert pridiff_ratios(deltas, gamma=0.5, alpha=0.8, theta=0.2, gamma_max=0.45) == pytest.approx([0.45, 0.4])
    # savings weighted by FLOPs: (0.5 * 3 + 0.4 * 1) / 4
    assert achieved_savings([0.5, 0.4], [3.0, 1.0]) == pytest.approx(0.475)
    assert achieved_savings([0.5], [0.0]) == 0.0
    with pytest.raises(ValueError, match="got 2 ratios for 1 layers"):
        achieved_savings([0.5, 0.4], [1.0])
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\], got 0"):
        pridiff_ratios(deltas, gamma=0.5, alpha=0, theta=0.2, gamma_max=0.9)
