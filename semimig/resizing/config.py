"""Configuration of ZERO-resizing (paper Sec. III; DESIGN.md section 1).

Variants (paper Sec. V):

    rd         random keep set, ratio from Eq. 1
    pri        prune the columns with the smallest weight variation delta, ratio from Eq. 1
    pridiff-e  per-layer ratios max(share(delta < theta), alpha * gamma) with the empirical
               gamma = ``empirical_gamma`` (1/2 in the paper)
    pridiff-r  the same with gamma from Eq. 1
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

__all__ = ["VARIANTS", "IMPUTES", "T_REFS", "ResizingConfig"]

Variant = Literal["rd", "pri", "pridiff-e", "pridiff-r"]
Impute = Literal["zero", "same", "average"]
TRef = Literal["mean", "min"]
VARIANTS: tuple[str, ...] = ("rd", "pri", "pridiff-e", "pridiff-r")
IMPUTES: tuple[str, ...] = ("zero", "same", "average")
T_REFS: tuple[str, ...] = ("mean", "min")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class ResizingConfig:
    """ZERO-resizing settings; every field is validated, errors name the field and the value."""

    variant: Variant = "pri"
    """Column selection and ratio rule, one of ``VARIANTS``."""
    gamma_max: float = 0.9
    """Upper clamp of every pruning ratio, in [0, 1)."""
    impute: Impute = "zero"
    """Value of pruned weight-gradient columns: ``zero``, ``same`` (previous iteration's), ``average``."""
    alpha: float = 0.8
    """PriDiff decay: a layer prunes at least ``alpha * gamma``; in (0, 1]."""
    theta_iter: float = 1e-3
    """PriDiff micro-threshold; theta = iterations per period * theta_iter; >= 0."""
    period: Optional[int] = None
    """Statistics period in iterations (>= 1); None = iterations per epoch when known."""
    refresh_threshold: float = 0.10
    """Relative change of a rank's own busy time that triggers a group refresh of T_ref; > 0."""
    t_ref: TRef = "mean"
    """Reference time of Eq. 1: group ``mean`` (ZERO alone) or ``min`` (inside SEMI)."""
    empirical_gamma: float = 0.5
    """The fixed gamma of ``pridiff-e`` (paper: 1/2); in [0, 1)."""
    seed: int = 0
    """Seed of the random keep sets (``rd``); >= 0."""

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.impute not in IMPUTES:
            raise ValueError(f"impute must be one of {IMPUTES}, got {self.impute!r}")
        if self.t_ref not in T_REFS:
            raise ValueError(f"t_ref must be one of {T_REFS}, got {self.t_ref!r}")
        if not (_is_number(self.gamma_max) and 0 <= self.gamma_max < 1):
            raise ValueError(f"gamma_max must be in [0, 1), got {self.gamma_max!r}")
        if not (_is_number(self.alpha) and 0 < self.alpha <= 1):
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha!r}")
        if not (_is_number(self.theta_iter) and self.theta_iter >= 0):
            raise ValueError(f"theta_iter must be a finite number >= 0, got {self.theta_iter!r}")
        if self.period is not None and not (_is_int(self.period) and self.period >= 1):
            raise ValueError(f"period must be an int >= 1 or None, got {self.period!r}")
        if not (_is_number(self.refresh_threshold) and self.refresh_threshold > 0):
            raise ValueError(f"refresh_threshold must be a finite number > 0, got {self.refresh_threshold!r}")
        if not (_is_number(self.empirical_gamma) and 0 <= self.empirical_gamma < 1):
            raise ValueError(f"empirical_gamma must be in [0, 1), got {self.empirical_gamma!r}")
        if not (_is_int(self.seed) and self.seed >= 0):
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")

    @property
    def prioritized(self) -> bool:
        """True when columns are chosen by smallest variation (every variant but ``rd``)."""
        return self.variant != "rd"

    @property
    def differentiated(self) -> bool:
        """True for the PriDiff variants (per-layer ratios)."""
        return self.variant in ("pridiff-e", "pridiff-r")

    def theta(self, iterations_per_period: int) -> float:
        """PriDiff threshold ``theta = N_iter * theta_iter``."""
        if not (_is_int(iterations_per_period) and iterations_per_period >= 1):
            raise ValueError(f"iterations_per_period must be an int >= 1, got {iterations_per_period!r}")
        return iterations_per_period * self.theta_iter
