"""The balancing modes: one type, the facts every part of semimig reads from a mode, and the tuples
of names derived from it.

A mode is what :func:`semimig.enable` does against a straggler (the README's table):

``semi``
    re-shards for a device that stays slow (on a model that takes a plan in units), resizes for
    one that comes and goes, migrates while the shards are even and migration measures faster.
``reshard``
    only re-shards (exact); its controller only measures.
``zero-rd`` / ``zero-pri`` / ``zero-pridiff-e`` / ``zero-pridiff-r``
    the straggler prunes K columns (ZERO-resizing), in the resizing variant the name carries.
``mig``
    the straggler hands K columns to its peers (SEMI-migration, every straggler migrates).
``baseline`` / ``off``
    nothing balanced: the layers are only timed (and slowed by a test straggler).  ``off`` is
    ``enable``'s word for it.

Strings are accepted wherever a mode is: ``Mode("semi") is Mode.SEMI``, ``Mode.SEMI == "semi"``,
``f"{Mode.SEMI}" == "semi"`` and ``repr(Mode.SEMI) == "'semi'"``.  Importing this module imports neither torch nor Colossal-AI
(the CLI's ``--help`` lists the modes from it).
"""
from __future__ import annotations

import enum
from typing import Any, Iterable, Optional

from semimig.errors import ConfigError

__all__ = ["Mode", "ENABLE_MODES", "CONTROLLER_MODES", "RESHARD_MODES", "PLAN_MODES", "parse_mode"]

_ZERO = "zero-"


class Mode(str, enum.Enum):
    """One balancing mode; a ``str`` equal to its name."""

    SEMI = "semi"
    MIG = "mig"
    ZERO_RD = "zero-rd"
    ZERO_PRI = "zero-pri"
    ZERO_PRIDIFF_E = "zero-pridiff-e"
    ZERO_PRIDIFF_R = "zero-pridiff-r"
    BASELINE = "baseline"
    OFF = "off"
    RESHARD = "reshard"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __repr__(self) -> str:
        return repr(self.value)  # a configuration's repr and a refusal show mode='semi', as the user wrote it

    @property
    def resizes(self) -> bool:
        """A straggler prunes K columns (the ``zero-*`` modes and ``semi``)."""
        return self.value.startswith(_ZERO) or self is Mode.SEMI

    @property
    def migrates(self) -> bool:
        """A straggler may hand K columns to its peers (``mig``, and ``semi`` on even shards)."""
        return self in (Mode.MIG, Mode.SEMI)

    @property
    def reshards(self) -> bool:
        """Uneven re-sharding serves the straggler that stays (``reshard``, and ``semi`` on a model
        that takes a plan in units)."""
        return self in (Mode.RESHARD, Mode.SEMI)

    @property
    def is_off(self) -> bool:
        """Nothing is balanced: the layers are only timed (``baseline`` and its synonym ``off``)."""
        return self in (Mode.BASELINE, Mode.OFF)

    @property
    def variant(self) -> Optional[str]:
        """The resizing variant a ``zero-*`` mode names (:data:`semimig.resizing.config.VARIANTS`), else ``None``."""
        return self.value[len(_ZERO):] if self.value.startswith(_ZERO) else None

    @property
    def controller_mode(self) -> "Mode":
        """The mode :class:`~semimig.controller.BalanceController` runs: ``off`` is ``baseline``, and
        so is ``reshard`` (its controller only measures; the re-sharder acts)."""
        return Mode.BASELINE if self in (Mode.OFF, Mode.RESHARD) else self

    @property
    def in_controller(self) -> bool:
        """A mode of the controller itself (:data:`CONTROLLER_MODES`); ``off`` and ``reshard`` are
        :func:`semimig.enable`'s only."""
        return self.controller_mode is self

    @property
    def plan_mode(self) -> str:
        """How shed columns are planned (``ControllerConfig.mode``, :data:`PLAN_MODES`): ``baseline``,
        ``zero`` (every ``zero-*`` mode), ``mig`` or ``semi``."""
        mode = self.controller_mode
        return "zero" if mode.variant is not None else mode.value


def parse_mode(value: Any, what: str = "mode", choices: Optional[Iterable[Mode]] = None) -> Mode:
    """``value`` (a :class:`Mode` or its name) as a :class:`Mode`, or :class:`ConfigError` naming
    ``what``, the bad value and the accepted names (``choices``: every mode unless given)."""
    allowed = tuple(Mode) if choices is None else tuple(choices)
    if isinstance(value, str):
        try:
            mode = Mode(value)
        except ValueError:
            mode = None
        if mode is not None and mode in allowed:
            return mode
    raise ConfigError(f"{what} must be one of {tuple(m.value for m in allowed)}, got {value!r}")


ENABLE_MODES: tuple[str, ...] = tuple(m.value for m in Mode)
"""Every mode :func:`semimig.enable` accepts."""
CONTROLLER_MODES: tuple[str, ...] = tuple(
    m.value for m in sorted(Mode, key=lambda m: (not m.is_off, m.migrates, m.resizes and m.migrates))
    if m.in_controller)
"""The modes of :class:`~semimig.controller.BalanceConfig`, in the paper's order: dense, the
resizing variants, migration, SEMI."""
RESHARD_MODES: tuple[str, ...] = tuple(m.value for m in Mode if m.reshards and not m.in_controller)
"""The modes beyond the controller's that re-shard (``reshard``)."""
PLAN_MODES: tuple[str, ...] = tuple(dict.fromkeys(Mode(m).plan_mode for m in CONTROLLER_MODES))
"""The plan modes of :class:`~semimig.controller.config.ControllerConfig` (``baseline``, ``zero``, ``mig``, ``semi``)."""
