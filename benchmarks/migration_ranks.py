"""What ``benchmarks/migration_bench.py`` runs on each rank: timed iterations, movements, a link sweep.

Every function is called on every rank of the gloo group with the same
``migration_bench.BenchConfig`` and returns the same records everywhere (times are the slowest
rank's, per-rank figures are all-gathered).  Communication is counted at semimig's primitive
calls (:func:`semimig.comm.traffic.count_traffic`): payload per call and the bytes each rank's
own link carries under a pipelined-collective model.
"""
from __future__ import annotations

import statistics
import time

from migration_report import POLICIES

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
STRAGGLER = 1
"""The migrating rank whose link the records follow (ranks ``1 .. nu`` migrate)."""


def _slowest(times: list[list[float]]) -> list[list[float]]:
    """Element-wise maximum over ranks of equally shaped lists of seconds."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def iteration_times(rank: int, world: int, cfg) -> list[dict]:
    """Time every (policy, nu, gamma) case; every rank returns the same records."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    from semimig.comm.traffic import count_traffic
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
    exchanges = {policy: make_exchange(policy, group, algorithm=cfg.br_algorithm) for policy in POLICIES}
    layouts = {(nu, gamma): {kind: MigrationLayout.build(world, k, cfg.migrate(nu, gamma, k))
                             for kind, k in (("column", cfg.k_column), ("row", cfg.k_row))}
               for nu in cfg.nus for gamma in cfg.gammas}
    iteration = 0

    def run(counter, policy: str, nu: int, gamma: float) -> tuple[float, float, dict]:
        """One forward + backward: (wall seconds, busy seconds, traffic totals) on this rank."""
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
        counter.reset()
        start = time.perf_counter()
        y = x
        for col, row in blocks:
            y = row(nn.functional.gelu(col(y)))
        y.sum().backward()
        elapsed = time.perf_counter() - start
        return elapsed, meter.snapshot().busy_s if meter is not None else 0.0, counter.reset()

    cases = cfg.cases()
    times, busy, comm = ({case: [] for case in cases} for _ in range(3))
    with count_traffic() as counter:
        for case in cases:
            for _ in range(cfg.warmup):
                run(counter, *case)
        for _ in range(cfg.rounds):
            for case in cases:
                for _ in range(cfg.iters_per_round):
                    elapsed, busy_s, counts = run(counter, *case)
                    times[case].append(elapsed)
                    busy[case].append(busy_s)
                    comm[case].append(counts)

    slowest = _slowest([times[c] for c in cases])
    mine = {c: (statistics.median(busy[c]), comm[c][0],
                {op: statistics.mean(it.get(op, {}).get("seconds", 0.0) for it in comm[c]) for op in COUNTED_OPS})
            for c in cases}
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    return [_record(cfg, case, slowest[i], [g[case] for g in gathered]) for i, case in enumerate(cases)]


def _record(cfg, case: tuple[str, int, float], samples: list[float], per_rank: list[tuple]) -> dict:
    """One case's record from the slowest-rank iteration times (in run order) and every rank's figures."""
    policy, nu, gamma = case
    comm = {}
    for op in COUNTED_OPS:
        counts = [r[1].get(op, {}) for r in per_rank]
        if op in ("send", "recv"):  # point to point: add up every rank's calls
            calls, nbytes = (sum(c.get(key, 0) for c in counts) for key in ("calls", "payload_bytes"))
        else:  # every rank joins each collective: rank 0 sees each call once
            calls, nbytes = counts[0].get("calls", 0), counts[0].get("payload_bytes", 0)
        comm[op] = {"calls": calls, "bytes": nbytes, "seconds_per_rank": [r[2][op] for r in per_rank]}
    straggler = per_rank[STRAGGLER][1]
    link = {key: sum(v[key] for op, v in straggler.items() if op != "all_reduce")
            for key in ("calls", "out_bytes", "in_bytes")}
    rounds = [samples[i:i + cfg.iters_per_round] for i in range(0, len(samples), cfg.iters_per_round)]
    ordered = sorted(samples)
    return {
        "policy": policy, "nu": nu, "gamma": gamma,
        "iter_time_s": statistics.median(ordered),
        "iter_time_p25_s": ordered[len(ordered) // 4],
        "iter_time_p75_s": ordered[(3 * len(ordered)) // 4],
        "round_medians_s": [statistics.median(r) for r in rounds],
        "iterations": len(samples),
        "migrating_ranks": sorted(cfg.migrate(nu, gamma, cfg.k_column)),
        "l_mig": {"column": round(gamma * cfg.k_column), "row": round(gamma * cfg.k_row)},
        "busy_s_per_rank": [r[0] for r in per_rank],
        "comm": comm,
        "comm_bytes": sum(v["bytes"] for op, v in comm.items() if op != "recv"),
        "straggler_link": {"rank": STRAGGLER, **link},
    }


def movement_times(rank: int, world: int, cfg) -> list[dict]:
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
    exchanges = [make_exchange(policy, dist.group.WORLD, algorithm=cfg.br_algorithm) for policy in POLICIES]
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


def link_sweep(rank: int, world: int, cfg) -> dict:
    """Seconds per message size: ping-pong between ranks 0 and 1 (half a round trip) and a broadcast
    from rank 0 to the whole group (slowest rank), fastest and median of the messages.  The fit uses
    the fastest: on a shared machine the median carries other processes' load, not the link's cost."""
    import torch
    import torch.distributed as dist

    from semimig.comm import primitives as P

    group = dist.group.WORLD
    ping, bcast = [], []
    for nbytes in cfg.link_sizes:
        buf = torch.zeros(nbytes // 4)
        one_way, spread = [], []
        for i in range(cfg.link_iters + 1):  # the first exchange is warm-up
            dist.barrier()
            start = time.perf_counter()
            if rank == 0:
                P.send(buf, 1, group)
                P.recv_(buf, 1, group)
            elif rank == 1:
                P.recv_(buf, 0, group)
                P.send(buf, 0, group)
            elapsed = (time.perf_counter() - start) / 2
            dist.barrier()
            start = time.perf_counter()
            P.broadcast_(buf, 0, group)
            if i:
                one_way.append(elapsed)
                spread.append(time.perf_counter() - start)
        ping.append(one_way)
        bcast.append(spread)
    ping_slowest, bcast_slowest = _slowest(ping), _slowest(bcast)
    return {"sizes": list(cfg.link_sizes),
            "ping_pong_s": [min(s) for s in ping_slowest], "broadcast_s": [min(s) for s in bcast_slowest],
            "ping_pong_median_s": [statistics.median(s) for s in ping_slowest],
            "broadcast_median_s": [statistics.median(s) for s in bcast_slowest]}


def bench_body(rank: int, world: int, cfg) -> dict:
    """Every part on this rank; rank 0's return value is the result."""
    import torch

    torch.set_num_threads(1)  # one thread per rank, ranks <= cores in measured mode
    records = iteration_times(rank, world, cfg)
    movements = movement_times(rank, world, cfg) if cfg.movement_iters else []
    link = link_sweep(rank, world, cfg) if cfg.link_iters else None
    return {"records": records, "movements": movements, "link": link} if rank == 0 else {}
