"""``semimig cluster``: run a torchrun script on N emulated nodes joined by shaped links.

    semimig cluster --nodes N --nproc-per-node P --link-gbit G [--link-delay-ms D]
                    [--straggler-link-gbit G1 [--straggler-node K]] [--run-id ID] [--timeout S] -- SCRIPT [ARGS...]
    semimig cluster --reap-stale

This module imports only ``argparse`` at load time (the ``semimig`` command builds every
subcommand's parser on each start); the work is in :mod:`semimig.cluster.launcher`.
"""
from __future__ import annotations

import argparse
import sys

__all__ = ["add_cluster_subcommand", "cluster_main"]

EPILOG = """\
Each node is a network namespace (smc-<id>-n<k>) joined to a bridge (smc-<id>-b) by a veth pair
whose two ends are shaped with tc tbf (and netem for a delay); node k holds ranks k*P .. k*P+P-1
and its ranks run torchrun's c10d rendezvous on node 0.  GLOO_SOCKET_IFNAME and
SEMIMIG_CLUSTER_{RUN,NODE,NODES,IF,NETNS,ADDRS} are set for every rank.  Everything the run makes is
removed when it ends (success, failure, SIGINT, SIGTERM, SIGHUP, SIGQUIT; each agent gets SIGTERM if
the launcher is killed); a crashed run's leftovers are removed by the next run.  SCRIPT is the
training script, not a launcher (torchrun is run here, one world over the nodes).  Needs root, iproute2 and network namespaces (exit 2 otherwise).  Exit code: the
job's (128 + signal when interrupted, 124 past --timeout)."""


def add_cluster_subcommand(sub) -> None:
    """Register ``cluster`` on the ``semimig`` subparsers."""
    p = sub.add_parser("cluster", help="run a torchrun script on N emulated nodes with shaped links (root)",
                       description=__doc__.split("\n")[0], epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, help="emulated nodes (network namespaces); required")
    p.add_argument("--nproc-per-node", type=int, default=1, help="ranks per node (default 1)")
    p.add_argument("--link-gbit", type=float, help="every node's link rate, Gbit/s each way; required")
    p.add_argument("--link-delay-ms", type=float, default=0.0, help="delay per link direction, ms (needs sch_netem)")
    p.add_argument("--straggler-link-gbit", type=float, help="the straggler node's link rate, Gbit/s")
    p.add_argument("--straggler-node", type=int, help="which node has the straggler link (default: the last)")
    p.add_argument("--run-id", help="1-6 characters of [a-z0-9] in every name the run makes (default: random)")
    p.add_argument("--timeout", type=float, help="stop the job after this many seconds (exit 124)")
    p.add_argument("--grace", type=float, default=10.0, help="seconds the agents get to stop (default 10)")
    p.add_argument("--reap-stale", action="store_true",
                   help="only remove the leftovers of crashed runs (dead owner), then exit")
    p.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]: the torchrun script and its args")
    p.set_defaults(func=cluster_main)


_LAUNCHERS = ("torchrun", "colossalai", "python", "python3", "mpirun", "srun")


def check_not_a_launcher(words: list) -> None:
    """The job is a script that torchrun runs on every node, one world of ``nodes x nproc-per-node``
    ranks; a launcher given as the script (``-- torchrun --nproc_per_node 2 train.py``) would start a
    world of its own on each node, every job alone and the shaped links unused: refused, naming it."""
    import os

    from semimig.errors import ConfigError

    name = os.path.basename(words[0])
    module = words[1] if words[0] in ("-m", "--module") and len(words) > 1 else ""
    if name in _LAUNCHERS or name.startswith("python") or module.startswith("torch.distributed"):
        raise ConfigError(f"the script {module or words[0]!r} is a launcher: semimig cluster runs torchrun itself, one world of "
                          "--nodes x --nproc-per-node ranks; give the training script and set --nproc-per-node, e.g. "
                          "semimig cluster --nodes 2 --nproc-per-node 2 --link-gbit 1 -- train.py")


def cluster_main(args: argparse.Namespace) -> int:
    """Validate, make the cluster, run the job, remove the cluster; the job's exit code (2: refused)."""
    from semimig._validate import check_number
    from semimig.cluster.netns import NetnsError, Unsupported, check_support
    from semimig.cluster.topology import RUN_ID_RE, ClusterConfig
    from semimig.errors import ConfigError

    if args.reap_stale:
        try:
            check_support()
            from semimig.cluster.netns import reap_stale

            reaped = reap_stale()
        except NetnsError as err:
            print(f"semimig cluster: {err}", file=sys.stderr)
            return 2
        print(f"semimig cluster: removed the leftovers of {len(reaped)} crashed run(s) {' '.join(reaped)}".rstrip())
        return 0
    words = list(args.script)
    if words and words[0] == "--":
        words = words[1:]
    try:
        for flag, value in (("--nodes", args.nodes), ("--link-gbit", args.link_gbit)):
            if value is None:
                raise ConfigError(f"{flag} is required")
        if not words:
            raise ConfigError("no script: put it after '--', e.g. semimig cluster --nodes 2 --link-gbit 1 -- train.py")
        check_not_a_launcher(words)
        if args.run_id is not None and not RUN_ID_RE.fullmatch(args.run_id):
            raise ConfigError(f"--run-id must be 1-6 characters of [a-z0-9], got {args.run_id!r}")
        check_number("--timeout", args.timeout, minimum=0.0, low_open=True, allow_none=True)
        check_number("--grace", args.grace, minimum=0.0, maximum=600.0)
        config = ClusterConfig(nodes=args.nodes, nproc_per_node=args.nproc_per_node, link_gbit=args.link_gbit,
                               link_delay_ms=args.link_delay_ms, straggler_link_gbit=args.straggler_link_gbit,
                               straggler_node=args.straggler_node)
    except ConfigError as err:
        print(f"semimig cluster: error: {err}", file=sys.stderr)
        return 2
    try:
        check_support()
        from semimig.cluster.launcher import run_cluster

        return run_cluster(config, words[0], words[1:], run_id=args.run_id, timeout_s=args.timeout,
                           grace_s=args.grace, echo=lambda text: print(text, flush=True))
    except Unsupported as err:
        print(f"semimig cluster: {err}", file=sys.stderr)
        return 2
    except (NetnsError, ConfigError) as err:
        print(f"semimig cluster: error: {err}", file=sys.stderr)
        return 2


def main(argv=None) -> int:
    """``python -m semimig.cluster.cli ARGS``: the subcommand alone, without the rest of the CLI's imports."""
    parser = argparse.ArgumentParser(prog="semimig")
    add_cluster_subcommand(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["cluster", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
