"""The shard plan semimig's planner chooses for one slow rank at tp 8, scored by the policy simulator's
step model (DESIGN §8), against the job's limit.

    python benchmarks/plan_at_scale.py [--tp 8] [--chi 4] [--json F]

A TP group of ``tp`` ranks with ``U`` MLP blocks and ``K`` KV groups (the example's Llama at tp 8:
32 blocks, 8 KV groups), one rank ``chi`` times slower.  For each replicated-to-shardable ratio
``R/S`` (the work every rank does whole over the group's paired work) the planner's best plan
(:func:`semimig.controller.sim.oracle.best_plans`: the solver per dimension and its joint roundings,
a rank may hold no unit of a kind) is scored by
:class:`~semimig.controller.sim.stepmodel.Workload` against three references: the even plan
(Colossal-AI alone), the continuous optimum (fractional shares, the step model's limit) and the job's
limit ``n / (n − 1 + 1/chi)`` (every rank's work movable).  The slow rank cannot shed its replicated
work, so once ``chi · R`` exceeds the job's limit no TP plan reaches it: the table shows where.
"""
from __future__ import annotations

import argparse
import sys

from bench_output import add_json_flag, write_result

from semimig.controller.sim.oracle import best_plans
from semimig.controller.sim.stepmodel import Workload

RATIOS = {"0.032": "R/S the re-shard policy measures across moves at tp 2 (the example's Llama, hidden 1024)",
          "0.0625": "twice that",
          "0.125": "R a third of a tp-4 step (the example's smaller Llama at tp 4)"}
"""The replicated-to-shardable ratios scored, and where each comes from."""


def score(tp: int, chi: float, ratio: float, mlp_units: int, kv_units: int) -> dict:
    """The planner's plan for ranks ``[1] * (tp - 1) + [1/chi]`` and its step against the references."""
    rho = ratio / (ratio + 1.0 / tp)  # R as a share of a healthy even step's compute
    work = Workload(tp=tp, replicated_share=rho, mlp_units=mlp_units, kv_units=kv_units)
    speeds = [1.0] * (tp - 1) + [1.0 / chi]
    healthy = work.step_seconds(work.even_plans(), [1.0] * tp)
    mlp, kv = best_plans(work, speeds)
    continuous = max((work.shardable + tp * work.replicated) / sum(speeds), work.replicated * chi)
    return {"replicated_over_shardable": ratio, "replicated_share": rho, "mlp_units": list(mlp.units),
            "kv_units": list(kv.units), "step_vs_healthy": work.step_seconds((mlp, kv), speeds) / healthy,
            "even_vs_healthy": work.step_seconds(work.even_plans(), speeds) / healthy,
            "continuous_vs_healthy": (continuous * work.compute_s + work.comm_s) / healthy,
            "job_limit_vs_healthy": tp / (tp - 1 + 1.0 / chi)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tp", type=int, default=8, choices=(2, 4, 8), help="TP group size (default 8)")
    parser.add_argument("--chi", type=float, default=4.0, help="the slow rank's slowdown, > 1 (default 4)")
    parser.add_argument("--mlp-units", type=int, default=32, help="MLP blocks (default 32)")
    parser.add_argument("--kv-units", type=int, default=8, help="KV groups (default 8)")
    add_json_flag(parser, required=False, help="write the rows here")
    args = parser.parse_args(argv)
    if not args.chi > 1.0:
        parser.error(f"--chi must be > 1, got {args.chi}")
    for flag, units in (("--mlp-units", args.mlp_units), ("--kv-units", args.kv_units)):
        if units < args.tp:
            parser.error(f"{flag} must be at least --tp {args.tp}, got {units}")
    rows = [dict(score(args.tp, args.chi, float(r), args.mlp_units, args.kv_units), source=RATIOS[r]) for r in RATIOS]
    print(f"tp {args.tp}, one rank {args.chi:g}x slower, {args.mlp_units} MLP blocks, {args.kv_units} KV groups")
    print(f"{'R/S':>6} {'MLP blocks':<26} {'KV groups':<18} {'plan':>6} {'even':>6} {'limit':>6} {'job':>6}")
    for row in rows:
        print(f"{row['replicated_over_shardable']:>6.3f} {','.join(map(str, row['mlp_units'])):<26} "
              f"{','.join(map(str, row['kv_units'])):<18} {row['step_vs_healthy']:>5.2f}x "
              f"{row['even_vs_healthy']:>5.2f}x {row['continuous_vs_healthy']:>5.2f}x {row['job_limit_vs_healthy']:>5.2f}x")
    print("plan: the planner's plan; even: Colossal-AI alone; limit: fractional shares; job: every rank's work movable")
    if args.json is not None:
        write_result(args.json, "plan_at_scale", None, vars(args) | {"json": str(args.json)}, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
