"""Unit tests of the pure SEMI-migration decision core (curves, config, plan).

Every expected number below is derived by hand in the test from the paper's equations
(Eq. 1, Eq. 2, Eq. 3 as read in ``semimig/controller/plan.py``), not taken from the code.
"""
from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semimig.controller.config import ControllerConfig
from semimig.controller.curves import CostCurves, Curve, fit_constant, fit_curve
from semimig.controller.plan import (
    GroupPlan,
    RankAction,
    decide_plan,
    solve_beta,
    unbalanced_times,
)
from semimig.errors import ConfigError

L = 1000  # reference K columns per rank


def _curves(*, omega1=0.0, omega2=(0.0, 0.0), phi1=(0.0, 0.0), phi2=(0.0, 0.0)) -> CostCurves:
    return CostCurves(
        omega1=omega1, omega2=Curve.affine(*omega2), phi1=Curve.affine(*phi1), phi2=Curve.affine(*phi2)
    )


# --------------------------------------------------------------------------------------------
# curves
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("degree", [1, 2])
def test_fit_curve_recovers_noise_free_polynomial(degree):
    ns = np.array([0.0, 64.0, 128.0, 256.0, 512.0])
    true = [0.003, 2e-5, 1e-8][: degree + 1]
    seconds = sum(c * ns**i for i, c in enumerate(true))
    curve = fit_curve(ns, seconds, degree=degree)
    assert curve.degree == degree
    np.testing.assert_allclose(curve.coeffs, true, rtol=1e-6, atol=1e-12)


def test_fit_curve_matches_unconstrained_least_squares_when_trend_is_positive():
    rng = np.random.default_rng(0)
    ns = np.linspace(0, 500, 9)
    seconds = 0.01 + 3e-5 * ns + rng.normal(0, 1e-4, ns.size)
    ref, *_ = np.linalg.lstsq(np.vander(ns, 2, increasing=True), seconds, rcond=None)  # float64 reference
    assert (ref > 0).all()  # the constraint is inactive, so NNLS must equal plain least squares
    np.testing.assert_allclose(fit_curve(ns, seconds).coeffs, ref, rtol=1e-8)


def test_fit_curve_single_sample_falls_back_to_constant():
    curve = fit_curve([128], [0.25])
    assert curve.coeffs == pytest.approx((0.25,))
    assert curve(0) == pytest.approx(0.25) and curve(1e6) == pytest.approx(0.25)


def test_fit_curve_all_equal_n_falls_back_to_mean():
    curve = fit_curve([64, 64, 64], [0.1, 0.2, 0.3], degree=2)
    assert curve.degree == 0 and curve.coeffs[0] == pytest.approx(0.2)


def test_fit_curve_falling_trend_fits_flat_not_negative():
    # Least squares would give slope -1e-4 < 0; NNLS clamps the slope to 0 and refits the
    # intercept: the best constant is the mean of the samples.
    ns, seconds = [0, 100, 200], [0.03, 0.02, 0.01]
    curve = fit_curve(ns, seconds)
    assert curve.coeffs[1] == 0.0
    assert curve.coeffs[0] == pytest.approx(0.02)


def test_fit_curve_negative_seconds_give_zero_curve():
    curve = fit_curve([0, 10, 20], [-0.1, -0.2, -0.3])
    assert curve.coeffs == (0.0, 0.0)
    assert curve(5) == 0.0


def test_fit_curve_drops_nan_samples():
    curve = fit_curve([0, 100, 200, 300], [0.01, float("nan"), 0.03, float("inf")])
    # Remaining samples (0, 0.01), (200, 0.03): the line through them.
    assert curve.coeffs == pytest.approx((0.01, 1e-4))


@pytest.mark.parametrize(
    "ns, seconds, match",
    [
        ([], [], "at least one"),
        ([0, 1], [float("nan"), float("nan")], "NaN or infinite"),
        ([-1, 2], [0.1, 0.2], "finite and >= 0"),
        ([1, 2], [0.1], "as many"),
    ],
)
def test_fit_curve_rejects_unusable_input(ns, seconds, match):
    with pytest.raises(ValueError, match=match):
        fit_curve(ns, seconds)


def test_curve_and_cost_curves_validation():
    with pytest.raises(ValueError, match=r"coeffs\[1\]"):
        Curve(coeffs=(0.1, -1.0))
    with pytest.raises(ValueError, match="omega1"):
        _curves(omega1=float("nan"))
    with pytest.raises(ValueError, match="n >= 0"):
        Curve.affine(0.0, 1.0)(-1.0)
    with pytest.raises(ValueError, match="version"):
        CostCurves.from_dict({"omega1": 0.0})


def test_cost_curves_json_round_trip():
    curves = CostCurves.fit(
        omega1_seconds=[0.002, 0.004],
        omega2_samples=([100, 200, 400], [0.01, 0.021, 0.039]),
        phi1_samples=([100, 200], [0.05, 0.09]),
        phi2_samples=([50, 100], [0.003, 0.007]),
        degree=1,
    )
    assert curves.omega1 == pytest.approx(0.003)
    again = CostCurves.from_dict(json.loads(json.dumps(curves.to_dict())))
    assert again == curves


def test_fit_constant_is_mean_and_non_negative():
    assert fit_constant([0.1, 0.3]) == pytest.approx(0.2)
    assert fit_constant([-0.5]) == 0.0


# --------------------------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"mode": "zero-pri"}, "mode"),
        ({"tol": -0.01}, "tol"),
        ({"tol": float("nan")}, "tol"),
        ({"refresh_threshold": float("inf")}, "refresh_threshold"),
        ({"gamma_max": 1.0}, "gamma_max"),
        ({"gamma_max": -0.1}, "gamma_max"),
        ({"gamma_max": float("nan")}, "gamma_max"),
        ({"zero_reference": "avg"}, "zero_reference"),
        ({"receivers": "all"}, "receivers"),
        ({"migrators": -1}, "migrators"),
        ({"migrators": 1.5}, "migrators"),
        ({"migrators": 1, "mode": "zero"}, "migrators"),
    ],
)
def test_config_validation_names_field_and_value(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ControllerConfig(**kwargs)


def test_config_is_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        ControllerConfig("semi")  # type: ignore[misc]
    cfg = ControllerConfig()
    with pytest.raises(AttributeError):
        cfg.tol = 0.2  # type: ignore[misc]


# --------------------------------------------------------------------------------------------
# decide_plan: known answers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["baseline", "zero", "mig", "semi"])
def test_no_straggler_gives_all_normal(mode):
    # 1.04 < 1.0 * (1 + 0.05): inside the noise tolerance.
    plan = decide_plan([1.0, 1.04, 1.02, 1.0], L, _curves(), ControllerConfig(mode=mode))
    assert plan.is_balanced and plan.stragglers == () and plan.x == 0
    assert all(a.receive_share == 0.0 for a in plan.actions)


def test_mild_straggler_with_expensive_migration_resizes_only():
    times = [1.0, 1.0, 1.5, 1.0]
    # Migration costs 1 s of traffic whatever the volume; resizing costs 2 ms + 10 µs/column.
    curves = _curves(omega1=0.002, omega2=(0.0, 1e-5), phi1=(1.0, 0.0), phi2=(0.0, 1e-5))
    plan = decide_plan(times, L, curves, ControllerConfig())
    gamma = 1 - 1.0 / 1.5  # Eq. 1 with M_i = T_i against T_min = 1
    # g(0) = Ω1 + Ω2(Lγ) − Φ1(0) − Φ2(0) = 0.002 + 1e-5 * 333.3 - 1.0 < 0: no β makes migration
    # cheaper than resizing, so β = 0.
    assert plan.beta == 0.0
    assert plan.stragglers == (2,) and plan.x == 0
    assert plan.actions[2].kind == "resize"
    assert plan.actions[2].gamma == pytest.approx(gamma)
    assert plan.actions[2].migrate_share == 0.0
    assert [a.kind for a in plan.actions] == ["normal", "normal", "resize", "normal"]


def test_heavy_straggler_splits_by_eq2_closed_form():
    e = 4
    times = [1.0, 1.0, 1.0, 4.0]
    a, b, c, d, p = 0.02, 1e-4, 0.01, 2e-5, 1e-4
    curves = _curves(omega1=a, omega2=(0.0, b), phi1=(c, d), phi2=(0.0, p))
    plan = decide_plan(times, L, curves, ControllerConfig(max_receiver_load=None))

    gamma = 1 - 1.0 / 4.0  # 0.75
    n = L * gamma
    # a + b n (1-β) = c + d n β + p n β/(e-1)  =>  β = (a - c + b n) / (n (b + d + p/(e-1)))
    beta = (a - c + b * n) / (n * (b + d + p / (e - 1)))
    assert 0 < beta < 1
    assert plan.beta == pytest.approx(beta, rel=1e-12)
    act = plan.actions[3]
    assert act.kind == "migrate"
    assert act.migrate_share == pytest.approx(gamma * beta, rel=1e-12)
    assert act.gamma == pytest.approx(gamma * (1 - beta), rel=1e-12)
    # Receivers in virtual-rank order (r - 3) mod 4: ranks 0, 1, 2 get r' = 1, 2, 3.
    assert act.receivers == (0, 1, 2)
    for r in range(3):
        assert plan.actions[r].kind == "normal"
        assert plan.actions[r].receive_share == pytest.approx(gamma * beta / 3, rel=1e-12)


def test_a_sliver_of_migration_resizes_instead():
    """Eq. 2 wants β = 0.03 of a 0.75 share (2 % of the columns): below min_migrate_share the
    straggler only resizes; with the threshold at 0, Eq. 2's own β stands."""
    times = [1.0, 4.0]  # two ranks
    a, b, c, d, p = 0.0, 1e-6, 0.0, 1e-6, 3e-5  # β = b n / (n (b + d + p)) = 1/32
    curves = _curves(omega1=a, omega2=(0.0, b), phi1=(c, d), phi2=(0.0, p))
    plan = decide_plan(times, L, curves, ControllerConfig())
    assert plan.actions[1].kind == "resize" and plan.actions[1].gamma == pytest.approx(0.75)
    assert plan.beta == 0.0
    raw = decide_plan(times, L, curves, ControllerConfig(min_migrate_share=0.0))
    assert raw.beta == pytest.approx(1 / 32) and raw.actions[1].migrate_share == pytest.approx(0.75 / 32)


def test_receiver_load_caps_eq2_and_the_rest_is_pruned():
    """Eq. 2 alone migrates everything (cheap migration); with the default cap a receiver computes at
    most max_receiver_load of its own columns on top: e = 2, shed 2/3 of L -> 0.15 L migrate, the
    rest of the shed share is pruned; with e = 4 three receivers take 3 x 0.15 = 0.45 L of the 2/3."""
    curves = _curves(omega1=0.05, omega2=(0.0, 1e-4), phi1=(0.0, 1e-6), phi2=(0.0, 1e-6))
    plan = decide_plan([3.0, 1.0], L, curves, ControllerConfig())
    act = plan.actions[0]
    assert act.migrate_share == pytest.approx(0.15, rel=1e-12)
    assert act.gamma == pytest.approx(2 / 3 - 0.15, rel=1e-12)
    assert plan.actions[1].receive_share == pytest.approx(0.15, rel=1e-12)
    wide = decide_plan([3.0, 1.0, 1.0, 1.0], L, curves, ControllerConfig())
    assert wide.actions[0].migrate_share == pytest.approx(0.45, rel=1e-12)
    assert wide.actions[0].gamma == pytest.approx(2 / 3 - 0.45, rel=1e-12)
    assert decide_plan([3.0, 1.0], L, curves, ControllerConfig(max_receiver_load=None)).beta == 1.0
    with pytest.raises(ConfigError, match="max_receiver_load"):
        ControllerConfig(max_receiver_load=-0.1)


def test_single_straggler_with_cheap_migration_migrates_everything():
    curves = _curves(omega1=0.05, omega2=(0.0, 1e-4), phi1=(0.0, 1e-6), phi2=(0.0, 1e-6))
    plan = decide_plan([3.0, 1.0], L, curves, ControllerConfig(max_receiver_load=None))
    # g(1) = 0.05 + 0 - 1e-6 n - 1e-6 n = 0.05 - 2e-6 * 666.7 > 0: migrating all is cheaper.
    assert plan.beta == 1.0
    assert plan.actions[0].migrate_share == pytest.approx(2 / 3) and plan.actions[0].gamma == 0.0
    assert plan.actions[1].receive_share == pytest.approx(2 / 3)


# Paper Fig. 11: 8 ranks, half of them straggle with χ = 8, 6, 4, 2; busy time ∝ χ, T_min = 1 s.
# Stragglers sit at scattered ranks to exercise the sorting.
FIG11_CHI = {5: 8, 2: 6, 7: 4, 0: 2}
FIG11_TIMES = [float(FIG11_CHI.get(r, 1)) for r in range(8)]


def _fig11_f_by_hand(phi1_fixed: Fraction, phi1_per_l: Fraction, receivers: str) -> list[Fraction]:
    """Eq. 3 with exact fractions. s_k = 1 - 1/χ_k; Γ(x) counted in units of L columns.

    non_migrating: R(x) = sorted positions x+1..8, |R| = 8 - x, slowest receiver per column
    χ_(x+1)/L (the next straggler, or a normal rank with χ = 1 when x = 4).
    normal: R = the 4 normal ranks, |R| = 4, per column 1/L.
    """
    chis = [8, 6, 4, 2, 1, 1, 1, 1]
    out, gamma = [], Fraction(0)
    for x in range(1, 5):
        gamma += 1 - Fraction(1, chis[x - 1])
        phi1 = phi1_fixed + phi1_per_l * gamma
        if receivers == "non_migrating":
            compute = gamma / (8 - x) * chis[x]
        else:
            compute = gamma / 4 * 1
        out.append((chis[x - 1] - 1) - phi1 - compute)
    return out


@pytest.mark.parametrize(
    "phi1_fixed, phi1_per_l, receivers, expected_x",
    [
        # Φ1 = 50 ms + 0.5 s per L migrated columns (traffic of half a clean iteration per L):
        # f = (5.76, 2.96, 0.74, -1.27) -> x = 3, the paper's measured sweet spot λ = 3.
        (Fraction(1, 20), Fraction(1, 2), "non_migrating", 3),
        # Same curves, only normal ranks receive: f = (6.29, 3.67, 1.11, -1.27) -> x = 3.
        (Fraction(1, 20), Fraction(1, 2), "normal", 3),
        # Ten times cheaper traffic: f(4) = 1 - 0.158 - 0.740 > 0 -> all four migrate (MIG).
        (Fraction(1, 100), Fraction(1, 20), "non_migrating", 4),
        # Traffic of 3 s per L: f = (3.87, -0.27, -5.09, -8.62) -> only the χ = 8 rank migrates.
        (Fraction(1, 20), Fraction(3), "non_migrating", 1),
    ],
)
def test_fig11_multi_straggler_x(phi1_fixed, phi1_per_l, receivers, expected_x):
    curves = _curves(phi1=(float(phi1_fixed), float(phi1_per_l) / L), phi2=(0.0, 1.0 / L))
    plan = decide_plan(FIG11_TIMES, L, curves, ControllerConfig(receivers=receivers))
    f_hand = _fig11_f_by_hand(phi1_fixed, phi1_per_l, receivers)
    expected_x_from_f = max((i + 1 for i, f in enumerate(f_hand) if f > 0), default=0)
    assert expected_x_from_f == expected_x  # the hand table above agrees with the comment

    assert plan.stragglers == (5, 2, 7, 0)
    assert plan.f_values == pytest.approx([float(f) for f in f_hand], rel=1e-12, abs=1e-12)
    assert plan.x == expected_x
    migrating, resizing = plan.stragglers[:expected_x], plan.stragglers[expected_x:]
    for r in migrating:
        act = plan.actions[r]
        assert act.kind == "migrate" and act.gamma == 0.0
        assert act.migrate_share == pytest.approx(1 - 1 / FIG11_CHI[r])
    for r in resizing:
        act = plan.actions[r]
        assert act.kind == "resize" and act.migrate_share == 0.0
        assert act.gamma == pytest.approx(1 - 1 / FIG11_CHI[r])  # Eq. 1 against T_min
    expected_receivers = (
        {r for r in range(8) if r not in migrating}
        if receivers == "non_migrating"
        else {r for r in range(8) if r not in FIG11_CHI}
    )
    for r in migrating:
        assert set(plan.actions[r].receivers) == expected_receivers
    # Every migrated column lands on exactly one receiver.
    migrated = sum(a.migrate_share for a in plan.actions) * L
    received = sum(a.receive_share for a in plan.actions) * L
    assert received == pytest.approx(migrated)


@pytest.mark.parametrize("lam", [0, 1, 2, 3, 4, 7])
def test_migrators_fix_x_for_the_lambda_sweep(lam):
    """λ replaces Eq. 3's x (capped at z = 4): the λ slowest migrate, the others resize by Eq. 1."""
    curves = _curves(phi1=(0.05, 0.5 / L), phi2=(0.0, 1.0 / L))
    auto = decide_plan(FIG11_TIMES, L, curves, ControllerConfig())
    plan = decide_plan(FIG11_TIMES, L, curves, ControllerConfig(migrators=lam))
    x = min(lam, 4)
    assert plan.x == x and plan.f_values == auto.f_values  # Eq. 3 still reported
    for i, r in enumerate(plan.stragglers):
        act = plan.actions[r]
        expected = 1 - 1 / FIG11_CHI[r]
        if i < x:
            assert act.kind == "migrate" and act.migrate_share == pytest.approx(expected) and act.gamma == 0.0
        else:
            assert act.kind == "resize" and act.gamma == pytest.approx(expected)
    assert (plan.x == auto.x) == (x == 3)  # Eq. 3 alone picks 3 on these curves


def test_zero_mode_uses_group_mean_or_min():
    times = [4.0, 1.0, 1.0, 1.0]
    mean_plan = decide_plan(times, L, _curves(), ControllerConfig(mode="zero"))
    # T_avg = 7/4; γ = 1 - (7/4)/4 = 9/16.
    assert mean_plan.t_ref == pytest.approx(1.75)
    assert mean_plan.actions[0].kind == "resize" and mean_plan.actions[0].gamma == pytest.approx(9 / 16)
    min_plan = decide_plan(times, L, _curves(), ControllerConfig(mode="zero", zero_reference="min"))
    assert min_plan.actions[0].gamma == pytest.approx(3 / 4)
    # With the mean as reference a rank just above T_min is not a straggler.
    assert [a.kind for a in mean_plan.actions[1:]] == ["normal"] * 3


def test_gamma_max_caps_the_shed_share():
    plan = decide_plan([20.0, 1.0, 1.0], L, _curves(), ControllerConfig(mode="zero", zero_reference="min"))
    assert plan.actions[0].gamma == pytest.approx(0.9)  # 1 - 1/20 = 0.95 capped at γ_max


def test_mig_mode_migrates_all_stragglers_to_normal_ranks():
    plan = decide_plan([4.0, 2.0, 1.0, 1.0], L, _curves(), ControllerConfig(mode="mig"))
    assert plan.stragglers == (0, 1) and plan.x == 2
    assert plan.actions[0].migrate_share == pytest.approx(0.75)
    assert plan.actions[1].migrate_share == pytest.approx(0.5)
    assert all(a.gamma == 0.0 for a in plan.actions)
    assert plan.actions[0].receivers == (2, 3)
    assert plan.actions[1].receivers == (2, 3)  # virtual ranks (2-1)%4 = 1, (3-1)%4 = 2
    # Each normal rank gets half of both: (0.75 + 0.5) / 2 of L.
    assert plan.actions[2].receive_share == pytest.approx(0.625)
    assert plan.actions[3].receive_share == pytest.approx(0.625)


def test_baseline_reports_stragglers_but_acts_normal():
    plan = decide_plan([1.0, 3.0, 2.0], L, _curves(), ControllerConfig(mode="baseline"))
    assert plan.stragglers == (1, 2) and plan.is_balanced


def test_ties_break_by_rank_and_virtual_rank_order():
    plan = decide_plan([1.0, 3.0, 1.0, 3.0, 1.0], L, _curves(), ControllerConfig(mode="mig"))
    assert plan.stragglers == (1, 3)
    assert plan.actions[1].receivers == (2, 4, 0)  # (r - 1) % 5 = 1, 3, 4
    assert plan.actions[3].receivers == (4, 0, 2)  # (r - 3) % 5 = 1, 2, 4


def test_per_rank_columns_weight_eq3():
    # Rank 1 has twice the columns: its seconds per column is half, Γ counts its own L.
    times = [3.0, 1.0, 2.0, 1.0]
    cols = [100, 200, 100, 100]
    curves = _curves(phi1=(0.0, 0.001))
    plan = decide_plan(times, cols, curves, ControllerConfig())
    # x=1: Γ = 100 * 2/3; R = {1, 2, 3}; per column max(1/200, 2/100, 1/100) = 0.02.
    g1 = 100 * (2 / 3)
    f1 = 2.0 - (0.001 * g1 + g1 / 3 * 0.02)
    # x=2: Γ += 100 * 1/2; R = {1, 3}; per column max(1/200, 1/100) = 0.01.
    g2 = g1 + 50
    f2 = 1.0 - (0.001 * g2 + g2 / 2 * 0.01)
    assert plan.f_values == pytest.approx((f1, f2))
    assert plan.x == max(i + 1 for i, f in enumerate((f1, f2)) if f > 0)


# --------------------------------------------------------------------------------------------
# hysteresis, determinism, helpers
# --------------------------------------------------------------------------------------------


def test_hysteresis_holds_under_small_noise_and_releases_on_big_change():
    curves = _curves(omega1=0.02, omega2=(0.0, 1e-4), phi1=(0.01, 2e-5), phi2=(0.0, 1e-4))
    cfg = ControllerConfig()
    first = decide_plan([1.0, 1.0, 1.0, 4.0], L, curves, cfg)
    rng = np.random.default_rng(1)
    for _ in range(20):
        noisy = [t * (1 + rng.uniform(-0.09, 0.09)) for t in first.busy_times]
        assert decide_plan(noisy, L, curves, cfg, previous=first) is first
    # Rank 0 becomes 30 % slower: moved more than 10 %, so a fresh plan is computed.
    moved = [1.3, 1.0, 1.0, 4.0]
    fresh = decide_plan(moved, L, curves, cfg, previous=first)
    assert fresh is not first and fresh.busy_times == tuple(moved)
    assert fresh == decide_plan(moved, L, curves, cfg)
    assert fresh.stragglers == (3, 0)
    # A changed config also releases the hold.
    other_cfg = ControllerConfig(mode="zero")
    assert decide_plan(first.busy_times, L, curves, other_cfg, previous=first) is not first


@pytest.mark.parametrize("change, holds", [(0.09, True), (-0.09, True), (0.11, False), (-0.11, False)])
def test_hysteresis_threshold_is_relative_to_decided_times(change, holds):
    cfg = ControllerConfig(refresh_threshold=0.10)
    first = decide_plan([1.0, 2.0, 1.0], L, _curves(), cfg)
    moved = [1.0, 2.0 * (1 + change), 1.0]  # only the straggler moves, by `change` of its 2 s
    assert (decide_plan(moved, L, _curves(), cfg, previous=first) is first) == holds


def test_decide_plan_is_deterministic():
    curves = _curves(omega1=0.01, omega2=(0.0, 1e-4), phi1=(0.01, 1e-4), phi2=(0.0, 1e-3))
    for times in ([2.0, 1.0, 1.0, 1.0], FIG11_TIMES, [1.0, 5.0, 5.0, 1.0, 2.5]):
        plans = [decide_plan(list(times), L, curves, ControllerConfig()) for _ in range(3)]
        assert plans[0] == plans[1] == plans[2]
        assert plans[0].summary() == plans[1].summary()


def test_unbalanced_times_inverts_proportional_busy_time():
    curves = _curves(omega1=0.02, omega2=(0.0, 1e-4), phi1=(0.01, 2e-5), phi2=(0.0, 1e-4))
    plan = decide_plan([1.0, 1.0, 1.0, 4.0], L, curves, ControllerConfig())
    beta = plan.beta
    # Proportional model by hand: the straggler keeps 1 - 0.75 of its columns at 4 s per L,
    # each receiver computes 1 + 0.75 β / 3 of L at 1 s per L.
    measured = [1.0 * (1 + 0.75 * beta / 3)] * 3 + [4.0 * 0.25]
    assert unbalanced_times(measured, plan) == pytest.approx((1.0, 1.0, 1.0, 4.0))
    with pytest.raises(ValueError, match="times for a plan"):
        unbalanced_times([1.0, 1.0], plan)


def test_column_counts_round_and_never_exceed_k():
    act = RankAction(rank=0, kind="migrate", gamma=0.45, migrate_share=0.45, receivers=(1,))
    # keep = round(10 * 0.1) = 1, shed = 9, migrated = round(4.5) = 4 (half to even), pruned = 5.
    assert act.column_counts(10) == (5, 4)
    # A resize-only action prunes DESIGN's |P| = K - round(K (1 - γ)): 7 - round(3.5) = 3.
    assert RankAction(rank=0, kind="resize", gamma=0.5).column_counts(7) == (3, 0)
    assert act.column_counts(0) == (0, 0)


def test_solve_beta_degenerate_curves_do_not_crash():
    zero = _curves()
    # g ≡ 0: every β balances; the tie goes to migration (loss-free).
    assert solve_beta(500.0, 4, zero) == 1.0
    assert solve_beta(0.0, 4, zero) == 0.0 and solve_beta(500.0, 1, zero) == 0.0
    flat = Curve.constant(0.0)
    huge = CostCurves(omega1=1e30, omega2=flat, phi1=flat, phi2=flat)
    assert solve_beta(500.0, 4, huge) == 1.0
    plan = decide_plan([5.0, 1.0], L, zero, ControllerConfig(max_receiver_load=None))
    assert plan.beta == 1.0 and plan.actions[0].migrate_share == pytest.approx(0.8)


@pytest.mark.parametrize(
    "times, columns, match",
    [
        ([], L, "none"),
        ([1.0, float("nan")], L, r"busy_times\[1\]"),
        ([1.0, 0.0], L, r"busy_times\[1\]"),
        ([1.0, -2.0], L, r"busy_times\[1\]"),
        ([1.0, 2.0], [L], "one per rank"),
        ([1.0, 2.0], [L, 0], r"columns\[1\]"),
        ([1.0, 2.0], True, r"columns\[0\]"),
    ],
)
def test_decide_plan_rejects_bad_input(times, columns, match):
    with pytest.raises(ValueError, match=match):
        decide_plan(times, columns, _curves(), ControllerConfig())


def test_rank_action_validation():
    with pytest.raises(ValueError, match="kind"):
        RankAction(rank=0, kind="normal", gamma=0.1)
    with pytest.raises(ValueError, match="receivers"):
        RankAction(rank=0, kind="migrate", migrate_share=0.1)
    with pytest.raises(ValueError, match="< 1"):
        RankAction(rank=0, kind="migrate", gamma=0.5, migrate_share=0.5, receivers=(1,))
    with pytest.raises(ValueError, match="one action per rank"):
        GroupPlan(config=ControllerConfig(), actions=(), busy_times=(1.0,), t_ref=1.0, stragglers=(), x=0)


# --------------------------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------------------------

_coef = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@st.composite
def _scenario(draw):
    e = draw(st.integers(min_value=1, max_value=8))
    times = draw(st.lists(st.floats(min_value=0.05, max_value=20.0), min_size=e, max_size=e))
    columns = draw(st.one_of(st.integers(1, 4096), st.lists(st.integers(1, 4096), min_size=e, max_size=e)))
    curves = CostCurves(
        omega1=draw(_coef),
        omega2=Curve(coeffs=(draw(_coef), draw(_coef) * 1e-3)),
        phi1=Curve(coeffs=(draw(_coef), draw(_coef) * 1e-3, draw(_coef) * 1e-6)),
        phi2=Curve(coeffs=(draw(_coef), draw(_coef) * 1e-3)),
    )
    config = ControllerConfig(
        mode=draw(st.sampled_from(["baseline", "zero", "mig", "semi"])),
        tol=draw(st.floats(0.0, 0.3)),
        gamma_max=draw(st.floats(0.0, 0.99)),
        zero_reference=draw(st.sampled_from(["mean", "min"])),
        receivers=draw(st.sampled_from(["non_migrating", "normal"])),
    )
    return times, columns, curves, config


@settings(max_examples=300, deadline=None)
@given(_scenario())
def test_plan_invariants(scenario):
    times, columns, curves, config = scenario
    plan = decide_plan(times, columns, curves, config)
    cols = [columns] * len(times) if isinstance(columns, int) else columns
    assert decide_plan(times, columns, curves, config) == plan  # deterministic
    straggling = set(plan.stragglers)
    t_min = min(times)
    assert times.index(t_min) not in straggling  # the fastest rank never straggles
    for a in plan.actions:
        assert 0.0 <= a.gamma <= config.gamma_max
        assert a.migrate_share >= 0.0 and a.receive_share >= 0.0
        assert a.shed_share <= config.gamma_max + 1e-15
        if a.kind == "normal":
            assert a.gamma == 0.0 and a.migrate_share == 0.0
        if a.rank not in straggling:
            assert a.kind == "normal"
        pruned, migrated = a.column_counts(cols[a.rank])
        assert 0 <= pruned and 0 <= migrated and pruned + migrated <= cols[a.rank]
    assert plan.x == sum(a.kind == "migrate" for a in plan.actions) <= len(plan.stragglers)
    if config.mode == "baseline":
        assert plan.is_balanced
    if config.mode == "zero":
        assert all(a.migrate_share == 0.0 for a in plan.actions)
    if config.mode == "mig":
        assert all(a.gamma == 0.0 for a in plan.actions)
    if plan.beta is not None:
        assert 0.0 <= plan.beta <= 1.0
    migrated_cols = sum(a.migrate_share * c for a, c in zip(plan.actions, cols))
    received_cols = sum(a.receive_share * c for a, c in zip(plan.actions, cols))
    assert math.isclose(migrated_cols, received_cols, rel_tol=1e-9, abs_tol=1e-9)


def test_equal_times_make_no_straggler_against_the_mean():
    """Three equal times: their mean rounds below them in floating point, and no rank may straggle for it."""
    times = [10.79246285129889] * 3
    assert sum(times) / 3 < times[0]  # the round-off the reference must not follow
    zero = CostCurves(omega1=0.0, omega2=Curve(coeffs=(0.0, 0.0)), phi1=Curve(coeffs=(0.0, 0.0, 0.0)),
                      phi2=Curve(coeffs=(0.0, 0.0)))
    plan = decide_plan(times, 1, zero, ControllerConfig(mode="zero", tol=0.0, zero_reference="mean"))
    assert plan.stragglers == () and all(a.kind == "normal" for a in plan.actions)


@settings(max_examples=200, deadline=None)
@given(
    n=st.floats(1.0, 1e4),
    e=st.integers(2, 16),
    a=_coef,
    b=_coef,
    c=_coef,
    d=_coef,
    p=_coef,
)
def test_solve_beta_balances_eq2(n, e, a, b, c, d, p):
    curves = _curves(omega1=a, omega2=(0.0, b * 1e-3), phi1=(c, d * 1e-3), phi2=(0.0, p * 1e-3))

    def g(beta):  # Eq. 2 residual written out again
        return a + b * 1e-3 * n * (1 - beta) - (c + d * 1e-3 * n * beta + p * 1e-3 * n * beta / (e - 1))

    beta = solve_beta(n, e, curves)
    assert 0.0 <= beta <= 1.0
    if beta == 0.0:
        assert g(0.0) <= 1e-12 or g(1e-9) < 0
    elif beta == 1.0:
        assert g(1.0) >= 0.0
    else:
        scale = max(a, c, b * 1e-3 * n, d * 1e-3 * n, p * 1e-3 * n, 1e-12)
        assert abs(g(beta)) <= 1e-9 * scale
