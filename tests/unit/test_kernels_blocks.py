"""Block-granular gathers and scatters of the torch path (kernels/reference.py) against the
single-column path on the same keep set, for every function the layers call, on random
aligned-block keep sets from nothing kept to everything kept (both scatter strategies: below a
quarter kept, zero fill + block copy; from a quarter, the block gather).  Gathers and the products
of gathered operands are bit-equal; a product written into a scatter buffer of another row stride
may round differently in the last bit (BLAS picks its kernel by the output's leading dimension: the
single-column path's own ``K' + 1``-wide buffer already differs from a contiguous product), so
scattered results are compared to fp32 rounding, and their pruned columns are exact zeros."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from semimig.kernels import plan_keep, reference


@st.composite
def blocked(draw):
    g = draw(st.sampled_from([8, 16, 32]))
    blocks = draw(st.integers(1, 24))
    k = g * blocks
    kept = sorted(draw(st.sets(st.integers(0, blocks - 1), max_size=blocks)))
    keep = torch.tensor([b * g + j for b in kept for j in range(g)], dtype=torch.int64)
    m, n = draw(st.integers(1, 9)), draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**16))
    return g, k, keep, m, n, seed


def _plans(g: int, k: int, keep: torch.Tensor):
    grouped = plan_keep(keep, k, "cpu")
    single = plan_keep(keep, k, "cpu", group=1)
    assert single.group == 1
    assert grouped.group >= g or grouped.span is not None or grouped.dense or grouped.n_kept == 0
    return grouped, single


@settings(max_examples=60, deadline=None)
@given(blocked())
def test_grouped_plans_gather_the_single_column_values_bit_for_bit_and_scatter_them_alike(case):
    g, k, keep, m, n, seed = case
    gen = torch.Generator().manual_seed(seed)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    dy, bias = torch.randn(m, n, generator=gen), torch.randn(n, generator=gen)
    grouped, single = _plans(g, k, keep)
    x_kept = x.index_select(1, keep)
    gathered = [
        (reference.gather_linear_fwd(x, w, bias, grouped), reference.gather_linear_fwd(x, w, bias, single)),
        (reference.compact_linear_fwd(x_kept, w, grouped)[1], reference.compact_linear_fwd(x_kept, w, single)[1]),
        (reference.compact_linear_fwd(x_kept, w, grouped)[0], reference.compact_linear_fwd(x_kept, w, single)[0]),
    ]
    for i, (a, b) in enumerate(gathered):
        assert a.shape == b.shape and torch.equal(a, b), (i, g, k, keep.tolist())
    scattered = [
        (reference.gather_linear_dgrad(dy, w, grouped), reference.gather_linear_dgrad(dy, w, single)),
        (reference.gather_linear_wgrad(dy, x, grouped), reference.gather_linear_wgrad(dy, x, single)),
        (reference.compact_linear_wgrad(dy, x_kept, grouped), reference.compact_linear_wgrad(dy, x_kept, single)),
    ]
    for i, (a, b) in enumerate(scattered):
        assert a.shape == b.shape, (i, a.shape, b.shape)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=f"scatter {i}, g {g}, keep {keep.tolist()}")
    # exact zeros on the pruned columns of every scattered result
    pruned = grouped.pruned.long()
    for dense in (reference.gather_linear_dgrad(dy, w, grouped), reference.gather_linear_wgrad(dy, x, grouped),
                  reference.compact_linear_wgrad(dy, x_kept, grouped)):
        assert torch.count_nonzero(dense.index_select(1, pruned)) == 0


@pytest.mark.parametrize("kept_blocks", [1, 3, 4, 12, 15])  # of 16: both sides of the quarter
def test_both_scatter_strategies_and_a_column_major_operand(kept_blocks):
    g, blocks = 8, 16
    k = g * blocks
    chosen = torch.randperm(blocks, generator=torch.Generator().manual_seed(kept_blocks))[:kept_blocks].sort().values
    keep = (chosen[:, None] * g + torch.arange(g)).flatten()
    grouped, single = _plans(g, k, keep)
    x = torch.randn(k, 5).t()  # column-major: the block gather falls back to single columns
    w, dy = torch.randn(7, k), torch.randn(5, 7)
    assert not x.is_contiguous()
    fwd = reference.gather_linear_fwd
    assert torch.equal(fwd(x, w, None, grouped), fwd(x, w, None, single))
    for got, want in ((reference.gather_linear_wgrad(dy, x, grouped), dy.t() @ x),
                      (reference.gather_linear_dgrad(dy, w, grouped), dy @ w)):
        pruned = grouped.pruned.long()
        assert torch.count_nonzero(got.index_select(1, pruned)) == 0
        torch.testing.assert_close(got.index_select(1, keep), want.index_select(1, keep), rtol=1e-5, atol=1e-5)
