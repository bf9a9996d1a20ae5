"""The pure SEMI-migration decision: busy times and cost curves in, a frozen plan out.

Every rank of a TP group all-gathers the busy times and calls :func:`decide_plan` with the same
numbers, so every rank computes the same plan (pure float arithmetic in a fixed order, ties broken
by rank) and no plan is ever broadcast. Notation (paper IV-B, DESIGN §3): ``e`` ranks, busy time
``T_i`` of rank ``i``, ``L_i`` its K columns (``columns``), ``T_min = min_i T_i``.

Stragglers. Rank ``i`` straggles iff ``T_i > T_ref·(1 + tol)``; ``T_ref = T_min`` except in mode
``zero``, which uses the group mean (paper Eq. 1) unless ``zero_reference="min"``. Stragglers are
ordered slowest first, ties by rank.

Eq. 1 (shed share). ``γ_i = clamp((T_i − T_ref)/M_i, 0, γ_max)`` with ``M_i`` the time of the
rank's linear GEMMs. The busy time this controller is given *is* that GEMM time, so ``M_i = T_i``
and ``γ_i = clamp(1 − T_ref/T_i, 0, γ_max)``: the share of its columns a straggler must stop
computing to finish in ``T_ref``. ``γ_max`` bounds the whole shed share (pruned + migrated).

Mode ``semi``, one straggler ``i`` (Eq. 2). It sheds ``n = L_i·γ_i`` columns, migrating ``nβ`` to
the ``e − 1`` others and pruning ``n(1 − β)``, with β balancing the straggler's resizing cost
against a receiver's migration cost,

    g(β) = Ω1 + Ω2(n(1−β)) − Φ1(nβ) − Φ2(nβ/(e−1)) = 0 .

With the monotone curves of :mod:`.curves`, ``g`` is non-increasing in β; :func:`solve_beta` takes
the largest β with ``g(β) ≥ 0`` by bisection: β = 1 when migration stays cheaper even for all
``n`` columns, β = 0 when it is dearer even at β = 0 (no root: the endpoint with the smaller
``|g|``), else the root. Ties prefer migration, which is loss-free.  A migrated share below
``ControllerConfig.min_migrate_share`` is rounded to 0 (the straggler then only resizes): every
migrating layer adds collectives that synchronise the receivers with the straggler inside the
layer, a fixed cost the pretest's traffic sample does not see (on a 2-rank CPU iteration even a
2.5 % migrated share costs tens of milliseconds more than resizing alone).  And β is capped so that no
receiver computes more than ``ControllerConfig.max_receiver_load`` of its own columns on top of
them (``β·n/(e−1) ≤ max_receiver_load·L``): Eq. 2 bounds neither side against ``T_min``, and a
single receiver loaded with most of a straggler's columns sets the group's pace.

Mode ``semi``, ``z ≥ 2`` stragglers (Eq. 3). With ``s_k`` the Eq. 1 shed share of the ``k``-th
slowest straggler (``k = 1 … z``), ``Γ(x) = Σ_{k≤x} L_k·s_k`` columns migrate when the ``x``
slowest migrate, and

    f(x) = (T_(x) − T_min) − [ Φ1(Γ(x)) + Γ(x)/|R(x)| · max_{y∈R(x)} T_y/L_y ] .

``R(x)`` are the receivers. The paper writes ``y ∈ [x+1, e]`` and divides by ``e − x``: every
rank at a sorted position after ``x``, i.e. every non-migrating rank, *including the stragglers
that resize*, receives an equal share. That literal reading is the default
(``receivers="non_migrating"``); ``receivers="normal"`` restricts ``R`` to the ``e − z``
non-stragglers. ``T_y/L_y`` is the receiver's seconds per column, so the bracket is the migration
traffic plus the slowest receiver's extra compute. The ``x`` slowest stragglers migrate for the
largest ``x ∈ [1, z]`` with ``f(x) > 0`` (``x = 0`` if none); this equals Algorithm 2's scan
"stop at the first ``f(k) < 0``" whenever ``f`` decreases, and is DESIGN's rule when it does not.
The other ``z − x`` stragglers resize by ``γ_k`` from Eq. 1 against ``T_min``.
``ControllerConfig.migrators = λ`` replaces Eq. 3's ``x`` by ``min(λ, z)`` (the paper's Fig. 11
sweep); ``f_values`` are still reported.

Modes ``zero``: every straggler resizes by Eq. 1. ``mig``: every straggler migrates its Eq. 1
share to the normal ranks. ``baseline``: every rank normal (stragglers are still reported).

Hysteresis. :func:`decide_plan` returns ``previous`` unchanged while, under the same config and
group size, every rank's time differs from the times ``previous`` was decided on by less than
``refresh_threshold`` (relative). Times measured while a plan is applied are no longer the
unbalanced times; :func:`unbalanced_times` undoes the plan's effect before they are fed back.
Pass ``previous=None`` to force a fresh decision (e.g. after the cost curves were refitted).
"""
from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass
from typing import Literal, Sequence

from semimig.resizing.ratio import pruning_ratio
from semimig.controller.config import ControllerConfig
from semimig.controller.curves import CostCurves

logger = logging.getLogger(__name__)

Kind = Literal["normal", "resize", "migrate"]
_BISECTION_STEPS = 60  # halves [0, 1] to below 1e-18, past float resolution


@dataclass(frozen=True, kw_only=True)
class RankAction:
    """What one rank does next iteration; shares are fractions of its own K columns."""

    rank: int
    kind: Kind
    """``migrate`` if it hands columns to peers (it may also prune: Eq. 2), ``resize`` if it only
    prunes, ``normal`` otherwise. Any kind may receive migrated columns (``receive_share``)."""
    gamma: float = 0.0
    """Pruned share of this rank's K columns (ZERO-resizing), in ``[0, γ_max]``."""
    migrate_share: float = 0.0
    """Share of its K columns computed by ``receivers`` instead (``L_mig / L``)."""
    receivers: tuple[int, ...] = ()
    """Ranks computing its migrated columns, equal shares, ordered by virtual rank
    ``(r − rank) mod e`` (DESIGN §2): the j-th receiver takes the j-th chunk."""
    receive_share: float = 0.0
    """Columns this rank receives from migrating peers, as a share of its own K columns."""

    def __post_init__(self) -> None:
        for name in ("gamma", "migrate_share", "receive_share"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(
                    f"RankAction.{name} must be finite and >= 0, got {value!r} (rank {self.rank})"
                )
        if self.gamma + self.migrate_share >= 1.0:
            raise ValueError(
                f"RankAction gamma + migrate_share must be < 1, got {self.gamma!r} + {self.migrate_share!r}"
            )
        expected = "migrate" if self.migrate_share > 0 else ("resize" if self.gamma > 0 else "normal")
        if self.kind != expected:
            raise ValueError(
                f"RankAction.kind must be {expected!r} for gamma={self.gamma!r}, "
                f"migrate_share={self.migrate_share!r}, got {self.kind!r}"
            )
        if (self.migrate_share > 0) != bool(self.receivers) or self.rank in self.receivers:
            raise ValueError(
                f"RankAction.receivers must list other ranks exactly when migrate_share > 0, "
                f"got {self.receivers!r} for rank {self.rank} with migrate_share={self.migrate_share!r}"
            )

    @property
    def shed_share(self) -> float:
        """Pruned plus migrated share."""
        return self.gamma + self.migrate_share

    @property
    def local_share(self) -> float:
        """Columns this rank computes, as a share of its own: ``1 − γ − migrate + receive``."""
        return 1.0 - self.gamma - self.migrate_share + self.receive_share

    def column_counts(self, k: int) -> tuple[int, int]:
        """``(pruned, migrated)`` column counts for a layer with ``k`` columns on this rank.

        The local keep set has ``round(k·(1 − γ − migrate))`` columns (DESIGN §1's
        ``|S| = round(K·(1−γ))``, Python rounding), ``shed = k − |S|``,
        ``migrated = min(round(k·migrate), shed)`` and ``pruned = shed − migrated``, so the two
        never exceed ``k`` together and a resize-only action prunes exactly DESIGN's ``|P|``.
        """
        if k < 0:
            raise ValueError(f"column_counts needs k >= 0, got {k!r}")
        shed = k - round(k * (1.0 - self.shed_share))
        migrated = min(shed, round(k * self.migrate_share))
        return shed - migrated, migrated


@dataclass(frozen=True, kw_only=True)
class GroupPlan:
    """The decision for one TP group, identical on every rank."""

    config: ControllerConfig
    actions: tuple[RankAction, ...]
    """One action per rank, ``actions[r].rank == r``."""
    busy_times: tuple[float, ...]
    """The (unbalanced) busy times this plan was decided on; hysteresis compares against them."""
    t_ref: float
    """Reference time of the straggler test and Eq. 1 (``T_min``, or the mean in mode zero)."""
    stragglers: tuple[int, ...]
    """Ranks with ``T_i > T_ref·(1 + tol)``, slowest first, ties by rank."""
    x: int
    """How many stragglers migrate (the first ``x`` of ``stragglers``)."""
    beta: float | None = None
    """Eq. 2 migrated fraction of the shed columns (mode semi, exactly one straggler)."""
    f_values: tuple[float, ...] = ()
    """Eq. 3 ``f(1) … f(z)`` in seconds (mode semi, ``z ≥ 2``), for logs and tests."""

    def __post_init__(self) -> None:
        if len(self.actions) != len(self.busy_times):
            raise ValueError(
                f"GroupPlan needs one action per rank, got {len(self.actions)} "
                f"for {len(self.busy_times)} busy times"
            )
        for r, action in enumerate(self.actions):
            if action.rank != r:
                raise ValueError(f"GroupPlan.actions[{r}] is for rank {action.rank}")

    @property
    def world_size(self) -> int:
        return len(self.actions)

    @property
    def t_min(self) -> float:
        return min(self.busy_times)

    @property
    def is_balanced(self) -> bool:
        """True when every rank runs normally."""
        return all(a.kind == "normal" for a in self.actions)

    def holds_for(self, busy_times: Sequence[float], threshold: float) -> bool:
        """Hysteresis test: every ``|T_i − T_i'| < threshold·T_i'`` against :attr:`busy_times`."""
        if len(busy_times) != self.world_size:
            return False
        return all(abs(t - t0) < threshold * t0 for t, t0 in zip(busy_times, self.busy_times))

    def summary(self) -> str:
        """One log line: mode, T_ref, x, β and the non-normal actions."""
        parts = [f"{self.config.mode} e={self.world_size} T_ref={self.t_ref:.4g} x={self.x}"]
        if self.beta is not None:
            parts.append(f"beta={self.beta:.3f}")
        for a in self.actions:
            if a.kind != "normal":
                parts.append(
                    f"r{a.rank}:{a.kind} gamma={a.gamma:.3f} mig={a.migrate_share:.3f}->{list(a.receivers)}"
                )
        return " | ".join(parts)


def shed_share(busy_time: float, t_ref: float, *, gamma_max: float) -> float:
    """Eq. 1 with ``M_i = T_i``: ``clamp(1 − t_ref/busy_time, 0, gamma_max)``."""
    return pruning_ratio(busy_time, t_ref, busy_time, gamma_max)


def solve_beta(n_shed: float, world_size: int, curves: CostCurves) -> float:
    """Eq. 2: largest ``β ∈ [0, 1]`` with ``Ω1 + Ω2(n(1−β)) ≥ Φ1(nβ) + Φ2(nβ/(e−1))``.

    See the module docstring; returns 0 for ``n_shed ≤ 0`` or a group of one.
    """
    if n_shed <= 0.0 or world_size < 2:
        return 0.0

    def g(beta: float) -> float:
        migrated = n_shed * beta
        return (curves.omega1 + curves.omega2(n_shed - migrated)) - (
            curves.phi1(migrated) + curves.phi2(migrated / (world_size - 1))
        )

    if g(1.0) >= 0.0:
        return 1.0
    if g(0.0) < 0.0:
        return 0.0
    lo, hi = 0.0, 1.0  # invariant: g(lo) >= 0 > g(hi)
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if g(mid) >= 0.0:
            lo = mid
        else:
            hi = mid
    return lo


def decide_plan(
    busy_times: Sequence[float],
    columns: int | Sequence[int],
    curves: CostCurves,
    config: ControllerConfig,
    previous: GroupPlan | None = None,
    *,
    shed: Sequence[float] | None = None,
) -> GroupPlan:
    """Decide who resizes and who migrates for the next iteration (see the module docstring).

    Args:
        busy_times: unbalanced busy time of every rank of the group, seconds, each finite > 0.
        columns: K columns per rank (``L``), one int for all ranks or one per rank; the cost
            curves count columns in the same units.
        curves: fitted Ω1, Ω2, Φ1, Φ2.
        config: mode, tolerances, γ_max.
        previous: the plan in force; returned unchanged while the hysteresis test holds.
        shed: the shed share of every rank, decided elsewhere (on real time:
            :class:`semimig.controller.shedding.ShedPolicy`, which has the evidence and the fixed
            costs Eq. 1 lacks); the stragglers are then the ranks with a share > 0, and Eqs. 2
            and 3 only split those shares.  ``None``: the straggler test and Eq. 1 from ``busy_times``.
    """
    times = _check_times(busy_times)
    e = len(times)
    cols = _check_columns(columns, e)
    if (
        previous is not None
        and shed is None
        and previous.config == config
        and previous.holds_for(times, config.refresh_threshold)
    ):
        return previous

    mode = config.mode
    t_min = min(times)
    # the mean is never below the least time, but its floating-point sum can round so where every time is equal
    t_ref = max(math.fsum(times) / e, t_min) if (mode == "zero" and config.zero_reference == "mean") else t_min
    if shed is None:
        slow = [r for r in range(e) if times[r] > t_ref * (1.0 + config.tol)]
    else:
        if len(shed) != e or not all(math.isfinite(s) and 0.0 <= s <= config.gamma_max for s in shed):
            raise ValueError(f"shed must hold one share in [0, {config.gamma_max}] per rank, got {tuple(shed)!r}")
        slow = [r for r in range(e) if shed[r] > 0.0]
    stragglers = tuple(sorted(slow, key=lambda r: (-times[r], r)))  # slowest first, ties by rank
    shares = ({r: shed_share(times[r], t_ref, gamma_max=config.gamma_max) for r in stragglers} if shed is None
              else {r: float(shed[r]) for r in stragglers})
    gamma = [0.0] * e
    migrate = [0.0] * e
    migrating: tuple[int, ...] = ()
    receivers_of: tuple[int, ...] = ()
    beta: float | None = None
    f_values: tuple[float, ...] = ()

    if mode == "zero":
        for r in stragglers:
            gamma[r] = shares[r]
    elif mode == "mig":
        migrating = stragglers
        receivers_of = _receivers(e, migrating, stragglers, "normal")
        for r in migrating:
            migrate[r] = shares[r]
    elif mode == "semi" and len(stragglers) == 1:  # Eq. 2
        (r,) = stragglers
        migrating = stragglers
        receivers_of = _receivers(e, migrating, stragglers, "non_migrating")
        beta = solve_beta(cols[r] * shares[r], e, curves)
        if config.max_receiver_load is not None and shares[r] > 0.0:
            # each receiver computes at most max_receiver_load of its own columns on top (config doc)
            receiver_columns = min(cols[y] for y in receivers_of)
            cap = config.max_receiver_load * len(receivers_of) * receiver_columns / (cols[r] * shares[r])
            beta = min(beta, cap)
        if shares[r] * beta < config.min_migrate_share:
            beta = 0.0  # a sliver of migration cannot pay for its per-layer collectives (config doc)
        migrate[r] = shares[r] * beta
        gamma[r] = shares[r] - migrate[r]
    elif mode == "semi" and len(stragglers) >= 2:  # Eq. 3
        f_values = eq3_f_values(times, cols, stragglers, shares, curves, config.receivers)
        x = max((i + 1 for i, f in enumerate(f_values) if f > 0.0), default=0)
        if config.migrators is not None:  # λ sweep: the caller fixes x
            x = min(config.migrators, len(stragglers))
        migrating = stragglers[:x]
        receivers_of = _receivers(e, migrating, stragglers, config.receivers)
        for r in stragglers:
            if r in migrating:
                migrate[r] = shares[r]
            else:
                gamma[r] = shares[r]

    plan = GroupPlan(
        config=config,
        actions=_build_actions(e, cols, gamma, migrate, migrating, receivers_of),
        busy_times=times,
        t_ref=t_ref,
        stragglers=stragglers,
        x=sum(1 for r in migrating if migrate[r] > 0.0),
        beta=beta,
        f_values=f_values,
    )
    logger.debug("decide_plan: %s", plan.summary())
    return plan


def eq3_f_values(
    times: Sequence[float],
    columns: Sequence[int],
    stragglers: Sequence[int],
    shares: dict[int, float],
    curves: CostCurves,
    receivers: Literal["non_migrating", "normal"],
) -> tuple[float, ...]:
    """Eq. 3: ``f(x)`` for ``x = 1 … z`` (``stragglers`` slowest first; see the module docstring)."""
    t_min = min(times)
    values = []
    gamma_x = 0.0
    for x in range(1, len(stragglers) + 1):
        k = stragglers[x - 1]
        gamma_x += columns[k] * shares[k]
        recv = _receivers(len(times), stragglers[:x], stragglers, receivers)
        seconds_per_column = max(times[y] / columns[y] for y in recv)
        cost = curves.phi1(gamma_x) + gamma_x / len(recv) * seconds_per_column
        values.append((times[k] - t_min) - cost)
    return tuple(values)


def unbalanced_times(measured_times: Sequence[float], plan: GroupPlan) -> tuple[float, ...]:
    """Estimate the busy times without ``plan``: ``T_i / local_share_i``.

    Assumes busy time proportional to the columns a rank computes (own kept columns plus
    received ones); the migration traffic itself is not removed. Feed the result to
    :func:`decide_plan` so that a balanced straggler is still seen as a straggler.
    """
    times = _check_times(measured_times)
    if len(times) != plan.world_size:
        raise ValueError(f"unbalanced_times got {len(times)} times for a plan of {plan.world_size} ranks")
    return tuple(t / a.local_share for t, a in zip(times, plan.actions))


def _receivers(
    e: int, migrating: Sequence[int], stragglers: Sequence[int], policy: Literal["non_migrating", "normal"]
) -> tuple[int, ...]:
    """Ranks that compute migrated columns, ascending (see ``ControllerConfig.receivers``)."""
    excluded = set(stragglers) if policy == "normal" else set(migrating)
    return tuple(r for r in range(e) if r not in excluded)


def _build_actions(
    e: int,
    cols: Sequence[int],
    gamma: Sequence[float],
    migrate: Sequence[float],
    migrating: Sequence[int],
    receivers: tuple[int, ...],
) -> tuple[RankAction, ...]:
    received = [0.0] * e  # columns
    for k in migrating:
        for r in receivers:
            received[r] += cols[k] * migrate[k] / len(receivers)
    actions = []
    for r in range(e):
        kind: Kind = "migrate" if migrate[r] > 0 else ("resize" if gamma[r] > 0 else "normal")
        own_receivers = tuple(sorted(receivers, key=lambda y: (y - r) % e)) if migrate[r] > 0 else ()
        actions.append(
            RankAction(
                rank=r,
                kind=kind,
                gamma=gamma[r],
                migrate_share=migrate[r],
                receivers=own_receivers,
                receive_share=received[r] / cols[r],
            )
        )
    return tuple(actions)


def _check_times(busy_times: Sequence[float]) -> tuple[float, ...]:
    times = tuple(float(t) for t in busy_times)
    if not times:
        raise ValueError("busy_times must hold one time per rank, got none")
    for r, t in enumerate(times):
        if not (math.isfinite(t) and t > 0.0):
            raise ValueError(f"busy_times[{r}] must be finite and > 0 seconds, got {t!r}")
    return times


def _check_columns(columns: int | Sequence[int], e: int) -> tuple[int, ...]:
    cols = (columns,) * e if isinstance(columns, numbers.Integral) else tuple(columns)
    if len(cols) != e:
        raise ValueError(f"columns must be one int or one per rank ({e}), got {len(cols)} values")
    for r, c in enumerate(cols):
        if isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 1:
            raise ValueError(f"columns[{r}] must be an int >= 1, got {c!r}")
    return tuple(int(c) for c in cols)
