"""Run a torchrun job on an emulated cluster: one agent per node namespace, bounded shutdown.

:func:`run_cluster` makes the cluster (:class:`~semimig.cluster.netns.Cluster`), starts node ``k``'s
torchrun agent inside its namespace (``ip netns exec``, in a process group of its own apart from the
terminal, so a terminal's Ctrl-C reaches the launcher only), waits for them, and returns the job's exit code: 0 when every agent
exits 0, else the first failing agent's code (``128 + s`` for a signal ``s``).  After the first
failure the other agents get ``grace_s`` to finish before they are stopped.  SIGTERM, SIGHUP, SIGINT
and SIGQUIT to the launcher stop the agents (SIGTERM, then SIGKILL after ``grace_s``; whatever still
runs in a namespace is killed with it) and the cluster is removed; the code is then ``128 + s``.
Signals that arrive while the cluster is being removed are ignored, so removal always finishes.
Each agent gets SIGTERM when the launcher dies, SIGKILL included
(:func:`semimig._lifetime.own_group_dying_with_parent`);
its namespaces and links are then reaped by the next run.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Optional, Sequence

from semimig._lifetime import END_SIGNALS, own_group_dying_with_parent
from semimig.cluster.netns import STATE_DIR, Cluster, kill_netns_pids
from semimig.cluster.topology import ClusterConfig, ClusterPlan, new_run_id

__all__ = ["Interrupted", "run_cluster"]

log = logging.getLogger(__name__)
_SIGNALS = END_SIGNALS


class Interrupted(BaseException):
    """The launcher received one of :data:`~semimig._lifetime.END_SIGNALS`."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


def _code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _stop(procs: list[subprocess.Popen], plan: ClusterPlan, grace_s: float) -> None:
    """SIGTERM every running agent's process group, SIGKILL after ``grace_s``, then whatever is left inside."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
    for node in plan.nodes:  # ranks run in process groups of their own: sweep the namespace
        with contextlib.suppress(Exception):
            kill_netns_pids(node.netns)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5.0)


def _wait(procs: list[subprocess.Popen], grace_s: float, timeout_s: Optional[float]) -> int:
    """Poll the agents; the job's exit code (see the module docstring)."""
    start = time.monotonic()
    failed: Optional[int] = None
    failed_at = 0.0
    while True:
        codes = [p.poll() for p in procs]
        if failed is None:
            bad = [c for c in codes if c not in (None, 0)]
            if bad:
                failed, failed_at = _code(bad[0]), time.monotonic()
                log.warning("an agent exited with %d; the others get %g s", failed, grace_s)
        if all(c is not None for c in codes):
            return failed or 0
        now = time.monotonic()
        if failed is not None and now - failed_at > grace_s:
            return failed
        if timeout_s is not None and now - start > timeout_s:
            log.warning("the job ran past --timeout %g s", timeout_s)
            return 124
        time.sleep(0.1)


def run_cluster(config: ClusterConfig, script: str, args: Sequence[str] = (), *, run_id: Optional[str] = None,
                timeout_s: Optional[float] = None, grace_s: float = 10.0, python: str = sys.executable,
                echo: Callable[[str], None] = print, env: Optional[dict] = None) -> int:
    """Make the cluster, run ``script args`` with torchrun on every node, remove the cluster; the
    job's exit code.  Raises :class:`~semimig.cluster.netns.Unsupported` when the machine cannot."""
    run_id = run_id or new_run_id()
    old = {}

    def handler(signum, _frame):
        raise Interrupted(signum)

    for sig in _SIGNALS:
        old[sig] = signal.signal(sig, handler)
    procs: list[subprocess.Popen] = []
    cluster = Cluster(config, run_id)
    try:
        with cluster as plan:
            echo(plan.describe())
            try:
                logs = str(STATE_DIR / run_id / "torchrun")  # torchrun's logs: removed with the run's state
                for k in range(config.nodes):
                    procs.append(subprocess.Popen(plan.agent_command(k, python, script, args, log_dir=logs),
                                                  env={**os.environ, **(env or {}), **plan.agent_env(k)},
                                                  preexec_fn=own_group_dying_with_parent()))
                code = _wait(procs, grace_s, timeout_s)
            except Interrupted as sig:
                echo(f"semimig cluster {run_id}: {sig}; stopping the job and removing the cluster")
                code = 128 + sig.signum
            finally:
                for s in _SIGNALS:  # nothing may interrupt the removal
                    signal.signal(s, signal.SIG_IGN)
                _stop(procs, plan, grace_s)
    except Interrupted as sig:  # during setup: Cluster removes what it made; finish that undisturbed
        for s in _SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        cluster.close()
        echo(f"semimig cluster {run_id}: {sig} while making the cluster; removed it")
        code = 128 + sig.signum
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)
    return code
