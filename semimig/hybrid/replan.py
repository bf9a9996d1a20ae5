"""When to recompute the batch plan: a TP group's speed moved, beyond noise, for long enough (pure).

Notation: data-parallel groups ``g = 0 … D-1`` (each a tensor-parallel group holding one
replica), the plan's predicted compute ``P_g`` of group ``g`` in one iteration (its speed curve at
its share of the batch), and the measured compute ``T_g`` (the slowest member's busy time, so the
group's speed after SEMI balancing).  Per iteration ``j``:

    r_g(j) = T_g(j) / P_g                       how far the group runs from its model
    m_g(j) = median(r_g(j-w+1) … r_g(j))        robust to single slow iterations (w = window)
    off(j) = some g with |m_g(j) - 1| > θ       (θ = threshold)

A re-plan is due at the first ``j`` where ``off`` held for ``patience`` consecutive iterations
(with a full window).  The decision scales every group's curve by its ``m_g`` (the profile keeps
its shape, the measurement sets its level), so the new plan's predictions match what the groups
run now.  A group the plan gives no sample still runs a one-row stand-in every micro-step (it must
join the gradient collectives): its prediction ``P_g`` is that, its curve's time for one sample per
micro-step (:meth:`HybridBalancer.step`), so a starved straggler that recovers is seen and gets
samples back; a group without any prediction keeps scale 1.  All windows restart after a
re-plan: the next decision needs ``window`` iterations of the new plan (its settling time).

Every rank feeds the same all-gathered numbers, so every rank decides the same re-plan at the
same iteration; nothing is broadcast.  A straggler that appears (``r_g`` rises) or leaves
(``r_g`` falls) triggers alike.
"""
from __future__ import annotations

import collections
import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

from semimig._validate import check_int, check_number
from semimig.allocation.speed import SpeedCurve
from semimig.errors import ConfigError

__all__ = ["ReplanConfig", "ReplanDecision", "ReplanTrigger", "scale_curve"]


@dataclass(frozen=True, kw_only=True)
class ReplanConfig:
    """The trigger's knobs (module docstring)."""

    threshold: float = 0.15
    """``θ``: relative distance of a group's median ratio from 1 that counts as a change, in (0, 10]."""
    window: int = 5
    """``w``: iterations in the median, >= 1."""
    patience: int = 3
    """Consecutive iterations the change must hold, >= 1."""

    def __post_init__(self) -> None:
        check_number("ReplanConfig.threshold", self.threshold, minimum=0.0, maximum=10.0, low_open=True)
        check_int("ReplanConfig.window", self.window, minimum=1, maximum=10_000)
        check_int("ReplanConfig.patience", self.patience, minimum=1, maximum=10_000)


@dataclass(frozen=True, kw_only=True)
class ReplanDecision:
    """A re-plan: scale group ``g``'s curve by ``scales[g]``."""

    iteration: int
    """The trigger's iteration counter when it fired."""
    scales: tuple[float, ...]
    """``m_g`` per group (1.0 where unmeasured)."""
    changed_groups: tuple[int, ...]
    """The groups whose ``|m_g - 1|`` exceeded the threshold (calibrating: every measured group)."""


class ReplanTrigger:
    """Feeds on ``(T_g, P_g)`` each iteration; returns a :class:`ReplanDecision` when one is due."""

    def __init__(self, num_groups: int, config: ReplanConfig = ReplanConfig(), *, calibrate: bool = False) -> None:
        self.num_groups = check_int("num_groups", num_groups, minimum=1)
        if not isinstance(config, ReplanConfig):
            raise ConfigError(f"config must be a ReplanConfig, got {config!r}")
        self.config = config
        self.calibrate = bool(calibrate)
        """The predictions are a guess (a common speed, not a profile): the first decision comes once the
        windows are full and ``patience`` iterations confirm, whatever the medians — every measured group
        counts as changed — so groups whose speeds differ by less than ``θ`` from the guess still get
        their measured speeds (with a threshold test, two groups at 0.9 and 1.1 s a sample against a
        guess of 1 s would never be split by speed)."""
        self.iteration = 0
        self._restart()

    def _restart(self) -> None:
        self._ratios = [collections.deque(maxlen=self.config.window) for _ in range(self.num_groups)]
        self._off_for = 0

    def medians(self) -> tuple[Optional[float], ...]:
        """``m_g`` per group (None until the group has a measurement)."""
        return tuple(statistics.median(r) if r else None for r in self._ratios)

    def observe(self, measured: Sequence[float], predicted: Sequence[float]) -> Optional[ReplanDecision]:
        """One iteration's ``T_g`` and ``P_g`` (seconds, group order); the decision if one is due."""
        if len(measured) != self.num_groups or len(predicted) != self.num_groups:
            raise ConfigError(f"need {self.num_groups} measured and predicted times, got {len(measured)} and "
                              f"{len(predicted)}")
        self.iteration += 1
        for history, t, p in zip(self._ratios, measured, predicted):
            if math.isfinite(t) and math.isfinite(p) and p > 0 and t >= 0:  # NaN/inf: not a measurement
                history.append(t / p)
        full = all(len(r) == self.config.window for r, p in zip(self._ratios, predicted) if p > 0)
        medians = self.medians()
        changed = tuple(g for g, m in enumerate(medians)
                        if m is not None and (self.calibrate or abs(m - 1.0) > self.config.threshold))
        self._off_for = self._off_for + 1 if changed and full else 0
        if self._off_for < self.config.patience:
            return None
        decision = ReplanDecision(iteration=self.iteration, scales=tuple(1.0 if m is None else m for m in medians),
                                  changed_groups=changed)
        self.calibrate = False
        self._restart()
        return decision


def scale_curve(curve: SpeedCurve, scale: float) -> SpeedCurve:
    """``curve`` with every profiled time multiplied by ``scale`` (same points, same interpolation)."""
    check_number("scale", scale, minimum=0.0, low_open=True)
    return SpeedCurve.from_points([(b, t * scale) for b, t in zip(curve.batch_sizes, curve.times_s)],
                                  max_batch_size=curve.max_batch_size, name=curve.name,
                                  interpolation=curve.interpolation)
