"""Set up Colossal-AI's legacy engine (``colossalai.legacy.launch``, 1D tensor mode) on CPU ranks.

Recipe, inside a body run by ``run_on_ranks`` (which has already opened its own gloo group)::

    port = free_ipv6_port()                      # in the test, before run_on_ranks
    def body(rank, world_size, port):
        launch_legacy_1d(rank, world_size, port)
        from colossalai.legacy.nn import Linear1D_Col, Linear1D_Row   # or semimig.nn
        ...

:func:`launch_legacy_1d`

1. applies :func:`semimig._compat.apply_cpu_shim` (a no-op when ``semimig.nn`` already did):
   without it the legacy seed manager calls ``torch.cuda`` RNG functions and no per-mode seeds
   are registered, so every legacy parallel layer fails in its constructor;
2. destroys the harness's default process group, because ``legacy.launch`` initialises its own;
3. calls ``colossalai.legacy.launch(config=dict(parallel=dict(tensor=dict(size=world_size,
   mode="1d"))), rank, world_size, host="::1", port, backend="gloo")``.  The host must be an
   IPv6 literal: launch builds ``tcp://[{host}]:{port}`` and an IPv4 address in brackets is
   rejected by Python's URL parser.  ``launch`` accepts no timeout, so torch's default
   process-group timeout is lowered to ``timeout_s`` while it runs; every group it creates
   (global, data, model, tensor, 1D) keeps that short timeout, and a hang fails in seconds.

After it returns, ``colossalai.legacy.core.global_context`` is set up: ``tensor_parallel_size
== world_size``, ``ParallelMode.PARALLEL_1D`` spans all ranks, the seeds are DATA ``seed`` and
TENSOR ``seed + rank``, and the current mode is DATA.  The harness's ``finally`` destroys the
default group the legacy engine made.
"""
from __future__ import annotations

import contextlib
import datetime
from typing import Iterator

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from semimig.launch import free_port

LEGACY_HOST = "::1"
"""Host for ``colossalai.legacy.launch`` on one machine (an IPv6 literal; see the module doc)."""


def free_ipv6_port() -> int:
    """A TCP port on ``::1`` that nobody listens on right now (:func:`semimig.launch.free_port`)."""
    return free_port(LEGACY_HOST)


@contextlib.contextmanager
def _default_pg_timeout(timeout_s: float) -> Iterator[None]:
    """Temporarily make ``timeout_s`` torch's default timeout for new gloo process groups."""
    saved = c10d.default_pg_timeout
    c10d.default_pg_timeout = datetime.timedelta(seconds=timeout_s)
    try:
        yield
    finally:
        c10d.default_pg_timeout = saved


def launch_legacy_1d(rank: int, world_size: int, port: int, *, seed: int = 1024, timeout_s: float = 20.0) -> None:
    """``colossalai.legacy.launch`` with 1D tensor parallelism over all ``world_size`` ranks on CPU."""
    import colossalai.legacy

    from semimig._compat import apply_cpu_shim

    apply_cpu_shim()
    if dist.is_initialized():
        dist.destroy_process_group()
    config = dict(parallel=dict(tensor=dict(size=world_size, mode="1d")))
    with _default_pg_timeout(timeout_s):
        colossalai.legacy.launch(
            config=config,
            rank=rank,
            world_size=world_size,
            host=LEGACY_HOST,
            port=port,
            backend="gloo",
            seed=seed,
            verbose=False,
        )
