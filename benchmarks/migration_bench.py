"""Table I of the paper on CPU/gloo: iteration time of broadcast-reduce vs scatter-gather migration.

    python benchmarks/migration_bench.py --json results/migration.json [--compute measured|emulated] [--quick]

What runs.  ``e`` gloo ranks on this machine run ``blocks`` stacked MLP blocks of semimig
layers, ``Linear1D_Col(H -> 4H)`` -> GELU -> ``Linear1D_Row(4H -> H)``, on ``tokens`` replicated
input rows.  One iteration is forward + backward (``y.sum().backward()``; the optimizer step
has no communication in 1D TP and is left out).  As in the paper the environment is
homogeneous: nobody is slow; ``nu`` ranks (ranks ``1 .. nu``) are told to migrate
``L_mig = round(gamma K)`` of their ``K`` reduction columns in every layer (``K = H`` for the
column layer, ``4H/e`` for the row layer), so all time above ``gamma = 0`` is migration cost.
Every layer gets a :class:`~semimig.nn.LayerDirective` with a
:class:`~semimig.migration.layout.MigrationLayout` and the exchange of the policy under test,
as the balancing runtime hands them out; ``gamma = 0`` takes the same path with an empty layout.

Compute (``--compute``).  ``measured`` (default): 2 ranks, one torch thread each, real GEMMs,
nothing emulated; with 2 ranks only ``nu = 1`` exists and the one receiver gets everything, so
the policies differ little by construction.  ``emulated``: 4 ranks, as before, and labelled so:
4 ranks on 2 cores would queue for the cores together with gloo's copies, so every rank's GEMMs
also sleep ``flops / rate`` (straggler injection mode ``emulated``, chi = 1 everywhere), ``rate``
chosen so that one rank's unmigrated GEMMs of an iteration sleep ``device_ms``.

Timing.  Each iteration starts after a barrier; its time is the slowest rank's wall time from
there to the end of its backward.  Cases are interleaved round-robin (``rounds`` passes of
``iters_per_round`` timed iterations each, after ``warmup`` untimed ones) so that drift of the
shared machine hits both policies alike; ``iter_time_s`` is the median, ``round_medians_s`` the
per-round medians, whose SG/BR ratios give the spread printed beside each ratio.

Bytes.  Every call of :mod:`semimig.comm.primitives` is counted (payload per call and, for the
migrating rank 1, the bytes its own link carries under a pipelined-collective model:
``straggler_link``); :func:`migration_report.straggler_traffic` derives the same numbers from
DESIGN §2, and the tests hold the two equal.  ``movements`` times each exchange movement alone.

Link constants and the paper's setting.  A ping-pong and a broadcast sweep over message sizes
fit ``t(B) = alpha + beta B`` on this machine; :func:`migration_report.alpha_beta_estimate`
prices each policy's straggler-link traffic with them for 8 ranks and one straggler (the
paper's setting, straggler-link bound), and with ``--link ALPHA_US,GBPS`` for a link you name.
Gloo on one machine cannot show what a NIC-bound cluster shows (see
``migration_report.GLOO_CAVEAT``, printed with the results): no byte crosses a link, every byte
is a copy on the shared cores, and gloo's broadcast is an unpipelined binomial tree.

Emulated cluster (``--straggler-link-gbit G``, root only).  Each rank runs on its own emulated
node (:mod:`semimig.cluster`: a network namespace whose veth link to a bridge is shaped with
``tc tbf``), rank 1's node at ``G`` Gbit/s and the others at ``--link-gbit`` (default 10), so the
straggler's NIC is the bottleneck, as in the paper.  ``e = --world`` ranks (default 4: with
``e >= 3`` the schemes differ in what the straggler's link carries).  Beside the times it
reports the bytes each link actually carried per iteration, read from the interface counters
(``/sys/class/net/<if>/statistics/{tx,rx}_bytes``) inside every namespace: a case runs ``1`` and
then ``1 + link_bytes_iters`` iterations, and the difference of the two counter deltas divided by
``link_bytes_iters`` is one iteration's traffic (TCP headers and acknowledgements included).
The alpha-beta estimate is priced with the link constants measured across the straggler's
link and with the tc rate itself, and again with the bytes as gloo carries them
(:func:`gloo_straggler_bytes`; the counters follow it to 0.05 MiB).  Broadcast-reduce's algorithm
(``--br-algorithm``, :data:`semimig.migration.exchange.EXCHANGE_ALGORITHMS`) decides what the
straggler's link carries: under ``direct`` (default) each block once, the straggler scattering
and gathering while the receivers relay among themselves; under ``tree`` (gloo's own broadcast
and reduce, kept for comparison) the binomial broadcast makes the straggler send its block
``ceil(log2 e)`` times and the reduce makes it send ``(e-1)/e`` of each reduced block, so at
``e = 4``, ``gamma = 1`` its busier direction carries 11.3 MiB per iteration against 12.0 under
scatter-gather, a link-bound ceiling of about 1.07x.  Under ``direct`` it carries 6.0 MiB each
way against scatter-gather's 8.0 out / 12.0 in (``--quick``, all-reduces included).

Output.  The table in the paper's format (ms), SG/BR per ``gamma`` with its per-round range
beside the paper's, the target check (broadcast-reduce beats scatter-gather at every
``gamma > 0`` for ``nu = 1``; the paper: 1.93x at ``gamma = 1``), the counted straggler traffic,
the movement table and the alpha-beta estimate.  ``--json`` writes all of it.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from semimig.errors import ConfigError

from bench_output import add_json_flag, refuse, write_result
from migration_ranks import MOVEMENTS
from migration_report import (GAMMAS, GLOO_CAVEAT, POLICIES, alpha_beta_estimate, fit_link, format_estimate,
                              format_movements, format_table, format_traffic, ratios, target)

__all__ = ["BenchConfig", "GAMMAS", "MOVEMENTS", "POLICIES", "main", "run_bench"]

COMPUTES = ("measured", "emulated")
BR_ALGORITHMS = ("direct", "tree")  # semimig.migration.exchange.EXCHANGE_ALGORITHMS, without importing torch
# per compute mode: ranks, migrating-rank counts, emulated device ms (0: real GEMMs only)
COMPUTE_DEFAULTS = {"measured": dict(world=2, nus=(1,), device_ms=0.0),
                    "emulated": dict(world=4, nus=(1, 2), device_ms=40.0)}
LINK_SIZES = tuple(4 ** i * 1024 for i in range(7))  # 1 KiB .. 4 MiB
PAPER_WORLD = 8


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """Sizes and repetitions of one benchmark run."""

    hidden: int = 256
    """``H``: model width; the MLP is ``H -> 4H -> H``."""
    tokens: int = 1024
    """Rows of the (replicated) input: batch x sequence."""
    blocks: int = 2
    """Stacked MLP blocks."""
    compute: str = "measured"
    """``measured`` (2 ranks, real GEMMs) or ``emulated`` (4 ranks, GEMMs also sleep); sets the defaults below."""
    world: Optional[int] = None
    """Tensor-parallel ranks ``e`` (``None``: 2 measured, 4 emulated)."""
    nus: Optional[tuple[int, ...]] = None
    """Numbers of migrating ranks; ranks ``1 .. nu`` migrate (``None``: (1,) measured, (1, 2) emulated)."""
    gammas: tuple[float, ...] = GAMMAS
    """Migrated shares ``L_mig / K``."""
    warmup: int = 2
    """Untimed iterations per case before timing."""
    rounds: int = 10
    """Round-robin passes over all cases."""
    iters_per_round: int = 5
    """Timed iterations per case and round."""
    movement_iters: int = 60
    """Timed repetitions of each movement alone (0: skip that part)."""
    device_ms: Optional[float] = None
    """Emulated GEMM time of one rank per unmigrated iteration (``None``: 0 measured, 40 emulated)."""
    link_iters: int = 20
    """Timed messages per size in the link sweep (0: skip the sweep and the estimate)."""
    link_sizes: tuple[int, ...] = LINK_SIZES
    """Message sizes in bytes of the link sweep (multiples of 4)."""
    seed: int = 0
    br_algorithm: str = "direct"
    """Broadcast-reduce's algorithm (``semimig.migration.exchange.EXCHANGE_ALGORITHMS``): ``direct``
    (the straggler's link carries each block once) or ``tree`` (gloo's broadcast / reduce)."""

    def __post_init__(self) -> None:
        if self.br_algorithm not in BR_ALGORITHMS:
            raise ConfigError(f"br_algorithm must be one of {BR_ALGORITHMS}, got {self.br_algorithm!r}")
        if self.compute not in COMPUTES:
            raise ConfigError(f"compute must be one of {COMPUTES}, got {self.compute!r}")
        for name, value in COMPUTE_DEFAULTS[self.compute].items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if self.compute == "measured" and self.device_ms != 0:
            raise ConfigError(f"device_ms={self.device_ms!r} emulates a device; compute 'measured' runs real GEMMs only")
        for name in ("hidden", "tokens", "blocks", "world", "rounds", "iters_per_round"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        if self.world < 2:
            raise ConfigError(f"world must be >= 2 (someone has to receive), got {self.world}")
        for name in ("warmup", "movement_iters", "link_iters"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be an int >= 0, got {value!r}")
        if (4 * self.hidden) % self.world:
            raise ConfigError(f"4 * hidden = {4 * self.hidden} is not divisible by world = {self.world}")
        if not self.nus or any(not 1 <= nu < self.world for nu in self.nus):
            raise ConfigError(f"nus must be non-empty, each in [1, world - 1 = {self.world - 1}], got {self.nus!r}")
        if not self.gammas or any(not 0.0 <= g <= 1.0 for g in self.gammas):
            raise ConfigError(f"gammas must be non-empty, each in [0, 1], got {self.gammas!r}")
        if not self.device_ms >= 0:
            raise ConfigError(f"device_ms must be >= 0, got {self.device_ms!r}")
        if len(self.link_sizes) < 2 or any(not isinstance(b, int) or b < 4 or b % 4 for b in self.link_sizes):
            raise ConfigError(f"link_sizes must be two or more byte counts, multiples of 4, got {self.link_sizes!r}")

    @property
    def k_column(self) -> int:
        """``K`` of the column layer's shard ``[4H/e, H]``."""
        return self.hidden

    @property
    def k_row(self) -> int:
        """``K`` of the row layer's shard ``[H, 4H/e]``."""
        return 4 * self.hidden // self.world

    def flops_per_iteration(self) -> int:
        """One rank's unmigrated GEMM FLOPs per iteration: 3 GEMMs of ``2 M (4H/e) H`` per layer."""
        return self.blocks * 2 * 3 * 2 * self.tokens * self.k_row * self.hidden

    def cases(self) -> list[tuple[str, int, float]]:
        return [(policy, nu, gamma) for nu in self.nus for gamma in self.gammas for policy in POLICIES]

    def migrate(self, nu: int, gamma: float, k: int) -> dict[int, int]:
        """``{rank: L_mig}`` for ranks ``1 .. nu`` (empty when ``round(gamma k) = 0``)."""
        count = round(gamma * k)
        return {rank: count for rank in range(1, nu + 1)} if count else {}

    def movement_shapes(self) -> dict[str, tuple[int, int]]:
        """The two block shapes migration moves: ``[rows, migrated columns]`` at ``gamma = 1``."""
        return {"activation": (self.tokens, self.k_row), "weight": (self.k_row, self.hidden)}


QUICK = dict(tokens=512, warmup=1, rounds=3, iters_per_round=4, movement_iters=30)


@dataclass(frozen=True, kw_only=True)
class _OneCase(BenchConfig):
    """``cfg`` restricted to one (policy, nu, gamma) case (for the link-counter pass)."""

    case: tuple = ()

    def cases(self) -> list[tuple[str, int, float]]:
        return [tuple(self.case)]


def _if_counters() -> tuple[int, int]:
    """``(tx_bytes, rx_bytes)`` of this node's link (``SEMIMIG_CLUSTER_IF``, seen inside its namespace)."""
    import os

    stats = Path("/sys/class/net") / os.environ["SEMIMIG_CLUSTER_IF"] / "statistics"
    return int((stats / "tx_bytes").read_text()), int((stats / "rx_bytes").read_text())


def link_bytes(rank: int, world: int, cfg: BenchConfig, iters: int) -> list[dict]:
    """Per case: the bytes each rank's link sent and received in one iteration (counter deltas of
    ``1 + iters`` minus ``1`` iterations, over ``iters``: set-up and result gathering cancel)."""
    import torch.distributed as dist
    from dataclasses import fields

    from migration_ranks import iteration_times

    base = {f.name: getattr(cfg, f.name) for f in fields(BenchConfig)}
    out = []
    for case in cfg.cases():
        deltas = []
        for k in (1, 1 + iters):
            one = _OneCase(**{**base, "warmup": 0, "rounds": 1, "iters_per_round": k}, case=case)
            dist.barrier()
            tx0, rx0 = _if_counters()
            iteration_times(rank, world, one)
            dist.barrier()
            tx1, rx1 = _if_counters()
            deltas.append((tx1 - tx0, rx1 - rx0))
        mine = [(deltas[1][i] - deltas[0][i]) / iters for i in range(2)]
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        out.append({"policy": case[0], "nu": case[1], "gamma": case[2],
                    "tx_bytes": [g[0] for g in gathered], "rx_bytes": [g[1] for g in gathered]})
    return out


def _rank_entry(cfg_path: str, out_path: str) -> int:
    """What each torchrun rank of the emulated cluster runs: the usual body, then the counter pass."""
    import datetime
    import json
    import pickle

    import torch.distributed as dist

    from migration_ranks import bench_body
    from semimig.launch import set_collective_timeout

    spec = json.loads(Path(cfg_path).read_text())
    cfg = BenchConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec["config"].items()})
    set_collective_timeout(300.0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        result = bench_body(rank, world, cfg)
        counted = link_bytes(rank, world, cfg, spec["link_bytes_iters"])
        if rank == 0:
            Path(out_path).write_bytes(pickle.dumps({**result, "link_bytes": counted}))
        dist.barrier()  # nobody tears its connections down while a peer still reads (gloo aborts then)
    finally:
        dist.destroy_process_group()
    return 0


def run_on_cluster(cfg: BenchConfig, *, straggler_gbit: float, link_gbit: float, link_bytes_iters: int,
                   timeout_s: float) -> dict:
    """Run ``cfg`` with rank ``r`` on emulated node ``r``, rank 1's link at ``straggler_gbit``."""
    import json
    import pickle
    import tempfile

    from migration_ranks import STRAGGLER
    from semimig.cluster.launcher import run_cluster
    from semimig.cluster.topology import ClusterConfig

    cluster = ClusterConfig(nodes=cfg.world, nproc_per_node=1, link_gbit=link_gbit,
                            straggler_link_gbit=straggler_gbit, straggler_node=STRAGGLER)
    with tempfile.TemporaryDirectory(prefix="semimig-migbench-") as tmp:
        spec, out = Path(tmp) / "cfg.json", Path(tmp) / "result.pkl"
        spec.write_text(json.dumps({"config": asdict(cfg), "link_bytes_iters": link_bytes_iters}))
        code = run_cluster(cluster, str(Path(__file__).resolve()), ["--rank-entry", str(spec), str(out)],
                           timeout_s=timeout_s, echo=lambda text: print(text, flush=True))
        if not out.exists():
            raise RuntimeError(f"the emulated-cluster run failed (exit {code}) before rank 0 wrote its result")
        if code != 0:
            print(f"warning: the emulated-cluster job exited {code} after rank 0 wrote its result", flush=True)
        result = pickle.loads(out.read_bytes())
    result["cluster"] = {"nodes": cfg.world, "link_gbit": link_gbit, "straggler_link_gbit": straggler_gbit,
                         "straggler_node": STRAGGLER}
    return result


def format_link_bytes(records: list[dict], link_bytes: list[dict], straggler: int, cfg: BenchConfig) -> str:
    """Per case: time, the straggler link's measured MiB out / in beside the counted migration
    traffic and the gloo model's prediction (gamma = 0 traffic + :func:`gloo_straggler_bytes`), and
    the other links' largest out / in."""
    times = {(r["policy"], r["nu"], r["gamma"]): r for r in records}
    lines = [f"Bytes on the links per iteration (interface counters, TCP included; MiB). Straggler = node {straggler}:",
             f"  {'policy':<17}{'nu':>3}{'gamma':>6}{'ms':>8}{'strag out':>11}{'strag in':>10}"
             f"{'counted out/in (migration only)':>33}{'gloo model out/in':>19}{'max other out':>15}{'max other in':>14}"]
    base = {(lb["policy"], lb["nu"]): lb for lb in link_bytes if lb["gamma"] == 0}
    for lb in link_bytes:
        rec = times[lb["policy"], lb["nu"], lb["gamma"]]
        others = [i for i in range(len(lb["tx_bytes"])) if i != straggler]
        counted = rec["straggler_link"]
        zero = base.get((lb["policy"], lb["nu"]))
        model = "-"
        if zero is not None and lb["nu"] == 1:  # the gamma = 0 traffic (TP all-reduces) + gloo's migration bytes
            out, in_ = gloo_straggler_bytes(lb["policy"], 1, lb["gamma"], hidden=cfg.hidden, tokens=cfg.tokens,
                                            blocks=cfg.blocks, world=len(lb["tx_bytes"]), algorithm=cfg.br_algorithm)
            model = (f"{(zero['tx_bytes'][straggler] + out) / 2**20:.2f} / "
                     f"{(zero['rx_bytes'][straggler] + in_) / 2**20:.2f}")
        lines.append(f"  {lb['policy']:<17}{lb['nu']:>3}{lb['gamma']:>6.2f}{rec['iter_time_s'] * 1e3:>8.1f}"
                     f"{lb['tx_bytes'][straggler] / 2**20:>11.2f}{lb['rx_bytes'][straggler] / 2**20:>10.2f}"
                     f"{counted['out_bytes'] / 2**20:>23.2f} / {counted['in_bytes'] / 2**20:<7.2f}{model:>19}"
                     f"{max(lb['tx_bytes'][i] for i in others) / 2**20:>15.2f}"
                     f"{max(lb['rx_bytes'][i] for i in others) / 2**20:>14.2f}")
    return "\n".join(lines)


def gloo_straggler_bytes(policy: str, nu: int, gamma: float, *, hidden: int, tokens: int, blocks: int,
                         world: int, algorithm: str = "tree") -> tuple[float, float]:
    """Migration bytes (out, in) through one straggler's link per iteration as gloo carries them.

    Broadcast-reduce's ``direct`` algorithm and scatter-gather are point-to-point messages: the
    link carries what :func:`migration_report.straggler_traffic` counts.  Under ``tree``:

    :func:`migration_report.straggler_traffic` counts a pipelined collective (the root's link
    carries each block once).  gloo's CPU broadcast is a binomial tree whose root sends the block
    once per level, ``ceil(log2 e)`` times, and its reduce is a ring reduce-scatter plus a gather at
    the root, whose link then sends ``(e - 1)/e`` and receives ``2 (e - 1)/e`` of the block.  With
    ``B`` the broadcast and ``R`` the reduce payload of the straggler's own collectives (``nu = 1``)::

        broadcast-reduce  out = ceil(log2 e) B + (e - 1)/e R        in = 2 (e - 1)/e R
        scatter-gather    as counted (point to point: each byte crosses the link once)

    On the emulated cluster (e = 4, H = 256, 512 tokens, gamma = 1) the link carries 8.28 / 4.53 MiB
    for broadcast-reduce against 8.25 / 4.50 here, 5.02 / 9.02 for scatter-gather against 5.0 / 9.0.
    """
    import math

    from migration_report import straggler_traffic

    t = straggler_traffic(policy, nu, gamma, hidden=hidden, tokens=tokens, blocks=blocks, world=world,
                          algorithm=algorithm)
    if policy != "broadcast-reduce" or algorithm == "direct":
        return float(t["out_bytes"]), float(t["in_bytes"])
    if nu != 1:
        raise ValueError(f"the gloo model covers nu = 1 only, got nu = {nu}")
    share = (world - 1) / world
    return math.ceil(math.log2(world)) * t["out_bytes"] + share * t["in_bytes"], 2 * share * t["in_bytes"]


def gloo_estimate(cfg: BenchConfig, link: dict, *, world: int = PAPER_WORLD) -> list[dict]:
    """The paper's setting (``world`` ranks, nu = 1) priced on ``link`` with gloo's algorithms and a
    full-duplex link: ``time = beta max(out, in)`` (the straggler's link binds; alpha is left out,
    its calls overlap on the two directions)."""
    rows = []
    for gamma in cfg.gammas:
        row = {"world": world, "nu": 1, "gamma": gamma}
        for policy in POLICIES:
            out, in_ = gloo_straggler_bytes(policy, 1, gamma, hidden=cfg.hidden, tokens=cfg.tokens, blocks=cfg.blocks,
                                            world=world, algorithm=cfg.br_algorithm)
            row[policy] = {"out_bytes": out, "in_bytes": in_, "time_s": link["beta_s_per_byte"] * max(out, in_)}
        br, sg = row["broadcast-reduce"]["time_s"], row["scatter-gather"]["time_s"]
        row["sg_over_br"] = sg / br if br > 0 else None
        rows.append(row)
    return rows


def format_gloo_estimate(rows: list[dict], gbit: float, algorithm: str) -> str:
    how = ("direct: the straggler sends / receives each block once" if algorithm == "direct"
           else "tree: gloo's binomial broadcast, ring reduce")
    lines = [f"alpha-beta estimate of the bytes as gloo carries them (broadcast-reduce {how}), e={rows[0]['world']}, "
             f"nu=1, straggler link {gbit:g} Gbit/s full duplex, migration traffic only:",
             f"  {'gamma':>6} {'BR MiB out/in':>15} {'SG MiB out/in':>15} {'BR ms':>8} {'SG ms':>8} {'SG/BR':>7}"]
    for row in rows:
        br, sg = row["broadcast-reduce"], row["scatter-gather"]
        ratio = f"{row['sg_over_br']:6.2f}x" if row["sg_over_br"] else "     -"
        lines.append(f"  {row['gamma']:>6.2f} {br['out_bytes'] / 2**20:>7.2f}/{br['in_bytes'] / 2**20:<7.2f}"
                     f" {sg['out_bytes'] / 2**20:>7.2f}/{sg['in_bytes'] / 2**20:<7.2f}"
                     f" {br['time_s'] * 1e3:>8.2f} {sg['time_s'] * 1e3:>8.2f} {ratio}")
    return "\n".join(lines)


CLUSTER_NOTE = ("emulated cluster: every rank is its own network namespace on a bridge; the straggler's veth is "
                "tbf-shaped on both ends, the other links too (at their own rate). Ranks still share this machine's "
                "cores, so compute and gloo's copies are contended as before; only the links are real.")


def run_bench(cfg: BenchConfig, *, timeout_s: float = 900.0) -> dict:
    """Run ``cfg`` on ``cfg.world`` gloo ranks: ``{"records": [...], "movements": [...], "link": ...}``."""
    from migration_ranks import bench_body
    from semimig.launch import run_on_ranks

    return run_on_ranks(bench_body, cfg.world, cfg, timeout_s=timeout_s)


def estimates(cfg: BenchConfig, link: dict, named_link: Optional[dict]) -> tuple[dict, dict]:
    """The link fits and the alpha-beta estimates for the paper's setting (8 ranks, nu = 1)."""
    fits = {"ping-pong": fit_link(link["sizes"], link["ping_pong_s"]),
            "broadcast": fit_link(link["sizes"], link["broadcast_s"])}
    sizes = dict(hidden=cfg.hidden, tokens=cfg.tokens, blocks=cfg.blocks, world=PAPER_WORLD, algorithm=cfg.br_algorithm)
    out = {"measured loopback ping-pong constants": alpha_beta_estimate(fits["ping-pong"], **sizes)}
    if named_link is not None:
        out[f"named link (alpha {named_link['alpha_s'] * 1e6:g} us, {1e-9 / named_link['beta_s_per_byte']:g} GB/s)"] = \
            alpha_beta_estimate(named_link, **sizes)
    return fits, out


def _link_arg(text: str) -> dict:
    """``ALPHA_US,GBPS`` -> link constants (e.g. ``10,12.5`` for 10 us and 100 Gb/s)."""
    try:
        alpha_us, gbps = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ALPHA_US,GBPS (two numbers), got {text!r}") from None
    if not (alpha_us >= 0 and gbps > 0) or gbps == float("inf"):
        raise argparse.ArgumentTypeError(f"alpha must be >= 0 and the bandwidth a finite number > 0, got {text!r}")
    return {"alpha_s": alpha_us * 1e-6, "beta_s_per_byte": 1e-9 / gbps}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_json_flag(parser, required=True, help="write records, ratios, target, traffic, estimate here")
    parser.add_argument("--compute", choices=COMPUTES, default="measured",
                        help="measured: 2 ranks, real GEMMs (default); emulated: 4 ranks, GEMMs also sleep")
    parser.add_argument("--quick", action="store_true", help="half the tokens, fewer iterations (< 2 min)")
    parser.add_argument("--hidden", type=int, help="H (default 256)")
    parser.add_argument("--tokens", type=int, help="input rows (default 1024, --quick 512)")
    parser.add_argument("--blocks", type=int, help="stacked MLP blocks (default 2)")
    parser.add_argument("--device-ms", type=float, help="emulated GEMM ms per rank and iteration (emulated only; default 40)")
    parser.add_argument("--warmup", type=int, help="untimed iterations per case")
    parser.add_argument("--rounds", type=int, help="round-robin passes over all cases")
    parser.add_argument("--iters", type=int, help="timed iterations per case and round")
    parser.add_argument("--movement-iters", type=int, help="timed repetitions per movement; 0 = skip")
    parser.add_argument("--link-iters", type=int, help="timed messages per size in the link sweep; 0 = skip")
    parser.add_argument("--link", type=_link_arg, help="also price the paper's setting on a link ALPHA_US,GBPS")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before the ranks are killed")
    parser.add_argument("--straggler-link-gbit", type=float,
                        help="run on an emulated cluster (root): one node per rank, rank 1's link at this rate")
    parser.add_argument("--link-gbit", type=float, default=10.0, help="the other nodes' link rate (cluster; default 10)")
    parser.add_argument("--world", type=int, help="ranks e (default 2 measured, 4 emulated or on a cluster)")
    parser.add_argument("--br-algorithm", choices=BR_ALGORITHMS,
                        help="broadcast-reduce's algorithm: direct (default; the straggler's link carries each block "
                             "once) or tree (gloo's broadcast / reduce, for comparison)")
    parser.add_argument("--link-bytes-iters", type=int, default=3,
                        help="iterations per case of the interface-counter pass (cluster; default 3)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    if words[:1] == ["--rank-entry"]:
        return _rank_entry(*words[1:3])
    args = _parse_args(argv)
    cluster = args.straggler_link_gbit is not None
    fields = dict(QUICK) if args.quick else {}
    overrides = {"compute": args.compute, "hidden": args.hidden, "tokens": args.tokens, "blocks": args.blocks,
                 "device_ms": args.device_ms, "warmup": args.warmup, "rounds": args.rounds,
                 "iters_per_round": args.iters, "movement_iters": args.movement_iters, "link_iters": args.link_iters,
                 "br_algorithm": args.br_algorithm,
                 "world": args.world if args.world is not None else (4 if cluster else None)}
    fields.update({k: v for k, v in overrides.items() if v is not None})
    try:
        cfg = BenchConfig(**fields)
        if cluster:
            from semimig._validate import check_int, check_number

            check_number("--straggler-link-gbit", args.straggler_link_gbit, minimum=0.001, maximum=400.0)
            check_number("--link-gbit", args.link_gbit, minimum=0.001, maximum=400.0)
            check_int("--link-bytes-iters", args.link_bytes_iters, minimum=1, maximum=100)
            if cfg.world < 3:
                raise ConfigError(f"--world must be >= 3 on a cluster (with 2 ranks the schemes move the same "
                                  f"bytes), got {cfg.world}")
    except ValueError as err:
        return refuse("migration_bench.py", err)
    where = (f"{cfg.world} emulated nodes, rank 1's link {args.straggler_link_gbit:g} Gbit/s, others "
             f"{args.link_gbit:g} Gbit/s" if cluster else f"{cfg.world} gloo ranks")
    print(f"migration bench ({cfg.compute}, broadcast-reduce {cfg.br_algorithm}): {len(cfg.cases())} cases x {cfg.rounds * cfg.iters_per_round} timed "
          f"iterations on {where}, CPU ({platform.machine()})", flush=True)
    start = time.perf_counter()
    named_link = args.link
    if cluster:
        from semimig.cluster.netns import Unsupported

        try:
            result = run_on_cluster(cfg, straggler_gbit=args.straggler_link_gbit, link_gbit=args.link_gbit,
                                    link_bytes_iters=args.link_bytes_iters, timeout_s=args.timeout)
        except Unsupported as err:
            print(f"migration_bench.py: {err}", file=sys.stderr)
            return 2
    else:
        result = run_bench(cfg, timeout_s=args.timeout)
    print(format_table(result["records"], cfg))
    print(format_traffic(result["records"]))
    if cluster:
        print(format_link_bytes(result["records"], result["link_bytes"], result["cluster"]["straggler_node"], cfg))
    if result["movements"]:
        print(format_movements(result["movements"]))
    fits, estimate = estimates(cfg, result["link"], named_link) if result["link"] else ({}, {})
    if cluster and fits and named_link is None:  # the straggler link's tc rate with the measured latency
        named_link = {"alpha_s": max(fits["ping-pong"]["alpha_s"], 0.0),
                      "beta_s_per_byte": 8 / (args.straggler_link_gbit * 1e9)}
        fits, estimate = estimates(cfg, result["link"], named_link)
        estimate = {key.replace("loopback", "straggler-link"): rows for key, rows in estimate.items()}
    gloo_rows = gloo_estimate(cfg, named_link) if cluster and named_link is not None else []
    caveat = CLUSTER_NOTE if cluster else GLOO_CAVEAT
    if fits:
        text = format_estimate(fits, estimate)
        if cluster:  # the report's wording is loopback's; here the fit crosses the straggler's shaped link
            text = text.replace("gloo, loopback;", "gloo across the straggler's emulated link;")
            text = text.replace("Caveat: " + GLOO_CAVEAT, "Note: " + CLUSTER_NOTE)
        print(text)
    else:
        print("Caveat: " + caveat)
    if gloo_rows:
        print(format_gloo_estimate(gloo_rows, 8e-9 / named_link["beta_s_per_byte"], cfg.br_algorithm))
    print(f"wall time {time.perf_counter() - start:.0f} s")
    extra = {"cluster": result["cluster"], "link_bytes": result["link_bytes"],
             "gloo_alpha_beta_estimate": gloo_rows} if cluster else {}
    write_result(args.json, "migration_bench", argv, asdict(cfg), records=result["records"],
                 ratios=ratios(result["records"]), target=target(result["records"]), movements=result["movements"],
                 link=result["link"], link_fits=fits, alpha_beta_estimates=estimate, caveat=caveat, **extra)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
