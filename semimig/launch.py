"""Run a function on N local ranks: gloo (or NCCL) process group, free port, bounded failure.

    run_on_ranks(body, world_size, *args, timeout_s=60)

Used by the test suite (every multi-rank case), ``semimig bench`` and the CPU benchmarks, which
start their ranks on one machine.  It starts ``world_size`` processes (from a forkserver that has
torch, and on a machine without CUDA colossalai too, preloaded, so a rank costs a fork, not an
interpreter start; see :func:`_preload_modules`), initialises a
fresh process group in each, calls ``body(rank, world_size, *args)`` and returns rank 0's result.

Failure is bounded and names the culprit:

- Every process group of the ranks, including those Colossal-AI creates later with
  ``dist.new_group`` (which would otherwise wait 30 minutes), times out after
  ``collective_timeout_s`` (default ``timeout_s / 2``): a rank blocked on a frozen peer fails.
- The parent watches each rank's pipe and process at once.  On the first failure it waits a short
  grace period for the other ranks' news, then blames, in this order: a rank that died without a
  word (its signal or exit code), a rank that is stopped (SIGSTOP), a rank whose body raised, a
  rank that is still running but answers nothing while its peers failed in a collective; only then
  the ranks whose collective failed.  The message says what each rank was doing
  (:func:`report_activity`), e.g. ``rank 1 of 2 was killed by SIGKILL while training semi chi=4``.
- ``timeout_s`` bounds the whole run (``None``: no bound, for long benchmarks; the collective
  timeout still bounds every wait).  A rank stopped for longer than the collective timeout fails
  the run even if no peer is waiting on it.
- No process outlives the caller: SIGTERM/SIGHUP to the parent raise :class:`Terminated` in it
  and SIGINT raises ``KeyboardInterrupt`` (ranks ignore SIGINT, so a Ctrl-C reaches the parent
  only); either way the ranks are terminated and reaped before the exception leaves.  A rank whose
  parent dies without cleaning up (SIGKILL) notices through its parent pipe and exits at once.

``body`` must be a module-level function (it is pickled by reference).
"""
from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import os
import random
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for
from typing import Any, Callable, Iterator, Optional

from semimig.errors import ConfigError

__all__ = ["RankFailure", "RanksTimedOut", "Terminated", "TorchrunEnv", "BACKENDS", "check_backend", "free_port",
           "report_activity", "run_on_ranks", "set_collective_timeout", "terminate_on_signals"]

# semimig._quiet first: it hides third-party warnings in the ranks when the CLI asked for it (before they import)
_PRELOAD_WITH_CUDA = ["semimig._quiet", "torch", "torch.distributed"]
_PRELOAD = _PRELOAD_WITH_CUDA + ["colossalai.shardformer", "colossalai.booster", "semimig.nn"]
_CTX = None
_GRACE_S = 2.0  # after the first failure: how long to wait for the other ranks' news before blaming
_COLLECTIVE_MARKERS = ("/gloo/", "gloo::", "NCCL", "Connection reset by peer", "Connection closed by peer",
                       "Timed out waiting", "DistBackendError", "DistNetworkError", "Broken pipe")


def _preload_modules(cuda: bool) -> list[str]:
    """The modules the forkserver imports before it forks the ranks.

    A process forked from one that has initialised CUDA fails at its first CUDA call ("Cannot
    re-initialize CUDA in forked subprocess"), and on a machine with CUDA importing Colossal-AI
    initialises it (``colossalai.quantization.fp8`` reads the device's capability at import), as
    does ``semimig.nn`` (its CPU shim asks whether CUDA is there).  So with CUDA present the
    forkserver holds torch alone and each rank imports Colossal-AI after its fork.
    """
    return _PRELOAD_WITH_CUDA if cuda else _PRELOAD


def _context():
    global _CTX
    if _CTX is None:
        import torch

        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(_preload_modules(torch.cuda.is_available()))
    return _CTX


class RankFailure(RuntimeError):
    """A rank raised, died or froze; the message names it, what it was doing, and its traceback."""


class RanksTimedOut(RankFailure, TimeoutError):
    """The ranks did not finish within ``timeout_s`` (also a ``TimeoutError``)."""


class Terminated(BaseException):
    """The parent received SIGTERM or SIGHUP while ranks ran; they have been stopped and reaped."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def _ephemeral_low() -> Optional[int]:
    """The first port of the kernel's ephemeral range (Linux), or None where it cannot be read."""
    try:
        with open(EPHEMERAL_RANGE_FILE) as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return low if 2048 < low <= 65535 else None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` (IPv4 or IPv6) that nobody listens on right now, from below the ephemeral range.

    The kernel hands ports of its ephemeral range (``ip_local_port_range``, 32768-60999 by
    default) to every outgoing connection, gloo's own pairs among them, so a port picked there can
    be taken between this check and the bind that needs it (a rank's store then fails with
    EADDRINUSE while other groups connect).  So the port is drawn at random from the
    thousands below that range (its own ``SystemRandom``: the caller's ``random`` state is left
    alone) and checked by binding it; where no range can be read, or no port there binds, the
    kernel picks one (a bind to port 0).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low = _ephemeral_low()
    if low is not None:
        draw = random.SystemRandom()
        for _ in range(64):
            port = draw.randrange(max(1024, low - 16384), low)
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


BACKENDS = ("gloo", "nccl")


def check_backend(backend: str, world_size: int) -> None:
    """Refuse a backend this machine cannot run ``world_size`` local ranks on (message names why)."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "nccl":
        import torch

        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < world_size:
            raise ConfigError(f"backend 'nccl' runs one rank per GPU: {world_size} ranks need {world_size} "
                              f"GPUs, this machine has {found}")


def set_collective_timeout(seconds: float) -> None:
    """Make ``seconds`` the timeout of every process group created from now on in this process.

    ``dist.new_group`` (called by Colossal-AI's ``ProcessGroupMesh``) takes torch's module default
    of 30 minutes unless given a timeout; this replaces that default (gloo and NCCL).
    """
    from torch.distributed import distributed_c10d as c10d

    delta = datetime.timedelta(seconds=seconds)
    c10d.default_pg_timeout = delta
    if isinstance(getattr(c10d, "default_pg_nccl_timeout", None), datetime.timedelta):
        c10d.default_pg_nccl_timeout = delta


# ---------------------------------------------------------------------------------------- child
_PARENT_CONN = None  # this rank's pipe to the parent, set in the child only


def report_activity(text: str) -> None:
    """Tell the parent what this rank is doing now (named in its error if the rank fails).

    A no-op outside :func:`run_on_ranks` (e.g. under torchrun).
    """
    if _PARENT_CONN is not None:
        with contextlib.suppress(OSError):
            _PARENT_CONN.send(("activity", str(text)))


def _exit_with_parent() -> None:
    """Exit this rank as soon as the process that started it is gone (it was SIGKILLed)."""
    parent = mp.parent_process()
    if parent is None or parent.sentinel is None:
        return

    def watch() -> None:
        wait_for([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="semimig-parent-watch", daemon=True).start()


def _looks_collective(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(marker in text for marker in _COLLECTIVE_MARKERS)


def _child(rank: int, world_size: int, port: int, collective_timeout_s: float, body, args, conn,
           backend: str = "gloo") -> None:
    global _PARENT_CONN
    _PARENT_CONN = conn
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it terminates us
    _exit_with_parent()
    for key in [k for k in os.environ if k.startswith("TORCHELASTIC_")]:
        del os.environ[key]  # an agent store named here would make init wait for a torchrun agent
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        set_collective_timeout(collective_timeout_s)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=collective_timeout_s))
        result = body(rank, world_size, *args)
        conn.send(("ok", result if rank == 0 else None))
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent
        kind = "collective" if _looks_collective(exc) else "raised"
        with contextlib.suppress(OSError):
            conn.send(("error", (kind, traceback.format_exc())))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# --------------------------------------------------------------------------------------- parent
@dataclass
class _Rank:
    """What the parent knows of one rank."""

    rank: int
    proc: Any
    conn: Any
    activity: str = ""
    outcome: Optional[str] = None  # "ok", "raised", "collective", "died"
    payload: Any = None
    stopped_since: Optional[float] = None

    def doing(self) -> str:
        return f" while {self.activity}" if self.activity else ""

    def is_stopped(self) -> bool:
        import psutil

        try:
            return psutil.Process(self.proc.pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
        except (psutil.Error, ValueError):
            return False

    def death(self) -> str:
        code = self.proc.exitcode
        if code is not None and code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code} without a result"


def _receive(rank: _Rank) -> None:
    try:
        kind, payload = rank.conn.recv()
    except (EOFError, OSError):  # the pipe closed: the process is gone or going
        rank.conn = None
        return
    if kind == "activity":
        rank.activity = payload
    elif kind == "ok":
        rank.outcome, rank.payload = "ok", payload
    else:
        rank.outcome, (_, rank.payload) = payload[0], payload


def _blame(ranks: list[_Rank], world_size: int, collective_timeout_s: float) -> str:
    """The failure message: the culprit first (see the module docstring), then the others' news."""
    lines = []
    for r in ranks:
        if r.outcome == "died":
            lines.append(f"rank {r.rank} of {world_size} {r.death()}{r.doing()}")
    for r in ranks:
        if r.outcome is None and r.is_stopped():
            lines.append(f"rank {r.rank} of {world_size} is stopped (SIGSTOP) and stopped answering{r.doing()}")
    for r in ranks:
        if r.outcome == "raised":
            lines.append(f"rank {r.rank} of {world_size} failed{r.doing()}:\n{r.payload}")
    collective = [r for r in ranks if r.outcome == "collective"]
    silent = [r for r in ranks if r.outcome is None and not r.is_stopped()]
    if collective and silent and not lines:
        for r in silent:
            lines.append(f"rank {r.rank} of {world_size} stopped making progress (running, no answer within "
                         f"the {collective_timeout_s:g} s collective timeout){r.doing()}")
    for i, r in enumerate(collective):
        if lines:
            first = r.payload.strip().splitlines()[-1]
            lines.append(f"rank {r.rank} then failed in a collective{r.doing()}: {first}")
        else:
            lines.append(f"rank {r.rank} of {world_size} failed in a collective{r.doing()}:\n{r.payload}")
    return "\n".join(lines) if lines else f"ranks of {world_size} failed without a report"


@contextlib.contextmanager
def terminate_on_signals() -> Iterator[None]:
    """SIGTERM / SIGHUP raise :class:`Terminated` in the main thread while ranks run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        raise Terminated(signum)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def _reap(ranks: list[_Rank], *, grace_s: float) -> None:
    """Stop every rank and wait for all of them: ranks that succeeded get ``grace_s`` to leave their
    process group; the others are terminated at once (killed if stopped or still there after it)."""
    started = [r for r in ranks if r.proc.pid is not None]
    for r in started:
        if r.outcome != "ok" and r.proc.is_alive():
            if r.is_stopped():
                r.proc.kill()  # a stopped process would hold SIGTERM pending
            else:
                r.proc.terminate()
    deadline = time.monotonic() + grace_s
    for r in started:
        r.proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if r.proc.is_alive():
            r.proc.kill()
            r.proc.join()
    for r in ranks:
        if r.conn is not None:
            r.conn.close()


def run_on_ranks(body: Callable[..., Any], world_size: int, *args: Any, timeout_s: Optional[float] = 60.0,
                 backend: str = "gloo", collective_timeout_s: Optional[float] = None) -> Any:
    """Run ``body(rank, world_size, *args)`` on ``world_size`` local ranks; return rank 0's result.

    ``timeout_s`` bounds the whole run (``None``: unbounded); ``collective_timeout_s`` (default
    ``timeout_s / 2``, or 300 s when ``timeout_s`` is ``None``) bounds every collective wait.
    Raises :class:`RankFailure` (:class:`RanksTimedOut` past ``timeout_s``) naming the culprit.
    ``backend="nccl"`` puts rank ``r`` on GPU ``r`` (one machine, one GPU per rank).
    """
    from semimig._validate import check_int, check_number

    if not callable(body):
        raise ConfigError(f"body must be a module-level function, got {body!r}")
    check_int("world_size", world_size, minimum=1, maximum=1024)
    check_number("timeout_s", timeout_s, minimum=0.0, low_open=True, allow_none=True)
    check_backend(backend, world_size)
    if collective_timeout_s is None:
        collective_timeout_s = timeout_s / 2 if timeout_s is not None else 300.0
    check_number("collective_timeout_s", collective_timeout_s, minimum=0.1, maximum=86_400.0)
    ctx = _context()
    port = free_port()
    ranks, senders = [], []
    for r in range(world_size):
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(r, world_size, port, collective_timeout_s, body, args, send, backend),
                           daemon=True, name=f"semimig-rank-{r}")
        ranks.append(_Rank(r, proc, receive))
        senders.append(send)
    with terminate_on_signals():
        try:
            for r, send in zip(ranks, senders):
                r.proc.start()
                send.close()  # the rank holds the only write end: its death closes the pipe
            _supervise(ranks, world_size, timeout_s, collective_timeout_s)
        finally:
            _reap(ranks, grace_s=5.0)
    return ranks[0].payload


def _supervise(ranks: list[_Rank], world_size: int, timeout_s: Optional[float], collective_timeout_s: float) -> None:
    """Wait for every rank's result; raise :class:`RankFailure` at the first failure (after the grace)."""
    start = time.monotonic()
    failed_at: Optional[float] = None
    while True:
        now = time.monotonic()
        pending = [r for r in ranks if r.outcome is None]
        if not pending:
            break
        if failed_at is not None and now - failed_at >= _GRACE_S:
            break
        if timeout_s is not None and now - start >= timeout_s:
            raise RanksTimedOut(f"ranks {[r.rank for r in pending]} of {world_size} did not finish within "
                                f"{timeout_s:g} s: " + "; ".join(f"rank {r.rank}{r.doing() or ' running'}"
                                                                  for r in pending))
        waitables = {}
        for r in pending:
            if r.conn is not None:
                waitables[r.conn] = r
            else:
                waitables[r.proc.sentinel] = r
        for ready in wait_for(list(waitables), timeout=1.0):
            r = waitables[ready]
            if ready is r.conn:
                _receive(r)
            elif r.outcome is None:  # exited, and its pipe is drained: no result is coming
                r.proc.join(timeout=1.0)
                r.outcome = "died"
        for r in ranks:
            if r.outcome is None and r.is_stopped():
                r.stopped_since = r.stopped_since or now
                if now - r.stopped_since > collective_timeout_s + _GRACE_S and failed_at is None:
                    failed_at = now - _GRACE_S  # stopped longer than any collective may wait: fail now
            else:
                r.stopped_since = None
        if failed_at is None and any(r.outcome not in (None, "ok") for r in ranks):
            failed_at = time.monotonic()
    if any(r.outcome != "ok" for r in ranks):
        raise RankFailure(_blame(ranks, world_size, collective_timeout_s))


# -------------------------------------------------------------------------------------- torchrun
_TORCHRUN_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class TorchrunEnv:
    """The ranks a launcher (torchrun, ``colossalai run``) started: this process's place among them."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @classmethod
    def from_environ(cls, environ: Optional[dict] = None) -> Optional["TorchrunEnv"]:
        """``None`` when no launcher started this process (``RANK`` and ``WORLD_SIZE`` unset);
        :class:`~semimig.errors.ConfigError` for a partial or inconsistent environment."""
        env = os.environ if environ is None else environ
        if "RANK" not in env and "WORLD_SIZE" not in env:
            return None
        missing = [k for k in _TORCHRUN_KEYS if not env.get(k)]
        if missing:
            raise ConfigError(f"started by a launcher (RANK or WORLD_SIZE is set) but {', '.join(missing)} "
                              "is not set: run under torchrun, or unset RANK and WORLD_SIZE to let semimig "
                              "start its own ranks")
        values = {}
        for key, name in (("RANK", "rank"), ("WORLD_SIZE", "world_size"), ("LOCAL_RANK", "local_rank"),
                          ("LOCAL_WORLD_SIZE", "local_world_size"), ("MASTER_PORT", "port")):
            text = env.get(key)
            if text is None:
                continue
            try:
                values[name] = int(text)
            except ValueError:
                raise ConfigError(f"environment variable {key} must be an integer, got {text!r}") from None
        world, rank = values["world_size"], values["rank"]
        local_world = values.get("local_world_size", world)
        local_rank = values.get("local_rank", rank)
        if world < 1 or not 0 <= rank < world or not 0 <= local_rank < local_world <= world:
            raise ConfigError(f"inconsistent launcher environment: RANK={rank} WORLD_SIZE={world} "
                              f"LOCAL_RANK={local_rank} LOCAL_WORLD_SIZE={local_world}")
        if not 0 < values["port"] < 65536:
            raise ConfigError(f"environment variable MASTER_PORT must be a TCP port, got {values['port']}")
        return cls(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world)

    def init_process_group(self, backend: str, timeout_s: float) -> None:
        """Join the launcher's process group (``env://``; torchrun's agent store when it offers one);
        every group made later in this process gets the same ``timeout_s``."""
        import torch
        import torch.distributed as dist

        if backend == "nccl":
            torch.cuda.set_device(self.local_rank)
        set_collective_timeout(timeout_s)
        dist.init_process_group(backend, init_method="env://", rank=self.rank, world_size=self.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
