"""A pool of ranks per world size, kept for the whole test run: many cases per process start.

    run_pooled(body, world_size, *args, timeout_s=60)   # same contract as semimig.launch.run_on_ranks

:func:`semimig.launch.run_on_ranks` forks ``world_size`` fresh ranks and makes a fresh gloo group
for every call; each rank then imports what its body needs (transformers, Colossal-AI's plugins),
builds its process groups and exits.  Here the ranks of one world size are started once (from the
same preloaded forkserver), join one gloo group once, and then run case after case:

- the parent sends every rank ``(body, args)`` (``body`` pickled by reference, as for
  ``run_on_ranks``); each rank calls ``body(rank, world_size, *args)`` and sends back ``("ok",
  result)`` or ``("error", traceback)`` over the protocol of :mod:`semimig.launch`, so the parent
  supervises it with the very code ``run_on_ranks`` uses (:func:`semimig.launch._supervise`): the
  same per-case deadline (``timeout_s``), the same blame (a rank that raised, died, froze or was
  stopped, with its traceback), the same :class:`~semimig.launch.RankFailure` /
  :class:`~semimig.launch.RanksTimedOut`;
- after ANY failure the pool is killed and reaped at once (its group may hold a half-done
  collective) and the next case starts a fresh one: a failing or hanging case fails itself, never
  the cases after it and never the suite;
- between cases every rank puts back what a case may change and a fresh process would not carry:
  the environment, the default dtype, grad mode, the RNG seed torch starts with, ``torch.Tensor``'s
  methods (tests patch ``Tensor.cuda``), warnings filters, Colossal-AI's ``Randomizer`` index
  (pipeline stages advance it differently: it must start at 0 on every rank);
- the process groups a case makes (Colossal-AI's meshes call ``dist.new_group``) stay alive, since
  a library may cache them; when rank 0 counts more than :data:`MAX_GROUPS` the pool is retired
  after that case and the next one starts fresh, so sockets stay bounded.

Set ``SEMIMIG_TEST_POOL=0`` to run every pooled case in fresh ranks instead (to rule the pool out
when a case misbehaves).  Cases that need a fresh process (their own ``init_process_group``,
another backend, signals to the rank) call ``run_on_ranks`` from :mod:`dist_harness` instead.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import gc
import os
import pickle
import signal
import sys
import threading
import traceback
import warnings
from typing import Any, Callable, Optional

from semimig import launch
from semimig.launch import RankFailure, run_on_ranks

__all__ = ["RankPool", "run_pooled", "shutdown_pools", "MAX_GROUPS", "pool_stats"]

MAX_GROUPS = 64  # process groups alive in one pool rank before the pool is retired
COLLECTIVE_TIMEOUT_S = 60.0  # every group of a pool; a case's own deadline usually comes first
_POOLS: dict[int, "RankPool"] = {}
_STATS = {"spawned": 0, "cases": 0, "failures": 0}


def pool_stats() -> dict:
    """How many pools were started, cases run in them and failures that retired one (this process)."""
    return dict(_STATS)


# ------------------------------------------------------------------------------------------ rank
def _snapshot() -> dict:
    import torch

    return {"environ": dict(os.environ), "dtype": torch.get_default_dtype(), "grad": torch.is_grad_enabled(),
            "tensor": {k: v for k, v in vars(torch.Tensor).items() if callable(v) or isinstance(v, property)},
            "warnings": list(warnings.filters), "threads": torch.get_num_threads()}


def _restore(state: dict, seed: int) -> None:
    import torch

    if os.environ != state["environ"]:
        os.environ.clear()
        os.environ.update(state["environ"])
    torch.set_default_dtype(state["dtype"])
    torch.set_grad_enabled(state["grad"])
    for name in [k for k in vars(torch.Tensor) if k not in state["tensor"]]:
        with contextlib.suppress(AttributeError, TypeError):
            delattr(torch.Tensor, name)
    for name, value in state["tensor"].items():
        if vars(torch.Tensor).get(name) is not value:
            with contextlib.suppress(AttributeError, TypeError):
                setattr(torch.Tensor, name, value)
    warnings.filters[:] = state["warnings"]
    torch.set_num_threads(state["threads"])
    torch.manual_seed(seed)
    layer_utils = sys.modules.get("colossalai.shardformer.layer.utils")
    if layer_utils is not None:  # a class-wide counter of sharded layers, 0 in a fresh process; pipeline
        layer_utils.Randomizer.reset_index()  # stages count differently, so it must not carry over


def _pool_rank(rank: int, world_size: int, port: int, conn) -> None:
    """A pool rank: join the group once, then run cases until the parent says stop or goes away."""
    launch._PARENT_CONN = conn
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    launch._exit_with_parent()
    for key in [k for k in os.environ if k.startswith("TORCHELASTIC_")]:
        del os.environ[key]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    torch.set_num_threads(1)
    seed = torch.initial_seed()  # what a fresh process's default generator starts from
    launch.set_collective_timeout(COLLECTIVE_TIMEOUT_S)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    state = _snapshot()
    frozen = False
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            break
        if not data:  # the parent retires the pool
            break
        try:
            body, args = pickle.loads(data)
            result = body(rank, world_size, *args)
            reply = ("ok", (result, len(c10d._world.pg_map)) if rank == 0 else None)
        except BaseException as exc:  # noqa: BLE001 - everything must reach the parent
            kind = "collective" if launch._looks_collective(exc) else "raised"
            reply = ("error", (kind, traceback.format_exc()))
        try:
            conn.send(reply)
        except OSError:
            break
        except Exception:  # noqa: BLE001 - an unpicklable result: say so, as a failure of the case
            with contextlib.suppress(OSError):
                conn.send(("error", ("raised", traceback.format_exc())))
        _restore(state, seed)
        if not frozen:  # after the first case the rank holds what every case imports: a full collection
            gc.collect()  # once, then those objects leave the collector's view (gc.freeze), so later
            gc.freeze()  # full collections, which would cost ~0.2 s CPU each, stay as cheap as a fresh
            frozen = True  # process's and do not stall a timed case
        else:
            gc.collect(1)  # the young generations only
    os._exit(0)  # skip destroy_process_group's handshake: the parent reaps or has gone


# ---------------------------------------------------------------------------------------- parent
class RankPool:
    """``world_size`` ranks in one gloo group, running cases one after another (see the module doc)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.ranks: list[launch._Rank] = []
        self.cases = 0

    def _start(self) -> None:
        ctx = launch._context()
        port = launch.free_port()
        ranks, children = [], []
        for r in range(self.world_size):
            mine, theirs = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=_pool_rank, args=(r, self.world_size, port, theirs), daemon=True,
                               name=f"semimig-pool{self.world_size}-rank-{r}")
            ranks.append(launch._Rank(r, proc, mine))
            children.append(theirs)
        for r, theirs in zip(ranks, children):
            r.proc.start()
            theirs.close()  # the rank holds the only other end: its death closes the pipe
        self.ranks = ranks
        self.cases = 0
        _STATS["spawned"] += 1

    def alive(self) -> bool:
        return bool(self.ranks) and all(r.proc.is_alive() and r.conn is not None for r in self.ranks)

    def run(self, body: Callable[..., Any], args: tuple, timeout_s: Optional[float]) -> Any:
        if not callable(body):
            raise launch.ConfigError(f"body must be a module-level function, got {body!r}")
        data = pickle.dumps((body, args))  # fails here, in the test, for a body not pickled by reference
        if not self.alive():
            self.close()
            self._start()
        for r in self.ranks:
            r.outcome, r.payload, r.activity, r.stopped_since = None, None, "", None
        ok = False
        with launch.terminate_on_signals():
            try:
                for r in self.ranks:
                    try:
                        r.conn.send_bytes(data)
                    except OSError:  # that rank is gone: the supervisor names it
                        r.conn = None
                launch._supervise(self.ranks, self.world_size, timeout_s, COLLECTIVE_TIMEOUT_S)
                ok = True
            finally:
                self.cases += 1
                _STATS["cases"] += 1
                if not ok:
                    _STATS["failures"] += 1
                    self.close(kill=True)
        result, groups = self.ranks[0].payload
        if groups > MAX_GROUPS:
            self.close()
        return result

    def close(self, kill: bool = False) -> None:
        """Retire the pool: ask the ranks to leave (``kill``: terminate them at once) and reap them."""
        if not self.ranks:
            return
        for r in self.ranks:
            if not kill and r.conn is not None:
                with contextlib.suppress(OSError):
                    r.conn.send_bytes(b"")
            if kill:
                r.outcome = None  # _reap terminates ranks without an "ok"
        launch._reap(self.ranks, grace_s=2.0 if not kill else 0.5)
        self.ranks = []


def run_pooled(body: Callable[..., Any], world_size: int, *args: Any, timeout_s: Optional[float] = 60.0) -> Any:
    """Run ``body(rank, world_size, *args)`` on this process's pool of ``world_size`` ranks; rank 0's
    result.  Same contract and failures as :func:`semimig.launch.run_on_ranks` (see the module doc)."""
    if os.environ.get("SEMIMIG_TEST_POOL", "1") == "0" or threading.current_thread() is not threading.main_thread():
        return run_on_ranks(body, world_size, *args, timeout_s=timeout_s)
    from semimig._validate import check_int

    check_int("world_size", world_size, minimum=1, maximum=64)
    pool = _POOLS.get(world_size)
    if pool is None:
        pool = _POOLS[world_size] = RankPool(world_size)
    return pool.run(body, args, timeout_s)


def shutdown_pools() -> None:
    """Retire every pool of this process (the test run's end; also at exit)."""
    for pool in list(_POOLS.values()):
        pool.close()
    _POOLS.clear()


atexit.register(shutdown_pools)
__all__ += ["RankFailure"]
