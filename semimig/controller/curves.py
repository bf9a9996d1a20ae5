"""Fitted cost curves of the SEMI-migration cost model (paper IV-B, Eq. 2 and Eq. 3).

The pretest samples, at a few column counts ``n``, the extra seconds per iteration that each
balancing action costs, and this module turns those samples into four small models:

    Ω1        fixed cost of resizing (allocating the reduced sub-matrices)      a constant
    Ω2(n)     cost of extracting ``n`` columns on the straggler                 curve
    Φ1(n)     migration communication for ``n`` migrated columns                curve
    Φ2(n)     compute on one receiver for ``n`` received columns                curve

Units. ``n`` counts columns of the reference column count ``L`` that the controller is given
(``decide_plan(columns=L)``): "n columns" means "the share n/L of every semimig layer's K
columns", and the value is the extra time of one whole iteration in seconds. The pretest must
sample in the same units.

Model. A curve is a polynomial with non-negative coefficients,

    c(n) = c0 + c1·n + … + cd·n^d ,   c_i ≥ 0 ,

fitted by non-negative least squares (``scipy.optimize.nnls``). Non-negative coefficients make
every fitted curve non-negative and non-decreasing on ``n ≥ 0`` by construction, so a noisy
pretest can never produce a "negative cost" or a cost that falls as more columns move, and the
Eq. 2 residual stays monotone in β. Degenerate samples fall back as documented in
:func:`fit_curve`.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.optimize import nnls

logger = logging.getLogger(__name__)

_FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class Curve:
    """``c(n) = Σ_i coeffs[i] · n^i`` with every coefficient finite and ``≥ 0``."""

    coeffs: tuple[float, ...]
    """Polynomial coefficients, constant term first (seconds, seconds/column, …)."""

    def __post_init__(self) -> None:
        coeffs = tuple(float(c) for c in self.coeffs)
        if not coeffs:
            raise ValueError("Curve.coeffs must hold at least one coefficient, got ()")
        for i, c in enumerate(coeffs):
            if not math.isfinite(c) or c < 0.0:
                raise ValueError(f"Curve.coeffs[{i}] must be finite and >= 0, got {c!r}")
        object.__setattr__(self, "coeffs", coeffs)

    @classmethod
    def constant(cls, value: float) -> Curve:
        """The flat curve ``c(n) = value``."""
        return cls(coeffs=(value,))

    @classmethod
    def affine(cls, intercept: float, slope: float) -> Curve:
        """``c(n) = intercept + slope · n``."""
        return cls(coeffs=(intercept, slope))

    @property
    def degree(self) -> int:
        return len(self.coeffs) - 1

    def __call__(self, n: float) -> float:
        """Seconds for ``n ≥ 0`` columns (Horner's rule)."""
        n = float(n)
        if not n >= 0.0 or math.isinf(n):
            raise ValueError(f"a cost curve is evaluated at a finite column count n >= 0, got {n!r}")
        value = 0.0
        for c in reversed(self.coeffs):
            value = value * n + c
        return value

    def to_dict(self) -> dict[str, Any]:
        return {"coeffs": list(self.coeffs)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Curve:
        if "coeffs" not in data:
            raise ValueError(f"a Curve dict needs the key 'coeffs', got keys {sorted(data)}")
        return cls(coeffs=tuple(data["coeffs"]))


def fit_curve(ns: Sequence[float], seconds: Sequence[float], *, degree: int = 1) -> Curve:
    """Fit ``seconds ≈ c(ns)`` by non-negative least squares.

    Args:
        ns: column counts of the samples, each finite and ``≥ 0``.
        seconds: measured extra seconds per iteration, one per sample.
        degree: polynomial degree of the model (0 constant, 1 affine, 2 quadratic).

    Fallbacks, in order (each logged at WARNING):

    - samples whose ``seconds`` is NaN or infinite are dropped; if none is left: ValueError.
    - fewer distinct ``n`` than ``degree + 1``: the degree is lowered to ``distinct − 1``
      (a single distinct ``n``, e.g. one sample, gives the constant mean of its seconds).
    - negative trends or negative seconds cannot produce negative coefficients: NNLS puts the
      offending coefficient at 0 (a falling cost fits as a flat one; all-negative samples fit
      as the zero curve).

    The fit is deterministic for identical input.
    """
    if degree not in (0, 1, 2):
        raise ValueError(f"fit_curve degree must be 0, 1 or 2, got {degree!r}")
    n_arr = np.asarray(ns, dtype=np.float64).reshape(-1)
    t_arr = np.asarray(seconds, dtype=np.float64).reshape(-1)
    if n_arr.shape != t_arr.shape:
        raise ValueError(f"fit_curve needs as many ns as seconds, got {n_arr.size} and {t_arr.size}")
    if n_arr.size == 0:
        raise ValueError("fit_curve needs at least one (n, seconds) sample, got none")
    bad_n = [float(v) for v in n_arr if not (math.isfinite(v) and v >= 0.0)]
    if bad_n:
        raise ValueError(f"fit_curve column counts must be finite and >= 0, got {bad_n}")

    finite = np.isfinite(t_arr)
    if not finite.all():
        logger.warning("fit_curve: dropping %d non-finite sample(s) of %d", int((~finite).sum()), t_arr.size)
        n_arr, t_arr = n_arr[finite], t_arr[finite]
    if n_arr.size == 0:
        raise ValueError("fit_curve: every sample's seconds is NaN or infinite; nothing to fit")

    distinct = np.unique(n_arr).size
    if distinct < degree + 1:
        logger.warning(
            "fit_curve: %d distinct n for degree %d, fitting degree %d", distinct, degree, distinct - 1
        )
        degree = distinct - 1

    # Scale n to [0, 1] for conditioning, fit, then undo the scaling on the coefficients.
    scale = float(n_arr.max()) if n_arr.max() > 0.0 else 1.0
    design = np.vander(n_arr / scale, degree + 1, increasing=True)
    scaled, _ = nnls(design, t_arr)
    coeffs = tuple(float(c) / scale**i for i, c in enumerate(scaled))
    return Curve(coeffs=tuple(max(c, 0.0) for c in coeffs))


def fit_constant(seconds: Sequence[float]) -> float:
    """Least-squares constant ``≥ 0`` through the finite samples (for Ω1); ValueError if none."""
    return fit_curve([0.0] * len(seconds), seconds, degree=0).coeffs[0]


@dataclass(frozen=True, kw_only=True)
class CostCurves:
    """The four fitted cost models of Eq. 2 / Eq. 3 (see the module docstring for units)."""

    omega1: float
    """Ω1: fixed seconds per iteration of resizing at all."""
    omega2: Curve
    """Ω2(n): seconds to extract ``n`` pruned columns on the straggler."""
    phi1: Curve
    """Φ1(n): migration communication seconds for ``n`` migrated columns."""
    phi2: Curve
    """Φ2(n): compute seconds on one receiver for ``n`` received columns."""

    def __post_init__(self) -> None:
        omega1 = float(self.omega1)
        if not math.isfinite(omega1) or omega1 < 0.0:
            raise ValueError(f"CostCurves.omega1 must be finite and >= 0, got {self.omega1!r}")
        object.__setattr__(self, "omega1", omega1)
        for name in ("omega2", "phi1", "phi2"):
            value = getattr(self, name)
            if not isinstance(value, Curve):
                raise ValueError(f"CostCurves.{name} must be a Curve, got {type(value).__name__}")

    @classmethod
    def fit(
        cls,
        *,
        omega1_seconds: Sequence[float],
        omega2_samples: tuple[Sequence[float], Sequence[float]],
        phi1_samples: tuple[Sequence[float], Sequence[float]],
        phi2_samples: tuple[Sequence[float], Sequence[float]],
        degree: int = 1,
    ) -> CostCurves:
        """Fit all four models; each ``*_samples`` is ``(ns, seconds)``."""
        return cls(
            omega1=fit_constant(omega1_seconds),
            omega2=fit_curve(*omega2_samples, degree=degree),
            phi1=fit_curve(*phi1_samples, degree=degree),
            phi2=fit_curve(*phi2_samples, degree=degree),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; :meth:`from_dict` inverts it exactly."""
        return {
            "version": _FORMAT_VERSION,
            "omega1": self.omega1,
            "omega2": self.omega2.to_dict(),
            "phi1": self.phi1.to_dict(),
            "phi2": self.phi2.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostCurves:
        version = data.get("version")
        if version != _FORMAT_VERSION:
            raise ValueError(f"CostCurves dict version must be {_FORMAT_VERSION}, got {version!r}")
        missing = sorted({"omega1", "omega2", "phi1", "phi2"} - set(data))
        if missing:
            raise ValueError(f"CostCurves dict is missing the keys {missing}")
        return cls(
            omega1=data["omega1"],
            omega2=Curve.from_dict(data["omega2"]),
            phi1=Curve.from_dict(data["phi1"]),
            phi2=Curve.from_dict(data["phi2"]),
        )
