"""A launcher's children end with it: the signals every launcher handles, and the parent-death signal.

Every semimig launcher (``semimig throttle``, ``semimig cluster``, ``benchmarks/time_to_loss.py``)
ends its children and removes what it made on each of :data:`END_SIGNALS`.  SIGKILL cannot be
handled, so each child is started with :func:`die_with_parent`: Linux's parent-death signal
(``prctl(PR_SET_PDEATHSIG)``) sends it ``signum`` when the launcher's thread that started it ends,
and a launcher already gone when the child starts is noticed at once (``getppid`` no longer the
launcher).  The setting survives ``execve`` (not of a set-user-ID program), so it holds for
``torchrun`` and ``ip netns exec`` alike; what a killed launcher made on the machine (cgroups,
namespaces) is reaped by its next run, by name.  Elsewhere than Linux it does nothing.
:func:`own_group_dying_with_parent` adds ``os.setsid()`` before it: the child leads a process group
of its own, apart from the launcher's terminal, so a terminal's Ctrl-C reaches the launcher alone
and the launcher ends the child's whole group with one ``killpg``.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Callable, Optional

__all__ = ["END_SIGNALS", "die_with_parent", "own_group_dying_with_parent"]

END_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
"""The signals that end a launcher: each ends its children and removes what it made first."""

_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGTERM) -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets ``signum`` when this process (the
    thread calling ``Popen``) dies, even of SIGKILL.  ``None`` where the platform has no such signal."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: nothing is loaded in the forked child
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl: nobody would send the signal
            os.kill(os.getpid(), signum)

    return preexec


def own_group_dying_with_parent(signum: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: ``os.setsid()`` (the child leads a new process
    group, its id the child's pid, with no controlling terminal), then :func:`die_with_parent`'s
    setting where the platform has it.  ``setsid`` runs first, as ``Popen`` orders its own call to it
    before a ``preexec_fn``; the parent-death signal is kept across ``setsid``."""
    dies = die_with_parent(signum)

    def preexec() -> None:
        os.setsid()
        if dies is not None:
            dies()

    return preexec
