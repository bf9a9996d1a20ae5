"""Block-granular priority pruning: the smallest weight change still goes first, per block."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semimig.kernels.layout import layout_keep
from semimig.resizing.priority import PriorityList, select_pruned, select_pruned_blocks


def _brute_force_blocks(delta, n_prune, block, ties=None):
    """Sorted columns of the round(n_prune / g) blocks of smallest (mean delta, summed ties, index), by a loop."""
    k = delta.numel()
    keys = []
    for b in range(k // block):
        cols = range(b * block, (b + 1) * block)
        mean = sum(float(delta[c]) for c in cols) / block
        tie = 0 if ties is None else sum(int(ties[c]) for c in cols)
        keys.append((mean, tie, b))
    chosen = sorted(keys)[: int(n_prune / block + 0.5)]
    return sorted(c for _, _, b in chosen for c in range(b * block, (b + 1) * block))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1, 8, 16]), st.integers(1, 6), st.floats(0, 1), st.integers(0, 2**31), st.booleans())
def test_block_selection_prunes_the_blocks_of_smallest_mean_change(block, n_blocks, frac, seed, with_ties):
    k = block * n_blocks
    gen = torch.Generator().manual_seed(seed)
    delta = torch.randint(0, 8, (k,), generator=gen).double() / 8  # exact sums, and ties happen
    ties = torch.randint(0, 3, (k,), generator=gen) if with_ties else None
    n_prune = round(frac * k)
    got = select_pruned_blocks(delta, n_prune, block, tie_break=ties)
    assert got.tolist() == _brute_force_blocks(delta, n_prune, block, ties)
    if block == 1:
        assert torch.equal(got, select_pruned(delta, n_prune, "pri", tie_break=ties))
    keep = torch.tensor(sorted(set(range(k)) - set(got.tolist())), dtype=torch.int64)
    assert layout_keep(keep, k, "cpu", block=block).n_kept == keep.numel()  # whole aligned blocks


def test_unmeasured_blocks_are_kept_and_recently_pruned_blocks_go_last():
    w = torch.zeros(2, 32)
    pl = PriorityList(w)
    step = torch.zeros(2, 32)
    step[:, :8] = 0.01  # block 0 moves least, block 3 most
    step[:, 8:16] = 0.02
    step[:, 16:24] = 0.03
    step[:, 24:] = 0.04
    pl.end_period(w + step, torch.zeros(32, dtype=torch.int64))
    assert pl.select(32, 8, block=8).tolist() == list(range(8))
    assert pl.select(32, 16, block=8).tolist() == list(range(16))
    counts = torch.zeros(32, dtype=torch.int64)
    counts[:8] = 3  # block 0 was pruned last period: with revisit it goes after the computed blocks
    pl.end_period(w + 2 * step, counts)
    assert pl.select(32, 8, block=8).tolist() == list(range(8, 16))
    assert pl.select(16, 8, block=8).tolist() == list(range(8, 16))  # within the rank's own columns
    assert pl.select(32, 11, block=8).tolist() == list(range(8, 16))  # round(11 / 8) = 1 block
    fresh = PriorityList(w)  # nothing measured: delta = inf everywhere, index order
    assert fresh.select(32, 16, block=8).tolist() == list(range(16))


def test_block_selection_rejects_bad_blocks():
    with pytest.raises(ValueError, match="block must be a positive int dividing"):
        select_pruned_blocks(torch.zeros(30, dtype=torch.float64), 8, 8)
    with pytest.raises(ValueError, match="dividing own"):
        PriorityList(torch.zeros(2, 32)).select(20, 8, block=8)


def test_config_block_is_validated_and_defaults_to_single_columns():
    from semimig.errors import ConfigError
    from semimig.resizing.config import ResizingConfig

    assert ResizingConfig().block == 1 and ResizingConfig(block=16).block == 16
    for bad in (12, 0, True, "8"):
        with pytest.raises(ConfigError, match=f"block must be one of .*got {bad!r}"):
            ResizingConfig(block=bad)


def test_controller_hook_prunes_whole_blocks_where_they_fit():
    """``LayerBinding._select`` with ``ResizingConfig(block=8)``: whole blocks for an own column
    count that 8 divides, single columns otherwise (a real PriorityList; the binding's other
    state is not involved)."""
    from types import SimpleNamespace

    from semimig.controller.binding import LayerBinding
    from semimig.resizing.config import ResizingConfig

    w = torch.zeros(2, 40)
    pl = PriorityList(w)
    step = torch.linspace(0.01, 0.4, 40).expand(2, 40)
    pl.end_period(w + step, torch.zeros(40, dtype=torch.int64))
    binding = SimpleNamespace(resizing=ResizingConfig(block=8), generator=torch.Generator())
    bound = SimpleNamespace(priority=pl)
    assert LayerBinding._select(binding, bound, 32, 13).tolist() == list(range(16))  # round(13 / 8) = 2 blocks
    assert LayerBinding._select(binding, bound, 36, 13).tolist() == list(range(13))  # 8 does not divide 36
    single = SimpleNamespace(resizing=ResizingConfig(), generator=torch.Generator())
    assert LayerBinding._select(single, bound, 32, 13).tolist() == list(range(13))
