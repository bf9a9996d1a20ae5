"""Run the LLM training binary ``benchmarks/llm_run.py`` (or ``examples/finetune_llm.py``: ``script=EXAMPLE``)
on local ranks forked from semimig's preloaded forkserver.

    done = run_example(["--steps", "6", ...], ranks=2, timeout_s=240)
    done.returncode, done.stdout, done.stderr   # like subprocess.run's: every rank's lines, rank 0's first

Each rank gets the environment torchrun gives its workers (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), the script's folder first
on ``sys.path`` and its own stdout/stderr files, and runs the script as ``__main__``, so the script
runs its own ``main`` unchanged: its flag checks, ``init_process_group("gloo")`` from the
environment, its logging, its summary line and its exit status.  What differs from torchrun is the
start: a rank is a fork of a process that has torch and Colossal-AI imported (:mod:`semimig.launch`'s
forkserver) instead of a fresh interpreter that imports them (~12 s per rank on the 2-core machine,
~19 s per 2-rank launch before the first step).

For the cases whose launcher is incidental (what the script trains, saves, prints). What only a
real launcher shows -- torchrun's agent, a rank or launcher dying, the command a user types --
stays on ``python -m torch.distributed.run`` (``test_example_llm``'s shared 6-step run,
``tests/e2e/test_probe_faults.py``, ``tests/e2e/test_cluster.py``).

Like torchrun: when one rank fails, the others are given :data:`GRACE_S` to finish and are then
killed; the launch's status is the first failing rank's.  The whole launch is bounded by
``timeout_s`` (:class:`TimeoutError` with every rank's output tail).
"""
from __future__ import annotations

import os
import runpy
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from semimig import launch

REPO = Path(__file__).resolve().parents[1]
BINARY = REPO / "benchmarks" / "llm_run.py"
EXAMPLE = REPO / "examples" / "finetune_llm.py"
GRACE_S = 10.0
"""After a rank fails: how long the others may take to notice and exit before they are killed."""


@dataclass(frozen=True)
class ExampleRun:
    """What ``subprocess.run`` would have returned for the launch."""

    returncode: int
    stdout: str
    stderr: str


def _rank_main(rank: int, world: int, port: int, script: str, argv: list, env: dict, out: str, err: str,
               cwd: str) -> None:
    """One rank, in the forked child: torchrun's environment, own output files, the script as ``__main__``."""
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    code = 1
    try:
        os.environ.clear()
        os.environ.update(env)
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                          GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        os.chdir(cwd)
        import torch

        torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))  # what OMP_NUM_THREADS does at a fresh start
        sys.argv = [script, *argv]
        sys.path.insert(0, str(Path(script).parent))  # as Python puts a script's folder
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:  # sys.exit(main()), sys.exit("message"), argparse's exit
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed stream: nothing left to keep
                pass
        os._exit(code)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def quiet_env(**extra: str) -> dict:
    """This process's environment with one torch thread per rank and Python's warnings off, plus ``extra``."""
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra)


def run_example(argv: Sequence[str], *, ranks: int = 2, timeout_s: float = 240, cwd: Path = REPO,
                env: Optional[dict] = None, script: Path = BINARY) -> ExampleRun:
    """Launch ``script`` (the benchmark binary unless given) on ``ranks`` forked ranks with ``argv`` (module
    docstring); wait at most ``timeout_s``.

    ``env`` defaults to :func:`quiet_env` (this process's environment, one torch thread per rank, no
    Python warnings), what every test launch of the script runs with."""
    env = quiet_env() if env is None else dict(env)
    ctx = launch._context()
    port = launch.free_port()
    with tempfile.TemporaryDirectory(prefix="semimig-example-") as tmp:
        files = [(Path(tmp) / f"{r}.out", Path(tmp) / f"{r}.err") for r in range(ranks)]
        procs = [ctx.Process(target=_rank_main, name=f"example-rank-{r}",
                             args=(r, ranks, port, str(script), list(argv), env, str(out), str(err), str(cwd)))
                 for r, (out, err) in enumerate(files)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        failed_at = first_failure = None
        timed_out = False
        try:
            while any(p.exitcode is None for p in procs):
                now = time.monotonic()
                if failed_at is None:
                    first_failure = next((p.exitcode for p in procs if p.exitcode not in (None, 0)), None)
                    failed_at = now if first_failure is not None else None
                if failed_at is not None and now > failed_at + GRACE_S:
                    break
                if now > deadline:
                    timed_out = True
                    break
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.exitcode is None:
                    os.kill(p.pid, signal.SIGKILL)
                p.join()
        stdout = "".join(_read(out) for out, _ in files)
        stderr = "".join(_read(err) for _, err in files)
    if timed_out and first_failure is None:
        raise TimeoutError(f"{Path(script).name} did not finish within {timeout_s:g} s on {ranks} ranks:\n"
                           f"{stdout[-3000:]}\n{stderr[-3000:]}")
    if first_failure is None:  # every rank ended by itself; one may have failed at the very end
        first_failure = next((p.exitcode for p in procs if p.exitcode != 0), 0)
    return ExampleRun(first_failure, stdout, stderr)
