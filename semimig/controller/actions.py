"""What the balancing runtime reports and applies: the step's :class:`StepReport` and the group's
:class:`GroupActions` (identical on every rank, hence digested)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from semimig._validate import is_int, is_number
from semimig.controller.agreement import describe
from semimig.controller.plan import GroupPlan
from semimig.controller.shedding import ShedDecision
from semimig.errors import ConfigError
from semimig.straggler.busy import BusyStats
from semimig.straggler.device import DeviceTime

__all__ = ["StepReport", "GroupActions", "check_forced"]


@dataclass(frozen=True)
class StepReport:
    """What ``step()`` measured for the iteration that just ended and decided for the next."""

    iteration: int
    busy: BusyStats
    gamma_target: float
    """This rank's shed share (pruned + migrated) for the next iteration."""
    gamma_per_layer: tuple[float, ...]
    achieved_savings: float
    migrate: Mapping[int, float]
    plan: Optional[GroupPlan]
    decision: Optional[ShedDecision] = None
    """The group's evidence and shares (flags, unpruned times, reference); ``None`` while forced."""
    digest: int = 0
    """Digest of the plan every rank applied in this iteration (checked equal on all ranks)."""
    device: Optional[DeviceTime] = None
    """This rank's step split into compute and communication: the step clock's (semimig's own
    collectives are the communication, :mod:`semimig.straggler.clock`), or under a whole-device test
    straggler its clock's (:mod:`semimig.straggler.device`).  On CUDA the split of the iteration
    before (one step late); ``None`` when not resolved."""
    reflex_gamma: float = 0.0
    """The share this rank pruned within the step on its own evidence (the step reflex,
    :mod:`semimig.controller.reflex`); 0 when it did not fire."""

    @property
    def balanced_share(self) -> Optional[float]:
        """Share of this rank's own work (``compute_s``) spent in the GEMMs semimig sheds (DESIGN §5's B)."""
        if self.device is None or self.device.compute_s <= 0:
            return None
        return min(self.busy.busy_s / self.device.compute_s, 1.0)

    @property
    def flagged(self) -> tuple[int, ...]:
        """The ranks treated as stragglers at this decision (slowest first)."""
        return () if self.decision is None else self.decision.flagged


@dataclass(frozen=True)
class GroupActions:
    """A group-level plan: what every rank does (identical on every rank, hence digested)."""

    prune: tuple[float, ...]
    """Pruned share of every rank's K columns."""
    migrate: Mapping[int, float] = field(default_factory=dict)
    """Migrated share per migrating rank."""
    receivers: Optional[tuple[int, ...]] = None
    """The plan's receivers (``None``: every non-migrating rank)."""
    plan: Optional[GroupPlan] = field(default=None, compare=False)
    decision: Optional[ShedDecision] = field(default=None, compare=False)

    def describe(self, mode: str) -> dict[str, str]:
        return describe(mode=mode, prune=self.prune, migrate=dict(self.migrate), receivers=self.receivers,
                        flagged=None if self.decision is None else self.decision.flagged)


def check_forced(what: str, table: Optional[Mapping[int, float]], size: int) -> dict[int, float]:
    """A ``force()`` table ``{rank: share}`` checked (ranks of a group of ``size``, shares in [0, 1]), sorted by rank."""
    if table is None:
        return {}
    if not isinstance(table, Mapping):
        raise ConfigError(f"force({what}=...) must be a mapping rank -> share, got {table!r}")
    out = {}
    for rank, share in table.items():
        if not is_int(rank) or not 0 <= rank < size:
            raise ConfigError(f"force({what}=...): rank {rank!r} must be an int in [0, {size})")
        if not is_number(share) or not 0.0 <= share <= 1.0:
            raise ConfigError(f"force({what}=...): share for rank {rank} must be a number in [0, 1], got {share!r}")
        out[int(rank)] = float(share)
    return dict(sorted(out.items()))  # equal tables describe (and digest) equally, whatever their order
