"""What a recorded run says: the step model's constants read from a ``time_to_loss`` result file, for the
replay of :mod:`~semimig.controller.sim.replay`.

throttle patterns which steps ran throttled (``throttled``), every re-plan of a ``reshard`` run
(``summary.reshard.events``: the step it was decided at, the MLP and KV units per rank), each mode's
per-rank ``balanced_share`` and the layout (``layout``: ``tp``, ``dp``, the throttled rank, its core
``fraction`` against every other rank's ``share``).  Every constant of the model is read from those
fields of the file being replayed, none is carried over from another run:

- layout: ``tp``, ``dp`` and the throttled rank from ``layout`` (else ``config``; files without them
  ran the benchmark's defaults: tp 2, dp 1, the last rank throttled; a straggler that moves lists the
  ranks it visits, and its runs record the rank held on each step, ``throttled_ranks``; stragglers slowed
  together, without a pattern, list their ranks and one ``fraction`` each, every rank with its own ``χ``
  below).  The model is one
  tensor-parallel group: a file with ``dp > 1`` (per-replica plans, a batch split) or ``pp > 1``
  (stages) is skipped with that reason;
- the healthy step ``T``: the mean of the healthy runs' steps after the first (the statistic the
  replayed runs are compared by);
- the slowdown ``χ``: an ``off`` run's (Colossal-AI alone, even plan) mean throttled step over ``T``
  where the file has one, since on the even plan the model's step is ``χ·T`` (the slow rank holds units
  of every kind, so its collectives run at its pace too); else the throttle's nominal ratio, the
  others' core ``share`` over the slow rank's ``fraction``, or the file's ``chi``, or (a plain
  ``real`` throttle on one core each) one over ``config.fraction``.  A straggler with no nominal
  slowdown (``neighbour``: ``chi`` null) and no ``off`` run is skipped.  Where the ``reshard`` runs
  record each rank's split under the plans they held and the throttled rank holds units there, its GEMM
  seconds per share over the healthy ranks' under the same plan are ``χ`` instead: the pace of its shardable work under the plans being
  replayed (an ``off`` run's step carries its replicated work as well, which need not slow alike);
- the shardable share ``B``: the median over ranks of the healthy mode's ``balanced_share``, the share
  of a rank's step its sheddable GEMM passes took (``busy / compute``, where ``compute`` is the step
  less the controller's own exchanges: the layers' collectives are inside it);
- the model shape: ``U`` MLP blocks and ``K`` KV groups from the run's first event (even: the
  example's ``I = 4·h`` and ``kv_heads``); the attention's share ``a`` of the shardable work as its share of
  the paired parameters, ``2·h·(h + h_kv)`` per layer against the MLP's ``3·h·I`` (``I = 128·U``).

The rest of a healthy step, ``1 − B``, is replicated work (norms, embeddings, head, loss, host work:
slow on the slow rank wherever it sits) and the group's collectives (slow only at its seats,
:meth:`~semimig.controller.sim.stepmodel.Workload.seat_comm`).  A file whose healthy mode records
each rank's step split (``step_split``: its own work ``c``, the time in semimig's collectives ``m``, the
balanced GEMMs ``g``, medians over ranks) splits it: ``B = g/(c + m)`` and ``f = (c − g)/(c − g + m)``,
the point estimate.  An older file keeps ``balanced_share`` as its only per-rank time, so its point
estimate is ``f = 1`` (all of it replicated: what the policy itself reads, a rank's ``compute − busy``
being the replicated seconds it posts).  Not all of a rank's own non-GEMM work ``c − g`` is replicated:
the attention core goes with the heads a rank holds and the MLP's activation with its columns.  Where
the file's ``reshard`` runs record each rank's split under the plans they held (every step's, grouped by plan
and throttle state: :func:`_split_points`), the replicated seconds ``R`` are fitted over the ranks' shares
(:func:`_replicated_s`), the rest of
``c − g`` joins the shardable work and the collectives stay ``m``: ``B = (c − R)/(c + m)`` and
``f = R/(R + m)``; the throttled rank's own non-GEMM seconds then give the pace ``φ`` of its replicated
work (:attr:`~semimig.controller.sim.stepmodel.Workload.replicated_pace`: a CPU quota that lets short
bursts through runs the many small kernels of the replicated work faster than the GEMMs).  Either way the replay also runs every split ``f`` in
:data:`~semimig.controller.sim.replay.SPLITS` (``f`` of ``1 − B`` replicated, the rest collectives) and reports the band of simulated
means over them.  In
the model's terms: ``comm_share = (1 − f)·(1 − B)`` and ``replicated_share = f·(1 − B) / (f·(1 − B) + B)``
(the replicated work's share of the compute, ``R + S/e = 1``).  A run whose re-shard summary says
``idle_skips`` let a rank holding nothing skip the step, and so does its replay.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

from semimig.controller.sim.stepmodel import Plans, Workload
from semimig.sharding.plan import ShardPlan

__all__ = ["BLOCK", "GROUP_STEPS", "file_constants", "file_workload", "plan_schedule", "run_events",
           "run_idle_skips", "held_ranks", "chi_of"]

BLOCK = 128
"""Columns of one MLP unit (the example's re-shard block)."""


GROUP_STEPS = 5
"""Fewest steps of one plan and throttle state whose split medians make a point of the fit (:func:`_split_points`)."""


def _layout(data: dict) -> Tuple[int, int, int, int]:
    """``(tp, dp, pp, throttled rank)`` from ``layout``, else ``config``, else the benchmark's defaults."""
    layout, config = data.get("layout") or {}, data.get("config") or {}

    def read(key: str, default: int) -> int:
        value = layout.get(key, config.get(key))
        return default if value is None else int(value)

    tp, dp, pp = read("tp", 2), read("dp", 1), read("pp", 1)
    moving = layout.get("straggler_rank")
    if isinstance(moving, list):  # a straggler that moves: the ranks it visits, in turn
        return tp, dp, pp, [int(r) for r in moving]
    return tp, dp, pp, read("straggler_rank", tp * dp * pp - 1)


def _nominal_chi(data: dict) -> Optional[float]:
    layout, config = data.get("layout") or {}, data.get("config") or {}
    if layout.get("share") and layout.get("fraction"):
        return float(layout["share"]) / float(layout["fraction"])
    if data.get("chi"):
        return float(data["chi"])
    if data.get("straggler") == "real" and config.get("fraction"):
        return 1.0 / float(config["fraction"])
    return None


def _nominal_chis(data: dict, ranks: Sequence[int]) -> Optional[dict]:
    """Stragglers slowed together: ``{rank: share / fraction}`` from ``layout`` (one fraction for all, or one
    each), or ``None`` where it does not say."""
    layout = data.get("layout") or {}
    share, fraction = layout.get("share"), layout.get("fraction")
    fractions = fraction if isinstance(fraction, list) else [fraction] * len(ranks)
    if not share or len(fractions) != len(ranks) or not all(fractions):
        return None
    return {int(r): float(share) / float(f) for r, f in zip(ranks, fractions)}


def chi_of(c: dict, rank: int) -> float:
    """The slowdown of a throttled ``rank``: its own where stragglers are slowed together, else the file's."""
    return c["chis"][rank] if "chis" in c else c["chi"]


def _steps(runs: Sequence[dict], pattern: bool, throttled: bool = True) -> List[float]:
    """The runs' steps after the first; under a pattern only those whose flag equals ``throttled``."""
    return [s for run in runs for i, s in enumerate(run["step_s"]) if i > 0
            and (not pattern or bool(run["throttled"][i]) == throttled)]


def file_constants(data: dict) -> dict:
    """What the module docstring derives from ``data``: ``{"tp", "straggler_rank", "healthy_step_s",
    "chi", "chi_from", "shardable_share", "split", "split_from", "hidden", "kv_heads", "kv_dim"}``, or
    ``{"skipped": why}``."""
    raw = data.get("raw") or {}
    tp, dp, pp, slow = _layout(data)
    if pp > 1:
        return {"skipped": f"pp {pp}: the step model is one tensor-parallel group (no pipeline stages)"}
    if dp > 1:
        return {"skipped": f"dp {dp}: the step model is one tensor-parallel group (no replicas with plans of "
                           f"their own, no batch split, no data-parallel reduction)"}
    if "reshard" not in raw or "healthy" not in raw:
        return {"skipped": f"modes {', '.join(raw) or 'none'}: no healthy and reshard runs (the other balancing "
                           f"modes shed work within a step, which the step model does not hold)"}
    if not all(run.get("step_s") and len(run["step_s"]) > 1 for run in raw["reshard"] + raw["healthy"]):
        return {"skipped": "a run without per-step times"}
    pattern = bool(data.get("pattern"))
    if pattern and any(run.get("throttled") is None for run in raw["reshard"] + raw.get("off", [])):
        return {"skipped": "a throttle pattern without per-step throttled flags"}
    if isinstance(slow, list) and pattern and any(run.get("throttled_ranks") is None
                                                  for run in raw["reshard"] + raw.get("off", [])):
        return {"skipped": f"ranks {slow} slowed in turn without the rank held on each step (throttled_ranks)"}
    healthy = statistics.fmean(_steps(raw["healthy"], pattern=False))
    together = isinstance(slow, list) and not pattern  # stragglers slowed together, each at its own fraction
    chis = _nominal_chis(data, slow) if together else None
    if together and chis is None:
        return {"skipped": f"ranks {slow} slowed together without a fraction and a share for each"}
    chi, source = (max(chis.values()), "nominal") if together else (_nominal_chi(data), "nominal")
    off = _steps(raw.get("off") or [], pattern) if all(r.get("step_s") for r in raw.get("off") or []) else []
    if off and not together:  # the even plan's step is the slowest straggler's: it says nothing of the others
        chi, source = statistics.fmean(off) / healthy, "off"
    if chi is None:
        return {"skipped": f"straggler {data.get('straggler')!r}: no nominal slowdown and no off run to measure it"}
    shares = ((data.get("modes") or {}).get("healthy") or {}).get("balanced_share")
    if not shares or any(b is None for b in shares):
        return {"skipped": "no balanced_share of the healthy mode: the shardable share is unknown"}
    split, b = 1.0, statistics.median(float(x) for x in shares)
    model = data.get("model") or {}
    if not model.get("hidden") or not model.get("heads"):
        return {"skipped": "no model shape (hidden, heads)"}
    hidden = int(model["hidden"])
    kv_heads = int(model.get("kv_heads") or model["heads"])
    out = {"tp": tp, "straggler_rank": slow, "healthy_step_s": healthy, "chi": max(chi, 1.0), "chi_from": source,
           "shardable_share": b, "split": split, "split_from": "none (f = 1)", "hidden": hidden,
           "kv_heads": kv_heads, "kv_dim": hidden // int(model["heads"]) * kv_heads,
           **({"chis": chis} if together else {})}
    measured = ((data.get("modes") or {}).get("healthy") or {}).get("step_split")
    if measured and all(r is not None for r in measured):
        c, m, g = (statistics.median(float(r[k]) for r in measured) for k in ("compute_s", "comm_s", "gemm_s"))
        if c + m > 0 and c - g + m > 0:
            out.update(split=max(c - g, 0.0) / (c - g + m), shardable_share=g / (c + m), split_from="step_split")
            points = _split_points(data, out)  # held flags and shares only: the slowdowns read below leave them
            fitted = _replicated_s(points, out, c - g)
            if fitted is not None:  # the rest of c − g follows the shares
                replicated, pace, chi = fitted
                out.update(split=replicated / (replicated + m), shardable_share=(c - replicated) / (c + m),
                           split_from="step_split, R fitted over the ranks' shares", replicated_s=replicated,
                           replicated_pace=pace)
                if together and chi != out["chis"]:
                    out.update(chis=chi, chi=max(chi.values()),
                               chi_from="the reshard runs' split (each throttled rank's GEMMs per share, where it held units)")
                elif not together and chi != out["chi"]:
                    out.update(chi=chi, chi_from="the reshard runs' split (the throttled rank's GEMMs per share)")
                psi = _seat_pace(data, points, out, m)  # at the slowdowns just read
                if psi is not None:
                    out.update(seat_pace=psi)
    return out


class SplitPoint(NamedTuple):
    """One rank's split under one plan and throttle state (:func:`_split_points`)."""

    plan: Tuple
    rank: int
    held: bool
    p: float
    own: float
    gemm: float
    comm: float


def _split_points(data: dict, c: dict) -> List[SplitPoint]:
    """Every rank's split under each plan its ``reshard`` runs held, as ``(plan, rank, held, p, own, gemm, comm)``:
    ``p`` the rank's share under that plan, ``held`` whether the throttle held it, ``own = compute − gemm``,
    ``gemm`` and ``comm`` (its seconds in the collectives, waits included) medians.  A run that records every step's split (``step_split_each``) gives one point per plan,
    rank and throttle state that held for at least :data:`GROUP_STEPS` steps, the first step and each move's
    step and the one after it left out (the move's seconds and its settling are not the plan's); an older run
    gives its split's medians over the second half of its steps where one plan held for most of them (no
    pattern: its medians would mix the throttle's states).  A rank holding nothing in a run whose idle ranks skip
    the step gives no point: it ran no replicated work, and its split is the device probe's seconds and its wait."""
    tp, pattern, points = c["tp"], bool(data.get("pattern")), []
    for run in data["raw"]["reshard"]:
        events, steps = run_events(run), len(run["step_s"])
        workload = file_workload(c, 1.0, events)
        each = run.get("step_split_each")
        skips = run_idle_skips(run)
        if each and len(each) == tp and all(rank and len(rank) == steps for rank in each):
            schedule, groups = plan_schedule(events, steps, workload.even_plans()), {}
            moved = {e["step"] + d for e in events for d in (0, 1)}
            for i in range(1, steps):
                held = held_ranks(c, run, i, pattern)
                for r in range(tp):
                    if i not in moved and each[r][i] is not None:
                        key = (tuple(tuple(p.units) for p in schedule[i]), r, r in held)
                        groups.setdefault(key, []).append(each[r][i])
            for (plan, r, held), rows in groups.items():
                p = workload.shares(tuple(ShardPlan(units=u) for u in plan))[r]
                if len(rows) >= GROUP_STEPS and (p > 0.0 or not skips):
                    points.append(SplitPoint(plan, r, held, p, statistics.median(max(x[0] - x[2], 0.0) for x in rows),
                                             statistics.median(x[2] for x in rows), statistics.median(x[1] for x in rows)))
            continue
        split = ((run.get("summary") or {}).get("step_split_by_rank"))
        if pattern or not split or len(split) != tp or any(r is None for r in split) or not events:
            continue
        last = sorted(events, key=lambda e: e["step"])[-1]
        if steps - 1 - last["step"] <= steps / 2:  # the split is a median over steps: one plan must hold most
            continue
        plan = (tuple(last["mlp_units"]), tuple(last["kv_units"]))
        shares = workload.shares(tuple(ShardPlan(units=u) for u in plan))
        held = held_ranks(c, run, 0, False)
        points += [SplitPoint(plan, r, r in held, p, max(float(row["compute_s"]) - float(row["gemm_s"]), 0.0),
                              float(row["gemm_s"]), float(row["comm_s"]))
                   for r, (row, p) in enumerate(zip(split, shares)) if p > 0.0 or not skips]
    return points


def _replicated_s(split_points: Sequence[SplitPoint], c: dict, own_even: float) -> Optional[Tuple[float, float, Any]]:
    """``(R, φ, χ)`` from the ranks' splits under the plans the ``reshard`` runs held (:func:`_split_points`,
    ``p`` a rank's share under a plan), or ``None`` where no plan spreads the healthy ranks' shares:

    - ``R``: the seconds of a healthy rank's own non-GEMM work (``compute − gemm``) that stay whatever it holds,
      the rest following its share of the shardable work (the attention core with its heads, the MLP's
      activation with its columns): the least-squares line ``own = R + N·p`` through the healthy ranks' points
      and the ranks at even (``p = 1/tp``, ``own_even``), ``R`` and ``N`` both kept ≥ 0;
    - ``χ``: a held rank's GEMM seconds per share over the healthy ranks' under the same plan (the median over
      its points where it holds units; else the file's ``χ``): the pace of its shardable work as it ran;
    - ``φ``: the pace of its replicated work (:attr:`~semimig.controller.sim.stepmodel.Workload.replicated_pace`):
      its own non-GEMM seconds are ``R·χ^φ + N·p·χ``, so ``φ`` is the median of ``log((own − N·p·χ)/R)/log χ``
      over its points, within ``[0, 1]`` (1 where ``R`` or the slowdown is nil)."""
    points = [(1.0 / c["tp"], own_even)] + [(p, own) for _, _, held, p, own, _, _ in split_points if not held]
    slow = [(r, p, own, gemm) for _, r, held, p, own, gemm, _ in split_points if held]
    paces: dict = {}
    for plan, rank, held, p, _, gemm, _ in split_points:
        healthy = [g / q for other, _, h, q, _, g, _ in split_points if other == plan and not h and q > 0.0]
        if held and p > 0.0 and healthy:
            paces.setdefault(rank if "chis" in c else None, []).append(gemm / p / statistics.median(healthy))
    xs, ys = [p for p, _ in points], [y for _, y in points]
    if max(xs) - min(xs) < 1e-9:  # the ranks at even alone: no line
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = max(sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs), 0.0)
    R = min(max(my - slope * mx, 0.0), own_even)
    if "chis" in c:  # stragglers slowed together: each its own pace, where it held units
        chi = {r: max(statistics.median(paces[r]), 1.0) if r in paces else x for r, x in c["chis"].items()}
    else:
        chi = max(statistics.median(paces[None]), 1.0) if paces else c["chi"]
    pace = (lambda r: chi[r]) if "chis" in c else (lambda r: chi)
    if not slow or R <= 0.0 or all(pace(r) <= 1.0 + 1e-9 for r, _, _, _ in slow):
        return R, 1.0, chi
    phis = [math.log(max(own - slope * p * pace(r), 1e-12) / R) / math.log(pace(r))
            for r, p, own, _ in slow if pace(r) > 1.0 + 1e-9]
    return R, min(max(statistics.median(phis), 0.0), 1.0), chi


def _seat_pace(data: dict, points: Sequence[SplitPoint], c: dict, comm_healthy: float) -> Optional[float]:
    """``ψ``, the pace of a slow rank's seats in the collectives (:attr:`~semimig.controller.sim.stepmodel.Workload.
    seat_pace`), from a steady throttle's ``reshard`` runs (no pattern: one set of held ranks), or ``None`` where no
    plan they held seats a slow rank: under each such plan the collectives' seconds of the healthy rank that computes
    longest (the one that waits least for the others) over the healthy step's (``comm_healthy``), matched by the
    model's seats at ``v^ψ`` (monotone in ``ψ``: bisection over ``[0, 1]``); the median over the plans."""
    if data.get("pattern") or comm_healthy <= 0.0:
        return None
    found = []
    for plan in {pt.plan for pt in points}:
        mine = [pt for pt in points if pt.plan == plan]
        free = [pt for pt in mine if not pt.held]
        if not any(pt.held and pt.p > 0.0 for pt in mine) or not free:
            continue
        lead = max(free, key=lambda pt: pt.own + pt.gemm)
        observed = statistics.median(pt.comm for pt in free if pt.rank == lead.rank) / comm_healthy
        plans = tuple(ShardPlan(units=u) for u in plan)
        workload = _workload(c, 0.5, sum(plan[0]), sum(plan[1]))  # the collectives' share cancels in the ratio
        speeds = [1.0] * c["tp"]
        for r in {pt.rank for pt in mine if pt.held}:
            speeds[r] = 1.0 / chi_of(c, r)

        def ratio(psi: float) -> float:
            return dataclasses.replace(workload, seat_pace=psi).seat_comm(plans, speeds) / workload.comm_s

        lo, hi = 0.0, 1.0
        if observed <= ratio(lo) or observed >= ratio(hi):
            found.append(lo if observed <= ratio(lo) else hi)
            continue
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if ratio(mid) < observed else (lo, mid)
        found.append(0.5 * (lo + hi))
    return statistics.median(found) if found else None


def _workload(c: dict, split: float, mlp_units: int, kv_units: int) -> Workload:
    h, h_kv, b = c["hidden"], c["kv_dim"], c["shardable_share"]
    attention = 2 * h * (h + h_kv) / (2 * h * (h + h_kv) + 3 * h * mlp_units * BLOCK)
    replicated = split * (1.0 - b)
    return Workload(tp=c["tp"], replicated_share=replicated / (replicated + b), mlp_units=mlp_units,
                    kv_units=kv_units, attention_share=attention, attention_param_share=attention,
                    comm_share=(1.0 - split) * (1.0 - b), step_s=c["healthy_step_s"],
                    replicated_pace=c.get("replicated_pace", 1.0), seat_pace=c.get("seat_pace"))


def plan_schedule(events: Sequence[dict], steps: int, even: Plans) -> List[Plans]:
    """The plans in force at each step: a decision at step ``i`` is in force from step ``i + 1``."""
    plans, out, j = even, [], 0
    moves = sorted(events, key=lambda e: e["step"])
    for i in range(steps):
        while j < len(moves) and moves[j]["step"] < i:
            plans = (ShardPlan(units=tuple(moves[j]["mlp_units"])), ShardPlan(units=tuple(moves[j]["kv_units"])))
            j += 1
        out.append(plans)
    return out


def run_events(run: dict) -> List[dict]:
    """The re-plans a run recorded (its summary's ``reshard.events``), oldest first as recorded."""
    return ((run.get("summary") or {}).get("reshard") or {}).get("events") or []


def run_idle_skips(run: dict) -> bool:
    """Whether the run's idle ranks skipped the step (its summary's ``reshard.idle_skips``)."""
    return bool(((run.get("summary") or {}).get("reshard") or {}).get("idle_skips"))


def file_workload(c: dict, split: float, events: Sequence[dict], idle_skips: bool = False) -> Workload:
    """The file's workload at ``split``: its unit totals from a recorded plan, else the model's shape; with
    ``idle_skips`` (the run recorded it) a rank holding nothing skips the step."""
    units = (sum(events[0]["mlp_units"]), sum(events[0]["kv_units"])) if events else (4 * c["hidden"] // BLOCK,
                                                                                      c["kv_heads"])
    return dataclasses.replace(_workload(c, split, *units), idle_skips=idle_skips)


def held_ranks(c: dict, run: dict, i: int, pattern: bool) -> Sequence[int]:
    """The ranks slow on step ``i`` of ``run``: the throttled rank (under a pattern, on the steps its flags
    mark), or for a straggler that moves the rank the throttle held then (``throttled_ranks``)."""
    if isinstance(c["straggler_rank"], list):
        return tuple(c["straggler_rank"]) if "chis" in c else run["throttled_ranks"][i] or ()
    return (c["straggler_rank"],) if not pattern or run["throttled"][i] else ()
