"""Autotune keys bucketed on the token count, and the kernels tuned before any timed step.

Run by Triton's interpreter on CPU (``TRITON_INTERPRET=1``, set by tests/conftest.py) on tiny
shapes; oracle: float64 products of the gathered operands, as in ``test_kernels_triton``.
"""
import os

import pytest
import torch

import semimig.kernels as sk
from semimig.kernels.keep import plan_keep

pytestmark = [
    pytest.mark.skipif(not sk.triton_available(), reason="triton is not installed"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                       reason="needs a GPU or TRITON_INTERPRET=1 (set by tests/conftest.py)"),
]

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


def test_token_counts_of_one_bucket_share_a_key():
    from semimig.kernels.triton_common import token_bucket
    from semimig.kernels.triton_gather import tune_key

    assert [token_bucket(m) for m in (1, 2, 3, 5, 8, 9, 4096, 4097, 8192, 8193)] == \
        [1, 2, 4, 8, 8, 16, 4096, 8192, 8192, 12288]
    for kernel in ("fwd", "dgrad", "wgrad"):
        keys = {tune_key(kernel, m, 24, 64, 40) for m in (4097, 5000, 6144, 8192)}
        assert len(keys) == 1, (kernel, keys)
        assert tune_key(kernel, 8192, 24, 64, 40) != tune_key(kernel, 8193, 24, 64, 40)
        assert tune_key(kernel, 8, 24, 64, 40) != tune_key(kernel, 8, 24, 64, 600)  # |S| still keys
    with pytest.raises(ValueError, match="'bwd'"):
        tune_key("bwd", 8, 8, 8, 8)


def test_the_kernels_key_on_the_buckets():
    from semimig.kernels.triton_gather import FWD_KEY, GRAD_KEY, _gather_fwd_kernel, _scatter_grad_kernel

    assert _gather_fwd_kernel.keys == FWD_KEY and "M" not in FWD_KEY
    assert _scatter_grad_kernel.keys == GRAD_KEY and "R" not in GRAD_KEY and "RED" not in GRAD_KEY


@pytest.mark.parametrize("m", [5, 6, 7, 8])  # one bucket (8): the same tuned config serves them all
def test_bucketed_keys_give_exact_results(m):
    from semimig.kernels.triton_gather import gather_linear_dgrad, gather_linear_fwd, gather_linear_wgrad

    g = torch.Generator().manual_seed(m)
    n, k = 9, 40
    x, w, dy = (torch.randn(*s, generator=g).to(DEVICE) for s in ((m, k), (n, k), (m, n)))
    bias = torch.randn(n, generator=g).to(DEVICE)
    keep = torch.tensor([0, 3, 4, 7, 11, 12, 20, 21, 22, 30, 38, 39])
    plan = plan_keep(keep.to(DEVICE), k, DEVICE)
    xd, wd, dyd = x.double().cpu(), w.double().cpu(), dy.double().cpu()
    y = gather_linear_fwd(x, w, bias, plan)
    torch.testing.assert_close(y.double().cpu(), xd[:, keep] @ wd[:, keep].t() + bias.double().cpu(),
                               atol=1e-5, rtol=1e-5)
    dx_exact, dw_exact = torch.zeros(m, k, dtype=torch.float64), torch.zeros(n, k, dtype=torch.float64)
    dx_exact[:, keep], dw_exact[:, keep] = dyd @ wd[:, keep], dyd.t() @ xd[:, keep]
    torch.testing.assert_close(gather_linear_dgrad(dy, w, plan).double().cpu(), dx_exact, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gather_linear_wgrad(dy, x, plan).double().cpu(), dw_exact, atol=1e-5, rtol=1e-5)


def test_tune_kernels_runs_each_key_once_and_is_a_no_op_on_the_torch_path():
    from semimig.kernels.tune import tune_kernels

    shapes = [(5, 8, 32), (7, 8, 32), (16, 8, 32)]  # 5 and 7: one bucket
    with sk.use_backend("torch"):
        assert tune_kernels(shapes, dtype=torch.float32, device=DEVICE) == 0
    with sk.use_backend("triton"):
        assert tune_kernels(shapes, dtype=torch.float32, device=DEVICE, shares=(0.5,)) == 2 * 3
        with pytest.raises(ValueError, match="share must be in \\[0, 1\\), got 1.0"):
            tune_kernels(shapes, dtype=torch.float32, device=DEVICE, shares=(1.0,))
