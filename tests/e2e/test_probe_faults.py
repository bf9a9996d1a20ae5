"""Process faults and the ``--tp 1`` edge of the LLM training binary ``benchmarks/llm_run.py`` (probes).

Each fault case starts the example under torchrun (``--standalone``, gloo, a tiny synthetic model, a
10 s collective timeout) in a process group of its own, so that whatever it leaves behind can be found and
killed by the test.  A fault case waits for the second logged step, SIGKILLs one process, and
checks that every process of the run has ended within a bound, with a message naming what died.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from example_ranks import quiet_env, run_example

psutil = pytest.importorskip("psutil")

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cpu_path")]

REPO = Path(__file__).resolve().parents[2]
TINY = ["--hidden", "16", "--layers", "1", "--seq-len", "8", "--batch-size", "2", "--data", "synthetic",
        "--eval-batches", "1", "--timeout-s", "10"]
BOUND_S = 45.0  # the collective timeout (10 s) plus a loaded 2-core machine's slack


def _start(nproc: int, *flags: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           str(REPO / "benchmarks" / "llm_run.py"), *TINY, *flags]
    return subprocess.Popen(cmd, cwd=REPO, env=quiet_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, process_group=0)


def _reap(procs: list) -> None:
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def test_tp_1_trains_with_one_warning_and_no_crash(backend: str) -> None:
    """``--tp 1`` (here one rank) is valid: it trains, and says once that there is nothing to balance.
    Its one rank is forked with torchrun's environment (tests/example_ranks.py): no fault here."""
    done = run_example([*TINY, "--tp", "1", "--steps", "3", "--straggler", "fixed:0:2"], ranks=1, timeout_s=240)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    warnings = [line for line in out.splitlines() if " WARNING " in line]
    assert len(warnings) == 1, warnings
    assert "no tensor-parallel group to balance" in warnings[0] and "tp_size=1" in warnings[0], warnings
    summary = [line for line in out.splitlines() if line.startswith("summary: ")]
    assert len(summary) == 1 and "steps=3" in summary[0] and " tp=1 " in summary[0], out[-4000:]


@pytest.mark.parametrize("victim", ["rank", "launcher"])
def test_a_dead_rank_or_launcher_ends_every_process_of_the_run(victim: str, backend: str) -> None:
    proc = _start(2, "--steps", "1000000", "--eval-every", "0", "--log-every", "1", "--balance", "off")
    lines: list = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    everything: list = []
    try:
        deadline = time.monotonic() + 240
        for line in proc.stdout:  # wait until both ranks train (rank 0 logs every step)
            lines.append(line)
            if "step 2/" in line or time.monotonic() > deadline:
                break
        assert any("step 2/" in line for line in lines), "".join(lines)[-4000:]
        launcher = psutil.Process(proc.pid)
        ranks = [p for p in launcher.children(recursive=True) if "llm_run.py" in " ".join(p.cmdline())]
        assert len(ranks) == 2, ranks
        everything = [launcher, *ranks]
        reader.start()
        os.kill(ranks[-1].pid if victim == "rank" else proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        code = proc.wait(timeout=BOUND_S)  # the launcher (reaped by subprocess, not psutil)
        _, alive = psutil.wait_procs(ranks, timeout=max(0.1, BOUND_S - (time.monotonic() - killed)))
        assert not alive, f"still running {BOUND_S} s after the {victim} was killed: {alive}"
        elapsed = time.monotonic() - killed
        reader.join(10)
        text = "".join(lines)
        assert code != 0
        if victim == "rank":  # torchrun names the dead rank and its signal, and ends the other
            assert "rank      : 1" in text and "SIGKILL" in text, text[-4000:]
        else:  # nothing of torchrun is left to say it: the ranks name their dead launcher
            assert f"its launcher (pid {proc.pid}) died" in text, text[-4000:]
        assert elapsed < BOUND_S
    finally:
        _reap(everything or psutil.Process().children(recursive=True))
        if proc.poll() is None:
            proc.kill()
