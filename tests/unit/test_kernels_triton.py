"""The Triton kernels themselves, run on CPU by Triton's interpreter (``TRITON_INTERPRET=1``).

Tiny shapes, fp32 and fp16, and bf16 on a GPU (the interpreter has no bf16 ``tl.dot``: it runs but
returns garbage).  Oracle: float64 products of the gathered operands, computed here with plain
indexing.  Tolerance: the bound of ``test_kernels_torch`` (fp32 accumulation of K' terms plus
one rounding to the output dtype, times two), i.e.

    |got - exact| <= 2 ((K' u_fp32 + u_out) (|a| @ |b|) + u_out tiny_out)     elementwise
"""
import os
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import semimig.kernels as sk
from kernel_cases import make_keep
from semimig.kernels.keep import plan_keep

pytestmark = [
    pytest.mark.skipif(not sk.triton_available(), reason="triton is not installed"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
        reason="needs a GPU or TRITON_INTERPRET=1 (set by tests/conftest.py)",
    ),
]

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
"""The operand dtypes under test: bf16 only where Triton compiles for a GPU."""
SETTINGS = settings(max_examples=20, deadline=None)


@pytest.fixture(autouse=True)
def _triton_backend():
    with sk.use_backend("triton"):
        yield


def assert_within_bound(got, exact, magnitude, n_terms, dtype):
    u_acc, u_out = UNIT_ROUNDOFF[torch.float32], UNIT_ROUNDOFF[dtype]
    if dtype == torch.float32 and DEVICE == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        u_acc = u_out = 2.0**-11  # TF32 operands
    bound = 2 * ((n_terms * u_acc + u_out) * magnitude + u_out * torch.finfo(dtype).smallest_normal)
    err = (got.double().cpu() - exact).abs()
    assert got.shape == exact.shape
    assert bool((err <= bound).all()), f"max error {err.max().item():.3g} (max bound {bound.max().item():.3g})"


def strided(t, transpose):
    """The same values as a non-contiguous view (column-major) when ``transpose``."""
    return t.t().contiguous().t() if transpose else t


@st.composite
def problems(draw):
    kind = draw(st.sampled_from(["empty", "full", "single", "run", "random", "grouped"]))
    group = draw(st.sampled_from([8, 16, 32]))
    m, n = draw(st.sampled_from([1, 2, 5, 17, 33])), draw(st.sampled_from([1, 3, 16, 19]))
    k = group * draw(st.integers(1, 3)) if kind == "grouped" else draw(st.sampled_from([1, 7, 33, 64, 70]))
    dtype = draw(st.sampled_from(DTYPES))
    rng = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    x = strided(torch.randn(m, k, generator=rng).to(dtype), draw(st.booleans()))
    w = strided(torch.randn(n, k, generator=rng).to(dtype), draw(st.booleans()))
    dy = strided(torch.randn(m, n, generator=rng).to(dtype), draw(st.booleans()))
    b = torch.randn(n, generator=rng).to(dtype) if draw(st.booleans()) else None
    keep = make_keep(kind, k, rng, group, min_random=1)
    return x, w, dy, b, keep, kind, dtype


@SETTINGS
@given(problems())
def test_triton_kernels_match_float64_oracle(problem):
    """The three kernels called directly (the dense shortcut of the dispatcher bypassed)."""
    from semimig.kernels import triton_gather

    x, w, dy, b, keep, kind, dtype = problem
    to = dict(device=DEVICE)
    x, w, dy, keep = x.to(**to), w.to(**to), dy.to(**to), keep.to(**to)
    b = b.to(**to) if b is not None else None
    plan = plan_keep(keep, x.shape[1], x.device)
    if kind == "grouped":
        assert plan.group > 1  # the grouped kernel variant is the one under test
    s = keep.long().cpu()
    x64, w64, dy64 = x.double().cpu(), w.double().cpu(), dy.double().cpu()
    b64 = b.double().cpu() if b is not None else torch.zeros(w.shape[0], dtype=torch.float64)

    y = triton_gather.gather_linear_fwd(x, w, b, plan)
    assert_within_bound(y, x64[:, s] @ w64[:, s].T + b64, x64[:, s].abs() @ w64[:, s].abs().T + b64.abs(), len(s), dtype)

    dx = triton_gather.gather_linear_dgrad(dy, w, plan)
    dx_exact, dx_mag = torch.zeros(x64.shape, dtype=torch.float64), torch.zeros(x64.shape, dtype=torch.float64)
    dx_exact[:, s], dx_mag[:, s] = dy64 @ w64[:, s], dy64.abs() @ w64[:, s].abs()
    assert_within_bound(dx, dx_exact, dx_mag, w.shape[0], dtype)

    dw = triton_gather.gather_linear_wgrad(dy, x, plan)
    dw_exact, dw_mag = torch.zeros(w64.shape, dtype=torch.float64), torch.zeros(w64.shape, dtype=torch.float64)
    dw_exact[:, s], dw_mag[:, s] = dy64.T @ x64[:, s], dy64.abs().T @ x64[:, s].abs()
    assert_within_bound(dw, dw_exact, dw_mag, x.shape[0], dtype)

    pruned = torch.ones(x.shape[1], dtype=torch.bool)
    pruned[s] = False  # every pruned column written, and written with exact zeros
    assert bool((dx.cpu()[:, pruned] == 0).all()) and bool((dw.cpu()[:, pruned] == 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    DEVICE != "cuda", reason="Triton's interpreter has no bf16 tl.dot (it runs and returns wrong values)"))])
@pytest.mark.parametrize("kind", ["random", "grouped"])
def test_pruned_linear_on_triton_backend_3d(dtype, kind):
    rng = torch.Generator().manual_seed(5)
    k, n = 64, 19
    x = torch.randn(2, 3, k, generator=rng).to(dtype).to(DEVICE).requires_grad_(True)
    w = torch.randn(n, k, generator=rng).to(dtype).to(DEVICE).requires_grad_(True)
    b = torch.randn(n, generator=rng).to(dtype).to(DEVICE).requires_grad_(True)
    keep = make_keep(kind, k, rng, 16, min_random=1).to(DEVICE)
    y = sk.pruned_linear(x, w, b, keep, impute="average")
    dy = torch.randn(y.shape, generator=rng).to(dtype).to(DEVICE)
    y.backward(dy)
    s = keep.long().cpu()
    x64, w64, dy64 = x.detach().double().cpu().reshape(-1, k), w.detach().double().cpu(), dy.double().cpu().reshape(-1, n)
    assert y.shape == (2, 3, n) and x.grad.shape == x.shape and w.grad.shape == w.shape
    y_exact = x64[:, s] @ w64[:, s].T + b.detach().double().cpu()
    assert_within_bound(y.reshape(-1, n), y_exact, x64[:, s].abs() @ w64[:, s].abs().T + b.detach().double().abs().cpu(), len(s), dtype)
    assert_within_bound(x.grad.reshape(-1, k)[:, s], dy64 @ w64[:, s], dy64.abs() @ w64[:, s].abs(), n, dtype)
    dw_s = dy64.T @ x64[:, s]
    assert_within_bound(w.grad[:, s], dw_s, dy64.abs().T @ x64[:, s].abs(), 6, dtype)
    pruned = torch.ones(k, dtype=torch.bool)
    pruned[s] = False
    assert bool((x.grad.cpu()[..., pruned] == 0).all())
    # "average": each pruned column is the row mean of the kept gradient columns
    # (an fp32 mean of |S| terms rounded to dtype: same error bound as a dot product)
    kept_grad = w.grad.double().cpu()[:, s]
    n_pruned = int(pruned.sum())
    row_mean = kept_grad.mean(1, keepdim=True).expand(-1, n_pruned)
    row_mag = kept_grad.abs().mean(1, keepdim=True).expand(-1, n_pruned)
    assert_within_bound(w.grad.cpu()[:, pruned], row_mean, row_mag, len(s), dtype)


@pytest.mark.parametrize("bad, position", [(48, 2), (-1, 0)])
def test_triton_entry_points_refuse_out_of_range_keep(bad, position):
    """An index outside [0, K) never reaches a kernel (it would read out of bounds): ConfigError naming it."""
    from semimig.errors import ConfigError

    x, w, dy = torch.randn(5, 48, device=DEVICE), torch.randn(7, 48, device=DEVICE), torch.randn(5, 7, device=DEVICE)
    keep = torch.tensor([0, 5, bad] if bad > 0 else [bad, 5, 6], device=DEVICE)
    message = f"keep index {bad} is out of range [0, 48) (at position {position})"
    for launch in (lambda: sk.gather_linear_fwd(x, w, None, keep), lambda: sk.gather_linear_dgrad(dy, w, keep),
                   lambda: sk.gather_linear_wgrad(dy, x, keep), lambda: sk.pruned_linear(x, w, None, keep)):
        with pytest.raises(ConfigError, match=re.escape(message)):
            launch()


def test_dispatch_uses_triton_and_matches_torch_path():
    """Same launch through both backends: the Triton path is really taken and agrees with torch."""
    from semimig.kernels import triton_gather

    rng = torch.Generator().manual_seed(1)
    x, w = torch.randn(9, 48, generator=rng).to(DEVICE), torch.randn(7, 48, generator=rng).to(DEVICE)
    keep = torch.tensor([0, 5, 6, 20, 47], device=DEVICE)
    calls = []
    original = triton_gather.gather_linear_fwd
    triton_gather.gather_linear_fwd = lambda *a: calls.append(1) or original(*a)  # spy, not a mock
    try:
        y_triton = sk.gather_linear_fwd(x, w, None, keep)
    finally:
        triton_gather.gather_linear_fwd = original
    with sk.use_backend("torch"):
        y_torch = sk.gather_linear_fwd(x, w, None, keep)
    assert calls == [1]
    torch.testing.assert_close(y_triton, y_torch, rtol=1e-5, atol=1e-5)  # fp32, 5 terms


def test_autotune_configs_for_hopper(monkeypatch):
    """Every Hopper config gathers BLOCK_K >= 32 columns (a multiple of every group size); pruning keeps one."""
    from semimig.kernels import triton_common

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # build the GPU list, not the interpreter's single tile
    for roles in [("BLOCK_M", "BLOCK_N", "BLOCK_K"), ("BLOCK_M", "BLOCK_K", "BLOCK_N"), ("BLOCK_N", "BLOCK_K", "BLOCK_M")]:
        configs = triton_common.gemm_configs(*roles)
        assert len(configs) > 4
        assert all(c.kwargs["BLOCK_K"] % 32 == 0 for c in configs)
        prune = triton_common.prune_configs(roles[0], "M" if roles[0] == "BLOCK_M" else "N")
        small = prune(configs, {"M": 1, "N": 1, "K_KEPT": 8})
        assert small and all(c.kwargs[roles[0]] <= 16 or c.kwargs["BLOCK_K"] <= 32 or len(small) == 1 for c in small)
        assert len(prune(configs, {"M": 8192, "N": 8192, "K_KEPT": 4096})) == len(configs)
    assert triton_common.kept_bucket(0) == 1 and triton_common.kept_bucket(300) == 512
    assert triton_common.kept_bucket(2049) == triton_common.kept_bucket(2560) == 2560
