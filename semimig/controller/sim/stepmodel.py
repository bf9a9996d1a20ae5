"""The step-time model the policy simulator runs on (DESIGN §8): what a step and a move cost.

A tensor-parallel group of ``tp`` ranks trains a model whose paired work is split in two kinds of
unit, MLP blocks and KV groups, each rank holding whole units of each (a
:class:`~semimig.sharding.ShardPlan` per kind, at least one unit per rank as the plans require).
Rank ``r`` at speed ``v_r`` (1: healthy) spends ``c_r = (R + S·p_r)/v_r`` on its own work, with
``R + S/e = 1`` so that a healthy even step's compute is 1, and ``p_r = (1 − a)·n_r/U + a·k_r/K`` its
share of the shardable work (``a`` the attention's share of it, ``n_r`` of ``U`` MLP blocks, ``k_r``
of ``K`` KV groups).  The ranks meet at every layer's reduction, so the step's compute is not
``max_r c_r`` but kind by kind the slowest rank's segment: each kind's layers with their share of the
replicated work, ``ω_k·(R + S·p_{k,r})/v_r`` with ``ω = (1 − a, a)`` and ``p_{k,r}`` the rank's share of
kind ``k`` (``Σ_k`` of them is ``c_r``; :meth:`Workload.bound`), as the joint planner's model
(:mod:`semimig.sharding.jobmodel`).  To it come the step's collectives, a share of a healthy
step split over each kind's reductions and the vocabulary's, each at its slowest member's pace
(:meth:`Workload.seat_comm`).  In seconds, a healthy even step is ``step_s``.  With
``idle_skips`` a rank holding no unit of either kind skips the step (:mod:`semimig.shardformer.skip`):
the step is the slowest *holder*'s, and what the policy reads of the idle rank is its replicated work at
its speed, ``R/v_r`` (what :mod:`semimig.resharder.idle` gives it from the probe).

A rank's replicated work need not slow as its shardable work does: at speed ``v_r`` it runs at
``v_r^φ`` (``replicated_pace``), so ``c_r = R/v_r^φ + S·p_r/v_r``, and its seats in the collectives run at that
pace too.  ``φ = 1`` (the family's) is a device that slows all of its work alike, as a slow GPU does; below 1
the many small kernels of the replicated work and the collectives' short bursts slow less than the large GEMMs,
as under a CPU quota that lets short bursts through (the recorded throttles' replay reads ``φ`` from the slow
rank's own split, :mod:`~semimig.controller.sim.recorded`, and the collectives of a plan that seats the slow rank
ran as that ``φ`` predicts in the throttles that come and go).  Where the step's collectives say otherwise its
seats run at ``v^ψ`` (``seat_pace``): a mildly slow rank with slack before each reduction, under a quota, ran its
seats near full pace while its replicated work ran slower than its GEMMs.

What the policy reads is not the truth: its weights are the paired *parameters*' shares
(``attention_param_share``: the attention core's time is not in them), and the shardable seconds a
rank's timers see are a share ``timed_share`` of its shardable work (the optimizer's update of the
shard is not timed), so the replicated work it infers is an upper bound, as on real runs.

A move sends, for every unit that changes owner, its weights and optimizer state
(``state_bytes`` for all units together, split by parameter share), in
``latency_s + bytes / bandwidth_bytes_s · pace`` (before the first step: the weights alone,
:data:`FIRST_MOVE_SHARE` of those bytes).  Half of a move's work (packing and sending, or receiving
and unpacking) runs at each end's pace, so a slow rank taking part stretches it:
``pace = (1 + χ)/2`` with ``χ`` the slowdown (fastest speed over its speed) of the slowest rank whose
units change (the policy's :func:`~semimig.controller.policy.gain.move_pace`; a move with a rank at a
quarter of a core, ``χ`` 4, measured 2-4x a free move's seconds per byte on the reference machine).
The step after a move (not the first, before any step) runs ``settle`` healthy even steps over the plan's
steady step, whatever the move's bytes: the first touches of the units moved in, the allocator's new blocks,
what the framework rebuilds (on the reference machine the two steps after a move ran a median 0.60 s over
steady under a 20:40 throttle and 0.35 s under 45:45, 0.7-0.8 of a healthy step, after transfers of 0.1-0.5 s).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

from semimig._validate import check_bool, check_int, check_number
from semimig.controller.policy.gain import move_pace, movers
from semimig.controller.reshard import moved_units
from semimig.errors import ConfigError
from semimig.sharding.solver import StepModel
from semimig.sharding.jobmodel import seat_scale
from semimig.sharding.plan import ShardPlan

__all__ = ["Workload", "Plans", "FIRST_MOVE_SHARE"]

FIRST_MOVE_SHARE = 1.0 / 3.0
"""Share of a unit's bytes a move before the first step sends: its weights (fp32), no optimizer state
exists yet (the two AdamW moments)."""

Plans = Tuple[ShardPlan, ShardPlan]
"""``(MLP blocks, KV groups)``: the plan in force, one per paired dimension, in the policy's order."""


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One group's model and machine: the constants of the step model (module docstring)."""

    tp: int
    replicated_share: float
    """``ρ = R``: the replicated work's share of a healthy even step's compute (norms, embeddings, head,
    loss, host work)."""
    mlp_units: int
    """``U``: MLP blocks."""
    kv_units: int
    """``K``: KV groups."""
    attention_share: float = 0.35
    """``a``: the attention's share of the shardable work (its GEMMs and its core)."""
    attention_param_share: float = 0.3
    """The attention's share of the paired parameters: the policy's weight of the KV dimension."""
    timed_share: float = 1.0
    """Share of a rank's shardable seconds its timers see (the rest reads as replicated)."""
    comm_share: float = 0.05
    """The step's collectives, as a share of a healthy even step (the same under every plan)."""
    step_s: float = 1.0
    """Seconds of a healthy even step."""
    state_bytes: int = 10**9
    """Bytes of every unit's weights and optimizer state together."""
    bandwidth_bytes_s: float = 1e9
    latency_s: float = 0.01
    idle_skips: bool = False
    """A rank holding no unit skips the step (module docstring)."""
    replicated_pace: float = 1.0
    """``φ``: a rank at speed ``v`` runs its replicated work at ``v^φ``, and its seats in the collectives too unless
    :attr:`seat_pace` says otherwise (module docstring)."""
    seat_pace: Optional[float] = None
    """``ψ``: a rank at speed ``v`` seated in the collectives runs them at ``v^ψ`` (``None``: ``φ``)."""
    settle: float = 0.0
    """The step after a move runs this many healthy even steps longer than the plan's steady step (module
    docstring)."""

    def __post_init__(self) -> None:
        check_int("Workload.tp", self.tp, minimum=1, maximum=1024)
        check_number("Workload.replicated_share", self.replicated_share, minimum=0.0, maximum=1.0, high_open=True)
        for name in ("mlp_units", "kv_units"):
            units = check_int(f"Workload.{name}", getattr(self, name), minimum=self.tp)
            if units % self.tp:
                raise ConfigError(f"Workload.{name}={units} is not divisible by tp={self.tp} (the even plan needs it)")
        check_number("Workload.attention_share", self.attention_share, minimum=0.0, maximum=1.0, high_open=True)
        check_number("Workload.attention_param_share", self.attention_param_share, minimum=0.0, maximum=1.0,
                     low_open=True, high_open=True)
        check_number("Workload.timed_share", self.timed_share, minimum=0.0, maximum=1.0, low_open=True)
        check_number("Workload.comm_share", self.comm_share, minimum=0.0, maximum=1.0, high_open=True)
        check_number("Workload.step_s", self.step_s, minimum=0.0, low_open=True)
        check_int("Workload.state_bytes", self.state_bytes, minimum=0)
        check_number("Workload.bandwidth_bytes_s", self.bandwidth_bytes_s, minimum=0.0, low_open=True)
        check_number("Workload.latency_s", self.latency_s, minimum=0.0)
        check_bool("Workload.idle_skips", self.idle_skips)
        check_number("Workload.replicated_pace", self.replicated_pace, minimum=0.0, maximum=1.0)
        check_number("Workload.seat_pace", self.seat_pace, minimum=0.0, maximum=1.0, allow_none=True)
        check_number("Workload.settle", self.settle, minimum=0.0)

    # ------------------------------------------------------------------ constants
    @property
    def seat_exponent(self) -> float:
        """The exponent a slow rank's seats in the collectives run at: :attr:`seat_pace`, else ``φ``."""
        return self.replicated_pace if self.seat_pace is None else self.seat_pace

    @property
    def replicated(self) -> float:
        """``R`` in units of a healthy even step's compute."""
        return self.replicated_share

    @property
    def shardable(self) -> float:
        """``S = e·(1 − R)`` (so that ``R + S/e = 1``)."""
        return self.tp * (1.0 - self.replicated_share)

    @property
    def compute_s(self) -> float:
        """Seconds of one unit of model work (a healthy even step's compute)."""
        return self.step_s * (1.0 - self.comm_share)

    @property
    def comm_s(self) -> float:
        """Seconds of the step's collectives."""
        return self.step_s * self.comm_share

    @property
    def weights(self) -> Tuple[float, float]:
        """The policy's weight of each dimension: its share of the paired parameters."""
        return 1.0 - self.attention_param_share, self.attention_param_share

    @property
    def bytes_per_unit(self) -> Tuple[int, int]:
        """Bytes one MLP block and one KV group move (weights and optimizer state)."""
        mlp, kv = self.weights
        return int(self.state_bytes * mlp / self.mlp_units), int(self.state_bytes * kv / self.kv_units)

    def even_plans(self) -> Plans:
        """Colossal-AI's layout: every rank an equal part of each dimension."""
        return ShardPlan.even(self.mlp_units, self.tp), ShardPlan.even(self.kv_units, self.tp)

    # ------------------------------------------------------------------ a step
    def shares(self, plans: Plans) -> Tuple[float, ...]:
        """``p_r``: each rank's share of the shardable work (module docstring)."""
        mlp, kv = plans
        a = self.attention_share
        return tuple((1.0 - a) * n / self.mlp_units + a * k / self.kv_units for n, k in zip(mlp.units, kv.units))

    def replicated_at(self, speed):
        """``R·v^(1 − φ)``: the replicated work at speed ``v`` (a float or an array of them) in units of the
        shardable work's pace, so that a rank's compute is ``(R·v^(1 − φ) + S·p)/v = R/v^φ + S·p/v``."""
        return self.replicated * speed ** (1.0 - self.replicated_pace)

    def step_model(self, speeds: Sequence[float]) -> StepModel:
        """The planner's :class:`~semimig.sharding.solver.StepModel` of this workload at ``speeds`` (its replicated
        pace on every rank; relative to the fastest rank, which the family's traces keep at 1)."""
        phi = self.replicated_pace
        return StepModel(speeds=tuple(float(v) for v in speeds), replicated=self.replicated, shardable=self.shardable,
                         replicated_pace=None if phi == 1.0 else (phi,) * len(speeds))

    def rank_compute(self, plans: Plans, speeds: Sequence[float]) -> Tuple[float, ...]:
        """``c_r`` in seconds."""
        S, unit = self.shardable, self.compute_s
        return tuple(unit * (self.replicated_at(v) + S * p) / v for p, v in zip(self.shares(plans), speeds))

    def shardable_compute(self, plans: Plans, speeds: Sequence[float]) -> Tuple[float, ...]:
        """Each rank's seconds of shardable work (all of it, timed or not)."""
        S, unit = self.shardable, self.compute_s
        return tuple(unit * S * p / v for p, v in zip(self.shares(plans), speeds))

    def seat_comm(self, plans: Plans, speeds: Sequence[float]) -> float:
        """The collectives' seconds: ``comm_s`` split evenly over the paired dimensions and the vocabulary's
        collectives, each dimension's reductions at the pace of its slowest rank holding units of it, the
        vocabulary's at its slowest rank (its slowest holder with ``idle_skips``), a rank at speed ``v`` seated at
        ``v^ψ`` (:attr:`seat_exponent`) (``comm_s`` on healthy ranks;
        the policy's :func:`~semimig.controller.policy.propose.seat_scale`; :meth:`seat_comms`)."""
        return _seat_comm(self, tuple(plans), tuple(float(v) for v in speeds))

    def seat_comms(self, plans: Sequence[Plans], speeds: np.ndarray) -> np.ndarray:
        """``[k, s]``: :meth:`seat_comm` of ``plans[k]`` at the speeds ``speeds[s]`` (one row per state)."""
        speeds = np.asarray(speeds, dtype=float) ** self.seat_exponent
        top = speeds.max(axis=1)  # (s,)
        out = np.zeros((len(plans), speeds.shape[0]))
        for k, plan in enumerate(plans):
            holders = np.zeros(speeds.shape[1], dtype=bool)
            for dim in plan:
                seated = np.array(dim.units) > 0
                holders |= seated
                out[k] += top / speeds[:, seated].min(axis=1) if seated.any() else 1.0
            vocab = holders if self.idle_skips else np.ones_like(holders)
            out[k] += top / speeds[:, vocab].min(axis=1)
        return self.comm_s * out / (len(plans[0]) + 1) if plans else out

    def step_seconds(self, plans: Plans, speeds: Sequence[float]) -> float:
        """The group's step: its compute (:meth:`bound`) plus the collectives."""
        return _bound(self, tuple(plans), tuple(float(v) for v in speeds), None) + self.seat_comm(plans, speeds)

    def bound(self, plans: Plans, speeds: Sequence[float], factors: Optional[Sequence[float]] = None) -> float:
        """The compute that bounds the step: kind by kind the slowest rank's segment (module docstring), over
        the holders with ``idle_skips``; ``factors``: each rank's compute scaled by it (measurement noise)."""
        return _bound(self, tuple(plans), tuple(float(v) for v in speeds),
                      None if factors is None else tuple(float(f) for f in factors))

    # ------------------------------------------------------------------ a move
    def move(self, old: Plans, new: Plans, *, first: bool = False,
             speeds: Optional[Sequence[float]] = None) -> Tuple[int, float]:
        """``(bytes, seconds)`` of moving from ``old`` to ``new`` (nothing when they are equal) at the ranks'
        ``speeds`` (``None``: all alike); ``first``: before the first step (weights only)."""
        if tuple(old) == tuple(new):
            return 0, 0.0
        nbytes = sum(moved_units(o, n) * b for o, n, b in zip(old, new, self.bytes_per_unit))
        if first:
            nbytes = int(nbytes * FIRST_MOVE_SHARE)
        return nbytes, self.move_seconds(nbytes, 1.0 if speeds is None else move_pace(movers(old, new), speeds))

    def move_seconds(self, nbytes, pace):
        """Seconds of a move of ``nbytes`` at ``pace`` (:func:`~semimig.controller.policy.gain.move_pace`; arrays
        of both alike)."""
        return self.latency_s + nbytes / self.bandwidth_bytes_s * pace


@functools.lru_cache(maxsize=4096)
def _seat_comm(workload: Workload, plans: Plans, speeds: Tuple[float, ...]) -> float:
    """:meth:`Workload.seat_comm`: the policy's :func:`~semimig.sharding.jobmodel.seat_scale` over the dimensions and
    the vocabulary (a trace holds its speeds and its plan for many steps: read once)."""
    paces = tuple(v ** workload.seat_exponent for v in speeds)
    return workload.comm_s * seat_scale(paces, plans, idle_free=workload.idle_skips) / (len(plans) + 1)


def _bound(workload: Workload, plans: Plans, speeds: Tuple[float, ...], factors: Optional[Tuple[float, ...]]) -> float:
    """:meth:`Workload.bound`: noise-free, one reading per plan and speeds (:func:`_noise_free`)."""
    return _noise_free(workload, plans, speeds) if factors is None else _scaled(workload, plans, speeds, factors)


@functools.lru_cache(maxsize=4096)
def _noise_free(workload: Workload, plans: Plans, speeds: Tuple[float, ...]) -> float:
    return _scaled(workload, plans, speeds, None)


def _scaled(workload: Workload, plans: Plans, speeds: Tuple[float, ...], factors: Optional[Tuple[float, ...]]) -> float:
    (mlp, kv), a = plans, workload.attention_share
    S, unit = workload.shardable, workload.compute_s
    held = [n > 0 or k > 0 or not workload.idle_skips for n, k in zip(mlp.units, kv.units)]
    scale = factors if factors is not None else (1.0,) * workload.tp
    ranks = [r for r in range(workload.tp) if held[r]]
    R = [workload.replicated_at(v) for v in speeds]
    return unit * (max((1.0 - a) * (R[r] + S * mlp.units[r] / workload.mlp_units) / speeds[r] * scale[r] for r in ranks)
                   + max(a * (R[r] + S * kv.units[r] / workload.kv_units) / speeds[r] * scale[r] for r in ranks))
