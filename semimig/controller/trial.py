"""Mode semi: migration must pay in wall time, not only in the cost model (DESIGN §3a).

Eq. 2 splits a straggler's shed share between pruning and migration with cost curves measured
by the pretest (Ω, Φ).  What the curves cannot see is how the migration's collectives sit in
the real iteration: each migrating layer adds a broadcast and a reduce that hold the receivers
at the straggler's pace inside the layer.  On a NIC-bound cluster that is the paper's bargain;
on gloo over loopback it is not (at tp = 2 on a 2-core CPU, migrating 15 % of the straggler's
columns makes the iteration ~40 % longer than resizing alone).  So SEMI
checks its own choice, the way a user would, on the iteration's wall time:

    1. ``samples`` iterations that apply a plan in which stragglers migrate: ``W_mig``, the
       median wall time of an iteration (the slowest rank's, so every rank holds the same number);
    2. then the same stragglers shed the same share by resizing only (a probe) for ``samples``
       iterations: ``W_res``;
    3. resizing only is kept iff ``W_res < (1 − margin) · W_mig``; otherwise migration resumes.
       Ties go to migration, which is loss-free.

The verdict holds for that set of migrating stragglers; a new set is tried afresh.  The first
iteration under each arm is not sampled (plan changes build keep sets and weight blocks).
Everything here is pure arithmetic on gathered numbers in a fixed order, so every rank reaches
the same verdict at the same step.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional

from semimig._validate import check_int, check_number

__all__ = ["MigrationTrial", "TrialVerdict"]


@dataclass(frozen=True)
class TrialVerdict:
    """What :meth:`MigrationTrial.observe` asks the runtime to do."""

    probe: frozenset[int] = frozenset()
    """Ranks to switch to resizing only now (the probe starts)."""
    restore: frozenset[int] = frozenset()
    """Ranks whose probe ended without switching them for good: back to Eq. 2's split."""
    resize_only: frozenset[int] = frozenset()
    """Ranks whose migration did not pay: resizing only from now on."""
    message: str = ""
    """A line for the log and the decision's events ('' when nothing happened)."""


@dataclass
class MigrationTrial:
    """The state machine of the module docstring; one per tensor-parallel group (all ranks alike)."""

    samples: int
    margin: float = 0.05
    _migrating: frozenset[int] = frozenset()
    _mig_walls: list[float] = field(default_factory=list)
    _probing: frozenset[int] = frozenset()
    _res_walls: list[float] = field(default_factory=list)
    _in_arm: bool = False
    _probe_age: int = 0
    _settled: dict[frozenset[int], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_int("samples", self.samples, minimum=1)
        check_number("margin", self.margin, minimum=0.0, maximum=1.0, high_open=True)

    @property
    def probing(self) -> frozenset[int]:
        """The ranks currently held at resizing only by the probe."""
        return self._probing

    def verdict_for(self, ranks) -> Optional[str]:
        """``"migrate"`` or ``"resize"`` once that set of migrating stragglers was tried, else None."""
        return self._settled.get(frozenset(ranks))

    def observe(self, wall_s: float, migrating, resizing) -> TrialVerdict:
        """One iteration's wall time and what its applied plan did.

        ``migrating``: ranks that handed columns to others in that iteration; ``resizing``: ranks
        that pruned.  Returns what to change from the next decision on.
        """
        check_number("wall_s", wall_s, minimum=0.0, low_open=True)
        migrating, resizing = frozenset(migrating), frozenset(resizing)
        if self._probing:
            return self._observe_probe(wall_s, migrating, resizing)
        if not migrating or migrating in self._settled:
            self._migrating, self._mig_walls = frozenset(), []
            return TrialVerdict()
        if migrating != self._migrating:  # a new migrating set: its first iteration is not sampled
            self._migrating, self._mig_walls = migrating, []
            return TrialVerdict()
        self._mig_walls.append(wall_s)
        if len(self._mig_walls) < self.samples:
            return TrialVerdict()
        self._probing, self._res_walls, self._in_arm, self._probe_age = migrating, [], False, 0
        return TrialVerdict(probe=migrating, message=(
            f"SEMI trial: ranks {sorted(migrating)} migrate at {statistics.median(self._mig_walls) * 1e3:.1f} ms per "
            f"iteration (median of {len(self._mig_walls)}); trying resizing only for {self.samples} iterations"))

    def _observe_probe(self, wall_s: float, migrating: frozenset[int], resizing: frozenset[int]) -> TrialVerdict:
        probed = self._probing
        self._probe_age += 1
        in_arm = probed <= resizing and not (probed & migrating)
        first, self._in_arm = in_arm and not self._in_arm, in_arm
        if in_arm and not first:
            self._res_walls.append(wall_s)
        if len(self._res_walls) >= self.samples:
            w_mig, w_res = statistics.median(self._mig_walls), statistics.median(self._res_walls)
            self._probing, self._migrating, self._mig_walls = frozenset(), frozenset(), []
            if w_res < (1.0 - self.margin) * w_mig:
                self._settled[probed] = "resize"
                return TrialVerdict(resize_only=probed, message=(
                    f"SEMI trial: migration does not pay here: {w_mig * 1e3:.1f} ms per iteration migrating vs "
                    f"{w_res * 1e3:.1f} ms resizing only; ranks {sorted(probed)} resize only from now on"))
            self._settled[probed] = "migrate"
            return TrialVerdict(restore=probed, message=(
                f"SEMI trial: migration pays: {w_mig * 1e3:.1f} ms per iteration migrating vs {w_res * 1e3:.1f} ms "
                f"resizing only; ranks {sorted(probed)} migrate again"))
        if self._probe_age > 4 * self.samples + 4:  # the probed ranks stopped shedding: no verdict
            self._probing, self._migrating, self._mig_walls = frozenset(), frozenset(), []
            return TrialVerdict(restore=probed, message=(
                f"SEMI trial abandoned: ranks {sorted(probed)} did not resize for {self.samples} iterations"))
        return TrialVerdict()
