"""The plan that minimises the step of a tensor-parallel group with ranks of unequal speed (DESIGN §8).

Model.  A step of rank ``r`` is ``t_r = (R + S·p_r) / v_r``: ``R`` the replicated work every rank
does whole (norms, embeddings, head, loss, host), ``S`` the shardable work of the whole group
(the paired GEMMs, their heads' attention, their parameters' optimizer update), ``p_r`` the
rank's share of the paired dimension (``Σ p_r = 1``) and ``v_r > 0`` its speed on its whole
work.  Units are free (``R``, ``S`` in work, ``v`` in work per second, ``t`` in seconds); with
``R + S/e = 1`` and a healthy rank at ``v = 1`` the even step of a healthy group is 1.  A rank may run
its replicated work at another pace than its shardable work (many small kernels against a few large
GEMMs): at ``v_r^φ_r`` relative to the fastest rank, so that its replicated work counts as
``R_r = R·(v_r/V)^(1 − φ_r)`` at its speed ``v_r`` (``V`` the fastest rank's); every ``R`` below is then
that rank's ``R_r`` (``φ_r = 1``: ``R_r = R``).

Continuous optimum.  ``t = max_r t_r`` is minimal when every rank finishes together:
``p_r = (t·v_r − R)/S`` and, summing, ``t = (S + Σ_r R_r)/Σ v_r``.  A rank with
``t·v_r − R < S·p_min`` (it cannot finish even its replicated work in ``t``) is pinned at the
minimum share ``p_min`` and the rest re-solved, ``t = (S·(1 − |F|·p_min) + Σ_A R_r)/Σ_{A} v_r`` for
the free ranks ``A`` and pinned ranks ``F``; pinning a rank lowers ``t``, so this repeats until
no free rank falls below ``p_min`` (at most ``e`` rounds).  The step is then
``max(t, max_{F} (R + S·p_min)/v_r)``.  Two ranks, one ``χ`` times slower, ``R + S/2 = 1``:
``t = 2/(1 + 1/χ) = 2χ/(χ+1)`` (1.6 at ``χ = 4``) while ``p_slow = (t/χ − R)/S ≥ 0``, i.e.
``R ≤ 2/(χ+1)`` (0.4 at ``χ = 4``).

Whole units.  Each rank holds ``n_r ≥ min_units`` of ``U`` units, ``t_r(n) = (R + S·n/U)/v_r``
(``min_units = 0`` by default: a rank whose ``t·v_r − R < 0`` is pinned at ``p = 0`` above and
rounds to no unit of the kind; its time is then ``R/v_r``, the floor no plan goes under).
Start from ``max(min_units, ⌊p_r·U⌋)`` and hand the remaining units one at a time to the rank
whose time *after* the unit is smallest (ties: lowest rank).  Every unit of ``⌊p_r·U⌋`` finishes
by ``t`` and every further unit after it, so this equals the greedy from ``min_units`` upwards,
which minimises ``max_r t_r(n_r)`` (the classic exchange argument); if floating point ever
over-assigns, units are taken back from the slowest rank.  Pure arithmetic in a fixed order:
every rank given the same numbers computes the same plan.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from typing import List, Optional, Sequence, Tuple

from semimig._validate import check_int, check_number
from semimig.errors import ConfigError
from semimig.sharding.plan import ShardPlan

__all__ = ["StepModel", "MAX_PACE", "continuous_shares", "solve_plan", "soonest_first", "predicted_step", "speeds_from_times",
           "fit_step_model"]

MAX_PACE = 4.0
"""Largest replicated pace ``φ`` a :class:`StepModel` takes (a rank's replicated work slowing as the fourth power
of its shardable work's slowdown is beyond any device measured)."""


@dataclass(frozen=True, kw_only=True)
class StepModel:
    """The numbers a plan is solved from.

    ``speeds``      ``v_r > 0`` per rank (group-rank order), on the whole step.
    ``replicated``  ``R ≥ 0``: work every rank does whole.
    ``shardable``   ``S > 0``: the whole group's work along the paired dimension.
    ``idle_free``   a rank holding no unit takes no part in the step (it skips it,
                    :mod:`semimig.shardformer.skip`): the step is the slowest *holder*'s.
    ``replicated_pace``  ``φ_r`` per rank (``None``: 1 on every rank): a rank at speed ``v_r`` runs its
                    replicated work at ``V·(v_r/V)^φ_r``, ``V`` the fastest rank's speed, so its replicated
                    work counts as ``R_r = R·(v_r/V)^(1 − φ_r)`` at its own speed (:attr:`replicated_work`).
    """

    speeds: Tuple[float, ...]
    replicated: float
    shardable: float
    idle_free: bool = False
    replicated_pace: Optional[Tuple[float, ...]] = None

    def __post_init__(self) -> None:
        speeds, R, S = self.speeds, self.replicated, self.shardable
        if not (type(speeds) is tuple and speeds and type(R) is float and type(S) is float  # plain floats: as they are
                and all(type(v) is float and 0.0 < v < math.inf for v in speeds) and 0.0 <= R < math.inf
                and 0.0 < S < math.inf):
            if isinstance(speeds, (str, bytes)) or not isinstance(speeds, (tuple, list)) or not speeds:
                raise ConfigError(f"speeds must be a non-empty tuple of numbers > 0 (one per rank), got {speeds!r}")
            speeds = tuple(check_number(f"speeds[{r}]", v, minimum=0.0, low_open=True) for r, v in enumerate(speeds))
            object.__setattr__(self, "speeds", speeds)
            object.__setattr__(self, "replicated", check_number("replicated", self.replicated, minimum=0.0))
            object.__setattr__(self, "shardable", check_number("shardable", self.shardable, minimum=0.0,
                                                               low_open=True))
        paces = self.replicated_pace
        if paces is None:
            object.__setattr__(self, "_work", (self.replicated,) * len(speeds))
            return
        if isinstance(paces, (str, bytes)) or not isinstance(paces, (tuple, list)) or len(paces) != len(speeds):
            raise ConfigError(f"replicated_pace must be one number >= 0 per rank ({len(speeds)}), got {paces!r}")
        paces = tuple(check_number(f"replicated_pace[{r}]", phi, minimum=0.0, maximum=MAX_PACE)
                      for r, phi in enumerate(paces))
        object.__setattr__(self, "replicated_pace", paces)
        fastest = max(speeds)
        object.__setattr__(self, "_work", tuple(self.replicated * (v / fastest) ** (1.0 - phi)
                                                for v, phi in zip(speeds, paces)))

    @property
    def replicated_work(self) -> Tuple[float, ...]:
        """``R_r`` per rank: its replicated work at its own speed (``R`` on every rank where ``φ`` is 1)."""
        return self._work

    @classmethod
    def normalised(cls, speeds: Sequence[float], *, replicated_share: float) -> "StepModel":
        """``R = ρ``, ``S = e·(1 − ρ)``: a healthy even step is 1 and ρ of it is replicated."""
        rho = check_number("replicated_share", replicated_share, minimum=0.0, maximum=1.0, high_open=True)
        model = cls(speeds=speeds, replicated=rho, shardable=1.0)  # validates the speeds first
        return replace(model, shardable=model.tp * (1.0 - rho))

    @property
    def tp(self) -> int:
        return len(self.speeds)

    def rank_time(self, rank: int, share: float) -> float:
        """``(R_r + S·p)/v_r``."""
        return (self._work[rank] + self.shardable * share) / self.speeds[rank]

    def step(self, shares: Sequence[float]) -> float:
        """``max_r (R_r + S·p_r)/v_r`` (over the ranks with ``p_r > 0`` when :attr:`idle_free`)."""
        if len(shares) != self.tp:
            raise ConfigError(f"shares must have one entry per rank ({self.tp}), got {len(shares)}")
        return max(self.rank_time(r, p) for r, p in enumerate(shares) if p > 0.0 or not self.idle_free)


def continuous_shares(model: StepModel, *, min_share: float = 0.0) -> Tuple[float, ...]:
    """The real-valued optimum ``p_r`` (module docstring), every ``p_r ≥ min_share``, ``Σ p_r = 1``."""
    e = model.tp
    check_number("min_share", min_share, minimum=0.0, maximum=1.0 / e)
    R, S, v = model.replicated_work, model.shardable, model.speeds
    pinned: set[int] = set()
    while True:
        free = [r for r in range(e) if r not in pinned]
        t = (S * (1.0 - len(pinned) * min_share) + sum(R[r] for r in free)) / sum(v[r] for r in free)
        low = [r for r in free if (t * v[r] - R[r]) / S < min_share]
        if not low or len(low) == len(free):  # all free ranks low: only float noise at min_share = 1/e
            break
        pinned.update(low)
    shares = [min_share if r in pinned else (t * v[r] - R[r]) / S for r in range(e)]
    # renormalise the free ranks' float residue so the shares sum to 1 exactly enough
    free = [r for r in range(e) if r not in pinned]
    if free:
        residue = 1.0 - sum(shares)
        for r in free:
            shares[r] += residue / len(free)
    return tuple(shares)


def _time(model: StepModel, rank: int, n: int, total: int) -> float:
    return model.rank_time(rank, n / total)


def solve_plan(model: StepModel, *, total_units: int, unit_size: int = 1, min_units: int = 0) -> ShardPlan:
    """The whole-unit plan minimising ``max_r t_r(n_r)`` with every ``n_r ≥ min_units`` (module docstring).

    ``min_units = 0`` (the default) lets a rank too slow for even one unit hold none of this kind
    (the layers serve empty shards, :mod:`semimig.sharding.plan`); a larger value keeps that many
    on every rank."""
    e = model.tp
    check_int("total_units", total_units, minimum=1)
    check_int("min_units", min_units, minimum=0)
    if total_units < e * min_units:
        raise ConfigError(f"total_units={total_units} cannot give each of tp={e} ranks min_units={min_units}")
    shares = continuous_shares(model, min_share=min_units / total_units)
    units = [max(min_units, math.floor(p * total_units)) for p in shares]
    while sum(units) > total_units:  # float residue only: take back from the slowest rank above the minimum
        above = [r for r in range(e) if units[r] > min_units]
        r = max(above, key=lambda r: (_time(model, r, units[r], total_units), -r))
        units[r] -= 1
    left = total_units - sum(units)
    if left > 0:  # each rank's time after one more unit; only the rank given it changes
        after = [(_time(model, r, units[r] + 1, total_units), r) for r in range(e)]
        for _ in range(left):
            r = min(after)[1]
            units[r] += 1
            after[r] = (_time(model, r, units[r] + 1, total_units), r)
    return ShardPlan(units=tuple(units), unit_size=unit_size)


def soonest_first(model: StepModel, base: Sequence[float], unit: float, ranks: Sequence[int], count: int) -> List[int]:
    """``count`` units of share ``unit`` each, one at a time to the rank of ``ranks`` that finishes it soonest on top
    of its ``base`` share, ``(R + S·(base_r + (n_r + 1)·unit))/v_r``, ties to the lower rank: the units each rank
    takes (0 outside ``ranks``).

    Each rank's finish times rise with its units, so every unit finishing before a level ``T`` precedes
    every unit finishing at or after it: the units below a level at which at most ``count`` finish are
    handed out in one pass (:func:`_below`), the rest one at a time (the heap holds each rank's
    next unit once, so which entry is least never depends on the heap's order)."""
    units, heap = _below(model, base, unit, ranks, count)
    R, S, v = model.replicated_work, model.shardable, model.speeds  # model.rank_time, read inline
    if heap is None:
        heap = [((R[r] + S * (base[r] + (units[r] + 1) * unit)) / v[r], r) for r in ranks]
    heapq.heapify(heap)
    for _ in range(count - sum(units)):
        r = heap[0][1]
        units[r] += 1
        heapq.heapreplace(heap, ((R[r] + S * (base[r] + (units[r] + 1) * unit)) / v[r], r))
    return units


def _below(model: StepModel, base: Sequence[float], unit: float, ranks: Sequence[int],
           count: int) -> Tuple[List[int], Optional[List[Tuple[float, int]]]]:
    """Per rank, its units that finish before a level ``T`` under which at most ``count`` units finish
    (:func:`soonest_first`), with each rank of ``ranks``' finish time of its next unit and the rank, read in
    the pass (``None`` where no rank was given a unit: :func:`soonest_first` reads them itself).

    ``T`` is the continuous level at which ``count`` units fit: a rank fits ``c_r`` there and finishes fewer
    than ``c_r`` whole units before it, so at most ``count`` finish in all unless some rank's base lies above
    ``T`` (``c_r < 0``); then the level at which ``count − |ranks|`` fit, and none where that too holds more."""
    Rs, S, v = model.replicated_work, model.shardable, model.speeds
    speed = sum(v[r] for r in ranks)
    if S <= 0.0 or speed <= 0.0:
        return [0] * len(base), None
    for fit in (count, count - len(ranks)):
        if fit <= 0:
            break
        # Σ_r ((T·v_r − R_r)/S − base_r)/unit = fit, solved for T
        level = (S * (unit * fit + sum(base[r] for r in ranks)) + sum(Rs[r] for r in ranks)) / speed
        out, after = [0] * len(base), []
        for r in ranks:
            b, vr, R = base[r], v[r], Rs[r]
            k = max(0, int(((level * vr - R) / S - b) / unit))
            while k > 0 and (R + S * (b + k * unit)) / vr >= level:
                k -= 1
            while (t := (R + S * (b + (k + 1) * unit)) / vr) < level:
                k += 1
            out[r] = k
            after.append((t, r))
        if sum(out) <= count:
            return out, after
    return [0] * len(base), None


def predicted_step(model: StepModel, plan: ShardPlan) -> float:
    """``max_r (R + S·n_r/U)/v_r`` for the plan's units ``n_r`` of ``U``."""
    plan.check_tp(model.tp)
    return model.step(plan.shares())


def speeds_from_times(times: Sequence[float], plan: ShardPlan, *, replicated: float, shardable: float) -> StepModel:
    """The model whose speeds explain the per-rank step ``times`` measured under ``plan``:
    ``v_r = (R + S·p_r)/t_r``."""
    if len(times) != plan.tp:
        raise ConfigError(f"times must have one entry per rank of the plan ({plan.tp}), got {len(times)}")
    times = [check_number(f"times[{r}]", t, minimum=0.0, low_open=True) for r, t in enumerate(times)]
    R = check_number("replicated", replicated, minimum=0.0)
    S = check_number("shardable", shardable, minimum=0.0, low_open=True)
    return StepModel(speeds=tuple((R + S * p) / t for p, t in zip(plan.shares(), times)), replicated=R, shardable=S)


def fit_step_model(replicated_times: Sequence[float], shardable_times: Sequence[float], plan: ShardPlan) -> StepModel:
    """``R``, ``S`` and every ``v_r`` from each rank's step split into its replicated seconds ``a_r = R/v_r``
    and its shardable seconds ``b_r = S·p_r/v_r``, measured under ``plan`` (shares ``p_r``).

    Each rank holding units estimates ``R/S = a_r·p_r/b_r``; their mean ``k`` is taken (a rank with
    ``p_r = 0`` has no shardable seconds and says nothing of ``S``: ``b_r ≥ 0`` is taken from it), the scale fixed by
    ``R + S/e = 1`` (a healthy even step is 1: ``S = 1/(k + 1/e)``, ``R = k·S``), and
    ``v_r = (R + S·p_r)/(a_r + b_r)`` (so the model reproduces every rank's measured step).
    """
    e = plan.tp
    if len(replicated_times) != e or len(shardable_times) != e:
        raise ConfigError(f"replicated_times and shardable_times must have one entry per rank of the plan ({e}), "
                          f"got {len(replicated_times)} and {len(shardable_times)}")
    a = [check_number(f"replicated_times[{r}]", t, minimum=0.0) for r, t in enumerate(replicated_times)]
    shares = plan.shares()
    b = [check_number(f"shardable_times[{r}]", t, minimum=0.0, low_open=shares[r] > 0)
         for r, t in enumerate(shardable_times)]
    holders = [r for r in range(e) if shares[r] > 0]
    k = sum(a[r] * shares[r] / b[r] for r in holders) / len(holders)
    S = 1.0 / (k + 1.0 / e)
    R = k * S
    return StepModel(speeds=tuple((R + S * shares[r]) / (a[r] + b[r]) for r in range(e)), replicated=R, shardable=S)
