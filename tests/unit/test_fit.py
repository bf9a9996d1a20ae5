"""semimig._fit.line_fit: the one straight-line fit (the controller's fixed fraction, the link and
fixed-cost fits of the benchmarks all call it)."""
import math
import random

import pytest

from semimig._fit import line_fit


def test_an_exact_line_is_recovered_and_the_order_of_points_does_not_matter():
    rng = random.Random(0)
    xs = [rng.uniform(0.1, 1.0) for _ in range(50)]
    ys = [0.3 + 2.5 * x for x in xs]
    a, b = line_fit(xs, ys)
    assert a == pytest.approx(0.3, abs=1e-12) and b == pytest.approx(2.5, abs=1e-12)
    order = list(range(50))
    rng.shuffle(order)
    assert line_fit([xs[i] for i in order], [ys[i] for i in order]) == (a, b)  # fsum: exactly rounded sums


def test_noisy_points_give_the_least_squares_line():
    xs, ys = [0.0, 1.0, 2.0, 3.0], [1.0, 2.0, 2.0, 4.0]
    a, b = line_fit(xs, ys)
    # normal equations by hand: b = Sxy / Sxx = 4.5 / 5 = 0.9, a = 2.25 - 0.9 * 1.5 = 0.9
    assert (a, b) == pytest.approx((0.9, 0.9))
    residual = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    for da, db in ((0.01, 0), (-0.01, 0), (0, 0.01), (0, -0.01)):  # any other line is worse
        assert sum((y - a - da - (b + db) * x) ** 2 for x, y in zip(xs, ys)) > residual


@pytest.mark.parametrize(("xs", "ys", "needle"), [
    ([1.0, 1.0, 1.0], [1.0, 2.0, 3.0], "two or more distinct x, got [1.0]"),
    ([1.0, 2.0], [1.0], "one y per x, got 2 x and 1 y"),
    ([], [], "two or more distinct x, got []"),
    ([float("nan"), float("nan")], [1.0, 2.0], "finite points, got [(nan, 1.0), (nan, 2.0)]"),  # NaN != NaN
    ([1.0, 2.0], [1.0, float("inf")], "finite points, got [(2.0, inf)]"),
    ([0.0, 5e-324], [1.0, 2.0], "x with a spread"),  # distinct, but Σ(x − x̄)² underflows to 0
])
def test_an_undefined_slope_is_refused_naming_the_points(xs, ys, needle):
    with pytest.raises(ValueError) as info:
        line_fit(xs, ys)
    assert needle in str(info.value)


def test_the_controllers_fixed_fraction_is_the_fit_of_its_points():
    from semimig.controller.timing import fit_fixed_fraction

    points = [(1.0, 10.0), (0.5, 6.0), (0.25, 4.0), (0.1, 2.9)]
    a, b = line_fit([w for w, _ in points], [t for _, t in points])
    assert fit_fixed_fraction(points) == pytest.approx(a / (a + b))
    assert math.isclose(fit_fixed_fraction([(1.0, 10.0), (0.5, 5.0)]), 0.0, abs_tol=1e-12)  # all of it shrinks
