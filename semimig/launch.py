"""Run a function on N local ranks: gloo (or NCCL) process group, free port, short timeout, fail fast.

    run_on_ranks(body, world_size, *args)

Used by the test suite (every multi-rank case) and by the CPU benchmarks, which start their
ranks on one machine.
It starts ``world_size`` processes (from a forkserver that has torch and colossalai preloaded,
so a test case costs a fork, not an interpreter start), initialises a fresh gloo process group
in each with a short timeout, calls ``body(rank, world_size, *args)`` and re-raises the first
failure in the calling process with the child's traceback.  A rank that hangs in a collective
fails after ``timeout_s``: first the process-group timeout fires inside the child, and the
parent kills everything still alive once its own deadline passes.

``body`` must be a module-level function (it is pickled by reference).
Whatever ``body`` returns on rank 0 is returned.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue as queue_mod
import socket
import time
import traceback
from typing import Any, Callable

_PRELOAD = ["torch", "torch.distributed", "colossalai.shardformer", "colossalai.booster", "semimig.nn"]
_CTX = None


def _context():
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(_PRELOAD)
    return _CTX


class RankFailure(RuntimeError):
    """A rank raised or died; the message carries its traceback."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


BACKENDS = ("gloo", "nccl")


def check_backend(backend: str, world_size: int) -> None:
    """Refuse a backend this machine cannot run ``world_size`` local ranks on (message names why)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "nccl":
        import torch

        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < world_size:
            raise ValueError(f"backend 'nccl' runs one rank per GPU: {world_size} ranks need {world_size} "
                             f"GPUs, this machine has {found}")


def _child(rank: int, world_size: int, port: int, timeout_s: float, body, args, queue, backend: str = "gloo") -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        OMP_NUM_THREADS="1",
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        result = body(rank, world_size, *args)
        queue.put((rank, "ok", result if rank == 0 else None))
    except BaseException:  # noqa: BLE001 - everything must reach the parent
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_on_ranks(body: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 60.0,
                 backend: str = "gloo") -> Any:
    """Run ``body(rank, world_size, *args)`` on ``world_size`` local ranks; return rank 0's result.

    ``backend="nccl"`` puts rank ``r`` on GPU ``r`` (one machine, one GPU per rank).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    check_backend(backend, world_size)
    ctx = _context()
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_child, args=(r, world_size, port, timeout_s / 2, body, args, queue, backend), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, tuple[str, Any]] = {}
    try:
        start = time.monotonic()
        while len(results) < world_size:
            remaining = timeout_s - (time.monotonic() - start)
            if remaining <= 0:
                missing = sorted(set(range(world_size)) - set(results))
                raise TimeoutError(f"ranks {missing} did not finish within {timeout_s:.0f}s")
            try:
                rank, status, payload = queue.get(timeout=min(remaining, 1.0))
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in results and p.exitcode]
                if dead:
                    raise RankFailure(f"ranks {dead} died with exit codes {[procs[r].exitcode for r in dead]}")
                continue
            results[rank] = (status, payload)
            if status == "error":
                raise RankFailure(f"rank {rank} of {world_size} failed:\n{payload}")
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    return results[0][1]
