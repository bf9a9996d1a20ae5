"""Pruned-vs-dense properties of the launchers and ``pruned_linear`` on the torch path.

Oracle: float64 products of the gathered operands (``x64[:, S] @ w64[:, S].T``), computed here
with plain indexing, independent of the library.  Tolerances are error bounds, not guesses:
for a dot product of ``K'`` terms accumulated in fp32 and rounded once to the output dtype,

    |got - exact| <= (K' · u_fp32 + u_out) · (|x[:, S]| @ |w[:, S]|^T + |b|) + u_out · tiny_out

elementwise, with ``u`` the unit roundoff (2^-24 fp32, 2^-11 fp16, 2^-8 bf16) and ``tiny`` the
smallest normal number (the last term covers rounding to a subnormal); we allow twice that.
"""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import semimig.kernels as sk
from kernel_cases import make_keep

UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
KEEP_KINDS = ["empty", "full", "single", "run", "random", "grouped"]
SETTINGS = settings(max_examples=40, deadline=None)


# -- oracle and problem generation --------------------------------------------------------------


def assert_within_bound(got, exact, magnitude, n_terms, dtype):
    """Elementwise ``|got - exact| <= 2 ((n_terms u_fp32 + u_out) magnitude + u_out tiny)``."""
    u_acc, u_out = min(UNIT_ROUNDOFF[torch.float32], UNIT_ROUNDOFF[dtype]), UNIT_ROUNDOFF[dtype]
    bound = 2 * ((n_terms * u_acc + u_out) * magnitude + u_out * torch.finfo(dtype).smallest_normal)
    err = (got.double() - exact).abs()
    assert got.shape == exact.shape
    assert bool((err <= bound).all()), f"max error {err.max().item():.3g} over bound (max bound {bound.max().item():.3g})"


@st.composite
def problems(draw, dtypes=DTYPES):
    """(x [M, K], w [N, K], b [N] or None, keep, dtype) with odd and tiny sizes, any keep kind."""
    kind = draw(st.sampled_from(KEEP_KINDS))
    group = draw(st.sampled_from([8, 16, 32]))
    m, n = draw(st.integers(1, 33)), draw(st.integers(1, 33))
    k = group * draw(st.integers(1, 4)) if kind == "grouped" else draw(st.integers(1, 70))
    dtype = draw(st.sampled_from(dtypes))
    rng = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    x = torch.randn(m, k, generator=rng).to(dtype)
    w = torch.randn(n, k, generator=rng).to(dtype)
    b = torch.randn(n, generator=rng).to(dtype) if draw(st.booleans()) else None
    keep = make_keep(kind, k, rng, group)
    if draw(st.booleans()):
        keep = keep.to(torch.int32)
    return x, w, b, keep, dtype


def pruned_mask(keep, k):
    mask = torch.ones(k, dtype=torch.bool)
    mask[keep.long()] = False
    return mask


# -- launchers ----------------------------------------------------------------------------------


@SETTINGS
@given(problems())
def test_launchers_match_float64_oracle_on_gathered_operands(problem):
    x, w, b, keep, dtype = problem
    m, k = x.shape
    s = keep.long()
    dy = torch.randn(m, w.shape[0], dtype=torch.float64).to(dtype)
    x64, w64, dy64 = x.double(), w.double(), dy.double()

    y = sk.gather_linear_fwd(x, w, b, keep)
    y_exact = x64[:, s] @ w64[:, s].T + (b.double() if b is not None else 0)
    y_mag = x64[:, s].abs() @ w64[:, s].abs().T + (b.double().abs() if b is not None else 0)
    assert y.dtype == dtype
    assert_within_bound(y, y_exact, y_mag, len(s), dtype)

    dx = sk.gather_linear_dgrad(dy, w, keep)
    dx_exact = torch.zeros(m, k, dtype=torch.float64)
    dx_exact[:, s] = dy64 @ w64[:, s]
    dx_mag = torch.zeros_like(dx_exact)
    dx_mag[:, s] = dy64.abs() @ w64[:, s].abs()
    assert_within_bound(dx, dx_exact, dx_mag, w.shape[0], dtype)

    dw = sk.gather_linear_wgrad(dy, x, keep)
    dw_exact = torch.zeros(w.shape, dtype=torch.float64)
    dw_exact[:, s] = dy64.T @ x64[:, s]
    dw_mag = torch.zeros_like(dw_exact)
    dw_mag[:, s] = dy64.abs().T @ x64[:, s].abs()
    assert_within_bound(dw, dw_exact, dw_mag, m, dtype)

    p = pruned_mask(keep, k)  # exact zeros, not merely small
    assert bool((dx[:, p] == 0).all()) and bool((dw[:, p] == 0).all())


@SETTINGS
@given(problems(dtypes=[torch.float32]), st.booleans())
def test_pruned_linear_shapes_zeros_and_values_3d_noncontiguous(problem, transpose):
    x, w, b, keep, dtype = problem
    m, k = x.shape
    # a 3-D input [2, M, K], optionally as a non-contiguous (transposed) view
    x3 = torch.stack([x, x.flip(0)]) if not transpose else torch.stack([x, x.flip(0)]).transpose(0, 1).contiguous().transpose(0, 1)
    x3 = x3.detach().requires_grad_(True)
    w = w.detach().requires_grad_(True)
    b = b.detach().requires_grad_(True) if b is not None else None
    y = sk.pruned_linear(x3, w, b, keep)
    dense = F.linear(x3.detach(), w.detach(), None if b is None else b.detach())
    assert y.shape == dense.shape
    dy = torch.randn_like(y)
    y.backward(dy)
    assert x3.grad.shape == x3.shape and w.grad.shape == w.shape
    s, p = keep.long(), pruned_mask(keep, k)
    x64, w64, dy64 = x3.detach().double().reshape(-1, k), w.detach().double(), dy.double().reshape(-1, w.shape[0])
    assert_within_bound(x3.grad.reshape(-1, k)[:, s], dy64 @ w64[:, s], dy64.abs() @ w64[:, s].abs(), w.shape[0], dtype)
    assert_within_bound(w.grad[:, s], dy64.T @ x64[:, s], dy64.abs().T @ x64[:, s].abs(), x64.shape[0], dtype)
    assert bool((x3.grad[..., p] == 0).all()) and bool((w.grad[:, p] == 0).all())
    if b is not None:  # the bias gradient is never pruned
        assert_within_bound(b.grad, dy64.sum(0), dy64.abs().sum(0), x64.shape[0], dtype)


@pytest.mark.parametrize("shape", [(1, 5), (7, 13), (64, 300), (3, 5, 17), (2, 1, 9)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("keep_all", ["none", "arange"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_keep_all_is_bit_for_bit_dense_in_fp32(shape, with_bias, keep_all, layout):
    """The torch path computes F.linear, dy @ w and dy^T @ x: exactly what F.linear's autograd does."""
    torch.manual_seed(sum(shape))
    k, n = shape[-1], 11
    x = torch.randn(*shape)
    if layout == "transposed":  # same values, non-contiguous: leading dims reversed in memory
        x = x.permute(*reversed(range(x.dim()))).contiguous().permute(*reversed(range(x.dim())))
    x.requires_grad_(True)
    w = torch.randn(n, k, requires_grad=True)
    b = torch.randn(n, requires_grad=True) if with_bias else None
    leaves = [x, w] + ([b] if with_bias else [])
    y_ref = F.linear(x, w, b)
    dy = torch.randn_like(y_ref)
    grads_ref = torch.autograd.grad(y_ref, leaves, dy)
    keep = None if keep_all == "none" else torch.arange(k, dtype=torch.int32)
    with sk.use_backend("torch"):
        y = sk.pruned_linear(x, w, b, keep)
        grads = torch.autograd.grad(y, leaves, dy)
    assert torch.equal(y, y_ref)
    for got, ref in zip(grads, grads_ref):
        assert torch.equal(got, ref)


@pytest.mark.parametrize("kind", ["random", "grouped", "empty", "single", "full"])
def test_gradcheck_float64(kind):
    rng = torch.Generator().manual_seed(7)
    x = torch.randn(5, 32, dtype=torch.float64, generator=rng, requires_grad=True)
    w = torch.randn(6, 32, dtype=torch.float64, generator=rng, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, generator=rng, requires_grad=True)
    keep = make_keep(kind, 32, rng, group=8)
    assert torch.autograd.gradcheck(lambda a, c, d: sk.pruned_linear(a, c, d, keep), (x, w, b))


def test_empty_keep_gives_bias_only_and_zero_grads():
    x = torch.randn(4, 9, requires_grad=True)
    w = torch.randn(3, 9, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    keep = torch.empty(0, dtype=torch.int32)
    y = sk.pruned_linear(x, w, b, keep)
    assert torch.equal(y, b.detach().expand(4, 3))
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x)) and torch.equal(w.grad, torch.zeros_like(w))
    assert torch.equal(b.grad, torch.full((3,), 4.0))
    assert torch.equal(sk.gather_linear_fwd(x.detach(), w.detach(), None, keep), torch.zeros(4, 3))


# -- imputation ---------------------------------------------------------------------------------


def test_impute_average_is_row_mean_of_kept_columns():
    rng = torch.Generator().manual_seed(3)
    dw = torch.randn(4, 10, generator=rng)
    keep = torch.tensor([1, 2, 6])
    p = pruned_mask(keep, 10)
    dw[:, p] = 0
    expected = dw.double().clone()
    expected[:, p] = dw.double()[:, keep].mean(1, keepdim=True)
    out = sk.impute_(dw, keep, "average")
    assert out is dw
    torch.testing.assert_close(dw.double(), expected, rtol=1e-6, atol=1e-7)  # one fp32 mean of 3 terms


def test_impute_zero_is_noop_and_same_copies_previous():
    dw = torch.randn(3, 8)
    before = dw.clone()
    keep = torch.tensor([0, 5])
    assert torch.equal(sk.impute_(dw, keep, "zero"), before)
    previous = torch.randn(3, 8)
    sk.impute_(dw, keep, "same", previous)
    p = pruned_mask(keep, 8)
    assert torch.equal(dw[:, p], previous[:, p]) and torch.equal(dw[:, ~p], before[:, ~p])
    sk.impute_(dw, keep, "same", None)  # no previous gradient yet: zeros
    assert bool((dw[:, p] == 0).all())


def test_pruned_linear_same_reuses_previous_gradient_columns():
    rng = torch.Generator().manual_seed(11)
    w = torch.randn(4, 16, generator=rng, requires_grad=True)
    sk.clear_imputation_state()
    grads = []
    for keep in [torch.tensor([0, 3, 9]), None, torch.tensor([2, 3, 4, 15])]:
        x = torch.randn(5, 16, generator=rng)
        w.grad = None
        sk.pruned_linear(x, w, None, keep, impute="same").pow(2).sum().backward()
        grads.append((keep, x, w.grad.clone()))
    (keep0, _, g0), (_, x1, g1), (keep2, x2, g2) = grads
    p0, p2 = pruned_mask(keep0, 16), pruned_mask(keep2, 16)
    assert bool((g0[:, p0] == 0).all())  # first backward: nothing to reuse
    assert torch.equal(g2[:, p2], g1[:, p2])  # pruned columns copied from the previous (dense) step
    s2 = keep2.long()
    dy2 = 2 * (x2[:, s2] @ w.detach()[:, s2].T)
    torch.testing.assert_close(g2[:, s2], dy2.T @ x2[:, s2])  # kept columns are the true gradient (fp32)
    sk.clear_imputation_state(w)
