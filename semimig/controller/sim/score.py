"""Score policies over a family of scenarios: time to the last step over the oracle's, per category.

Per scenario: each policy's ratio (:func:`~semimig.controller.sim.simulate.run_policy` time over
:func:`~semimig.controller.sim.oracle.oracle_time`), Colossal-AI alone's (the even plan, never moved)
and the limit's (:func:`~semimig.controller.sim.oracle.limit_time`: below 1 by what whole units and
paid moves cost the oracle).  Per category and overall: the median ratio, the share of scenarios
within 1.10 of the oracle, and the worst ratio of the scenarios with no straggler.
"""
from __future__ import annotations

import statistics
from typing import Dict, List, Mapping, Optional, Sequence

from semimig.controller.sim.oracle import fixed_time, limit_time, oracle_time
from semimig.controller.sim.scenarios import CATEGORIES, Scenario
from semimig.controller.sim.simulate import PolicyFactory, ratio, run_policy

__all__ = ["evaluate", "summarise", "table", "WITHIN"]

WITHIN = 1.10
"""The ratio a scenario must stay within to count as served (``share_within_1_10``)."""


def evaluate(scenarios: Sequence[Scenario], policies: Mapping[str, PolicyFactory]) -> List[dict]:
    """One record per scenario: what was drawn, the oracle's seconds and moves, and per policy (and
    ``colossal``, the even plan) the ratio to the oracle and the moves."""
    records = []
    for scenario in scenarios:
        oracle_s, oracle_moves = oracle_time(scenario)
        record = {"name": scenario.name, "category": scenario.category, "tp": scenario.tp, "steps": scenario.steps,
                  "oracle_s": oracle_s, "oracle_moves": oracle_moves,
                  "colossal": ratio(fixed_time(scenario, scenario.workload.even_plans()), oracle_s),
                  "limit": ratio(limit_time(scenario), oracle_s), "drawn": scenario.info, "policies": {}}
        for name, factory in policies.items():
            run = run_policy(scenario, factory)
            record["policies"][name] = {"ratio": ratio(run.time_s, oracle_s), "moves": run.moves,
                                        "bytes_moved": run.bytes_moved}
        records.append(record)
    return records


def _stats(ratios: Sequence[float], colossal: Sequence[float], limits: Sequence[float], moves: Sequence[int],
           none: Sequence[float]) -> dict:
    ordered = sorted(ratios)
    return {"scenarios": len(ratios), "median_ratio": statistics.median(ratios),
            "share_within_1_10": sum(r <= WITHIN for r in ratios) / len(ratios),
            "no_straggler_max": max(none) if none else None,
            "p90_ratio": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], "max_ratio": ordered[-1],
            "colossal_median": statistics.median(colossal), "limit_median": statistics.median(limits),
            "mean_moves": sum(moves) / len(moves)}


def summarise(records: Sequence[dict], policy: str) -> dict:
    """``{"overall": {...}, "categories": {name: {...}}, "by_tp": {tp: {...}}}`` for ``policy``."""
    def block(rows: Sequence[dict]) -> dict:
        ratios = [r["policies"][policy]["ratio"] for r in rows]
        none = [r["policies"][policy]["ratio"] for r in rows if r["category"] == "none"]
        return _stats(ratios, [r["colossal"] for r in rows], [r["limit"] for r in rows],
                      [r["policies"][policy]["moves"] for r in rows], none)

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
           f"{'colossal':>8} {'limit':>6}"
    lines = [title] if title else []
    lines += [head, "-" * len(head)]
    rows = list(summary["categories"].items()) + [(f"tp {k}", v) for k, v in summary["by_tp"].items()]
    for name, s in rows + [("overall", summary["overall"])]:
        lines.append(f"{name:<12} {s['scenarios']:>5} {s['median_ratio']:>7.3f} {s['share_within_1_10']:>7.1%} "
                     f"{s['p90_ratio']:>6.2f} {s['max_ratio']:>6.2f} {s['mean_moves']:>6.2f} "
                     f"{s['colossal_median']:>8.3f} {s['limit_median']:>6.3f}")
    worst = summary["overall"]["no_straggler_max"]
    if worst is not None:
        lines.append(f"no straggler: worst ratio {worst:.4f}")
    return "\n".join(lines)
