"""Configuration of the pure SEMI-migration decision core (DESIGN §3)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Mode = Literal["baseline", "zero", "mig", "semi"]
MODES: tuple[str, ...] = ("baseline", "zero", "mig", "semi")
ZERO_REFERENCES: tuple[str, ...] = ("mean", "min")
RECEIVER_POLICIES: tuple[str, ...] = ("non_migrating", "normal")


@dataclass(frozen=True, kw_only=True)
class ControllerConfig:
    """How :func:`semimig.controller.plan.decide_plan` turns busy times into a plan."""

    mode: Mode = "semi"
    """``baseline``: every rank normal. ``zero``: every straggler resizes (Eq. 1 against
    ``zero_reference``). ``mig``: every straggler migrates, nobody prunes. ``semi``: Eq. 2 for a
    single straggler, Eq. 3 for several (paper IV-B)."""

    tol: float = 0.05
    """Noise tolerance of the straggler test: rank ``i`` straggles iff ``T_i > T_ref·(1 + tol)``."""

    refresh_threshold: float = 0.10
    """Hysteresis: the previous plan is kept while every rank's busy time differs from the times
    that plan was decided on by less than this relative amount (``|T_i − T_i'| < thr·T_i'``)."""

    gamma_max: float = 0.9
    """Upper bound of a rank's shed share (pruned + migrated share of its K columns), so a
    straggler always computes at least ``1 − gamma_max`` of its own columns. In ``[0, 1)``."""

    zero_reference: Literal["mean", "min"] = "mean"
    """``T_ref`` of mode ``zero``: the group mean (ZERO alone, paper Eq. 1) or the minimum.
    The other modes always use ``T_min`` (paper IV-B)."""

    receivers: Literal["non_migrating", "normal"] = "non_migrating"
    """Who computes migrated columns when several ranks straggle. ``non_migrating`` (the paper's
    Eq. 3 read literally: the ``e − x`` ranks at sorted positions ``x+1 … e``, so resizing
    stragglers receive too) or ``normal`` (only the ``e − z`` non-stragglers receive; Eq. 3's
    ``e − x`` becomes ``e − z`` and ``y`` ranges over the normal ranks)."""

    migrators: int | None = None
    """λ of the paper's Fig. 11: when set, mode ``semi`` with several stragglers migrates the
    ``min(λ, z)`` slowest instead of Eq. 3's ``x`` (the others resize), so a sweep over λ shows
    where Eq. 3's choice lands.  ``None`` (default) lets Eq. 3 decide."""

    def __post_init__(self) -> None:
        if self.migrators is not None:
            m = self.migrators
            if isinstance(m, bool) or not isinstance(m, int) or m < 0:
                raise ValueError(f"ControllerConfig.migrators must be None or an int >= 0, got {m!r}")
            if self.mode != "semi":
                raise ValueError(f"ControllerConfig.migrators (λ={m}) only applies to mode 'semi', got mode {self.mode!r}")
        if self.mode not in MODES:
            raise ValueError(f"ControllerConfig.mode must be one of {MODES}, got {self.mode!r}")
        for name in ("tol", "refresh_threshold"):
            value = getattr(self, name)
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not is_number or not math.isfinite(value) or value < 0:
                raise ValueError(f"ControllerConfig.{name} must be a finite number >= 0, got {value!r}")
        gm = self.gamma_max
        if isinstance(gm, bool) or not isinstance(gm, (int, float)) or not (0.0 <= gm < 1.0):
            raise ValueError(f"ControllerConfig.gamma_max must be in [0, 1), got {gm!r}")
        if self.zero_reference not in ZERO_REFERENCES:
            raise ValueError(
                f"ControllerConfig.zero_reference must be one of {ZERO_REFERENCES}, "
                f"got {self.zero_reference!r}"
            )
        if self.receivers not in RECEIVER_POLICIES:
            raise ValueError(
                f"ControllerConfig.receivers must be one of {RECEIVER_POLICIES}, got {self.receivers!r}"
            )
