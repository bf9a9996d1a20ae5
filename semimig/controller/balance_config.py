"""The balancing runtime's configuration (:class:`BalanceConfig`): one frozen object, validated on
construction, that stays the one in force for the controller's whole life.  What the shards' state
changes at run time (measuring only after a move, migration off on uneven shards, the busy scale) is
the controller's state (:meth:`semimig.controller.runtime.BalanceController.set_phase`), never a
rewritten configuration."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional, Union

from semimig._validate import check_choice, check_int, check_str_tuple
from semimig.controller.config import ControllerConfig
from semimig.controller.curves import CostCurves
from semimig.errors import ConfigError
from semimig.migration.exchange import EXCHANGE_POLICIES
from semimig.modes import CONTROLLER_MODES, Mode, parse_mode
from semimig.resizing.config import ResizingConfig
from semimig.straggler.injection import StragglerConfig

__all__ = ["BalanceConfig", "MODES"]

MODES = CONTROLLER_MODES
"""The modes a :class:`BalanceConfig` takes (:data:`semimig.modes.CONTROLLER_MODES`)."""


@dataclass(frozen=True, kw_only=True)
class BalanceConfig:
    """Everything the runtime needs; validated on construction."""

    mode: Union[Mode, str] = Mode.SEMI
    """One of :data:`MODES`, as a :class:`~semimig.modes.Mode` or its name (held as the ``Mode``)."""
    resizing: ResizingConfig = field(default_factory=ResizingConfig)
    """Pruning settings; for ``zero-*`` modes the variant is taken from the mode name."""
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    """Evidence, Eq. 1-3 settings; its ``mode`` is derived from :attr:`mode`."""
    straggler: Union[StragglerConfig, str] = field(default_factory=StragglerConfig)
    """Injected slowdown (benchmarks and tests): a :class:`StragglerConfig` or its CLI spec
    (``"fixed:1:4"``); ``pattern="none"`` in production."""
    exchange: str = "broadcast-reduce"
    """How migrated operands travel: one of ``EXCHANGE_POLICIES``."""
    interval: int = 1
    """Re-plan every ``interval`` iterations (the plan is kept in between)."""
    curves: Optional[CostCurves] = None
    """SEMI cost curves; ``None`` runs the pretest when the first straggler is flagged."""
    dense_layers: tuple[str, ...] = ("classifier", "lm_head", "score", "qa_outputs")
    """Module-name suffixes of layers that never resize or migrate (still timed and slowed): the
    model's output head.  The paper balances the transformer layers (attention and MLP); pruning
    a sharded head would train the straggler's logits from a fraction of the features."""

    def __post_init__(self) -> None:
        mode = parse_mode(self.mode, "BalanceConfig.mode", map(Mode, MODES))
        object.__setattr__(self, "mode", mode)
        for name, kind in (("resizing", ResizingConfig), ("controller", ControllerConfig)):
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(f"BalanceConfig.{name} must be a {kind.__name__}, got {getattr(self, name)!r}")
        if isinstance(self.straggler, str):
            object.__setattr__(self, "straggler", StragglerConfig.from_cli(self.straggler))
        if not isinstance(self.straggler, StragglerConfig):
            raise ConfigError(f"BalanceConfig.straggler must be a StragglerConfig or a spec like 'fixed:1:4', "
                              f"got {self.straggler!r}")
        if self.curves is not None and not isinstance(self.curves, CostCurves):
            raise ConfigError(f"BalanceConfig.curves must be CostCurves or None, got {self.curves!r}")
        check_choice("BalanceConfig.exchange", self.exchange, EXCHANGE_POLICIES)
        check_int("BalanceConfig.interval", self.interval, minimum=1, maximum=10**6)
        object.__setattr__(self, "dense_layers", check_str_tuple("BalanceConfig.dense_layers", self.dense_layers))
        if mode.variant is not None:
            object.__setattr__(self, "resizing", dataclasses.replace(self.resizing, variant=mode.variant))
        gamma_max = self.resizing.gamma_max
        default = ControllerConfig.__dataclass_fields__["gamma_max"].default
        if self.controller.gamma_max not in (default, gamma_max):
            raise ConfigError(f"controller.gamma_max={self.controller.gamma_max!r} disagrees with "
                              f"resizing.gamma_max={gamma_max!r}: set it once, on resizing")
        if self.controller.migrators is not None and mode is not Mode.SEMI:
            raise ConfigError(f"controller.migrators (λ={self.controller.migrators}) needs mode 'semi', "
                              f"got {self.mode!r}")
        object.__setattr__(self, "controller", dataclasses.replace(self.controller, mode=mode.plan_mode,
                                                                        gamma_max=gamma_max))
