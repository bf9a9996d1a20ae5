"""Every way a launcher's run can end cleans up: SIGINT, SIGTERM, SIGHUP and SIGQUIT to the launcher,
and SIGKILL of it (its children notice through the parent-death signal; what it made on the machine is
reaped by the next run).  Each case compares the machine before and after: the processes carrying the
case's marker in their environment, the launcher's cgroups, namespaces, links and scratch directories.
The payload is ``sleep``, not training: every ending signal keeps its default action from its first
instruction, so the command dies of the signal whenever it arrives (a Python payload still in its
start-up turns SIGINT into a KeyboardInterrupt and exits 1).  Every wait is bounded.  The cgroup and namespace cases
skip where this is not root or the machine lacks them; whatever a case makes, it removes.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dist_harness import sigint_as_from_a_terminal
from scripts import REPO

SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGKILL]
SLEEP = [shutil.which("sleep") or "/bin/sleep", "60"]


def _marked(mark: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds ``CARELESS_MARK=mark``."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("CARELESS_MARK") == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def _until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _env(mark: str, **extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "CARELESS_MARK": mark, **extra}


def _stop(proc: subprocess.Popen, mark: str) -> None:
    """Whatever the case left (only on a failure): the launcher, then every marked process."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
    for pid in _marked(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# -- semimig throttle ---------------------------------------------------------------------------
def _controller():
    from semimig.straggler.throttle import ThrottleUnavailable, find_cpu_controller

    if os.geteuid() != 0:
        pytest.skip("cgroup throttling needs root")
    try:
        return find_cpu_controller()
    except ThrottleUnavailable as err:
        pytest.skip(f"no cgroup cpu controller: {err}")


def _throttle_cgroups(controller, pid: int) -> list[str]:
    return [n for n in os.listdir(controller.root) if n.startswith(f"semimig-throttle-{pid}-")]


def _throttle_launcher(mark: str) -> subprocess.Popen:
    """``semimig throttle`` holding rank 0 of a sleeping payload to half a core."""
    return subprocess.Popen([sys.executable, "-m", "semimig.straggler.throttle_cli", "--rank", "0", "--fraction",
                             "0.5", "--", "env", "RANK=0", *SLEEP], env=_env(mark),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_from_a_terminal)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_the_throttle_launcher_leaves_nothing_on_any_signal(sig):
    """On every signal, SIGHUP and SIGKILL included, no cgroup is left with the command throttled
    inside, and the command (torchrun and its ranks) does not outlive the launcher."""
    from semimig.straggler.throttle import remove_stale_throttles

    controller = _controller()
    mark = secrets.token_hex(4)
    proc = _throttle_launcher(mark)
    try:
        def attached() -> bool:
            assert proc.poll() is None, proc.stderr.read()
            groups = _throttle_cgroups(controller, proc.pid)
            return bool(groups) and bool(open(os.path.join(controller.root, groups[0], "cgroup.procs")).read().split())

        _until(attached, 30, "the payload was never throttled")
        proc.send_signal(sig)
        proc.wait(timeout=20)
        _until(lambda: not _marked(mark), 10, f"processes of the run outlive {sig.name}: {_marked(mark)}")
        if sig == signal.SIGKILL:  # nothing ran in the launcher: the next run reaps its cgroup by name
            remove_stale_throttles(controller)
        assert not _throttle_cgroups(controller, proc.pid)
        if sig != signal.SIGKILL:
            assert proc.returncode == 128 + sig, (proc.returncode, proc.stderr.read())
    finally:
        _stop(proc, mark)
        remove_stale_throttles(controller)


@pytest.mark.parametrize("sig", SIGNALS[:-1], ids=lambda s: s.name)
def test_a_signal_the_moment_the_cgroup_exists_leaves_nothing(sig):
    """The launcher's handlers are in place before its cgroup exists: a signal sent the moment the cgroup
    appears (before the command may have started) ends the launcher with ``128 + N``, its cgroup removed
    and no process of the run left, whether the command had started or not."""
    from semimig.straggler.throttle import remove_stale_throttles

    controller = _controller()
    mark = secrets.token_hex(4)
    proc = _throttle_launcher(mark)
    try:
        deadline = time.monotonic() + 30
        while not _throttle_cgroups(controller, proc.pid):  # no sleep: the signal follows the mkdir closely
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the launcher never made its cgroup"
        proc.send_signal(sig)
        proc.wait(timeout=20)
        _until(lambda: not _marked(mark), 10, f"processes of the run outlive {sig.name}: {_marked(mark)}")
        assert proc.returncode == 128 + sig, (proc.returncode, proc.stderr.read())
        assert not _throttle_cgroups(controller, proc.pid)
    finally:
        _stop(proc, mark)
        remove_stale_throttles(controller)


# -- benchmarks/time_to_loss.py -----------------------------------------------------------------
_TTL_DRIVER = """
import sys
sys.path.insert(0, {bench!r})
import time_to_loss as ttl
ttl.check_commands = lambda p, args: None  # the payload below is not the example
ttl.command = lambda args, mode, out: {throttle!r}
sys.exit(ttl.main(["--straggler", "device", "--modes", "healthy", "--repeats", "1", "--json", {json!r}]))
"""


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_time_to_loss_leaves_no_process_cgroup_or_scratch_directory_on_any_signal(sig, tmp_path):
    """On every signal its child throttle, torchrun, the ranks and the scratch directory end with it."""
    controller = _controller()
    mark = secrets.token_hex(4)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    throttle = [sys.executable, "-m", "semimig.cli", "throttle", "--rank", "0", "--fraction", "1", "--", "env",
                "RANK=0", *SLEEP]
    driver = _TTL_DRIVER.format(bench=str(REPO / "benchmarks"), throttle=throttle, json=str(tmp_path / "r.json"))
    proc = subprocess.Popen([sys.executable, "-c", driver], env=_env(mark, TMPDIR=str(scratch)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_from_a_terminal)
    try:
        # the payload itself (the launcher's own command line holds it too, from before its cgroup and handlers)
        sleeping = lambda: [p for p in _marked(mark) if [a for a in _cmdline(p) if a][1:] == SLEEP[1:]]  # noqa: E731
        _until(lambda: proc.poll() is None and sleeping(), 60, f"the payload never started: {proc.poll()}")
        assert list(scratch.glob("semimig-ttl-*"))
        run_pids = set(_marked(mark))  # the driver, the throttle launcher, torchrun's stand-in: their cgroups
        proc.send_signal(sig)
        proc.wait(timeout=40)
        _until(lambda: not _marked(mark), 20, f"processes of the run outlive {sig.name}: {_marked(mark)}")
        if sig == signal.SIGKILL:  # the next run removes a dead owner's scratch directory
            sys.path.insert(0, str(REPO / "benchmarks"))
            from scripts import load_script

            ttl = load_script("benchmarks/time_to_loss.py", "time_to_loss_signals")
            old = os.environ.get("TMPDIR")
            os.environ["TMPDIR"] = str(scratch)
            import tempfile

            tempfile.tempdir = None
            try:
                assert ttl.reap_stale_scratch()
            finally:
                os.environ.pop("TMPDIR") if old is None else os.environ.__setitem__("TMPDIR", old)
                tempfile.tempdir = None
        else:
            assert proc.returncode == 128 + sig, proc.stderr.read()
        assert not list(scratch.glob("semimig-ttl-*"))
        # this run's launcher removed its cgroup (another run's leftover, reaped by the next launcher, is not its own)
        assert not [n for n in os.listdir(controller.root) if n.startswith("semimig-throttle-") and
                    int(n.split("-")[2]) in run_pids], run_pids
    finally:
        _stop(proc, mark)
        from semimig.straggler.throttle import remove_stale_throttles

        remove_stale_throttles(controller)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    except OSError:
        return []


# -- semimig cluster: SIGHUP, SIGQUIT (SIGINT, SIGTERM and SIGKILL: test_cluster.py) ------------------
@pytest.mark.mutex("netns")
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT], ids=lambda s: s.name)
def test_the_cluster_launcher_removes_its_network_and_job_on_sighup_and_sigquit(sig, tmp_path):
    """SIGHUP and SIGQUIT remove the namespaces, the bridge, the shaped links and the job."""
    from test_cluster import _REASON, SLEEPER, _assert_clean, _launcher, _rid, _snapshot, _wait_ready

    if _REASON:
        pytest.skip(_REASON)
    script = tmp_path / "sleep.py"
    script.write_text(SLEEPER)
    ready = tmp_path / "ready"
    ready.mkdir()
    before, run_id = _snapshot(), _rid()
    proc = _launcher(run_id, script, str(ready), grace=3.0)
    try:
        _wait_ready(ready, 2, [proc], timeout_s=90)
        proc.send_signal(sig)
        out = proc.communicate(timeout=60)[0]
        assert proc.returncode == 128 + sig and f"interrupted by {sig.name}" in out, out
        _assert_clean(before, run_id)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        from semimig.cluster.netns import reap_stale

        reap_stale()


# -- semimig bench (spawned ranks) ----------------------------------------------------------------
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_semimig_bench_leaves_no_rank_on_any_signal(sig, tmp_path):
    """SIGQUIT before: it killed the launcher alone, its ranks left to notice."""
    mark = secrets.token_hex(4)
    proc = subprocess.Popen([sys.executable, "-m", "semimig.cli", "bench", "--compute", "emulated", "--quick",
                             "--epochs", "50", "--iters-per-epoch", "50", "--no-plots", "--modes", "baseline",
                             "--chi", "1", "--json", str(tmp_path / "b.json")], env=_env(mark),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_from_a_terminal)
    try:
        _until(lambda: proc.poll() is None and len(_marked(mark)) >= 3, 90, f"no ranks started: {proc.poll()}")
        time.sleep(1.0)  # the ranks past start-up, in their loop
        proc.send_signal(sig)
        proc.wait(timeout=60)
        _until(lambda: not _marked(mark), 20, f"ranks outlive {sig.name}: {_marked(mark)}")
        if sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            assert proc.returncode == 128 + sig, proc.stderr.read()[-2000:]
        elif sig == signal.SIGINT:  # interrupted, not a run that ended before the signal mattered
            err = proc.stderr.read()
            assert proc.returncode == 130 and "interrupted (SIGINT)" in err, err[-2000:]
    finally:
        _stop(proc, mark)
