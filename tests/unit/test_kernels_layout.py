"""Keep layouts (``semimig.kernels.layout``): the kept columns as one contiguous prefix.

Properties, on random keep sets (hypothesis):

- the layout's gather is the old path's: ``to_layout(t)[:, :K'] == t[:, S]`` exactly, and its
  scatter is too: ``from_layout`` of a laid-out gradient equals the old path's full-size
  scatter (``reference._scattered``) of the same products, bit for bit, zeros included;
- fwd / dgrad / wgrad on laid-out operands, mapped back, match a float64 oracle of the dense
  gradient on ``S`` within the fp32 error bound, with exact zeros on ``P``;
- persistent gradient buffers keep their pruned columns exactly zero, also after someone else
  wrote to the buffer, and after a plan change.
"""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_cases import make_keep
from semimig.errors import ConfigError
from semimig.kernels import layout as L
from semimig.kernels import reference
from semimig.kernels.keep import plan_keep

SETTINGS = settings(max_examples=40, deadline=None)
U32 = 2.0**-24


@st.composite
def problems(draw):
    """(x [M, K], w [N, K], dy [M, N], keep, block) with block-granular or single-column keep sets."""
    block = draw(st.sampled_from([1, 1, 8, 16]))
    kind = draw(st.sampled_from(["empty", "full", "single", "run", "random"] if block == 1 else ["grouped", "full", "empty"]))
    m, n = draw(st.integers(1, 24)), draw(st.integers(1, 24))
    k = block * draw(st.integers(1, 5)) if block > 1 else draw(st.integers(1, 70))
    rng = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    x, w, dy = (torch.randn(m, k, generator=rng), torch.randn(n, k, generator=rng), torch.randn(m, n, generator=rng))
    keep = make_keep(kind, k, rng, block) if kind == "grouped" or block == 1 else make_keep(kind, k, rng)
    return x, w, dy, keep, block


def assert_fp32_bound(got, exact, magnitude, n_terms):
    bound = 2 * ((n_terms * U32 + U32) * magnitude + U32 * torch.finfo(torch.float32).smallest_normal)
    err = (got.double() - exact).abs()
    assert bool((err <= bound).all()), f"max error {err.max().item():.3g}"


@SETTINGS
@given(problems())
def test_layout_gather_and_scatter_equal_the_old_path(problem):
    x, w, dy, keep, block = problem
    k, kp = w.shape[1], keep.numel()
    lay = L.layout_keep(keep, k, "cpu", block=block)
    plan = plan_keep(keep, k, "cpu")
    assert sorted(lay.perm.tolist()) == list(range(k))
    assert torch.equal(lay.perm[lay.inverse], torch.arange(k))
    assert torch.equal(lay.kept(lay.to_layout(x)), x[:, keep])  # the gather, exactly
    assert torch.equal(lay.from_layout(lay.to_layout(w)), w)
    # the scatter: the same products, placed by the layout or by the old full-size scatter
    products = dy.mm(w[:, keep])  # [M, K']
    laid = torch.zeros(x.shape[0], k)
    laid[:, :kp] = products
    old = reference._scattered(plan, x.shape[0], dy, lambda out: out.copy_(products))
    assert torch.equal(lay.from_layout(laid), old)
    buf, wl = L.GradBuffer(), lay.to_layout(w)
    for _ in range(2):  # the original-order scatter into a persistent buffer, twice: the same result
        got = L.scatter_dgrad(dy, wl, lay, buf)
        assert bool((got[:, plan.pruned.long()] == 0).all())
        torch.testing.assert_close(got, old, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(problems(), st.booleans())
def test_layout_gemms_match_the_dense_gradient_on_kept_columns(problem, buffered):
    x, w, dy, keep, block = problem
    k = w.shape[1]
    lay = L.layout_keep(keep, k, "cpu", block=block)
    xl, wl = lay.to_layout(x), lay.to_layout(w)
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    kept = torch.zeros(k, dtype=torch.bool)
    kept[keep] = True
    xs, ws = x64 * kept, w64 * kept  # the pruned columns contribute nothing
    bufs = (L.GradBuffer(), L.GradBuffer()) if buffered else (None, None)
    for _ in range(2 if buffered else 1):
        y = L.layout_fwd(xl, wl, None, lay)
        dx = lay.from_layout(L.layout_dgrad(dy, wl, lay, bufs[0]))
        dw = lay.from_layout(L.layout_wgrad(dy, xl, lay, bufs[1]))
        dx_scatter = L.scatter_dgrad(dy, wl, lay)
        kp = keep.numel()
        assert_fp32_bound(y, xs @ ws.t(), x64.abs() @ (w64.abs() * kept).t(), kp)
        for got, exact, mag, rows in (
            (dx, (dy64 @ w64) * kept, dy64.abs() @ w64.abs(), x.shape[0]),
            (dx_scatter, (dy64 @ w64) * kept, dy64.abs() @ w64.abs(), x.shape[0]),
            (dw, (dy64.t() @ x64) * kept, dy64.abs().t() @ x64.abs(), w.shape[0]),
        ):
            assert got.shape == (rows, k)
            assert bool((got[:, ~kept] == 0).all())  # exact zeros on P
            assert_fp32_bound(got * kept, exact, mag, max(x.shape[0], w.shape[0]))
        # the old path's values on S (same reduction terms in the same order)
        plan = plan_keep(keep, k, "cpu")
        torch.testing.assert_close(dw, reference.gather_linear_wgrad(dy, x, plan), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(dx, reference.gather_linear_dgrad(dy, w, plan), rtol=1e-5, atol=1e-5)


def test_grad_buffer_rezeroes_after_a_foreign_write_and_on_plan_change():
    rng = torch.Generator().manual_seed(3)
    x, dy = torch.randn(6, 32, generator=rng), torch.randn(6, 5, generator=rng)
    lay = L.layout_keep(torch.arange(8, 16), 32, "cpu", block=8)
    xl, buf = lay.to_layout(x), L.GradBuffer()
    first = L.layout_wgrad(dy, xl, lay, buf)
    expected = first.clone()
    assert bool((first[:, 8:] == 0).all())
    first[:, 20:].fill_(7.0)  # a consumer writes into the buffer (bumps its version)
    again = L.layout_wgrad(dy, xl, lay, buf)
    assert again.data_ptr() == first.data_ptr()  # persistent: no new allocation
    assert torch.equal(again, expected)
    lay2 = L.layout_keep(torch.cat([torch.arange(8), torch.arange(24, 32)]), 32, "cpu", block=8)
    third = L.layout_wgrad(dy, lay2.to_layout(x), lay2, buf)  # K' changed: a fresh zeroed buffer
    assert bool((third[:, 16:] == 0).all())
    torch.testing.assert_close(lay2.from_layout(third)[:, 24:], dy.t() @ x[:, 24:])


def test_dense_layout_is_the_dense_product_bit_for_bit():
    rng = torch.Generator().manual_seed(4)
    x, w, dy = torch.randn(5, 12, generator=rng), torch.randn(3, 12, generator=rng), torch.randn(5, 3, generator=rng)
    lay = L.layout_keep(None, 12, "cpu")
    assert lay.identity and lay.to_layout(x) is x
    assert torch.equal(L.layout_fwd(x, w, None, lay), torch.nn.functional.linear(x, w))
    assert torch.equal(L.layout_dgrad(dy, w, lay), dy.mm(w))
    assert torch.equal(L.layout_wgrad(dy, x, lay), dy.t().mm(x))


def test_empty_keep_gives_bias_and_zero_gradients():
    lay = L.layout_keep(torch.empty(0, dtype=torch.int64), 16, "cpu", block=8)
    x, w, dy, b = torch.randn(3, 16), torch.randn(2, 16), torch.randn(3, 2), torch.randn(2)
    assert torch.equal(L.layout_fwd(x, w, b, lay), b.expand(3, 2))
    assert not L.layout_dgrad(dy, w, lay).any() and not L.layout_wgrad(dy, x, lay, L.GradBuffer()).any()


@pytest.mark.parametrize("keep, k, block, match", [
    (torch.arange(4, 12), 32, 8, "aligned blocks of 8"),
    (torch.arange(8), 30, 8, "does not divide K = 30"),
    (torch.arange(8), 32, 0, "block must be a positive int"),
    (torch.tensor([3, 1]), 8, 1, "sorted and unique"),
    (torch.tensor([8]), 8, 1, "out of range"),
])
def test_layout_keep_rejects_bad_inputs(keep, k, block, match):
    with pytest.raises(ConfigError, match=match):
        L.layout_keep(keep, k, "cpu", block=block)


# -- the Triton path on the layout (interpreter: TRITON_INTERPRET=1, tiny shapes, fp32) ----------

def _triton_ready():
    import os

    import semimig.kernels as sk

    return sk.triton_available() and (os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available())


@pytest.mark.skipif(not _triton_ready(), reason="needs triton with a GPU or TRITON_INTERPRET=1")
@pytest.mark.parametrize("block, kp_blocks", [(1, None), (8, 2), (16, 1)])
def test_triton_backend_on_laid_out_operands(block, kp_blocks):
    """On the layout the Triton backend takes the slice path (cuBLAS on a GPU, never a gather
    kernel), and the gather kernels run on the prefix plan (its autotune key: |S| and GROUP of
    the prefix) agree with it and with the gather kernels on the original operands."""
    import semimig.kernels as sk
    from semimig.kernels import ops, triton_gather

    device = "cuda" if torch.cuda.is_available() and __import__("os").environ.get("TRITON_INTERPRET") != "1" else "cpu"
    rng = torch.Generator().manual_seed(7)
    k = 48
    x, w, dy = (torch.randn(9, k, generator=rng), torch.randn(5, k, generator=rng), torch.randn(9, 5, generator=rng))
    keep = torch.tensor([1, 4, 5, 30, 47]) if block == 1 else \
        (torch.tensor([0, 2])[:kp_blocks, None] * block + torch.arange(block)).flatten()
    x, w, dy, keep = x.to(device), w.to(device), dy.to(device), keep.to(device)
    lay = L.layout_keep(keep, k, device, block=block)
    xl, wl = lay.to_layout(x), lay.to_layout(w)
    calls = []
    spied = {name: getattr(triton_gather, name) for name in ("gather_linear_fwd", "gather_linear_dgrad", "gather_linear_wgrad")}
    for name, fn in spied.items():
        setattr(triton_gather, name, lambda *a, fn=fn: calls.append(1) or fn(*a))  # spy, not a mock
    try:
        with sk.use_backend("triton"):
            y = ops.fwd("triton", xl, wl, None, lay.prefix)
            dx = ops.dgrad("triton", dy, wl, lay.prefix)
            dw = ops.wgrad("triton", dy, xl, lay.prefix)
    finally:
        for name, fn in spied.items():
            setattr(triton_gather, name, fn)
    assert calls == []  # the prefix plan is a span: slices, no gather kernel
    assert torch.equal(y, L.layout_fwd(xl, wl, None, lay))
    assert torch.equal(dx, L.layout_dgrad(dy, wl, lay)) and torch.equal(dw, L.layout_wgrad(dy, xl, lay))
    prefix_grouped = plan_keep(torch.arange(lay.n_kept, device=device), k, device)  # group detected on the prefix
    # a prefix is aligned: the grouped kernel (vectorised loads) for any g dividing K' and K
    assert prefix_grouped.group == max([g for g in (32, 16, 8) if k % g == 0 and lay.n_kept % g == 0], default=1)
    tk = (triton_gather.gather_linear_fwd(xl, wl, None, prefix_grouped),
          triton_gather.gather_linear_dgrad(dy, wl, prefix_grouped),
          triton_gather.gather_linear_wgrad(dy, xl, prefix_grouped))
    plan = plan_keep(keep, k, device)
    orig = (triton_gather.gather_linear_fwd(x, w, None, plan), triton_gather.gather_linear_dgrad(dy, w, plan),
            triton_gather.gather_linear_wgrad(dy, x, plan))
    for got, kernel, original in zip((y, dx, dw), tk, orig):
        torch.testing.assert_close(got, kernel, rtol=1e-5, atol=1e-5)
        if got.shape[1] == k:  # gradients: back in the original order, equal to the gather kernels'
            back = lay.from_layout(got)
            torch.testing.assert_close(back, original, rtol=1e-5, atol=1e-5)
            pruned = torch.ones(k, dtype=torch.bool, device=device)
            pruned[keep] = False
            assert bool((back[:, pruned] == 0).all())
        else:
            torch.testing.assert_close(got, original, rtol=1e-5, atol=1e-5)


def test_paired_layout_keeps_the_mlp_and_its_adamw_training():
    """Permuting the paired dimension (rows of fc1 + bias, columns of fc2, AdamW moments) once,
    mid-training, leaves the MLP's training unchanged (up to the reduction order of fc2), and the
    laid-out fc2 input's kept columns are the prefix."""
    rng = torch.Generator().manual_seed(11)
    h, i = 8, 24
    x = torch.randn(16, h, generator=rng)
    target = torch.randn(16, h, generator=rng)

    def make():
        torch.manual_seed(0)
        fc1, fc2 = torch.nn.Linear(h, i), torch.nn.Linear(i, h)
        return fc1, fc2, torch.optim.AdamW([*fc1.parameters(), *fc2.parameters()], lr=1e-2)

    def step(fc1, fc2, opt):
        opt.zero_grad()
        loss = ((fc2(torch.nn.functional.gelu(fc1(x))) - target) ** 2).mean()
        loss.backward()
        opt.step()
        return loss.item()

    a, b = make(), make()
    for _ in range(3):
        assert step(*a) == step(*b)
    keep = torch.tensor([0, 1, 2, 3, 16, 17, 18, 19])
    lay = L.layout_keep(keep, i, "cpu", block=4)
    perm = L.relative_permutation(None, lay.perm)
    L.apply_paired_layout_(b[0].weight, b[0].bias, b[1].weight, perm, b[2])
    hidden = torch.nn.functional.gelu(b[0](x))
    assert torch.equal(lay.kept(hidden), torch.nn.functional.gelu(a[0](x))[:, keep])  # the prefix is S
    for _ in range(3):
        torch.testing.assert_close(step(*b), step(*a), rtol=1e-5, atol=1e-6)
    back = L.relative_permutation(lay.perm, torch.arange(i))  # undo: original order again
    assert torch.equal(lay.perm[back], torch.arange(i))
    L.apply_paired_layout_(b[0].weight, b[0].bias, b[1].weight, back, b[2])
    for pa, pb in zip([*a[0].parameters(), *a[1].parameters()], [*b[0].parameters(), *b[1].parameters()]):
        torch.testing.assert_close(pb, pa, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b[2].state[pb]["exp_avg"], a[2].state[pa]["exp_avg"], rtol=1e-5, atol=1e-6)
