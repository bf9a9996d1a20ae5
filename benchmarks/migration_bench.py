"""Table I of the paper on CPU/gloo: iteration time of broadcast-reduce vs scatter-gather migration.

    python benchmarks/migration_bench.py --json results/migration.json [--quick]

What runs.  ``e = 4`` gloo ranks on this machine run ``blocks`` stacked MLP blocks of semimig
layers, ``Linear1D_Col(H -> 4H)`` -> GELU -> ``Linear1D_Row(4H -> H)``, on ``tokens`` replicated
input rows.  One iteration is forward + backward (``y.sum().backward()``; the optimizer step
has no communication in 1D TP and is left out).  As in the paper the environment is
homogeneous: nobody is slow; ``nu`` ranks (ranks ``1 .. nu``) are told to migrate
``L_mig = round(gamma K)`` of their ``K`` reduction columns in every layer (``K = H`` for the
column layer, ``4H/e`` for the row layer), so all time above ``gamma = 0`` is migration cost.
Every layer gets a :class:`~semimig.nn.LayerDirective` with a
:class:`~semimig.migration.layout.MigrationLayout` and the exchange of the policy under test,
as the balancing runtime hands them out; ``gamma = 0`` takes the same path with an empty layout.
With ``nu = 2`` only the two other ranks receive (a migrating rank never receives).

Timing.  Each iteration starts after a barrier; its time is the slowest rank's wall time from
there to the end of its backward.  Cases are interleaved round-robin (``rounds`` passes of
``iters_per_round`` timed iterations each, after ``warmup`` untimed ones) so that drift of the
shared machine hits both policies alike; ``iter_time_s`` is the median.  ``torch.distributed``
is wrapped throughout to count calls, payload bytes (a collective's tensor once per call, each
point-to-point send) and seconds inside each kind of call per rank.  A second part times each
exchange movement alone (``movements``: broadcast-reduce vs scatter-gather for one straggler
handing all columns of an activation block ``[tokens, 4H/e]`` or a weight block ``[4H/e, H]``),
which is what explains the table.

Why emulated compute.  This box has 2 cores for 4 ranks.  Real GEMMs of 4 ranks would queue for
the cores together with gloo's copies, nothing like 4 GPUs computing side by side while links
carry the data.  So every rank's GEMMs also sleep ``flops / rate`` (straggler injection mode
``emulated`` through :class:`~semimig.straggler.BusyMeter`, chi = 1 everywhere), ``rate`` chosen
so that one rank's unmigrated GEMMs of an iteration sleep ``device_ms``.  Sleeping ranks leave
the cores to whoever communicates; receivers that compute migrated columns sleep longer, the
migrating ranks shorter.  The real GEMMs still run (their results are needed) and add their own,
contended, time (``busy_s_per_rank`` shows both).  ``--device-ms 0`` turns emulation off.

Sizes.  ``H = 256``, 1024 tokens (``tokens / H = 4``, as for ViT-1B with 64 x 65 tokens or an LLM
with 8k tokens per micro-batch), 2 blocks, ``device_ms = 40``: each shard is ``[256, 256]`` and
an activation shard ``[1024, 256]`` is 1 MiB in fp32, which gloo moves over loopback in 1-5 ms.
At ``gamma = 0`` an iteration is ~115 ms: ~70 ms of GEMMs per rank (40 emulated, ~30 real and
contended; 0.8 GFLOP per rank and block) and ~45 ms in the four all-reduces, so communication
is a plainly visible share, and migration traffic adds to it.  Larger ``H`` makes the real
GEMMs swamp everything on 2 cores; fewer tokens make every collective latency-bound.
``--quick`` halves the tokens and runs fewer iterations.

Reading the result.  On a cluster the straggler's link is the bottleneck: NCCL pipelines a
broadcast or reduce of ``B`` bytes at about ``B / bandwidth``, while scatter-gather pushes ``3B``
through the straggler's link whenever every receiver needs, or returns, a whole tensor.  On
loopback there is no link; every byte is CPU work on the 2 shared cores and every message round
a context switch.  Gloo's broadcast is an unpipelined binomial tree (the root sends the whole
block twice, ``3B`` in all, where scattering slices sends ``B``) and its reduce a segmented ring
reduce-scatter plus a gather to the root (many rounds; a zero-padded block reduced to return
disjoint slices costs far more than sending the slices).  Only the merges, which send nothing,
and the broadcast of a whole ``dY_k`` come out in broadcast-reduce's favour.  With ``nu = 2``
each straggler's broadcasts and reduces still span all 4 ranks (the other migrating rank relays
and adds zeros) while scatter-gather touches only the 2 receivers.  ``movements`` shows the
cost of each movement alone; the table adds them up, partly hidden behind the emulated compute.

Output.  The table in the paper's format (ms), the SG/BR ratio per ``gamma`` from the same run
beside the paper's, the target check (broadcast-reduce beats scatter-gather at every
``gamma > 0`` for ``nu = 1``; the paper: 1.93x at ``gamma = 1``) and the movement table.
``--json`` writes ``records`` (``policy``, ``nu``, ``gamma``, ``iter_time_s`` and the extras
above), ``ratios``, ``target`` and ``movements``.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from migration_report import GAMMAS, POLICIES, format_movements, format_table, ratios, target

NUS = (1, 2)
COUNTED_OPS = ("all_reduce", "broadcast", "reduce", "send", "recv")
# The exchange's movements (semimig.migration.exchange) timed alone, on the block they carry:
# (movement, block, times per MLP block at gamma = 1, nu = 1, where the layers use it).
MOVEMENTS = (
    ("share_block", "weight", 2, "col/row fwd W_k[:, mig]"),
    ("share_block", "activation", 1, "row fwd X_k[:, mig]"),
    ("share_whole", "activation", 1, "col bwd dY_k"),
    ("return_sum", "activation", 1, "col fwd partial Y"),
    ("merge_sum", "activation", 1, "row fwd partial Y"),
    ("merge_block", "activation", 1, "col bwd dX[:, mig]"),
    ("return_block", "activation", 1, "row bwd dX_k[:, mig]"),
    ("return_block", "weight", 2, "col/row bwd dW_k[:, mig]"),
)


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """Sizes and repetitions of one benchmark run."""

    hidden: int = 256
    """``H``: model width; the MLP is ``H -> 4H -> H``."""
    tokens: int = 1024
    """Rows of the (replicated) input: batch x sequence."""
    blocks: int = 2
    """Stacked MLP blocks."""
    world: int = 4
    """Tensor-parallel ranks ``e``."""
    nus: tuple[int, ...] = NUS
    """Numbers of migrating ranks; ranks ``1 .. nu`` migrate."""
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
    device_ms: float = 40.0
    """Emulated GEMM time of one rank per unmigrated iteration (0: no emulation)."""
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("hidden", "tokens", "blocks", "world", "rounds", "iters_per_round"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.world < 2:
            raise ValueError(f"world must be >= 2 (someone has to receive), got {self.world}")
        for name in ("warmup", "movement_iters"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if (4 * self.hidden) % self.world:
            raise ValueError(f"4 * hidden = {4 * self.hidden} is not divisible by world = {self.world}")
        if not self.nus or any(not 1 <= nu < self.world for nu in self.nus):
            raise ValueError(f"nus must be non-empty, each in [1, world - 1 = {self.world - 1}], got {self.nus!r}")
        if not self.gammas or any(not 0.0 <= g <= 1.0 for g in self.gammas):
            raise ValueError(f"gammas must be non-empty, each in [0, 1], got {self.gammas!r}")
        if not self.device_ms >= 0:
            raise ValueError(f"device_ms must be >= 0, got {self.device_ms!r}")

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


# ----------------------------------------------------------------------------- on the ranks
class _CommMeter:
    """Wraps ``torch.distributed`` calls (as tests/test_migration.py does): calls, payload, seconds."""

    def __init__(self) -> None:
        self.counts: dict[str, list] = {}
        self.take()

    def take(self) -> dict[str, list]:
        """This rank's ``{op: [calls, bytes, seconds]}`` since the last take; starts afresh."""
        counts, self.counts = self.counts, {op: [0, 0, 0.0] for op in COUNTED_OPS}
        return counts

    def __enter__(self) -> "_CommMeter":
        import torch.distributed as dist

        self._originals = {op: getattr(dist, op) for op in COUNTED_OPS}

        def wrap(op, fn):
            def call(tensor, *args, **kwargs):
                start = time.perf_counter()
                result = fn(tensor, *args, **kwargs)
                entry = self.counts[op]
                entry[0] += 1
                entry[1] += tensor.numel() * tensor.element_size()
                entry[2] += time.perf_counter() - start
                return result
            return call

        for op, fn in self._originals.items():
            setattr(dist, op, wrap(op, fn))
        return self

    def __exit__(self, *exc) -> None:
        import torch.distributed as dist

        for op, fn in self._originals.items():
            setattr(dist, op, fn)


def _slowest(times: list[list[float]]) -> list[list[float]]:
    """Element-wise maximum over ranks of equally shaped lists of seconds."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _iteration_times(rank: int, world: int, cfg: BenchConfig) -> list[dict]:
    """Time every (policy, nu, gamma) case; every rank returns the same records."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    from semimig.migration.exchange import make_exchange
    from semimig.migration.layout import MigrationLayout
    from semimig.nn import LayerDirective, Linear1D_Col, Linear1D_Row
    from semimig.straggler import BusyMeter, StragglerConfig, StragglerInjector

    group = dist.group.WORLD
    torch.manual_seed(cfg.seed)  # same dense weights and input on every rank
    h = cfg.hidden
    blocks = [(Linear1D_Col.from_native_module(nn.Linear(h, 4 * h), group),
               Linear1D_Row.from_native_module(nn.Linear(4 * h, h), group, parallel_input=True))
              for _ in range(cfg.blocks)]
    layers = [layer for block in blocks for layer in block]
    x = torch.randn(cfg.tokens, h)
    meter = None
    if cfg.device_ms > 0:
        rate = cfg.flops_per_iteration() / (cfg.device_ms / 1e3)
        emulated = StragglerConfig(pattern="none", mode="emulated", flops_per_second=rate)
        meter = BusyMeter(StragglerInjector(emulated, rank, world))
    exchanges = {policy: make_exchange(policy, group) for policy in POLICIES}
    layouts = {(nu, gamma): {kind: MigrationLayout.build(world, k, cfg.migrate(nu, gamma, k))
                             for kind, k in (("column", cfg.k_column), ("row", cfg.k_row))}
               for nu in cfg.nus for gamma in cfg.gammas}
    comm_meter = _CommMeter()
    iteration = 0

    def run(policy: str, nu: int, gamma: float) -> tuple[float, float, dict]:
        """One forward + backward: (wall seconds, busy seconds, comm counts) on this rank."""
        nonlocal iteration
        iteration += 1  # a new iteration: migrated weights are broadcast afresh
        for layer in layers:
            layer.directive = LayerDirective(iteration=iteration, layout=layouts[nu, gamma][layer.matrix_kind],
                                             exchange=exchanges[policy], timer=meter)
            for p in layer.parameters():
                p.grad = None
        if meter is not None:
            meter.reset()
        dist.barrier()
        comm_meter.take()
        start = time.perf_counter()
        y = x
        for col, row in blocks:
            y = row(nn.functional.gelu(col(y)))
        y.sum().backward()
        elapsed = time.perf_counter() - start
        return elapsed, meter.snapshot().busy_s if meter is not None else 0.0, comm_meter.take()

    cases = cfg.cases()
    times, busy, comm = ({case: [] for case in cases} for _ in range(3))
    with comm_meter:
        for case in cases:
            for _ in range(cfg.warmup):
                run(*case)
        for _ in range(cfg.rounds):
            for case in cases:
                for _ in range(cfg.iters_per_round):
                    elapsed, busy_s, counts = run(*case)
                    times[case].append(elapsed)
                    busy[case].append(busy_s)
                    comm[case].append(counts)

    slowest = _slowest([times[c] for c in cases])
    mine = {c: (statistics.median(busy[c]), comm[c][0],
                {op: statistics.mean(it[op][2] for it in comm[c]) for op in COUNTED_OPS}) for c in cases}
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    return [_record(cfg, case, sorted(slowest[i]), [g[case] for g in gathered]) for i, case in enumerate(cases)]


def _record(cfg: BenchConfig, case: tuple[str, int, float], samples: list[float], per_rank: list[tuple]) -> dict:
    """One case's record from the slowest-rank iteration times and every rank's (busy, counts, seconds)."""
    policy, nu, gamma = case
    comm = {}
    for op in COUNTED_OPS:
        if op in ("send", "recv"):  # point to point: add up every rank's calls
            calls, nbytes = (sum(r[1][op][i] for r in per_rank) for i in (0, 1))
        else:  # every rank joins each collective: rank 0 sees each call once
            calls, nbytes = per_rank[0][1][op][:2]
        comm[op] = {"calls": calls, "bytes": nbytes, "seconds_per_rank": [r[2][op] for r in per_rank]}
    return {
        "policy": policy, "nu": nu, "gamma": gamma,
        "iter_time_s": statistics.median(samples),
        "iter_time_p25_s": samples[len(samples) // 4],
        "iter_time_p75_s": samples[(3 * len(samples)) // 4],
        "iterations": len(samples),
        "migrating_ranks": sorted(cfg.migrate(nu, gamma, cfg.k_column)),
        "l_mig": {"column": round(gamma * cfg.k_column), "row": round(gamma * cfg.k_row)},
        "busy_s_per_rank": [r[0] for r in per_rank],
        "comm": comm,
        "comm_bytes": sum(v["bytes"] for op, v in comm.items() if op != "recv"),
    }


def _movement_times(rank: int, world: int, cfg: BenchConfig) -> list[dict]:
    """Each exchange movement alone: rank 1 hands all K columns of a block to the other ranks."""
    import torch
    import torch.distributed as dist

    from semimig.migration.exchange import make_exchange
    from semimig.migration.layout import MigrationLayout

    def mover(movement: str, block: torch.Tensor):
        rows, cols = block.shape
        share = MigrationLayout.build(world, cols, {1: cols}).shares[0]
        span = share.range_of(rank)
        part = block[:, span[0]:span[1]].clone() if span is not None else None
        moves = {
            "share_block": lambda ex: ex.share_block(block if rank == 1 else None, share, (rows, cols),
                                                     block.dtype, block.device),
            "share_whole": lambda ex: ex.share_whole(block.clone(), share),
            "return_sum": lambda ex: ex.return_sum(block.clone(), share),
            "return_block": lambda ex: ex.return_block(part, share, (rows, cols), block.dtype, block.device),
            "merge_sum": lambda ex: ex.merge_sum(block.clone(), block if rank != 1 else None, share),
            "merge_block": lambda ex: ex.merge_block(block.clone(), part, share),
        }
        return moves[movement]

    shapes = cfg.movement_shapes()
    times = []
    exchanges = [make_exchange(policy, dist.group.WORLD) for policy in POLICIES]
    for movement, tensor, _, _ in MOVEMENTS:
        move = mover(movement, torch.randn(*shapes[tensor]))
        samples = [[] for _ in POLICIES]
        for i in range(cfg.movement_iters + 1):  # the first round is warm-up
            for exchange, policy_samples in zip(exchanges, samples):  # policies alternate: same drift
                dist.barrier()
                start = time.perf_counter()
                move(exchange)
                if i:
                    policy_samples.append(time.perf_counter() - start)
        times.extend(samples)
    slowest = iter(_slowest(times))
    return [{"movement": movement, "tensor": tensor, "shape": list(shapes[tensor]), "per_block": per_block,
             "used_by": used_by, "policy": policy, "time_s": statistics.median(next(slowest))}
            for movement, tensor, per_block, used_by in MOVEMENTS for policy in POLICIES]


def _bench_body(rank: int, world: int, cfg: BenchConfig) -> dict:
    """Both parts on this rank; rank 0's return value is the result."""
    records = _iteration_times(rank, world, cfg)
    movements = _movement_times(rank, world, cfg) if cfg.movement_iters else []
    return {"records": records, "movements": movements} if rank == 0 else {}


def run_bench(cfg: BenchConfig, *, timeout_s: float = 900.0) -> dict:
    """Run ``cfg`` on ``cfg.world`` gloo ranks: ``{"records": [...], "movements": [...]}``."""
    from semimig.launch import run_on_ranks

    return run_on_ranks(_bench_body, cfg.world, cfg, timeout_s=timeout_s)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, required=True, help="write records, ratios, target, movements here")
    parser.add_argument("--quick", action="store_true", help="half the tokens, fewer iterations (< 2 min)")
    parser.add_argument("--hidden", type=int, help="H (default 256)")
    parser.add_argument("--tokens", type=int, help="input rows (default 1024, --quick 512)")
    parser.add_argument("--blocks", type=int, help="stacked MLP blocks (default 2)")
    parser.add_argument("--device-ms", type=float, help="emulated GEMM ms per rank and iteration; 0 = off (default 40)")
    parser.add_argument("--warmup", type=int, help="untimed iterations per case")
    parser.add_argument("--rounds", type=int, help="round-robin passes over all cases")
    parser.add_argument("--iters", type=int, help="timed iterations per case and round")
    parser.add_argument("--movement-iters", type=int, help="timed repetitions per movement; 0 = skip")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before the ranks are killed")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    fields = dict(QUICK) if args.quick else {}
    overrides = {"hidden": args.hidden, "tokens": args.tokens, "blocks": args.blocks, "device_ms": args.device_ms,
                 "warmup": args.warmup, "rounds": args.rounds, "iters_per_round": args.iters,
                 "movement_iters": args.movement_iters}
    fields.update({k: v for k, v in overrides.items() if v is not None})
    try:
        cfg = BenchConfig(**fields)
    except ValueError as err:
        print(f"migration_bench.py: error: {err}", file=sys.stderr)
        return 2
    print(f"migration bench: {len(cfg.cases())} cases x {cfg.rounds * cfg.iters_per_round} timed iterations "
          f"on {cfg.world} gloo ranks, CPU ({platform.machine()})", flush=True)
    start = time.perf_counter()
    result = run_bench(cfg, timeout_s=args.timeout)
    print(format_table(result["records"], cfg))
    if result["movements"]:
        print(format_movements(result["movements"]))
    print(f"wall time {time.perf_counter() - start:.0f} s")
    out = {
        "benchmark": "migration_bench",
        "argv": sys.argv[1:] if argv is None else list(argv),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "device": "cpu"},
        "config": asdict(cfg),
        "records": result["records"],
        "ratios": ratios(result["records"]),
        "target": target(result["records"]),
        "movements": result["movements"],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
