"""semimig.launch: a dead, frozen or failing rank ends the run within the bound and is named; a
terminated parent leaves no process behind.  Tiny bodies (an all-reduce loop), so each case takes
seconds."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dist_harness import run_on_ranks, sigint_as_from_a_terminal
from semimig.launch import RankFailure, RanksTimedOut

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent  # the shared helpers (dist_harness)


def _all_reduce_loop(rank, world, *, steps=10_000, victim=None, sig=None, raise_at=None):
    import torch
    import torch.distributed as dist

    from semimig.launch import report_activity

    t = torch.ones(4)
    for step in range(steps):
        if step % 5 == 0:
            report_activity(f"step {step}")
        if rank == victim and step == 5:
            if raise_at is not None:
                raise ValueError("bad input on purpose")
            os.kill(os.getpid(), sig)
        dist.all_reduce(t)
        time.sleep(0.01)
    return float(t[0])


def _sum_body(rank, world):
    return _all_reduce_loop(rank, world, steps=3)


def _kill_body(rank, world, sig):
    return _all_reduce_loop(rank, world, victim=1, sig=sig)


def _raise_body(rank, world):
    return _all_reduce_loop(rank, world, victim=1, raise_at=5)


def _sleep_body(rank, world):
    from semimig.launch import report_activity

    report_activity(f"sleeping on rank {rank}")
    time.sleep(600)


def test_returns_rank_zeros_result():
    assert run_on_ranks(_sum_body, 2, timeout_s=60) == 8.0  # 1 doubled by three all-reduces of 2 ranks


def test_a_killed_rank_is_named_with_its_signal_and_activity_not_the_survivor():
    start = time.monotonic()
    with pytest.raises(RankFailure) as err:
        run_on_ranks(_kill_body, 2, signal.SIGKILL, timeout_s=60, collective_timeout_s=30)
    message = str(err.value)
    assert time.monotonic() - start < 20  # the survivor's read fails at once; no collective timeout
    assert message.startswith("rank 1 of 2 was killed by SIGKILL while step 5")
    assert "rank 0 then failed in a collective" in message


def test_a_frozen_rank_ends_the_run_within_the_collective_timeout_and_is_named():
    start = time.monotonic()
    with pytest.raises(RankFailure) as err:
        run_on_ranks(_kill_body, 2, signal.SIGSTOP, timeout_s=120, collective_timeout_s=4)
    elapsed = time.monotonic() - start
    assert elapsed < 4 + 15, elapsed  # timeout + grace + start-up, far below the whole-run bound
    message = str(err.value)
    assert message.startswith("rank 1 of 2 is stopped (SIGSTOP)"), message
    assert "while step 5" in message and "Timed out" in message


def test_a_rank_that_raises_is_named_at_once_not_after_its_peers_timeout():
    start = time.monotonic()
    with pytest.raises(RankFailure, match=r"(?s)^rank 1 of 2 failed while step 5:.*ValueError: bad input on purpose"):
        run_on_ranks(_raise_body, 2, timeout_s=60, collective_timeout_s=30)
    assert time.monotonic() - start < 20  # rank 0 still waits in its all-reduce: not waited for


def test_the_whole_run_bound_names_the_ranks_and_what_they_did():
    with pytest.raises(RanksTimedOut, match=r"ranks \[0, 1\] of 2 did not finish within 3 s: rank 0 while sleeping"):
        run_on_ranks(_sleep_body, 2, timeout_s=3, collective_timeout_s=30)


_PARENT = textwrap.dedent("""
    import sys
    sys.path[:0] = [{here!r}, {tests!r}]
    from test_launch import _sleep_body
    from semimig import launch
    from semimig.launch import run_on_ranks
    launch._PRELOAD = ["torch", "torch.distributed"]  # what a sleeping rank needs: no Colossal-AI (~10 s a start)
    run_on_ranks(_sleep_body, 2, timeout_s=None, collective_timeout_s=60)
""")


def _start_parent_with_two_ranks():
    """The parent process and every process below it (forkserver, resource tracker, 2 ranks)."""
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", _PARENT.format(here=str(HERE), tests=str(TESTS))], cwd=TESTS.parent,
                            preexec_fn=sigint_as_from_a_terminal)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        servers = [p for p in parent.children() if "forkserver" in " ".join(p.cmdline())]
        if servers and len(servers[0].children()) >= 2:
            return proc, parent.children(recursive=True)
        time.sleep(0.2)
    proc.kill()
    pytest.fail("the ranks did not start within 90 s")


def _gone_within(processes, seconds):
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=seconds)
    for p in alive:
        p.kill()
    return [(p.pid, p.name()) for p in alive]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT,
                                 pytest.param(signal.SIGKILL, marks=pytest.mark.slow)])
def test_no_process_outlives_a_signalled_parent(sig):
    """SIGTERM/SIGINT: the parent terminates and reaps its ranks; SIGKILL: the ranks see their parent
    pipe close and exit; the forkserver follows once they are gone."""
    proc, children = _start_parent_with_two_ranks()
    os.kill(proc.pid, sig)
    proc.wait(timeout=30)
    assert _gone_within(children, 15) == []
