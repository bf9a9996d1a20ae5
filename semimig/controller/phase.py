"""The phase the shard plan in force imposes on the balancing runtime (every rank the same, at the same
step): whether it only measures (a plan just moved to), whether every rank holds the same shard shapes
(mode ``semi`` migrates only then), and each rank's busy-time baseline under an uneven plan, which
resizing compares the rank with (:class:`~semimig.controller.shedding.ShedPolicy`).

:class:`Phase` is that part of :class:`~semimig.controller.runtime.BalanceController` (a mixin of it);
the re-sharder sets it after each move (:mod:`semimig.resharder.enable`).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from semimig.errors import ConfigError
from semimig.modes import Mode

__all__ = ["Phase"]


class Phase:
    """The phase of :class:`~semimig.controller.runtime.BalanceController` (a mixin of it)."""

    @property
    def acting(self) -> Mode:
        """The mode the controller acts in now (:attr:`config.mode <BalanceConfig.mode>` stays as given):
        ``baseline`` while :attr:`holding`; mode ``semi`` on uneven shards (not :attr:`even`) acts as
        the ``zero-*`` mode of its resizing variant, since migration assumes equal K per rank."""
        if self.holding:
            return Mode.BASELINE
        if self.config.mode is Mode.SEMI and not self.even:
            return Mode("zero-" + self.config.variant)
        return self.config.mode

    def set_phase(self, *, hold: bool = False, even: bool = True,
                  baseline: Optional[Sequence[float]] = None) -> bool:
        """Set the runtime state the shards' plan imposes (every rank the same, at the same step):
        ``hold`` measures only (no decisions, every layer dense), ``even`` says whether every rank
        holds the same shard shapes (semi migrates only then), ``baseline`` (default none) each rank's
        busy seconds measured under an uneven plan: a rank is then compared with its own baseline, and
        a straggler aims at the others' real times, never below its baseline
        (:class:`~semimig.controller.shedding.ShedPolicy`).  A change starts the decisions afresh
        (a dense plan, a new evidence state; the timing models keep their history, the iteration,
        the injector's phase and fitted cost curves stay); returns whether anything changed."""
        base = self._check_baseline(baseline)
        if (bool(hold), bool(even), base) == (self.holding, self.even, self.baseline):
            return False
        self.holding, self.even, self.baseline = bool(hold), bool(even), base
        self._restart()
        return True

    def rebind(self, *, hold: bool = False, even: bool = True,
               baseline: Optional[Sequence[float]] = None) -> list:
        """Bind the layers again after their shapes changed (a re-shard moved them; every rank at the
        same step) and set the phase (:meth:`set_phase`), starting the decisions afresh as it does.
        The controller stays the one in use: its configuration, iteration, epoch, the injector's
        phase, clocks, reports, fitted cost curves and the timing models' history.  Returns the
        bound layers."""
        base = self._check_baseline(baseline)
        self.binding.clear_directives()
        self.binding.detach()
        self.binding = self._bind()
        self.holding, self.even, self.baseline = bool(hold), bool(even), base
        self._restart()
        return [b.layer for b in self.binding.layers]

    def _check_baseline(self, baseline: Optional[Sequence[float]]) -> Optional[tuple[float, ...]]:
        if baseline is None:
            return None
        base = tuple(float(s) for s in baseline)
        if len(base) != self.size or not all(math.isfinite(s) and s > 0.0 for s in base):
            raise ConfigError(f"baseline must hold {self.size} positive finite seconds, got {baseline!r}")
        return base

    def _restart(self) -> None:
        """Drop what was decided (the posted exchange is collected and its plans discarded: they
        were made for the old phase or shapes) and start the decisions afresh."""
        with self.meter.comm():
            self._exchange.collect()
        self._start_decisions()
        self.restart_step()
