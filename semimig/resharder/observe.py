"""What the re-sharder observes: each step's split of every rank's work, and the device probe.

A step's row per rank is its compute seconds (the controller's clock: wall minus time in
collectives), the GEMM seconds of semimig's paired layers, the seconds between a pair's two layers
(the attention core, the activation: shardable too), its seconds in collectives, an injected
whole-device sleep, the wall time and the work fraction it ran at.  While a straggler prunes or
migrates, :func:`unshed` scales its GEMM seconds up to full work from this step's own measurement,
so the policy reads the rank's speed, not its shrunk work.  With several replicas sharing one plan,
:func:`slowest_per_position` reads the slowest rank at each TP position.  :func:`probe_times`
times the same fixed work on every rank before the first step.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Optional

import torch
import torch.distributed as dist

from semimig._validate import check_int
from semimig.comm import primitives as P
from semimig.controller.reshard import PROBE_REPEATS, ReshardSample
from semimig.controller.timing import dense_equivalent
from semimig.errors import ConfigError
from semimig.straggler.clock import Span

__all__ = ["PROBE_MAX_SIZE", "PROBE_TARGET_S", "ProbeWork", "gemm_baseline", "probe_times", "row_sample",
           "slowest_per_position", "step_sample", "unshed"]

PROBE_TARGET_S = 0.1
"""Seconds one repeat of the device probe takes on the fastest rank (:func:`probe_times`).  A repeat must
hold several products on every device: a repeat of one product reads its start-up (thread wake-up, cache,
a clock ramping up) and where in its time base a quota or power limit caught it, and can read a slow
rank well off its steady speed.  The whole cost is paid once, at enable time: ``PROBE_REPEATS``
repeats, each ``target_s`` times the slowest rank's slowdown; a rank that skips the step reruns at most a
quarter of a step of it (:mod:`semimig.resharder.idle`)."""
PROBE_MAX_SIZE = 4096
"""Largest side of the probe's matrices (the model's hidden size below it): 3 x 64 MB in fp32."""


def unshed(compute_s: float, shardable_s: float, *, sleep_s: float, work: float, fixed: float) -> tuple[float, float]:
    """A rank's ``(compute, shardable)`` seconds at full work, from a step it ran at work fraction
    ``work`` (pruned or migrated columns; 1: nothing shed, returned as measured).

    The GEMM time model of :mod:`semimig.controller.timing`: ``b = S·(f + (1 − f)·w)``, so the full
    work's GEMM seconds are ``S = b / (f + (1 − f)·w)`` (its :func:`~semimig.controller.timing.dense_equivalent`;
    ``f`` the fitted fixed fraction, 0 where it is
    not a number in ``[0, 1)``); the extra ``S − b`` is added to both, scaled by ``c / (c − sleep)``
    (an emulated whole-device straggler's sleep slows the extra work alike; 1 on a real device).
    """
    if not 0.0 < work < 1.0 or shardable_s <= 0.0:
        return compute_s, shardable_s
    f = fixed if 0.0 <= fixed < 1.0 else 0.0  # NaN (no estimate yet) fails the test too
    extra = dense_equivalent(shardable_s, work, f) - shardable_s
    scale = compute_s / (compute_s - sleep_s) if compute_s > sleep_s > 0.0 else 1.0
    return compute_s + extra * scale, shardable_s + extra * scale


def slowest_per_position(rows: list[list[float]], *, tp: int) -> list[list[float]]:
    """One row per TP position from every rank's row of a tp x dp grid (DESIGN §8: every DP replica
    holds the same plan, so it is planned for the slowest rank at each TP position).

    ``rows[i] = [tp_rank, dp_rank, compute, shardable, comm, gemm, ...]`` (any order, one per rank;
    seconds at full work; a row may stop after ``compute``, as the device probe's do).  Replica ``d``'s fastest compute is ``c_d``; position ``r`` takes the row
    of the replica where ``compute / c_d`` is largest (the rank slowest *relative to its own replica*,
    so a replica that Poplar gives more samples is not mistaken for a slow one; ties: the lowest
    ``dp_rank``), its compute, shardable and GEMM seconds put on one time base (scaled by
    ``mean_d c_d / c_d``; the seconds in collectives and the other columns as they are).  One
    replica: its rows, unchanged."""
    by_replica: dict[int, dict[int, list[float]]] = {}
    for row in rows:
        by_replica.setdefault(int(row[1]), {})[int(row[0])] = row
    replicas = sorted(by_replica)
    if any(sorted(by_replica[d]) != list(range(tp)) for d in replicas):
        raise ConfigError(f"slowest_per_position: every replica needs one row per TP rank 0..{tp - 1}, got "
                          f"{ {d: sorted(by_replica[d]) for d in replicas} }")
    if len(replicas) == 1:
        return [by_replica[replicas[0]][r] for r in range(tp)]
    fastest = {d: min(by_replica[d][r][2] for r in range(tp)) for d in replicas}
    base = sum(fastest.values()) / len(replicas)
    out = []
    for r in range(tp):
        d = max(replicas, key=lambda d: (by_replica[d][r][2] / fastest[d] if fastest[d] > 0 else 0.0, -d))
        scale = base / fastest[d] if fastest[d] > 0 else 1.0
        row = list(by_replica[d][r])
        for i in (2, 3, 5):
            if i < len(row):
                row[i] *= scale
        out.append(row)
    return out


class ProbeWork:
    """The device probe's fixed work on ``device``: products of two ``size x size`` matrices of constant
    values (the global random stream is not touched), touched once at construction."""

    def __init__(self, size: int, *, device: Any = None, dtype: Any = None) -> None:
        check_int("size", size, minimum=1)
        device = torch.device(device or "cpu")
        self.a = torch.full((size, size), 1.0 / size, device=device, dtype=dtype or torch.float32)
        self.b, self.c = self.a.clone(), torch.empty_like(self.a)
        self.device = device
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.run(1)  # first touch

    def run(self, n: int) -> float:
        """Seconds of ``n`` products on the device, from the end of the work queued before them to the end of
        theirs (:class:`~semimig.straggler.clock.Span`: one wait; the probe's work is timed on purpose, at
        enable time or on a rank that skips the step)."""
        span = Span(self.device)
        for _ in range(n):
            torch.mm(self.a, self.b, out=self.c)
        return span.seconds()


def probe_times(group: Any, clock: Any = None, *, size: int, device: Any = None, dtype: Any = None,
                repeats: int = PROBE_REPEATS, target_s: float = PROBE_TARGET_S,
                work: Optional[dict] = None) -> list[list[float]]:
    """Every rank's seconds for the same fixed work, ``repeats`` times: ``out[i][r]`` (collective over
    ``group``; identical on every rank).

    The work is ``n`` products of :class:`ProbeWork`, ``n`` chosen from one timed product so that the
    *fastest* rank takes about ``target_s``; every rank runs the same ``n``.  Each repeat ends with a
    one-element all-reduce, so that an emulated whole-device straggler (``scope=device``) sleeps its
    slowdown of the repeat there (:class:`~semimig.straggler.device.DeviceClock`), and a repeat's seconds
    are the clock's compute (wall minus time in collectives: a fast rank's wait for the slow one is not
    its work).

    Without a clock a repeat's seconds are its own products alone, between two synchronisations of
    the device (enable-time code): on CUDA the boundary's all-reduce returns at enqueue and the next
    repeat's products queue behind it, so a repeat timed from the host without the first wait would
    hold the slowest rank's previous repeat and every rank would read the same time."""
    check_int("repeats", repeats, minimum=1)
    probe = ProbeWork(size, device=device, dtype=dtype)
    one = min(P.all_gather_floats(probe.run(1), group))
    n = max(1, min(10_000, math.ceil(target_s / max(one, 1e-7))))
    if work is not None:  # what one repeat ran: the idle ranks' probe reruns it (semimig.resharder.idle)
        work.update(size=size, n=n)
    flag = torch.zeros(1, device=P.collective_device(group))
    seconds = []
    for _ in range(repeats):
        probe.sync()  # the previous boundary's all-reduce (and the wait for the slowest rank in it) is done
        if clock is not None:
            clock.take()
        elapsed = probe.run(n)  # without a clock: the work alone, not the wait for the others
        dist.all_reduce(flag, group=group)  # the repeat's boundary (an emulated straggler sleeps before it)
        seconds.append(clock.take().compute_s if clock is not None else elapsed)
    columns = P.all_gather_rows(seconds, group)  # columns[r][i]: rank r, repeat i
    return [[columns[r][i] for r in range(len(columns))] for i in range(repeats)]


def row_sample(rows: list[list[float]]) -> ReshardSample:
    """The policy's sample from one replica's rows ``[tp_rank, dp_rank, compute, shardable, comm, gemm, …]``
    in TP rank order (seconds at full work); ``row[10]`` and ``row[11]``, where rows carry them, are the
    rank's data-parallel wait and its optimizer step (NaN: not told apart, not timed)."""
    def column(i: int) -> Optional[tuple[float, ...]]:
        values = tuple(r[i] for r in rows) if len(rows[0]) > i else ()
        return values if values and not any(math.isnan(v) for v in values) else None

    return ReshardSample(tuple(r[2] for r in rows), tuple(r[3] for r in rows), tuple(r[4] for r in rows),
                         gemm_s=tuple(r[5] for r in rows), dp_wait_s=column(10), update_s=column(11))


def step_sample(split: list[tuple[float, float]], rows: list[list[float]], *,
            step_s: Optional[float] = None) -> ReshardSample:
    """The policy's sample from each rank's unshed ``(compute, GEMM)`` and its gathered row: the pair's
    non-GEMM work (attention core, activation, ``row[6]``) is shardable too; pruning does not shrink it."""
    return ReshardSample(tuple(c for c, _ in split), tuple(b + row[6] for (_, b), row in zip(split, rows)),
                         tuple(row[2] for row in rows), gemm_s=tuple(b for _, b in split), step_s=step_s)


def gemm_baseline(samples: Any, size: int) -> Optional[tuple[float, ...]]:
    """Per rank, its median GEMM seconds (``ReshardSample.gemm``: what the resizing controller's busy
    time measures, not the spans between a pair's layers) over ``samples``, the busy times the plan in
    force was measured at (``None`` without samples, or where a rank's median is not positive).  A
    resizing controller on top compares each rank with its own baseline (what *varies*) and aims at
    the ranks' real times (:class:`~semimig.controller.shedding.ShedPolicy`).  The GEMMs' own split, not
    the shardable one: an uneven plan gives a rank a share of the attention core different from its
    share of the GEMMs, so a baseline from GEMMs + spans reads a balanced rank slow."""
    samples = list(samples)
    if not samples:
        return None
    medians = tuple(statistics.median(s.gemm[r] for s in samples) for r in range(size))
    return medians if all(m > 0.0 for m in medians) else None
