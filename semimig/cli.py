"""``semimig`` command line: ``semimig demo``, ``bench``, ``report``, ``plan``, ``throttle``, ``cluster``."""
from __future__ import annotations

import argparse
import logging
import re
import sys
import textwrap
from typing import Optional, Sequence


def _check_demo(args: argparse.Namespace) -> None:
    """The demo's flags, refused by name before any rank starts (its ViT has hidden 64 and 4 heads)."""
    from semimig._validate import check_choice, check_int

    check_int("--steps", args.steps, minimum=1, maximum=10_000)
    check_int("--batch", args.batch, minimum=1, maximum=1000)
    check_int("--seed", args.seed, minimum=0, maximum=2**32 - 1)
    check_choice("--tp (must divide the demo ViT's 4 heads)", args.tp, (1, 2, 4))


def _demo(args: argparse.Namespace) -> int:
    from semimig.bench.demo import run_demo
    from semimig.errors import ConfigError

    try:
        _check_demo(args)
    except ConfigError as err:
        print(f"semimig demo: error: {err}", file=sys.stderr)
        return 2
    losses = run_demo(steps=args.steps, batch=args.batch, seed=args.seed, tp=args.tp)
    print(f"tiny ViT on digits, HybridParallelPlugin(tp_size={args.tp}), CPU/gloo, seed {args.seed}")
    print(f"{'step':>4}  {'Colossal-AI policy':>20}  {'SemiMigPolicy':>15}  {'|diff|':>9}")
    worst = 0.0
    for i, (a, b) in enumerate(zip(losses["colossalai"], losses["semimig"])):
        worst = max(worst, abs(a - b))
        print(f"{i:>4}  {a:>20.6f}  {b:>15.6f}  {abs(a - b):>9.2e}")
    print(f"largest loss difference: {worst:.2e}")
    return 0


DESCRIPTION = "semimig: straggler-tolerant tensor parallelism for Colossal-AI. Each command has its own --help."
EPILOG = """examples:
  semimig demo                      Colossal-AI's layers and semimig's side by side, no straggler
  semimig bench --quick             the benchmark in a few minutes (time only)
  semimig bench                     the full benchmark (see: semimig bench --help)
  semimig throttle --rank 1 --fraction 0.25 --pin -- torchrun ...   a real slow rank (root)"""

SUMMARIES = {
    "demo": "Train a tiny ViT on digits with Colossal-AI's layers and with semimig's side by side and print "
            "both losses step by step: with no straggler they agree.",
    "bench": "The end-to-end straggler benchmark: a ViT on scikit-learn's digits under HybridParallelPlugin, "
             "trained by each balancing mode with one slowed rank; for each mode the time per iteration and "
             "the accuracy against Colossal-AI alone.",
    "report": "Merge saved semimig bench result files (a second run's modes beside a first run's baseline, "
              "say) into one table, JSON and plots, without training. The runs must share every setting but "
              "the modes, chi values, seeds and lambdas, and measure no case twice.",
    "plan": "Print the Poplar batch allocation (the samples each device takes) for a JSON file of device "
            "specs or a measured profile.",
    "throttle": "Run a command and throttle the worker of one rank, or of several, with a Linux cgroup CPU "
                "limit: a real slow device on a CPU machine (needs root and a cpu controller).",
    "cluster": "Run a torchrun script on N emulated nodes on this machine, each a network namespace joined "
               "to the others by a shaped link (needs root).",
}
"""Each command's first paragraph in ``--help``; what follows it in the command's own description
(examples, notes) is kept, in plain words."""

_ROLE = re.compile(r":(?:class|func|mod|meth|data|attr|obj|ref):`~?([^`]+)`")


def plain(text: str) -> str:
    """``text`` without reStructuredText markup: roles become their target, literals their text."""
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1] if m.group(0).count("~") else m.group(1), text)
    return text.replace("``", "").replace("`", "").replace("::\n", ":\n")


def _describe(parser: argparse.ArgumentParser, name: str) -> None:
    """The command's summary, then the rest of its own description (after the first paragraph)."""
    own = (parser.description or "").strip()
    rest = own.split("\n\n", 1)[1] if own.lstrip("`").startswith(f"semimig {name}") and "\n\n" in own else ""
    parser.description = textwrap.fill(SUMMARIES[name], width=88) + ("\n\n" + plain(rest) if rest else "")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def build_parser() -> argparse.ArgumentParser:
    from semimig.allocation.cli import add_plan_subcommand
    from semimig.bench.cli import add_bench_subcommand, add_report_subcommand
    from semimig.cluster.cli import add_cluster_subcommand
    from semimig.straggler.throttle_cli import add_throttle_subcommand

    parser = argparse.ArgumentParser(prog="semimig", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log at INFO level and show third-party warnings")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="train a tiny ViT with Colossal-AI's and semimig's layers side by side")
    demo.add_argument("--steps", type=int, default=5)
    demo.add_argument("--batch", type=int, default=32)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--tp", type=int, default=2)
    demo.set_defaults(func=_demo)

    add_bench_subcommand(sub)
    add_report_subcommand(sub)
    add_plan_subcommand(sub)
    add_throttle_subcommand(sub)
    add_cluster_subcommand(sub)
    for name, command in sub.choices.items():
        _describe(command, name)
    for action in sub._choices_actions:  # the one-line summaries of the command list
        action.help = plain(action.help or "")
    return parser


def _verbose_requested(argv: Sequence[str]) -> bool:
    """``-v``/``--verbose`` among ``argv``, read before the full parse (which may import a command's code)."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("-v", "--verbose", action="store_true")
    return pre.parse_known_args(argv)[0].verbose


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one subcommand; returns its exit status (2: a refused input, named in one line).

    Third-party warnings (:mod:`semimig._quiet`) are hidden unless ``-v`` is given.  Building the
    parser imports neither torch nor Colossal-AI (``--help`` is quick); a command imports its
    implementation when it runs.
    """
    from semimig._quiet import quiet_third_party

    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_third_party(verbose=_verbose_requested(argv))
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv  # the subcommand's own words, for hints such as how to resume
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
