"""The whole-device straggler and the per-rank split of a step into compute and communication.

A real slow device (an older card, a throttled or shared GPU, a node with a noisy neighbour) is
slow at *everything* it computes — attention, norms, the optimizer, host work — and not at its
communication.  ``scope=device`` (:class:`~semimig.straggler.injection.StragglerConfig`) emulates
that: every span of a rank's work between two collectives takes ``chi`` times as long::

    span_j  = t_issue(collective j) − t_return(collective j−1) − excluded_j
    sleep_j = (chi − 1) · span_j          slept right before collective j is issued

so a step whose own work took ``W`` seconds occupies the rank ``chi · W`` seconds, its time inside
collectives unchanged.  ``chi`` is read from the injector at every collective, so time-varying
patterns (bursts, round-robin) switch at the next collective after ``set_position``.  The first
span after attaching is measured from the attach time.

Every rank gets the accounting, straggler or not (``chi = 1``: no sleep)::

    comm_s     = Σ_j  t_return(j) − t_issue(j)      (after the sleep: the collective's own time)
    sleep_s    = Σ_j  sleep_j
    compute_s  = wall − comm_s                     (the rank's own work, sleeps included)

which is what the balanced share reported beside every speed-up is measured against
(``balanced_share = busy_gemm_s / compute_s``, DESIGN §5).

How: while a :class:`DeviceClock` is attached, the collectives of :mod:`torch.distributed`
(``all_reduce``, ``all_gather``, ``broadcast``, ``reduce_scatter``, ``send``/``recv``, ... — the
module attributes Colossal-AI and semimig call through ``dist.<name>``) are wrapped; the original
functions are restored when the last clock detaches.  Calls nested inside a wrapped collective
(``all_gather_object`` calls ``all_gather``) are counted once.  An asynchronous collective
(``async_op=True``) returns a ``Work`` whose ``wait()`` is a boundary of its own: the span before
it (e.g. the weight gradient Colossal-AI's column layer computes while ``dX`` is all-reduced) is
slowed, and the time ``wait()`` blocks is communication — a fast rank waiting for the straggler
must never look busy.  (``Work.wait`` is wrapped on the class, for every process group.)

A test injector only: the balancing runtime attaches a clock only while a whole-device test
straggler (``scope=device``) is configured; every other step is split by the step clock
(:mod:`semimig.straggler.clock`) around semimig's own collectives, and nothing in
:mod:`torch.distributed` is wrapped.  On CUDA the device is synchronised before each collective
so the span is the device's, and the sleep is enqueued on the stream (:meth:`StragglerInjector.inject`): like real slow compute, later
kernels queue behind it.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch

from semimig.errors import ConfigError
from semimig.straggler.injection import StragglerInjector

__all__ = ["COLLECTIVES", "DeviceClock", "DeviceTime"]

logger = logging.getLogger(__name__)

COLLECTIVES: tuple[str, ...] = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base", "all_gather_object",
    "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast", "broadcast_object_list",
    "reduce", "all_to_all", "all_to_all_single", "gather", "gather_object", "scatter", "scatter_object_list",
    "barrier", "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv",
)
"""The :mod:`torch.distributed` functions a clock wraps (those this torch has)."""


@dataclass(frozen=True)
class DeviceTime:
    """One rank's step split by a :class:`DeviceClock` (see the module docstring)."""

    wall_s: float
    """Seconds since the previous :meth:`DeviceClock.take` (or the attach)."""
    comm_s: float
    """Seconds inside collectives (their own time, after the straggler's sleep)."""
    sleep_s: float
    """Seconds slept by the whole-device straggler (part of ``compute_s``)."""
    collectives: int
    """Collectives issued (an async collective's ``wait()`` is timed, not counted again)."""
    dp_s: Optional[float] = None
    """The part of ``comm_s`` spent in the data-parallel gradient reduction's wait (the step clock's ``"dp"``
    regions); ``None``: not told apart."""
    update_s: Optional[float] = None
    """The part of ``compute_s`` in the optimizer's step (the step clock's ``"update"`` regions); ``None``: not
    timed."""

    @property
    def compute_s(self) -> float:
        """The rank's own work, slept time included: ``wall_s − comm_s``."""
        return max(self.wall_s - self.comm_s, 0.0)


class DeviceClock:
    """Per-rank clock over the collectives; slows the rank when its injector's scope is ``device``.

    ``injector=None`` (or a ``scope=gemm`` injector) only measures.  Use as a context manager or
    call :meth:`attach` / :meth:`detach`; :meth:`take` closes a step and returns its
    :class:`DeviceTime`.
    """

    def __init__(self, injector: Optional[StragglerInjector] = None, *,
                 device: torch.device | str = "cpu") -> None:
        if injector is not None and not isinstance(injector, StragglerInjector):
            raise ConfigError(f"injector must be a StragglerInjector or None, got {injector!r}")
        self.injector = injector
        self.slows = injector is not None and injector.config.scope == "device"
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self.attached = False
        self._reset(time.perf_counter())

    # ------------------------------------------------------------------ lifetime
    def attach(self) -> "DeviceClock":
        """Start measuring (and slowing) from now; idempotent."""
        if not self.attached:
            _PATCH.add(self)
            self.attached = True
            self._reset(time.perf_counter())
        return self

    def detach(self) -> None:
        """Stop; the collectives are unwrapped once no clock is attached.  Idempotent."""
        if self.attached:
            _PATCH.remove(self)
            self.attached = False

    def __enter__(self) -> "DeviceClock":
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    # ------------------------------------------------------------------ accounting
    def take(self) -> DeviceTime:
        """This step's split since the previous ``take`` (or the attach); starts the next step."""
        now = time.perf_counter()
        result = DeviceTime(wall_s=max(now - self._step_start - self._off_s, 0.0), comm_s=self._comm_s,
                            sleep_s=self._sleep_s, collectives=self._count)
        self._step_start, self._comm_s, self._sleep_s, self._count, self._off_s = now, 0.0, 0.0, 0, 0.0
        return result

    @contextlib.contextmanager
    def off(self) -> Iterator[None]:
        """Time inside the block is no step's work (an evaluation between steps): it is left out of the
        step's wall time and of the span a slow rank's sleep scales with, its collectives are not the
        step's, and no rank is slowed in it."""
        start = time.perf_counter()
        saved = (self._comm_s, self._sleep_s, self._count, self._span_start, self._excluded, self.slows)
        self.slows = False
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            self._comm_s, self._sleep_s, self._count, self._span_start, self._excluded, self.slows = saved
            self._excluded += spent
            self._off_s += spent

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        """Time inside the block is no span of work (timers, the harness's own bookkeeping)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._excluded += time.perf_counter() - start

    def _reset(self, now: float) -> None:
        self._step_start = self._span_start = now
        self._comm_s = self._sleep_s = self._excluded = self._off_s = 0.0
        self._count = 0

    def _before(self) -> None:
        """Called right before a collective is issued: sleep the span's slowdown (if this rank slows)."""
        if self.slows:
            chi = self.injector.current_chi()
            if chi > 1.0:  # only a rank slow now pays the sync (fast ranks and off-phases run free)
                if self._cuda:
                    torch.cuda.synchronize(self.device)
                span = time.perf_counter() - self._span_start - self._excluded
                delay = (chi - 1.0) * max(span, 0.0)
                self.injector.inject(delay, self.device)
                self._sleep_s += delay

    def _after(self, issued: float, *, issue: bool = True) -> None:
        now = time.perf_counter()
        self._comm_s += now - issued
        self._count += issue  # an async collective's wait() is no second collective
        self._span_start, self._excluded = now, 0.0


class _CollectivePatch:
    """Wraps :data:`COLLECTIVES` in :mod:`torch.distributed` while at least one clock is attached."""

    def __init__(self) -> None:
        self._clocks: list[DeviceClock] = []
        self._originals: dict[str, Callable] = {}
        self._lock = threading.Lock()
        self._local = threading.local()

    def add(self, clock: DeviceClock) -> None:
        with self._lock:
            if not self._clocks:
                self._install()
            self._clocks = self._clocks + [clock]  # rebound, never mutated: a collective iterates it as is

    def remove(self, clock: DeviceClock) -> None:
        with self._lock:
            self._clocks = [c for c in self._clocks if c is not clock]
            if not self._clocks:
                self._uninstall()

    def _install(self) -> None:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        work = getattr(dist, "Work", None)
        if work is not None:
            self._originals["Work.wait"] = work.wait
            work.wait = self._wrap(work.wait, issue=False)

        for name in COLLECTIVES:
            original = getattr(c10d, name, None) or getattr(dist, name, None)
            if original is None:
                continue
            self._originals[name] = original
            wrapped = self._wrap(original)
            for module in (dist, c10d):
                if getattr(module, name, None) is original:
                    setattr(module, name, wrapped)
        logger.debug("device clock: wrapped %d torch.distributed collectives", len(self._originals))

    def _uninstall(self) -> None:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        for name, original in self._originals.items():
            if name == "Work.wait":
                dist.Work.wait = original
                continue
            for module in (dist, c10d):
                if getattr(getattr(module, name, None), "__wrapped__", None) is original:
                    setattr(module, name, original)
        self._originals = {}

    def _wrap(self, original: Callable, *, issue: bool = True) -> Callable:
        local = self._local

        @functools.wraps(original)
        def collective(*args, **kwargs):
            clocks = self._clocks
            if getattr(local, "depth", 0) or not clocks:
                return original(*args, **kwargs)  # nested inside a wrapped collective: counted there
            for clock in clocks:
                clock._before()
            issued = time.perf_counter()  # after every sleep: a sleep is work, never communication
            local.depth = 1
            try:
                return original(*args, **kwargs)
            finally:
                local.depth = 0
                for clock in clocks:
                    clock._after(issued, issue=issue)

        return collective


_PATCH = _CollectivePatch()
