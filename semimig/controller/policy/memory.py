"""Step times measured under each plan at the speeds in force: what a proposal already measured weighs
more than what the step model predicts for it (DESIGN §9).

The step model predicts a plan from the plan in force through per-dimension weights (each kind's share
of the shardable work) that the layers' parameter counts only approximate: attention's softmax and
value products, for one, scale with the sequence and not with a parameter.  Such a bias does not
cancel between two neighbouring plans.  Read from plan A, plan B can look a few per cent faster, and
read from B, A can; each move then measures the plan it moved to, the model is refitted on it, and
the next decision proposes the way back — a pair of plans traded for as long as the speeds hold.
(The same bias moves the speed ratios the model reads under the two plans by as much as the smallest
slowdown that counts, so they cannot tell whether two readings were taken at the same speeds.)

The remedy is the measurement itself: every decision records the step of the plan in force (the
window's reading, over ``N_MIN`` or more steps at one set of speeds).  A proposal recorded at the same
speeds is scored by its recorded step instead of the model's prediction, so of two plans both measured,
the faster one is kept, and a plan that measured slower is not proposed again on a prediction.

"The same speeds": the same set of slow ranks and no change of any rank's speed detected since (the
window's change-point test).  A drift too slow for that test leaves a record stale; the plan in force
is recorded afresh at every decision, so only a plan left earlier can be held back by an old reading.

Seats (:class:`SeatRates`).  The layers' reductions are priced as a rate times the plan's seat scale
(:func:`~semimig.controller.policy.propose.seat_delta`: a reduction at its slowest member's pace).  A plan
that seats no slow rank in any dimension measures its reductions without one, and a slow seat may cost
more than its pace: each reduction also waits for the slow member to reach it, and under a CPU quota
for the quota's next period.  Such a plan cannot measure what seating the slow rank again costs, so
the rate is read, for that set of slow ranks, from the last plan that seated one of them, where it is
the higher.
"""
from __future__ import annotations

from typing import AbstractSet, Dict, Hashable, Optional, Sequence, Tuple

from semimig.sharding.jobmodel import seat_scale

__all__ = ["PlanMemory", "SeatRates"]


class PlanMemory:
    """The measured step of every plan at the speeds in force (module docstring)."""

    def __init__(self) -> None:
        self.records: Dict[Hashable, Tuple[float, frozenset]] = {}
        """``plans → (step seconds, slow ranks)`` at the recording."""

    def forget(self) -> None:
        """Some rank's speed changed: nothing recorded was measured at the speeds now in force."""
        self.records.clear()

    def record(self, plans: Hashable, step_s: float, slow: AbstractSet[int]) -> None:
        """``plans`` measured ``step_s`` seconds a step with ``slow`` slow."""
        if step_s > 0.0:
            self.records[plans] = (step_s, frozenset(slow))

    def measured(self, plans: Hashable, slow: AbstractSet[int]) -> Optional[float]:
        """The step ``plans`` measured at the speeds in force (``slow`` slow), or ``None``."""
        found = self.records.get(plans)
        return found[0] if found is not None and found[1] == frozenset(slow) else None


class SeatRates:
    """The reductions' seconds per unit of seat scale, per set of slow ranks, as the last plan that seated
    one of them measured it (module docstring)."""

    def __init__(self) -> None:
        self.rates: Dict[frozenset, float] = {}

    def read(self, seconds: float, speeds: Sequence[float], plans: Sequence, slow: AbstractSet[int], *,
             idle_free: bool = False) -> float:
        """The reductions' ``seconds`` the plan in force ``plans`` measured at ``speeds``, to price other plans
        from: as measured where a rank of ``slow`` holds a unit (the rate kept), else at least the kept rate
        (``idle_free``: a rank holding nothing skips the step, as :func:`seat_scale` reads it)."""
        here, key = seat_scale(speeds, plans, idle_free=idle_free), frozenset(slow)
        if here <= 0.0:
            return seconds
        if any(p.units[r] > 0 for p in plans for r in key):
            self.rates[key] = seconds / here
            return seconds
        return max(seconds, self.rates.get(key, 0.0) * here)
