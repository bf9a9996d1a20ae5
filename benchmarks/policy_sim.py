"""Score the re-shard policy on a family of simulated scenarios (DESIGN §9), and replay recorded runs.

    python benchmarks/policy_sim.py --json F [--quick] [--scenarios N] [--seed S] [--replay DIR] [--idle-skips]
                                    [--clock wall|steps] [--joint N]

Runs :mod:`semimig.controller.sim` on ``N`` generated scenarios (default 1200; ``--quick``: 30 short
ones, for CI): each policy's time to the last step over the scenario's oracle, per category and
overall, beside Colossal-AI alone (the even plan) and the reactive bound (what reacting only to measured
changes costs by itself), and prints one table per policy.  ``--replay DIR``
(default: the repository's ``docs/results`` unless ``--quick``) runs every ``time_to_loss`` result
with re-shard runs through the step model (:mod:`semimig.controller.sim.replay`) and reports the
simulated mean step against the measured one, per run, and every straggler result it cannot replay
with the reason; a throttle pattern also through the policy itself, on the wall clock, against what its
runs gained over Colossal-AI alone.  ``--idle-skips``: in every scenario a rank holding no unit skips the step (one TP
group of a Llama-family model: :mod:`semimig.shardformer.skip`), for the policy, its step model and
the oracle alike; without it an emptied rank still runs its replicated work (pipelines, replicas, ZeRO,
other models).  ``--clock``: what the traces' rows count (:mod:`semimig.controller.sim.scenarios`): the
wall clock's seconds (default: a slowdown from outside the job keeps its own time), or the steps (the
same draws, a phase lasting as many steps under every plan).
The JSON holds ``{"overall", "categories", "policy"}`` for the policy in use, every policy's summary
under ``"policies"``, each scenario's record, the replay, the policy in use's host time per decision by
tensor-parallel size (``"decision_ms"``: one ``observe`` a step, what the step hook adds on every rank of a
real run), and the command, commit, machine, date, wall and CPU time and the machine's load around the run.
``--joint N`` (default 200; ``--quick`` 8; 0: none): the joint planner's family of tp x dp jobs
(:mod:`semimig.resharder.jointsim`: the replicas' policies and the job's readings on a known job model),
each job's time against the oracle's and against the reactive bound, and its joint moves, under ``"joint"``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from bench_output import add_json_flag, refuse, write_result

from semimig.controller.sim import family
from semimig.controller.sim.scenarios import CLOCKS
from semimig.controller.sim.replay import replay_file, replay_summary
from semimig.controller.sim.score import evaluate, summarise, table
from semimig.controller.sim.simulate import reshard_policy

REPO = Path(__file__).resolve().parent.parent
POLICIES = {"reshard": reshard_policy}
"""The policies scored; the first is the one in use."""


def _optional_policies() -> dict:
    """Policies beside the one in use that this tree has (a sketch not wired into production)."""
    try:
        from semimig.controller.statemachine import StateMachinePolicy
    except ImportError:
        return {}
    return {"statemachine": StateMachinePolicy.factory}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_json_flag(parser, required=True, help="write the scores here")
    parser.add_argument("--quick", action="store_true", help="30 short scenarios and no replay (CI)")
    parser.add_argument("--scenarios", type=int, default=None, help="scenarios in the family (default 1200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the family (default 0)")
    parser.add_argument("--replay", type=Path, default=None,
                        help="folder of time_to_loss results to replay (default docs/results; none with --quick)")
    parser.add_argument("--no-replay", action="store_true", help="skip the replay")
    parser.add_argument("--idle-skips", action="store_true",
                        help="a rank holding no unit skips the step in every scenario (one TP group, Llama family)")
    parser.add_argument("--clock", default="wall", choices=CLOCKS,
                        help="what the traces' rows count: wall-clock seconds (default) or steps")
    parser.add_argument("--joint", type=int, default=None,
                        help="tp x dp jobs for the joint planner's family (default 200; --quick 8; 0: none)")
    args = parser.parse_args(argv)
    if args.scenarios is not None and args.scenarios < 1:
        parser.error(f"--scenarios must be >= 1, got {args.scenarios}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.joint is not None and args.joint < 0:
        parser.error(f"--joint must be >= 0, got {args.joint}")
    if args.replay is not None and args.no_replay:
        parser.error(f"--replay {args.replay} and --no-replay contradict each other: give one")
    if args.replay is not None and not args.replay.is_dir():
        parser.error(f"--replay {args.replay} is not a folder")
    return args


class DecisionClock:
    """Host seconds of each policy decision (one ``observe`` a step), per tensor-parallel size: the work the step
    hook adds on every rank of a real run, the same code whatever the device."""

    def __init__(self) -> None:
        self.seconds: dict = {}

    def wrap(self, factory):
        """``factory`` whose policies time their ``observe``."""
        def timed_factory(plans, **kwargs):
            policy = factory(plans, **kwargs)
            observe, seconds = policy.observe, self.seconds.setdefault(len(plans[0].units), [])

            def timed(sample):
                start = time.perf_counter()
                decision = observe(sample)
                seconds.append(time.perf_counter() - start)
                return decision
            policy.observe = timed
            return policy
        return timed_factory

    def summary(self) -> dict:
        """``{tp: {"steps", "mean_ms", "p99_ms"}}``."""
        return {str(tp): {"steps": len(s), "mean_ms": 1e3 * sum(s) / len(s), "p99_ms": 1e3 * sorted(s)[int(0.99 * (len(s) - 1))]}
                for tp, s in sorted(self.seconds.items()) if s}


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if head.returncode == 0 else "unknown"


REPLAYED = ("time_to_loss", "pipeline_real")
"""The benchmarks whose result files hold a straggler's runs: every one is replayed or listed as skipped."""


def _replay(folder: Path) -> dict:
    results = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            results.append({"file": path.name, "skipped": f"unreadable: {err}"})
            continue
        if isinstance(data, dict) and data.get("benchmark") in REPLAYED:
            results.append(replay_file(data, path.name))
    return {"summary": replay_summary(results), "files": results}


def _replay_table(replay: dict) -> str:
    """One line per replayed run: measured and simulated mean step, their ratio, the band over splits, and
    under a steady throttle the model's best plan over its healthy step (the layout's limit with the
    file's replicated work)."""
    lines = [f"{'replayed file':40s} {'run':>3s} {'measured':>8s} {'sim':>7s} {'ratio':>6s} {'band':>13s} "
             f"{'best':>5s}"]
    for result in replay["files"]:
        best = result.get("model_best")
        for i, run in enumerate(result.get("runs", [])):
            lo, hi = run["band_s"]
            lines.append(f"{result['file'][:40]:40s} {i:3d} {run['measured_mean_s']:8.3f} "
                         f"{run['simulated_mean_s']:7.3f} {run['ratio']:6.2f} {lo:6.3f}-{hi:6.3f} "
                         + (f"{best['vs_healthy']:4.2f}x" if best else "    -"))
    for result in replay["files"]:
        if (pattern := result.get("pattern_policy")) is not None:
            ratio, sim, real = pattern["policy_vs_even"], pattern["simulated"], pattern["measured"]
            lines.append(f"{result['file'][:40]}: the policy through its pattern {ratio['simulated']:.3f}x the even "
                         f"plan's mean step ({sim['moves']:.1f} moves); its reshard runs {ratio['measured']:.3f}x "
                         f"off's ({real['moves']:.1f} moves)")
    for name, why in replay["summary"]["skipped"].items():
        lines.append(f"skipped {name}: {why}")
    return "\n".join(lines)


def _joint(count: int, seed: int) -> Optional[dict]:
    """The joint planner's family (:mod:`semimig.resharder.jointsim`): ``count`` jobs, the categories in turn."""
    if count == 0:
        return None
    from semimig.resharder.jointsim import CATEGORIES, make_joint_scenario, run_joint, summarize_joint

    start = time.perf_counter()
    records = [run_joint(make_joint_scenario(seed + i, CATEGORIES[i % len(CATEGORIES)])) for i in range(count)]
    return {**summarize_joint(records), "wall_s": time.perf_counter() - start, "records": records}


def _joint_table(joint: dict) -> str:
    rows = [f"joint planner, tp x dp: time to N steps / oracle and / reactive bound ({joint['overall']['scenarios']} jobs)",
            f"{'category':<9} {'jobs':>4} {'median':>6} {'<=1.10':>6} {'worst':>6} {'/react':>6} {'<=1.10':>6} "
            f"{'worst':>6} {'moves':>5} {'most':>4}"]
    for name, c in [*joint["categories"].items(), ("overall", joint["overall"])]:
        rows.append(f"{name:<9} {c['scenarios']:>4} {c['median_ratio']:>6.3f} {c['share_within_1_10']:>6.0%} "
                    f"{c['max_ratio']:>6.3f} {c['median_ratio_to_reactive']:>6.3f} "
                    f"{c['share_within_1_10_of_reactive']:>6.0%} {c['max_ratio_to_reactive']:>6.3f} "
                    f"{c['mean_moves']:>5.2f} {c['max_moves']:>4}")
    return "\n".join(rows)


def _round(value):
    if isinstance(value, float):
        return round(value, 5)
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_round(v) for v in value]
    return value


def main(argv=None) -> int:
    args = parse_args(argv)
    count = args.scenarios or (30 if args.quick else 1200)
    steps = dict(min_steps=60, max_steps=160) if args.quick else dict(min_steps=150, max_steps=600)
    load_before = os.getloadavg()
    start, cpu_start = time.perf_counter(), time.process_time()
    scenarios = family(count, args.seed, **steps, idle_skips=args.idle_skips, clock=args.clock)
    policies = {**POLICIES, **_optional_policies()}
    clock = DecisionClock()
    in_use = next(iter(POLICIES))
    records = evaluate(scenarios, {name: clock.wrap(f) if name == in_use else f for name, f in policies.items()})
    summaries = {name: summarise(records, name) for name in policies}
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    joint = _joint(args.joint if args.joint is not None else (8 if args.quick else 200), args.seed)
    replay = None
    folder = args.replay or (None if args.quick or args.no_replay else REPO / "docs" / "results")
    if folder is not None:
        replay = _replay(folder)
    for name, summary in summaries.items():
        print(table(summary, title=f"policy {name}: time to N steps / oracle ({count} scenarios)"))
        print()
    policy_word = "policy" if len(policies) == 1 else "policies"
    print(f"{count} scenarios in {wall:.1f} s (load {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after)")
    print(f"{cpu:.1f} s of CPU: the oracles and {len(policies)} {policy_word}")
    decisions = clock.summary()
    for tp, d in decisions.items():
        print(f"tp {tp}: the policy's decision takes {d['mean_ms']:.2f} ms of host time a step (p99 {d['p99_ms']:.2f})")
    if joint is not None:
        print(_joint_table(joint))
        print(f"{joint['overall']['scenarios']} joint jobs in {joint['wall_s']:.1f} s")
    if replay is not None:
        s = replay["summary"]
        print(_replay_table(replay))
        print(f"replay: {s['within_10pct']} of {s['files']} recorded files within 10 % "
              f"(median {s['median_abs_error'] or 0:.1%}, worst {s['max_abs_error'] or 0:.1%}); "
              f"{s['in_band']} within 10 % of their band; {len(s['skipped'])} skipped")
    try:
        write_result(args.json, "policy_sim", argv, {"scenarios": count, "seed": args.seed, "quick": args.quick,
                                                      "idle_skips": args.idle_skips, "clock": args.clock,
                                                      **steps},
                     command=" ".join(["python", "benchmarks/policy_sim.py", *(sys.argv[1:] if argv is None
                                                                               else argv)]),
                     commit=_commit(), date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), wall_s=wall, cpu_s=cpu,
                     load_average={"before": list(load_before), "after": list(os.getloadavg())},
                     policy=in_use, decision_ms=_round(decisions), overall=_round(summaries[in_use]["overall"]),
                     categories=_round(summaries[in_use]["categories"]), policies=_round(summaries),
                     replay=_round(replay), records=_round(records), joint=_round(joint))
    except OSError as err:
        return refuse("policy_sim.py", err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
