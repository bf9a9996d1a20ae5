"""The joint planner's plans and batch split for one slow rank in a tp x dp job, scored by the policy
simulator's step model (DESIGN §8), against the job's limit.

    python benchmarks/plan_at_scale.py [--chi 4] [--global-batch 64] [--shapes example,llama3-8b] [--json F]

Eight ranks laid out as tp 8 x dp 1, tp 4 x dp 2 and tp 2 x dp 4 (each TP group holds a model of
:data:`SHAPES`: the example's Llama, 32 MLP blocks and 8 KV groups, or Llama-3-8B's 112 and 8), the last rank
``chi`` times slower.  For each replicated-to-shardable
ratio ``R/S`` (the work every rank of a TP group does whole over the group's paired work)
:func:`semimig.sharding.joint.plan_job` chooses every replica's plan (a rank may hold no unit of a kind, and a
rank holding none skips the step) and the batch split together, on the simulator's model with its seats priced;
each replica's step is the simulator's :meth:`~semimig.controller.sim.stepmodel.Workload.step_seconds` of its
plan (each kind's layers at their slowest holder, the collectives at their slowest member), scaled by its share
of the global batch (its work is per sample), and the job's step is the slowest replica's.  References:
Colossal-AI alone (even plans, even split), the batch split alone (even plans, split by the planner: Poplar),
the plans alone (per-replica plans, even split) and the job's limit ``n / (n − 1 + 1/chi)`` (every rank's work
movable).  The ranks meet at every layer's reduction, so each kind's units bound its layers: at tp 8 the seven
ranks left hold eight KV groups, one of them two, whatever the MLP blocks do.  ``--kv-units`` scores a finer
attention unit too (``--kv-units 16``: the example's 16 query heads one by one; not built).  A rank holding
``h`` query heads in order, which span ``g`` of the ``G`` KV groups, computes the K/V rows of each group it
spans, so its attention is ``(1 − κ)·h/H + κ·g/G`` of the whole instead of ``h/H`` (``κ`` the K/V
projections' share of the attention's projections, :func:`kv_share`; the attention's core, which follows the
query heads, left out, so ``κ`` is the most a split costs): the planner plans on ``h/H`` and each row also
gives its plan's step so counted (``step_with_kv_rows_vs_healthy``).
"""
from __future__ import annotations

import argparse
import sys
from collections import namedtuple
from dataclasses import replace

from bench_output import add_json_flag, write_result

from semimig.controller.sim.stepmodel import Workload
from semimig.sharding.joint import JointProblem, UnitKind, plan_job

RATIOS = {"0.032": "R/S the re-shard policy measures across moves at tp 2 (the example's Llama, hidden 1024)",
          "0.0625": "twice that",
          "0.125": "R a third of a tp-4 step (the example's smaller Llama at tp 4)"}
"""The replicated-to-shardable ratios scored, and where each comes from."""
LAYOUTS = ((8, 1), (4, 2), (2, 4))
"""``(tp, dp)`` of the eight ranks."""
SHAPES = {"example": (32, 8), "llama3-8b": (112, 8)}
"""Per TP group ``(MLP blocks of 128 columns, KV groups)``: the example's Llama at hidden 1024 (intermediate 4096),
and Llama-3-8B (intermediate 14336, 8 KV heads), the canonical GQA model at tp 8."""
QUERY_HEADS = {"example": 16, "llama3-8b": 32}
"""Query heads per model: a finer attention unit is a whole number of them (``--kv-units`` divides it)."""


def kv_share(shape: str) -> float:
    """``κ``: the K and V projections' share of the attention's projections, ``2·n_kv/(2·n_q + 2·n_kv)`` (1/3 for
    the example's 16 query heads over 8 KV heads, 0.2 for Llama-3-8B's 32 over 8)."""
    kv = SHAPES[shape][1]
    return kv / (QUERY_HEADS[shape] + kv)


Held = namedtuple("Held", "units")
"""One kind's units as each rank's work in units (fractional where a split group's K/V rows count on every
holder), for the step model."""


def problem(work: Workload, speeds: tuple, global_batch: int) -> JointProblem:
    """The joint planner's input for ``work`` on every replica, as the simulator's model has it: a healthy even
    step of ``work.step_s`` at ``global_batch / dp`` samples per replica, its compute per sample, its collectives
    seated (each kind's reductions and the vocabulary's at their slowest member's pace, per sample), a rank
    holding no unit skipping the step."""
    per = global_batch / len(speeds) / work.compute_s  # samples per second of a healthy replica's compute
    a, S = work.attention_share, work.shardable
    kinds = (UnitKind(name="mlp", total_units=work.mlp_units, work_per_sample=S * (1.0 - a) / per),
             UnitKind(name="kv", total_units=work.kv_units, work_per_sample=S * a / per))
    return JointProblem(speeds=speeds, kinds=kinds, global_batch=global_batch,
                        replicated_per_sample=work.replicated / per, idle_free=True,
                        seat_per_sample=work.comm_s / (len(kinds) + 1) / (global_batch / len(speeds)))


def attention_held(heads: tuple, groups: int, kappa: float) -> Held:
    """Each rank's attention work in query-head units when rank ``r`` holds ``heads[r]`` heads in order and
    computes the K/V rows of every one of the ``groups`` KV groups its heads span (module docstring)."""
    total, start, held = sum(heads), 0, []
    per = total // groups
    for h in heads:
        spanned = len({head // per for head in range(start, start + h)})
        held.append((1.0 - kappa) * h + kappa * spanned * per)
        start += h
    return Held(units=tuple(held))


def simulated(work: Workload, speeds: tuple, samples: tuple, plans: tuple, kv: tuple | None = None) -> float:
    """The job's step in the simulator's model: each replica's :meth:`~Workload.step_seconds` (each kind's
    layers at their slowest holder, the collectives at their seats, an idle rank skipping) scaled by its
    samples over an even share; the slowest replica's.  ``kv``: ``(groups, κ)`` where the attention's units
    are query heads whose groups' K/V rows count on every holder (:func:`attention_held`)."""
    even = sum(samples) / len(samples)

    def step(p: tuple, v: tuple) -> float:
        if kv is None:
            return work.step_seconds(p, v)
        return work.bound((p[0], attention_held(p[1].units, *kv)), v) + work.seat_comm(p, v)
    return max(step(p, v) * b / even for v, b, p in zip(speeds, samples, plans))


def score(tp: int, dp: int, chi: float, ratio: float, mlp_units: int, kv_units: int, global_batch: int,
          kv: tuple | None = None) -> dict:
    """The planner's answer for the last rank ``chi`` times slower, against the references (module docstring);
    ``kv``: ``(KV groups, κ)`` where ``kv_units`` counts query heads."""
    rho = ratio / (ratio + 1.0 / tp)  # R as a share of a healthy even step's compute
    work = Workload(tp=tp, replicated_share=rho, mlp_units=mlp_units, kv_units=kv_units, idle_skips=True)
    speeds = ((1.0,) * tp,) * (dp - 1) + ((1.0,) * (tp - 1) + (1.0 / chi,),)
    healthy = work.step_seconds(work.even_plans(), [1.0] * tp)
    joint = problem(work, speeds, global_batch)
    best = plan_job(joint)
    even_split = (global_batch // dp,) * dp
    pinned = replace(joint, kinds=tuple(replace(k, min_units=k.total_units // tp) for k in joint.kinds))
    split_only = plan_job(pinned)  # every kind's minimum is its even share: only the split moves
    plans_only = plan_job(replace(joint, micro_batch=global_batch // dp))  # one granule each: only the plans move
    even = (work.even_plans(),) * dp
    step = {name: simulated(work, speeds, s, p) / healthy for name, s, p in (
        ("step", best.samples, best.plans), ("even", even_split, even),
        ("split_only", split_only.samples, split_only.plans), ("plans_only", plans_only.samples, plans_only.plans))}
    return {"tp": tp, "dp": dp, "replicated_over_shardable": ratio, "replicated_share": rho,
            "samples": list(best.samples), "mlp_units": [list(p[0].units) for p in best.plans],
            "kv_units": [list(p[1].units) for p in best.plans], "step_vs_healthy": step["step"],
            "planner_predicted_vs_healthy": best.step / healthy, "even_vs_healthy": step["even"],
            "split_only_vs_healthy": step["split_only"], "plans_only_vs_healthy": step["plans_only"],
            "job_limit_vs_healthy": tp * dp / (tp * dp - 1 + 1.0 / chi),
            "step_with_kv_rows_vs_healthy": None if kv is None else
            simulated(work, speeds, best.samples, best.plans, kv) / healthy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chi", type=float, default=4.0, help="the slow rank's slowdown, > 1 (default 4)")
    parser.add_argument("--shapes", default=",".join(SHAPES),
                        help=f"comma-separated model shapes among {', '.join(SHAPES)} (default all)")
    parser.add_argument("--kv-units", type=int, default=None, help="attention units per TP group instead of the shape's "
                        "KV groups: query heads for a finer unit (not built; also scored with a split group's K/V rows on every "
                        "holder: the 'K/V' column)")
    parser.add_argument("--global-batch", type=int, default=64, help="samples per step over all replicas (default 64)")
    add_json_flag(parser, required=False, help="write the rows here")
    args = parser.parse_args(argv)
    if not args.chi > 1.0:
        parser.error(f"--chi must be > 1, got {args.chi}")
    shapes = [name.strip() for name in args.shapes.split(",") if name.strip()]
    if not shapes or any(name not in SHAPES for name in shapes):
        parser.error(f"--shapes must name some of {', '.join(SHAPES)}, got {args.shapes!r}")
    if args.kv_units is not None and (args.kv_units < 8 or args.kv_units % 8):
        parser.error(f"--kv-units must be a multiple of 8 (the even plan at tp 8), got {args.kv_units}")
    for name in shapes if args.kv_units is not None else ():
        if QUERY_HEADS[name] % args.kv_units:
            parser.error(f"--kv-units {args.kv_units}: a unit must be whole query heads, and {name} has "
                         f"{QUERY_HEADS[name]} (pass --shapes to score one shape)")
    if args.global_batch < 4 or args.global_batch % 4:
        parser.error(f"--global-batch must be a multiple of 4 (an even split at dp 4), got {args.global_batch}")
    rows = [dict(score(tp, dp, args.chi, float(r), SHAPES[shape][0], args.kv_units or SHAPES[shape][1],
                       args.global_batch, kv=None if not args.kv_units or args.kv_units == SHAPES[shape][1]
                       else (SHAPES[shape][1], kv_share(shape))), shape=shape, source=RATIOS[r])
            for shape in shapes for tp, dp in LAYOUTS for r in RATIOS]
    print(f"8 ranks, the last {args.chi:g}x slower; global batch {args.global_batch}; per TP group "
          + "; ".join(f"{name}: {SHAPES[name][0]} MLP blocks, {args.kv_units or SHAPES[name][1]} attention units"
                      for name in shapes))
    print(f"{'shape':<10} {'layout':<9} {'R/S':>6} {'samples':<13} {'slow replica MLP / KV':<36} {'joint':>6} "
          f"{'even':>6} {'split':>6} {'plans':>6} {'job':>6} {'K/V':>6}")
    for row in rows:
        slow = f"{','.join(map(str, row['mlp_units'][-1]))} / {','.join(map(str, row['kv_units'][-1]))}"
        print(f"{row['shape']:<10} {'tp%d x dp%d' % (row['tp'], row['dp']):<9} {row['replicated_over_shardable']:>6.3f} "
              f"{','.join(map(str, row['samples'])):<13} {slow:<36} {row['step_vs_healthy']:>5.3f}x "
              f"{row['even_vs_healthy']:>5.2f}x {row['split_only_vs_healthy']:>5.2f}x {row['plans_only_vs_healthy']:>5.2f}x "
              f"{row['job_limit_vs_healthy']:>5.3f}x "
              + ("     -" if row['step_with_kv_rows_vs_healthy'] is None else f"{row['step_with_kv_rows_vs_healthy']:>5.3f}x"))
    print("joint: the planner's plans and split; even: Colossal-AI alone; split: the batch split alone (even plans); "
          "plans: per-replica plans alone (even split); job: the job's limit, every rank's work movable; "
          "K/V: joint with a split KV group's K/V rows on each of its holders")
    if args.json is not None:
        write_result(args.json, "plan_at_scale", None, vars(args) | {"json": str(args.json)}, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
