"""Keep sets, plans, backends and bad input: every mistake gets a clear error naming the value."""
import re

import pytest
import torch

import semimig.kernels as sk
from semimig.kernels.keep import KeepPlan, plan_keep, validate_keep

K = 64


def _x_w(k: int = K, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(3, k, dtype=dtype), torch.randn(5, k, dtype=dtype)


# -- validate_keep ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_validate_keep_accepts_sorted_unique_and_returns_int32(dtype):
    keep = torch.tensor([0, 3, 7, 63], dtype=dtype)
    out = validate_keep(keep, K, "cpu")
    assert out.dtype == torch.int32 and out.is_contiguous()
    assert out.tolist() == [0, 3, 7, 63]


def test_validate_keep_none_is_all_columns():
    assert validate_keep(None, 5, "cpu").tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "keep, exc, match",
    [
        (torch.tensor([0, 64]), ValueError, "index 64 is out of range"),
        (torch.tensor([-1, 3]), ValueError, "index -1 is out of range"),
        (torch.tensor([1, 3, 3, 5]), ValueError, "duplicate index 3, 3 at positions 1, 2"),
        (torch.tensor([1, 5, 4]), ValueError, "unsorted indices 5, 4"),
        (torch.tensor([0.0, 1.0]), TypeError, "int32 or int64 .* torch.float32"),
        (torch.tensor([0, 1], dtype=torch.int16), TypeError, "torch.int16"),
        (torch.tensor([True, False]), TypeError, "torch.bool"),
        (torch.tensor([[0, 1]]), ValueError, r"1-D, got shape \(1, 2\)"),
        (torch.arange(65), ValueError, "65 entries but K = 64"),
        ([0, 1, 2], TypeError, "torch.Tensor .* got list"),
        (torch.tensor([0, 1], device="meta"), ValueError, "keep is on meta but the operands are on cpu"),
    ],
)
def test_validate_keep_rejects_bad_keep(keep, exc, match):
    with pytest.raises(exc, match=match):
        validate_keep(keep, K, "cpu")


@pytest.mark.parametrize(
    "launch",
    [
        lambda x, w, keep: sk.gather_linear_fwd(x, w, None, keep),
        lambda x, w, keep: sk.gather_linear_dgrad(torch.randn(3, 5), w, keep),
        lambda x, w, keep: sk.gather_linear_wgrad(torch.randn(3, 5), x, keep),
        lambda x, w, keep: sk.pruned_linear(x, w, None, keep),
        lambda x, w, keep: sk.impute_(torch.zeros(5, K), keep, "average"),
    ],
)
def test_every_entry_point_validates_keep(launch):
    x, w = _x_w()
    with pytest.raises(ValueError, match="duplicate index 2"):
        launch(x, w, torch.tensor([2, 2]))
    with pytest.raises(ValueError, match="out of range"):
        launch(x, w, torch.tensor([K]))
    with pytest.raises(TypeError, match="int32 or int64"):
        launch(x, w, torch.tensor([1.5]))


# -- plans and groups ---------------------------------------------------------------------------


def test_plan_complement_is_sorted_rest():
    keep = torch.tensor([1, 4, 5, 9])
    plan = plan_keep(keep, 12, "cpu")
    assert plan.pruned.tolist() == [0, 2, 3, 6, 7, 8, 10, 11]
    assert (plan.n_kept, plan.n_pruned, plan.group, plan.dense) == (4, 8, 1, False)


@pytest.mark.parametrize("g", [8, 16, 32])
def test_plan_detects_largest_aligned_group(g):
    k = 128
    blocks = torch.tensor([0, 2, 3]) if k // g > 3 else torch.tensor([1])
    keep = (blocks[:, None] * g + torch.arange(g)).flatten()
    plan = plan_keep(keep, k, "cpu")
    assert plan.group == g
    assert plan.keep_groups.tolist() == blocks.tolist()
    expected_pruned = sorted(set(range(k // g)) - set(blocks.tolist()))
    assert plan.pruned_groups.tolist() == expected_pruned


def test_plan_group_needs_k_divisible():
    keep = torch.arange(8, 16)  # an aligned block of 8, but K = 20 is not a multiple of 8
    assert plan_keep(keep, 20, "cpu").group == 1
    with pytest.raises(ValueError, match="aligned groups of 8 columns with K = 20"):
        plan_keep(keep, 20, "cpu", group=8)


def test_plan_explicit_group_is_checked_and_misaligned_rejected():
    assert plan_keep(torch.arange(16, 32), 64, "cpu", group=16).group == 16
    assert plan_keep(torch.arange(16, 32), 64, "cpu", group=1).group == 1  # finer is always allowed
    with pytest.raises(ValueError, match="aligned groups of 16"):
        plan_keep(torch.arange(8, 24), 64, "cpu", group=16)
    with pytest.raises(ValueError, match="group must be None, 1 or one of"):
        plan_keep(torch.arange(8), 64, "cpu", group=4)


def test_plan_is_reused_and_checked_against_k():
    plan = plan_keep(torch.tensor([0, 2]), 8, "cpu")
    assert plan_keep(plan, 8, "cpu") is plan
    with pytest.raises(ValueError, match="built for K = 8 but the operands have K = 9"):
        plan_keep(plan, 9, "cpu")


def test_keep_plans_are_built_by_plan_keep_only():
    """A hand-made plan (or a replaced field) could hold any index: it is refused at construction."""
    import dataclasses

    from semimig.errors import ConfigError

    with pytest.raises(ConfigError, match="built by plan_keep"):
        KeepPlan(k=4, keep=torch.tensor([0, 9], dtype=torch.int32), pruned=torch.tensor([1, 2], dtype=torch.int32),
                 group=1, first=0, last=9)
    plan = plan_keep(torch.tensor([0, 2]), 4, "cpu")
    with pytest.raises(ConfigError, match="built by plan_keep"):
        dataclasses.replace(plan, keep=torch.tensor([-1, 2], dtype=torch.int32))


def test_plan_owns_its_indices_and_knows_its_bounds():
    keep = torch.tensor([2, 3, 4], dtype=torch.int32)
    plan = plan_keep(keep, 8, "cpu")
    keep[0] = 7  # the caller's tensor changes afterwards; the plan must not
    assert plan.keep.tolist() == [2, 3, 4] and (plan.first, plan.last, plan.span) == (2, 4, (2, 5))
    gappy = plan_keep(torch.tensor([1, 3]), 8, "cpu")
    assert gappy.span is None and gappy.keep64.dtype == torch.int64 and gappy.keep64.tolist() == [1, 3]
    blocks = plan_keep(torch.cat([torch.arange(8, 16), torch.arange(24, 32)]), 32, "cpu")
    assert blocks.group == 8 and blocks.block_scatter_source.tolist() == [2, 0, 2, 1]
    empty = plan_keep(torch.empty(0, dtype=torch.long), 3, "cpu")
    assert (empty.first, empty.last, empty.span) == (-1, -1, None)


@pytest.mark.parametrize("keep, bad, position", [(torch.tensor([0, 3, 64]), 64, 2), (torch.tensor([-1, 3]), -1, 0)])
def test_bad_index_is_a_config_error_naming_it(keep, bad, position):
    from semimig.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(f"keep index {bad} is out of range [0, 64) (at position {position})")):
        plan_keep(keep, K, "cpu")


# -- operand errors -----------------------------------------------------------------------------


def test_mismatched_k_between_x_and_weight():
    x, w = torch.randn(3, 10), torch.randn(5, 11)
    with pytest.raises(ValueError, match=r"mismatched K .*10 != 11"):
        sk.gather_linear_fwd(x, w, None, None)
    with pytest.raises(ValueError, match="x has 10 features but weight has 11 columns"):
        sk.pruned_linear(x, w, None, None)


def test_mismatched_dims_dtype_and_bias():
    x, w = _x_w()
    with pytest.raises(TypeError, match="weight has dtype torch.float64 but x has dtype torch.float32"):
        sk.gather_linear_fwd(x, w.double(), None, None)
    with pytest.raises(ValueError, match=r"mismatched N .*4 != 5"):
        sk.gather_linear_fwd(x, w, torch.zeros(4), None)
    with pytest.raises(ValueError, match=r"mismatched N \(dy.shape\[1\] vs weight.shape\[0\]\): 6 != 5"):
        sk.gather_linear_dgrad(torch.randn(3, 6), w, None)
    with pytest.raises(ValueError, match=r"mismatched M \(dy.shape\[0\] vs x.shape\[0\]\): 4 != 3"):
        sk.gather_linear_wgrad(torch.randn(4, 5), x, None)
    with pytest.raises(ValueError, match="x must be 2-D"):
        sk.gather_linear_fwd(x[None], w, None, None)
    with pytest.raises(TypeError, match="floating-point"):
        sk.gather_linear_fwd(x.long(), w.long(), None, None)


def test_impute_bad_policy_and_previous():
    with pytest.raises(ValueError, match="impute policy must be one of .* got 'mean'"):
        sk.impute_(torch.zeros(2, 4), torch.tensor([0]), "mean")
    with pytest.raises(ValueError, match="impute policy"):
        sk.pruned_linear(torch.randn(2, 4), torch.randn(3, 4), None, None, impute="zeros")
    with pytest.raises(ValueError, match=r"previous gradient has shape \(2, 3\)"):
        sk.impute_(torch.zeros(2, 4), torch.tensor([0]), "same", torch.zeros(2, 3))


# -- backend selection --------------------------------------------------------------------------


def test_backend_setting_and_context_manager():
    assert sk.get_backend() == "auto"
    assert sk.resolve_backend(torch.device("cpu"), torch.float32) == "torch"  # auto on CPU
    with sk.use_backend("torch"):
        assert sk.get_backend() == "torch"
    assert sk.get_backend() == "auto"
    with pytest.raises(ValueError, match="backend must be one of .* got 'cuda'"):
        sk.set_backend("cuda")


@pytest.mark.skipif(not sk.triton_available(), reason="triton is not installed")
def test_triton_backend_rejects_float64():
    with sk.use_backend("triton"), pytest.raises(TypeError, match="Triton kernels support"):
        sk.gather_linear_fwd(torch.randn(2, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64), None, None)
