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
    """Pruning settings, kept as given.  A ``zero-*`` mode names the variant (:attr:`variant`); its
    ``gamma_max`` bounds the controller's shed shares too (:attr:`gamma_max`)."""
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    """Evidence, Eq. 1-3 settings, kept as given; its ``mode`` and ``gamma_max`` are read from
    :attr:`mode` and :attr:`resizing` instead (:meth:`controller_in_force`)."""
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
        self._check_agreement(mode)

    def _check_agreement(self, mode: Mode) -> None:
        """The sub-configs' copies of what :attr:`mode` and :attr:`resizing` decide (the plan mode, a
        ``zero-*`` mode's variant, ``gamma_max``) are read from there (:attr:`plan_mode`,
        :attr:`variant`, :attr:`gamma_max`); a copy left at its default is unused, a different one
        is refused rather than silently overridden."""
        variant = _default(ResizingConfig, "variant")
        if mode.variant is not None and self.resizing.variant not in (variant, mode.variant):
            raise ConfigError(f"resizing.variant={self.resizing.variant!r} disagrees with mode={mode!r}, which "
                              f"names the variant {mode.variant!r}: set it once, in the mode")
        if self.controller.mode not in (_default(ControllerConfig, "mode"), mode.plan_mode):
            raise ConfigError(f"controller.mode={self.controller.mode!r} disagrees with mode={mode!r}, which "
                              f"plans as {mode.plan_mode!r}: set it once, as BalanceConfig.mode")
        if self.controller.gamma_max not in (_default(ControllerConfig, "gamma_max"), self.gamma_max):
            raise ConfigError(f"controller.gamma_max={self.controller.gamma_max!r} disagrees with "
                              f"resizing.gamma_max={self.gamma_max!r}: set it once, on resizing")
        if self.controller.migrators is not None and mode is not Mode.SEMI:
            raise ConfigError(f"controller.migrators (λ={self.controller.migrators}) needs mode 'semi', "
                              f"got {mode!r}")

    # ------------------------------------------------------------------ derived, never stored
    @property
    def plan_mode(self) -> str:
        """How shed columns are planned (:attr:`Mode.plan_mode <semimig.modes.Mode.plan_mode>` of
        :attr:`mode`): ``baseline``, ``zero``, ``mig`` or ``semi``."""
        return Mode(self.mode).plan_mode

    @property
    def variant(self) -> str:
        """The resizing variant in force: the one a ``zero-*`` mode names, else ``resizing.variant``."""
        return Mode(self.mode).variant or self.resizing.variant

    @property
    def gamma_max(self) -> float:
        """Upper bound of a rank's shed share and of every pruning ratio: ``resizing.gamma_max``."""
        return self.resizing.gamma_max

    def resizing_in_force(self) -> ResizingConfig:
        """:attr:`resizing` with :attr:`variant`, as the layer binding prunes by it (``resizing`` itself
        when it already names that variant; else a new object, the user's stays as given)."""
        if self.resizing.variant == self.variant:
            return self.resizing
        return dataclasses.replace(self.resizing, variant=self.variant)

    def controller_in_force(self) -> ControllerConfig:
        """:attr:`controller` as the decision core reads it (:func:`~semimig.controller.plan.decide_plan`,
        :class:`~semimig.controller.shedding.ShedPolicy`): with :attr:`plan_mode` and :attr:`gamma_max`
        (``controller`` itself when it already holds them; else a new object, the user's stays as
        given).  A controller acting in another mode than :attr:`mode` for a while (measuring only,
        or ``semi`` on uneven shards) tells the policy that mode itself."""
        if (self.controller.mode, self.controller.gamma_max) == (self.plan_mode, self.gamma_max):
            return self.controller
        return dataclasses.replace(self.controller, mode=self.plan_mode, gamma_max=self.gamma_max)


def _default(kind: type, name: str) -> object:
    """The default of field ``name`` of dataclass ``kind``."""
    return kind.__dataclass_fields__[name].default
