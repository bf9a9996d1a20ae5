"""A real straggler: Linux cgroup CPU bandwidth on one process (benchmarks, tests).

Injected delays (:mod:`semimig.straggler.injection`) only slow what semimig times; a real slow
device is slow at all of its work (DESIGN §5).  On CPU the kernel's CFS bandwidth controller gives
exactly that: a cgroup with quota ``q`` per period ``p`` lets its threads run at most ``q`` µs of
CPU time in every ``p`` µs window, then parks them until the next window,

    rate ≤ fraction · one core,        q = round(fraction · p)            (fraction in (0, 1])

so a single-threaded busy loop at ``fraction = 0.25`` gets ≤ 0.25 s of CPU per second of wall time.
The period is short (4 ms by default: 1 ms on, 3 ms parked at 25 %) so the slowdown is spread
evenly over every span of compute between two collectives instead of arriving as 75 ms stalls.
The kernel refuses quotas under 1000 µs, so a fraction below ``1000 / period_us`` lengthens the
period to ``ceil(1000 / fraction)`` (logged).  ``fraction = 1.0`` removes the limit
(v1 ``cpu.cfs_quota_us = -1``, v2 ``cpu.max = max``).

Both cgroup versions are found from ``/proc/mounts``: v1 (a ``cgroup`` mount whose options name
``cpu``: files ``cpu.cfs_period_us``, ``cpu.cfs_quota_us``) and v2 (a ``cgroup2`` mount whose
``cgroup.controllers`` lists ``cpu``: file ``cpu.max``; ``+cpu`` is enabled in the root's
``cgroup.subtree_control``).  Throttle cgroups are made directly under the controller's mount
root and named ``semimig-throttle-<owner pid>-<random hex>``; :func:`remove_stale_throttles`
removes those whose owner pid no longer exists (a crashed or SIGKILLed run), never a live run's.

:class:`CpuThrottle` cleans up on every exit path it can see: ``with`` exit (normal or exception),
SIGINT and SIGTERM of the owning process (handlers that clean up, restore the previous handler and
re-deliver the signal to it, so the process still dies of SIGTERM or raises KeyboardInterrupt),
and ``atexit``.  Cleaning up moves every process still in the cgroup back to the cgroup it came
from (or the parent) — unthrottled — and removes the directory.  Where a throttle cannot be made
(not Linux, no cpu controller mounted, not root) :class:`ThrottleUnavailable` says so in one line.

:class:`ThrottlePattern` makes the throttle time-varying (``"20:40"``: throttled 20 s, free 40 s,
repeating, starting throttled); :class:`PatternDriver` applies it from a background thread (both
in :mod:`semimig.straggler.throttle_pattern`, re-exported here).
:func:`pin_to_core` pins every thread of a process to one core, so a throttled rank cannot borrow
a second core and an unthrottled one is not slowed by sharing.

GPU equivalents (outside this module, which throttles CPU time only): lock a device's SM clock lower with
``nvidia-smi -i GPU -lgc MIN,MAX`` (``-rgc`` resets), cap its power with ``nvidia-smi -i GPU -pl
WATTS``, or run the rank under an MPS server with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25`` so its
kernels get a quarter of the SMs.  All three need root or MPS set up by the administrator.
"""
from __future__ import annotations

import atexit
import errno
import logging
import math
import os
import re
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

from semimig._validate import check_int, check_number
from semimig.errors import ConfigError

__all__ = ["CpuController", "CpuThrottle", "DEFAULT_PERIOD_US", "PatternDriver", "ThrottlePattern",
           "ThrottleUnavailable", "find_cpu_controller", "pin_to_core", "remove_stale_throttles"]

logger = logging.getLogger(__name__)

DEFAULT_PERIOD_US = 4000
MIN_QUOTA_US = 1000          # the kernel refuses smaller quotas (v1 and v2)
MAX_PERIOD_US = 1_000_000    # and longer periods
NAME_PREFIX = "semimig-throttle-"
_NAME_RE = re.compile(r"^semimig-throttle-(\d+)-[0-9a-f]+$")


class ThrottleUnavailable(ConfigError):
    """No CPU throttle can be made here; the one-line message says what is missing."""


@dataclass(frozen=True, kw_only=True)
class CpuController:
    """Where the cgroup cpu controller is mounted."""

    version: int
    """1 (``cpu.cfs_quota_us``) or 2 (``cpu.max``)."""
    root: str
    """The mount point: throttle cgroups are made directly under it."""


def find_cpu_controller(mounts: str = "/proc/mounts") -> CpuController:
    """The cpu controller of this machine (v1 preferred where both list it), or ThrottleUnavailable."""
    if not sys.platform.startswith("linux"):
        raise ThrottleUnavailable(f"CPU throttling needs Linux cgroups; this is {sys.platform}")
    try:
        with open(mounts, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as err:
        raise ThrottleUnavailable(f"cannot read {mounts} to find the cgroup cpu controller: "
                                  f"{err.strerror or err}") from err
    v2_roots = []
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        mount_point, fstype, options = fields[1], fields[2], fields[3].split(",")
        if fstype == "cgroup" and "cpu" in options and os.path.isfile(os.path.join(mount_point, "cpu.cfs_quota_us")):
            return CpuController(version=1, root=mount_point)
        if fstype == "cgroup2":
            v2_roots.append(mount_point)
    for root in v2_roots:
        try:
            with open(os.path.join(root, "cgroup.controllers"), encoding="utf-8") as f:
                if "cpu" in f.read().split():
                    return CpuController(version=2, root=root)
        except OSError:
            continue
    raise ThrottleUnavailable("no cgroup cpu controller mounted (no v1 'cgroup ... cpu' mount, no cgroup2 "
                              f"mount listing 'cpu' in cgroup.controllers; see {mounts})")


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


def _read_pids(path: str) -> List[int]:
    try:
        with open(path, encoding="ascii") as f:
            return [int(tok) for tok in f.read().split()]
    except FileNotFoundError:
        return []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cgroup_dir_of(pid: int, controller: CpuController) -> Optional[str]:
    """The directory of ``pid``'s cgroup in ``controller``'s hierarchy, if it can be read and exists."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if (controller.version == 2 and names == "") or (controller.version == 1 and "cpu" in names.split(",")):
            candidate = os.path.join(controller.root, path.lstrip("/"))
            return candidate if os.path.isdir(candidate) else None
    return None


def _evacuate(cgroup_dir: str, fallback: str, homes: Dict[int, str]) -> None:
    """Move every process (and, v1, every thread) out of ``cgroup_dir``: to its home, else ``fallback``."""
    for pid in _read_pids(os.path.join(cgroup_dir, "cgroup.procs")):
        for target in (homes.get(pid), fallback):
            if target is None:
                continue
            try:
                _write(os.path.join(target, "cgroup.procs"), str(pid))
                break
            except ProcessLookupError:
                break
            except OSError as err:
                logger.warning("cannot move pid %d from %s to %s: %s", pid, cgroup_dir, target, err)
    tasks = os.path.join(cgroup_dir, "tasks")  # v1 only: threads moved one by one
    for tid in _read_pids(tasks) if os.path.exists(tasks) else []:
        try:
            _write(os.path.join(fallback, "tasks"), str(tid))
        except OSError:
            pass


def _remove_cgroup(cgroup_dir: str, homes: Dict[int, str], *, attempts: int = 50) -> bool:
    """Evacuate then ``rmdir``; retried while a process forks into it.  True when gone."""
    fallback = os.path.dirname(cgroup_dir.rstrip("/"))
    for _ in range(attempts):
        _evacuate(cgroup_dir, fallback, homes)
        try:
            os.rmdir(cgroup_dir)
            return True
        except FileNotFoundError:
            return True
        except OSError as err:
            if err.errno != errno.EBUSY:
                logger.warning("cannot remove cgroup %s: %s", cgroup_dir, err)
                return False
            time.sleep(0.01)
    logger.warning("cgroup %s still busy after %d attempts; left in place (the next run's "
                   "remove_stale_throttles() removes it once its owner is gone)", cgroup_dir, attempts)
    return False


def remove_stale_throttles(controller: Optional[CpuController] = None) -> List[str]:
    """Remove ``semimig-throttle-<pid>-*`` cgroups whose owner pid is gone; returns the removed paths.

    A live owner's cgroup is never touched (a reused pid keeps a leftover alive: it is left, not
    guessed at).  Processes still inside are moved to the parent, unthrottled.
    """
    controller = controller or find_cpu_controller()
    removed = []
    for name in sorted(os.listdir(controller.root)):
        match = _NAME_RE.match(name)
        if match is None or _pid_alive(int(match.group(1))):
            continue
        path = os.path.join(controller.root, name)
        if _remove_cgroup(path, {}):
            logger.info("removed stale throttle %s (owner pid %s is gone)", path, match.group(1))
            removed.append(path)
    return removed


_LIVE: "set[CpuThrottle]" = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _close_all_live() -> None:
    for throttle in list(_LIVE):
        throttle.close()


class CpuThrottle:
    """One cgroup that limits the processes attached to it to ``fraction`` of one core.

    ``with CpuThrottle(0.25) as t: t.attach(pid); ...; t.set_fraction(1.0)`` — see the module
    docstring for the formula, the period and the cleanup guarantees.  ``handle_signals`` installs
    the SIGINT/SIGTERM handlers (main thread only); a caller that forwards signals itself (the
    ``semimig throttle`` launcher) turns them off and closes the throttle in its own ``finally``.
    """

    def __init__(self, fraction: float = 1.0, *, period_us: int = DEFAULT_PERIOD_US,
                 controller: Optional[CpuController] = None, handle_signals: bool = True) -> None:
        self._fraction = check_number("fraction", fraction, minimum=0.0, maximum=1.0, low_open=True)
        self._period_us = check_int("period_us", period_us, minimum=MIN_QUOTA_US, maximum=MAX_PERIOD_US)
        self._controller = controller
        self._handle_signals = handle_signals
        self._path: Optional[str] = None
        self._homes: Dict[int, str] = {}
        self._previous_handlers: Dict[int, object] = {}
        self._lock = threading.RLock()
        self._owner_pid = os.getpid()   # a forked child inherits this object and its handlers: it must not clean up

    # -- life cycle --------------------------------------------------------------------------
    def __enter__(self) -> "CpuThrottle":
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def path(self) -> str:
        """The cgroup directory (only while open)."""
        if self._path is None:
            raise RuntimeError("CpuThrottle is not open")
        return self._path

    @property
    def fraction(self) -> float:
        return self._fraction

    @property
    def period_us(self) -> int:
        """The period in force: ``period_us`` or longer where the fraction needs it (module docstring)."""
        return self._effective_period(self._fraction)

    def open(self) -> "CpuThrottle":
        """Make the cgroup and set the limit; ThrottleUnavailable (one line) where that is impossible."""
        with self._lock:
            if self._path is not None:
                return self
            controller = self._controller = self._controller or find_cpu_controller()
            self._owner_pid = os.getpid()
            path = os.path.join(controller.root, f"{NAME_PREFIX}{self._owner_pid}-{secrets.token_hex(4)}")
            try:
                if controller.version == 2:
                    _write(os.path.join(controller.root, "cgroup.subtree_control"), "+cpu")
                os.mkdir(path)
            except PermissionError as err:
                raise ThrottleUnavailable(f"permission denied creating a cgroup under {controller.root} "
                                          "(CPU throttling needs root)") from err
            except OSError as err:
                raise ThrottleUnavailable(f"cannot create a cgroup under {controller.root}: "
                                          f"{err.strerror or err}") from err
            self._path = path
            with _LIVE_LOCK:
                _LIVE.add(self)
            try:
                self._apply(self._fraction)
            except BaseException:
                self.close()
                raise
            if self._handle_signals and threading.current_thread() is threading.main_thread():
                for signum in (signal.SIGINT, signal.SIGTERM):
                    self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
            logger.info("throttle %s: %.3g of a core (period %d us)", path, self._fraction, self.period_us)
            return self

    def close(self) -> None:
        """Move every process out (unthrottled), remove the cgroup, restore signal handlers.  Idempotent.

        In a forked child of the owner (which inherits this object) it does nothing: the owner cleans up.
        """
        if os.getpid() != self._owner_pid:
            return
        with self._lock:
            if threading.current_thread() is threading.main_thread():
                for signum, previous in self._previous_handlers.items():
                    if signal.getsignal(signum) == self._on_signal:
                        signal.signal(signum, previous)
                self._previous_handlers = {}
            if self._path is None:
                return
            path, self._path = self._path, None
            _remove_cgroup(path, self._homes)
            with _LIVE_LOCK:
                _LIVE.discard(self)
            logger.info("throttle %s removed", path)

    def _on_signal(self, signum: int, frame: object) -> None:
        previous = self._previous_handlers.get(signum, signal.SIG_DFL)
        self.close()
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:   # SIG_DFL (or unknown): die of the signal as before
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    # -- the limit ---------------------------------------------------------------------------
    def _effective_period(self, fraction: float) -> int:
        if fraction >= 1.0:
            return self._period_us
        return max(self._period_us, math.ceil(MIN_QUOTA_US / fraction))

    def _apply(self, fraction: float) -> None:
        path, period = self.path, self._effective_period(fraction)
        if period > MAX_PERIOD_US:
            raise ConfigError(f"fraction {fraction:g} needs a period of {period} us, over the kernel's "
                              f"{MAX_PERIOD_US} us (a quota must be >= {MIN_QUOTA_US} us)")
        if period != self._period_us:
            logger.info("fraction %g: period lengthened from %d to %d us (quota >= %d us)",
                        fraction, self._period_us, period, MIN_QUOTA_US)
        quota = -1 if fraction >= 1.0 else max(MIN_QUOTA_US, round(fraction * period))
        if self._controller.version == 1:
            _write(os.path.join(path, "cpu.cfs_quota_us"), "-1")
            _write(os.path.join(path, "cpu.cfs_period_us"), str(period))
            _write(os.path.join(path, "cpu.cfs_quota_us"), str(quota))
        else:
            _write(os.path.join(path, "cpu.max"), f"{'max' if quota < 0 else quota} {period}")

    def set_fraction(self, fraction: float) -> None:
        """Change the limit of the running cgroup (``1.0``: unlimited)."""
        fraction = check_number("fraction", fraction, minimum=0.0, maximum=1.0, low_open=True)
        with self._lock:
            self._apply(fraction)
            self._fraction = fraction

    def attach(self, pid: int) -> None:
        """Move process ``pid`` with all its threads into the cgroup (its children made later follow)."""
        check_int("pid", pid, minimum=1)
        with self._lock:
            home = _cgroup_dir_of(pid, self._controller)
            if home is not None and home != self.path:
                self._homes[pid] = home
            _write(os.path.join(self.path, "cgroup.procs"), str(pid))

    def pids(self) -> List[int]:
        """The processes now in the cgroup."""
        return _read_pids(os.path.join(self.path, "cgroup.procs"))

    def stats(self) -> Dict[str, int]:
        """The cgroup's ``cpu.stat`` (``nr_periods``, ``nr_throttled``, ``throttled_time`` ns / ``throttled_usec``)."""
        with open(os.path.join(self.path, "cpu.stat"), encoding="ascii") as f:
            return {key: int(value) for key, value in (line.split() for line in f if line.strip())}


def pin_to_core(pid: int, core: int) -> List[int]:
    """Pin every thread of ``pid`` (``/proc/<pid>/task/*``) to CPU ``core``; returns the tids pinned.

    Threads made later by a pinned thread inherit the pin.  A thread that exits meanwhile is skipped.
    """
    check_int("core", core, minimum=0)
    pinned = []
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return pinned
    for tid in tids:
        try:
            os.sched_setaffinity(tid, {core})
            pinned.append(tid)
        except ProcessLookupError:
            continue
    return pinned


from semimig.straggler.throttle_pattern import PatternDriver, ThrottlePattern  # noqa: E402  (re-exported)
