"""Score policies over a family of scenarios: time to the last step over the oracle's, per category.

Per scenario: each policy's ratio (:func:`~semimig.controller.sim.simulate.run_policy` time over
:func:`~semimig.controller.sim.oracle.oracle_time`), Colossal-AI alone's (the even plan, never moved)
and the limit's (:func:`~semimig.controller.sim.oracle.limit_time`: below 1 by what whole units and
paid moves cost the oracle), and the reactive bound's (:func:`~semimig.controller.sim.oracle.reactive_time`:
what reacting only to measured changes costs by itself).  Per category and overall: the median ratio, the
share of scenarios within 1.10 of the oracle, the worst ratio of the scenarios with no straggler, the
share of scenarios whose reactive bound is above 1.10 of the oracle (where no reactive policy can be
within 1.10) and the policy's time over the reactive bound (median, share within 1.10); and against
Colossal-AI alone, the share of scenarios the policy runs more than :data:`HURTS` slower than the even plan
never moved, and its worst time over the even plan's (what re-sharding can cost where it should not
have moved: a short slowdown, or a rank misread after the plan moved).
"""
from __future__ import annotations

import statistics
from typing import Dict, List, Mapping, Optional, Sequence

from semimig.controller.sim.oracle import candidate_plans, fixed_time, limit_time, oracle_time, reactive_time
from semimig.controller.sim.scenarios import CATEGORIES, Scenario
from semimig.controller.sim.simulate import PolicyFactory, ratio, run_policy

__all__ = ["evaluate", "summarise", "table", "WITHIN", "HURTS"]

WITHIN = 1.10
"""The ratio a scenario must stay within to count as served (``share_within_1_10``)."""
HURTS = 1.01
"""Times the even plan's time (Colossal-AI alone) beyond which the policy counts as slower than doing
nothing (``share_over_colossal``): the tolerance the scenarios with no straggler are held to."""


def evaluate(scenarios: Sequence[Scenario], policies: Mapping[str, PolicyFactory]) -> List[dict]:
    """One record per scenario: what was drawn, the oracle's seconds and moves, and per policy (and
    ``colossal``, the even plan) the ratio to the oracle and the moves."""
    records = []
    for scenario in scenarios:
        plans = candidate_plans(scenario)
        oracle_s, oracle_moves = oracle_time(scenario, plans)
        reactive_s, _ = reactive_time(scenario, plans)
        record = {"name": scenario.name, "category": scenario.category, "tp": scenario.tp, "steps": scenario.steps,
                  "oracle_s": oracle_s, "oracle_moves": oracle_moves,
                  "colossal": ratio(fixed_time(scenario, scenario.workload.even_plans()), oracle_s),
                  "limit": ratio(limit_time(scenario), oracle_s), "reactive": ratio(reactive_s, oracle_s),
                  "drawn": scenario.info, "policies": {}}
        for name, factory in policies.items():
            run = run_policy(scenario, factory)
            record["policies"][name] = {"ratio": ratio(run.time_s, oracle_s), "moves": run.moves,
                                        "bytes_moved": run.bytes_moved,
                                        "ratio_to_reactive": ratio(run.time_s, reactive_s)}
        records.append(record)
    return records


def _stats(ratios: Sequence[float], colossal: Sequence[float], limits: Sequence[float], moves: Sequence[int],
           none: Sequence[float], reactive: Sequence[float], to_reactive: Sequence[float]) -> dict:
    ordered = sorted(ratios)
    return {"scenarios": len(ratios), "median_ratio": statistics.median(ratios),
            "share_within_1_10": sum(r <= WITHIN for r in ratios) / len(ratios),
            "no_straggler_max": max(none) if none else None,
            "p90_ratio": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], "max_ratio": ordered[-1],
            "colossal_median": statistics.median(colossal), "limit_median": statistics.median(limits),
            "mean_moves": sum(moves) / len(moves),
            "reactive_bound_median": statistics.median(reactive),
            "reactive_bound_share_above_1_10": sum(r > WITHIN for r in reactive) / len(reactive),
            "median_ratio_to_reactive": statistics.median(to_reactive),
            "share_within_1_10_of_reactive": sum(r <= WITHIN for r in to_reactive) / len(to_reactive),
            "share_over_colossal": sum(r > HURTS * c for r, c in zip(ratios, colossal)) / len(ratios),
            "max_over_colossal": max(r / c for r, c in zip(ratios, colossal))}


def summarise(records: Sequence[dict], policy: str) -> dict:
    """``{"overall": {...}, "categories": {name: {...}}, "by_tp": {tp: {...}}}`` for ``policy``."""
    def block(rows: Sequence[dict]) -> dict:
        ratios = [r["policies"][policy]["ratio"] for r in rows]
        none = [r["policies"][policy]["ratio"] for r in rows if r["category"] == "none"]
        return _stats(ratios, [r["colossal"] for r in rows], [r["limit"] for r in rows],
                      [r["policies"][policy]["moves"] for r in rows], none, [r["reactive"] for r in rows],
                      [r["policies"][policy]["ratio_to_reactive"] for r in rows])

    out: Dict[str, dict] = {"overall": block(records), "categories": {}, "by_tp": {}}
    for category in CATEGORIES:
        rows = [r for r in records if r["category"] == category]
        if rows:
            out["categories"][category] = block(rows)
    for tp in sorted({r["tp"] for r in records}):
        out["by_tp"][str(tp)] = block([r for r in records if r["tp"] == tp])
    return out


def table(summary: dict, title: Optional[str] = None) -> str:
    """The summary as a table of at most 80 columns."""
    head = f"{'category':<12} {'n':>5} {'median':>7} {'<=1.10':>7} {'p90':>6} {'max':>6} {'moves':>6} " \
           f"{'react>1.1':>9} {'/react':>6} {'<=1.10':>6}"
    lines = [title] if title else []
    lines += [head, "-" * len(head)]
    rows = list(summary["categories"].items()) + [(f"tp {k}", v) for k, v in summary["by_tp"].items()]
    for name, s in rows + [("overall", summary["overall"])]:
        lines.append(f"{name:<12} {s['scenarios']:>5} {s['median_ratio']:>7.3f} {s['share_within_1_10']:>7.1%} "
                     f"{s['p90_ratio']:>6.2f} {s['max_ratio']:>6.2f} {s['mean_moves']:>6.2f} "
                     f"{s['reactive_bound_share_above_1_10']:>9.1%} "
                     f"{s['median_ratio_to_reactive']:>6.3f} {s['share_within_1_10_of_reactive']:>6.1%}")
    overall = summary["overall"]
    worst = overall["no_straggler_max"]
    if worst is not None:
        lines.append(f"no straggler: worst ratio {worst:.4f}")
    lines.append(f"over {HURTS:.2f}x Colossal-AI alone: {overall['share_over_colossal']:.1%} of the scenarios, "
                 f"worst {overall['max_over_colossal']:.3f}x")
    return "\n".join(lines)
