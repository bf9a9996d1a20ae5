"""Pretest: measure the SEMI cost curves Ω1, Ω2, Φ1, Φ2 on the real group (paper Alg. 2, line 1).

Every sample is the cost, in seconds per iteration, of shedding a share ``s`` of the K columns
of *every* semimig layer of the model (so it is in the units of the busy times the controller
compares).  Column counts handed to the curves are ``n = s · REFERENCE_COLUMNS``.

    Ω1 + Ω2(n)  resizing overhead: the real pruned path (gather forward, dgrad and wgrad with the
                zero fill) at ``n`` pruned columns, minus dense GEMMs of the kept width
                ``(1 − s)K``; ``Ω1`` is the smallest sampled overhead, ``Ω2`` the rest
    Φ1(n)       migration traffic: broadcast ``w[:, mig]`` and ``dY`` ``[M, N]``, reduce ``[M, N]``
                partial outputs and ``[N, |mig|]`` weight gradients, straggler = group rank 0
                (a column layer's pattern, an upper bound for row layers)
    Φ2(n)       receiver compute: forward, dgrad and wgrad GEMMs on n-share columns

One currency (DESIGN §3a).  Compute costs (Ω, Φ2) are charged the way the iteration's busy time
is: through ``gemm_timer`` (the runtime passes its :class:`~semimig.straggler.busy.BusyMeter`),
so on real compute they are measured wall times (a straggler's own injected slowdown included)
and under the emulated device they are the emulated device time (which charges FLOPs only:
``Ω = 0`` there, as on a device whose gathers are free).  Φ1 is the wall time of real
collectives in both cases — the emulation models compute, not the network.  Without a timer
every sample is wall time.

A paired MLP (``ResizingConfig(paired=True)``) prunes along another path, and the pretest times
that one for its layers: a shape ``(M, N, K, "rows")`` is a paired column layer (it computes only
the output rows it keeps, whole K) and ``(M, N, K, "compact")`` a paired row layer (its input
arrives compact over the kept columns); ``(M, N, K)`` or ``"gather"`` is the per-layer path.

Spread over training (:class:`PretestRun`): the runtime runs one small task per training step
(one kind of timing at one share, for every distinct layer shape, ~1/36 of the whole pretest),
so no step stalls; SEMI resizes only until the curves exist.

Each rank measures, then the samples are all-reduced so that every rank fits the same curves
from the same numbers (plans must be identical everywhere): MAX for the straggler-side and
traffic costs, MIN for Φ2, because receivers are the fast ranks.  Shapes come from the layers
(``[N, K]`` weight shards) and the token count ``M`` seen in training.
"""
from __future__ import annotations

import collections
import logging
import math
import time
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from semimig.comm import primitives as P
from semimig.controller.curves import CostCurves

logger = logging.getLogger(__name__)

PATHS = ("gather", "rows", "compact")
"""How a layer prunes: its own K columns gathered (``gather``), or as half of a paired MLP —
output rows only (``rows``, the column layers) or a compact input (``compact``, the row layer)."""

REFERENCE_COLUMNS = 1000
"""Columns of the reference layer the curves and plans count in (shares × 1000)."""


def _best_of(fn: Callable[[], object], repeats: int, timer=None) -> float:
    """Smallest of ``repeats`` timings of ``fn``: busy-time deltas of ``timer`` if given, else wall time."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    best = float("inf")
    for _ in range(repeats):
        if timer is not None:
            before = timer.snapshot().busy_s
            fn()
            best = min(best, timer.snapshot().busy_s - before)
            continue
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def _charged(timer, gemm: Callable[[], object], flops: int, full_flops: int):
    """``gemm()``'s result, its time charged to ``timer`` (the busy meter) when there is one."""
    if timer is None:
        return gemm()
    return timer.timed(gemm, flops=flops, full_flops=full_flops)


def _shape_with_path(shape: Sequence) -> tuple[int, int, int, str]:
    """``(M, N, K)`` or ``(M, N, K, path)`` -> ``(M, N, K, path)``, the path one of :data:`PATHS`."""
    if len(shape) not in (3, 4):
        raise ValueError(f"a pretest shape is (M, N, K) or (M, N, K, path), got {tuple(shape)!r}")
    m, n, k, *path = shape
    path = path[0] if path else "gather"
    if path not in PATHS:
        raise ValueError(f"a pretest shape's path must be one of {PATHS}, got {path!r}")
    return int(m), int(n), int(k), path


class PretestRun:
    """The pretest as a list of small tasks, so it can be spread over ordinary training steps.

    A task is one timing of one kind at one share for one distinct layer shape: ``pruned``
    (the straggler's three GEMMs on the kept columns, gathers and zero fill included), ``kept``
    (dense GEMMs of the kept width, the physical limit), ``traffic`` (a column layer's migration
    traffic, collective) and ``moved`` (dense GEMMs of the shed width, the receivers' work); the
    tasks cycle through the shares ``repeats`` times, a (kind, share) sums its shapes (each
    counted as often as it occurs) within a repeat and keeps its best (smallest) sum.  One shape
    per task bounds what a task adds to the step it runs in: at most the three GEMMs of one
    layer, where one task over every shape would add the whole model's GEMMs again, slowed as
    much as the throttled rank is.  :meth:`advance` runs the next ``tasks`` of them; once all
    have run it all-reduces the samples (MAX for the straggler-side and traffic costs, MIN for
    Φ2) and returns them.

    Collective: every rank of ``group`` runs the same tasks in the same order (the runtime
    advances it once per ``step()`` on every rank, from a decision identical everywhere).
    """

    KINDS = ("pruned", "kept", "traffic", "moved")

    def __init__(self, shapes: Sequence[tuple[int, int, int]], group, *,
                 shares: Sequence[float] = (0.25, 0.5, 0.75), repeats: int = 3, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", gemm_timer=None) -> None:
        if not shapes:
            raise ValueError("the pretest needs at least one (M, N, K) layer shape")
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
        for share in shares:
            if not 0.0 < share < 1.0:
                raise ValueError(f"pretest shares must be in (0, 1), got {share}")
        from semimig.kernels.backend import resolve_backend

        self.group, self.shares, self.dtype, self.timer = group, tuple(shares), dtype, gemm_timer
        self.backend = resolve_backend(torch.device(device), dtype)
        # Transformer blocks repeat their shapes: each distinct (M, N, K, path) is measured once and
        # counted as often as it occurs (a 32-block model costs what one block costs).
        distinct = collections.Counter(_shape_with_path(shape) for shape in shapes)
        self._gen = torch.Generator().manual_seed(0)
        # The GEMM operands are drawn where they are used: nothing of their size is built on the host.
        device = torch.device(device)
        gen = self._gen if device.type == "cpu" else torch.Generator(device=device).manual_seed(0)

        def draw(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, generator=gen, device=device, dtype=dtype)

        self.tensors = [(draw(m, k), draw(n, k), draw(m, n), count, path) for (m, n, k, path), count in distinct.items()]
        self.tasks = [(kind, share, rep, shape) for rep in range(repeats) for share in self.shares
                      for kind in self.KINDS for shape in range(len(self.tensors))]
        self.sums: dict[tuple[str, float, int], float] = collections.defaultdict(float)
        """Per (kind, share, repeat): the seconds of the shapes measured so far."""
        self.position = 0

    @property
    def remaining(self) -> int:
        """Tasks still to run."""
        return len(self.tasks) - self.position

    def advance(self, tasks: int = 1) -> Optional[dict]:
        """Run the next ``tasks`` tasks; the samples once the last has run (see :meth:`run_all`), else ``None``."""
        for kind, share, rep, shape in self.tasks[self.position:self.position + tasks]:
            if kind == "traffic" and P.group_size(self.group) > 1:
                dist.barrier(group=self.group)  # start aligned: the traffic time is not a wait for a peer
            t = self.tensors[shape]
            self.sums[kind, share, rep] += t[3] * _best_of(self._closure(kind, share, t), 1,
                                                          None if kind == "traffic" else self.timer)
            self.position += 1
        return self._samples() if self.remaining == 0 else None

    @property
    def best(self) -> dict[tuple[str, float], float]:
        """Per (kind, share): the smallest of its repeats' sums over the shapes."""
        best: dict[tuple[str, float], float] = {}
        for (kind, share, _), seconds in self.sums.items():
            best[kind, share] = min(best.get((kind, share), math.inf), seconds)
        return best

    def run_all(self) -> dict:
        """Every task now: ``{"omega1": [...], "omega2": (ns, s), "phi1": (ns, s), "phi2": (ns, s)}``."""
        return self.advance(self.remaining)

    def _closure(self, kind: str, share: float, t: tuple) -> Callable[[], object]:
        x, w, dy, _, path = t
        timer, backend = self.timer, self.backend
        if kind == "pruned" and path != "gather":
            return self._paired_closure(path, share, x, w, dy)
        if kind == "pruned":  # the layers' own path: one validated plan per keep set
            from semimig.kernels import ops as kernel_ops
            from semimig.kernels import plan_keep

            keep = torch.randperm(w.shape[1], generator=self._gen)[:max(1, round(w.shape[1] * (1.0 - share)))]
            plan = plan_keep(keep.sort().values.to(w.device), w.shape[1], w.device,
                             group=1 if backend == "torch" else None)
            flops, full = 2 * x.shape[0] * w.shape[0] * plan.n_kept, 2 * x.shape[0] * w.shape[0] * w.shape[1]

            def run():
                _charged(timer, lambda: kernel_ops.fwd(backend, x, w, None, plan), flops, full)
                _charged(timer, lambda: kernel_ops.dgrad(backend, dy, w, plan), flops, full)
                _charged(timer, lambda: kernel_ops.wgrad(backend, dy, x, plan), flops, full)
            return run
        if kind == "traffic":
            # Per layer and iteration, a column layer's traffic in training: two broadcasts
            # (w[:, mig], dY_k) and two reduces (partial outputs, dW_k[:, mig]).  A row layer
            # needs one reduce fewer (dX_k and dW_k travel stacked), so Φ1 is an upper bound there.
            c, group, dtype = max(1, round(w.shape[1] * share)), self.group, self.dtype

            def run():
                P.broadcast_(w[:, :c].contiguous(), 0, group)
                P.broadcast_(dy.clone(), 0, group)
                P.reduce_(dy.clone(), 0, group)
                P.reduce_(torch.zeros(w.shape[0], c, dtype=dtype, device=w.device), 0, group)
            return run
        # dense GEMMs of a narrower width: "kept" the straggler's limit, "moved" the receivers' work
        fraction, straggler_side = (1.0 - share, True) if kind == "kept" else (share, False)
        c = max(1, round(w.shape[1] * fraction))
        xs, ws = x[:, :c], w[:, :c]
        flops = 2 * x.shape[0] * w.shape[0] * c
        full = 2 * x.shape[0] * w.shape[0] * w.shape[1] if straggler_side else 0

        def run():
            for gemm in (lambda: F.linear(xs, ws), lambda: dy.matmul(ws), lambda: dy.t().matmul(xs)):
                _charged(timer, gemm, flops, full)
        return run

    def _paired_closure(self, path: str, share: float, x, w, dy) -> Callable[[], object]:
        """A paired MLP's half, on the layers' own functions (:mod:`semimig.kernels.reference`):
        ``rows`` keeps ``(1 − s)·N`` output rows (operands ``x [M, K]``, ``dy_S``), ``compact``
        ``(1 − s)·K`` input columns (``x_S`` already compact).  The same FLOPs as the per-layer path."""
        from semimig.kernels import plan_keep
        from semimig.kernels.reference import compact_linear_fwd, compact_linear_wgrad, rows_linear_fwd, rows_linear_wgrad

        timer, (n, k) = self.timer, w.shape
        units = n if path == "rows" else k
        keep = torch.randperm(units, generator=self._gen)[:max(1, round(units * (1.0 - share)))].sort().values
        keep = keep.to(w.device)
        full = 2 * x.shape[0] * n * k
        if path == "rows":
            dy_rows, flops = dy[:, :keep.numel()].contiguous(), 2 * x.shape[0] * keep.numel() * k

            def run():
                w_rows, _ = _charged(timer, lambda: rows_linear_fwd(x, w, None, keep), flops, full)
                _charged(timer, lambda: dy_rows.matmul(w_rows), flops, full)
                _charged(timer, lambda: rows_linear_wgrad(dy_rows, x, keep, n), flops, full)
            return run
        plan = plan_keep(keep, k, w.device, group=1)
        x_kept, flops = x[:, :plan.n_kept].contiguous(), 2 * x.shape[0] * n * plan.n_kept

        def run():
            w_kept, _ = _charged(timer, lambda: compact_linear_fwd(x_kept, w, plan), flops, full)
            _charged(timer, lambda: dy.matmul(w_kept), flops, full)
            _charged(timer, lambda: compact_linear_wgrad(dy, x_kept, plan), flops, full)
        return run

    def _samples(self) -> dict:
        b = self.best
        overheads = [max(0.0, b["pruned", s] - b["kept", s]) for s in self.shares]
        omega1 = min(overheads)
        values_local = [omega1] + [v for o, s in zip(overheads, self.shares)
                                   for v in (o - omega1, b["traffic", s], b["moved", s])]
        group = self.group
        samples = torch.tensor(values_local, dtype=torch.float64, device=P.collective_device(group))
        phi2 = torch.zeros_like(samples, dtype=torch.bool)
        phi2[3::3] = True  # rows: omega1, then (omega2, phi1, phi2) per share
        if P.group_size(group) > 1:
            high, low = samples.clone(), samples.clone()
            dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
            dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
            samples = torch.where(phi2, low, high)
        values = samples.cpu().tolist()
        ns = [share * REFERENCE_COLUMNS for share in self.shares]
        per = [values[1 + 3 * i: 4 + 3 * i] for i in range(len(self.shares))]
        return {
            "omega1": [values[0]],
            "omega2": (ns, [p[0] for p in per]),
            "phi1": (ns, [p[1] for p in per]),
            "phi2": (ns, [p[2] for p in per]),
        }


def measure_cost_samples(shapes: Sequence[tuple[int, int, int]], group, *, shares: Sequence[float] = (0.25, 0.5, 0.75),
                         repeats: int = 3, dtype: torch.dtype = torch.float32,
                         device: torch.device | str = "cpu", gemm_timer=None) -> dict:
    """Raw samples ``{"omega1": [...], "omega2": (ns, s), "phi1": (ns, s), "phi2": (ns, s)}``, all at once.

    ``shapes``: ``(M, N, K)`` of every semimig GEMM of one iteration on this rank.  Collective:
    every rank of ``group`` must call it with the same shapes and shares.
    """
    return PretestRun(shapes, group, shares=shares, repeats=repeats, dtype=dtype, device=device,
                      gemm_timer=gemm_timer).run_all()


def fit_curves(samples: dict) -> CostCurves:
    """Affine cost curves through the samples of :class:`PretestRun`; logs the result."""
    curves = CostCurves.fit(omega1_seconds=samples["omega1"], omega2_samples=samples["omega2"],
                            phi1_samples=samples["phi1"], phi2_samples=samples["phi2"])
    logger.info("pretest cost curves: %s", curves.to_dict())
    return curves


def run_pretest(shapes: Sequence[tuple[int, int, int]], group, **kwargs) -> CostCurves:
    """Measure (see :func:`measure_cost_samples`) and fit affine cost curves; logs the result."""
    return fit_curves(measure_cost_samples(shapes, group, **kwargs))
