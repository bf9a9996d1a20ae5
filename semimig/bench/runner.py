"""Run the cases of a ``semimig bench`` sweep on ranks it starts, or on the ranks torchrun started.

    semimig bench ...                                  # spawned: one run_on_ranks per case
    torchrun --nproc_per_node 2 -m semimig bench ...   # launched: every rank loops over the cases

A :class:`Sweep` says what to train (the 1-D straggler sweep of :mod:`.sweeps`, or the 2-D one);
this module runs it.  Either way each finished case is added to the results file at once
(:mod:`semimig.bench.results`), only rank 0 (or the parent) prints and writes, and an interrupt
or a failed rank keeps every finished case and says how to resume.  Under a launcher the checks
only some ranks can make (outputs and results file on rank 0, cores or GPUs on each node) are
gathered, so a refusal ends every rank at once instead of leaving the others in a collective.
"""
from __future__ import annotations

import os
import shlex
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from semimig.bench.results import ResultsFile, check_outputs, describe_case
from semimig.errors import ConfigError
from semimig.launch import RankFailure, Terminated, TorchrunEnv, terminate_on_signals

Case = tuple


@dataclass(frozen=True)
class Outputs:
    """Where results go and how an existing results file is treated (the bench CLI's flags)."""

    json: Path
    plots: Optional[Path]
    resume: bool = False
    overwrite: bool = False
    dry_run: bool = False
    argv: Optional[Sequence[str]] = None
    """The command line after ``semimig`` (for the resume hint)."""
    full_trace: bool = False
    """Keep every record's per-rank traces (``--full-trace``; :func:`semimig.bench.results.slim_record`)."""


@dataclass(frozen=True)
class Sweep:
    """A benchmark as the runner sees it: settings, cases, how a rank trains one, how to show them."""

    config: dict
    """The settings saved with the results (what ``--resume`` compares)."""
    cases: tuple
    world: int
    device: str
    compute: str
    timeout_s: float
    body: Callable[..., dict]
    """Module-level ``body(rank, world, *body_args, case) -> record`` (run on every rank)."""
    body_args: tuple
    banner: Callable[[int, int, Optional[TorchrunEnv]], str]
    """``banner(cases to train, cases in all, launcher or None)``."""
    finish: Callable[[list, float, Optional[Path]], None]
    """``finish(records, seconds, plots directory or None)``: table, notes, plots."""

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"


class Refused(Exception):
    """The run cannot start; ``code`` is the exit status (2: bad input, 1: start-up failure)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


class Stopped(Exception):
    """The sweep stopped before its end; the message says why, what was kept and how to resume."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_local_resources(device: str, compute: str, local_ranks: int) -> None:
    """Refuse what this machine cannot give ``local_ranks`` ranks: one core each for measured compute
    on CPU, one GPU each on CUDA."""
    if device == "cuda":
        import torch

        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < local_ranks:
            raise ConfigError(f"backend 'nccl' runs one rank per GPU: {local_ranks} ranks need {local_ranks} "
                              f"GPUs, this machine has {found}")
    elif compute == "measured" and local_ranks > usable_cores():
        raise ConfigError(f"--compute measured runs each rank's real GEMMs on one core: {local_ranks} ranks on this "
                          f"machine need {local_ranks} cores, it has {usable_cores()}; use --compute emulated "
                          "(sleeping ranks share cores) or fewer ranks")


def resume_hint(argv: Optional[Sequence[str]], launched: bool) -> str:
    if argv is None or launched:
        return "re-run the same command with --resume to train only the missing cases"
    return "resume with: semimig " + shlex.join([*[a for a in argv if a not in ("--resume", "--overwrite")],
                                                  "--resume"])


def _open_results(sweep: Sweep, out: Outputs) -> ResultsFile:
    """Check the outputs and the existing results file against this run's settings."""
    from semimig.bench import report

    check_outputs(out.json, out.plots)
    return ResultsFile.open(out.json, sweep.config, machine=report.machine(), resume=out.resume,
                            overwrite=out.overwrite, full_trace=out.full_trace)


def _plan(sweep: Sweep, results: ResultsFile) -> tuple[list, int]:
    todo = results.missing(sweep.cases)
    return todo, len(todo) + len(results.records)


def _train_all(results: Optional[ResultsFile], todo: Sequence[Case], train: Callable[[Case], dict], *, total: int,
               out: Outputs, launched: bool) -> None:
    """Train ``todo`` one by one; the writer (``results`` given) saves each record as it finishes."""
    from rich.progress import Progress

    done, current = 0, None
    before = len(results.records) if results is not None else 0
    try:
        with terminate_on_signals(), Progress(disable=results is None, transient=True) as progress:
            task = progress.add_task("training", total=len(todo))
            for current in todo:
                progress.update(task, description=describe_case(current))
                record = train(current)
                if results is not None:
                    results.add(record, cases_total=total)
                done += 1
                progress.advance(task)
    except (KeyboardInterrupt, Terminated, Exception) as err:  # noqa: BLE001 - every stop keeps the results
        if results is not None:  # what the file holds: a stop may land between a case's write and its count
            done = len(results.records) - before
        kept = f"{done} of {len(todo)} cases of this run finished"
        if results is not None:
            kept += (f"; every finished case is in {results.path}" if results.records
                     else f"; nothing was written to {results.path}")
        if isinstance(err, KeyboardInterrupt):
            why, code = "interrupted (SIGINT)", 130
        elif isinstance(err, Terminated):
            why, code = f"terminated ({signal.Signals(err.signum).name})", 128 + err.signum
        elif isinstance(err, (RankFailure, ConfigError)):
            why, code = str(err), 1
        else:
            why, code = f"{type(err).__name__} while training {describe_case(current)}: {err}", 1
        raise Stopped(f"{why}\n{kept}\n{resume_hint(out.argv, launched)}", code) from None


def _finish(sweep: Sweep, results: ResultsFile, out: Outputs, *, total: int, start: float) -> None:
    results.write(complete=True, cases_total=total)
    sweep.finish(results.records, time.perf_counter() - start, out.plots)
    print(f"JSON: {results.path}")


def _print_cases(todo: Sequence[Case]) -> None:
    for case in todo:
        print(f"  would train {describe_case(case)}")
    print("dry run: settings checked, no rank started")


def run_spawned(sweep: Sweep, out: Outputs) -> int:
    """``semimig bench`` as one command: this process starts the ranks of each case."""
    from semimig.launch import run_on_ranks

    check_local_resources(sweep.device, sweep.compute, sweep.world)
    results = _open_results(sweep, out)
    todo, total = _plan(sweep, results)
    print(sweep.banner(len(todo), total, None), flush=True)
    if out.dry_run:
        _print_cases(todo)
        return 0
    start = time.perf_counter()

    def train(case: Case) -> dict:
        return run_on_ranks(sweep.body, sweep.world, *sweep.body_args, case, timeout_s=None, backend=sweep.backend,
                            collective_timeout_s=sweep.timeout_s)

    _train_all(results, todo, train, total=total, out=out, launched=False)
    _finish(sweep, results, out, total=total, start=start)
    return 0


def run_launched(sweep: Sweep, out: Outputs, env: TorchrunEnv) -> int:
    """``semimig bench`` under torchrun: this process is one of the launcher's ranks."""
    import torch
    import torch.distributed as dist

    if env.world_size != sweep.world:
        raise Refused(f"the launcher started {env.world_size} ranks but tp={sweep.config.get('tp')} x "
                      f"dp={sweep.config.get('dp')} needs {sweep.world}: start {sweep.world} ranks or change --tp/--dp")
    torch.set_num_threads(1)  # measured compute: one thread per rank, like the spawned ranks
    try:
        env.init_process_group(sweep.backend, sweep.timeout_s)
    except Exception as err:  # noqa: BLE001 - the launcher's store or peers are unreachable
        raise Refused(f"cannot join the launcher's process group within {sweep.timeout_s:g} s: {err}", 1) from None
    try:
        results, refusal = None, None
        try:
            check_local_resources(sweep.device, sweep.compute, env.local_world_size)
            if env.rank == 0:
                results = _open_results(sweep, out)
        except ConfigError as err:
            refusal = str(err)
        refusals = _gather(refusal, env)
        if refusals:
            raise Refused("; ".join(refusals))
        todo, total = _broadcast(_plan(sweep, results) if env.rank == 0 else None)
        if env.rank == 0:
            print(sweep.banner(len(todo), total, env), flush=True)
        if out.dry_run:
            if env.rank == 0:
                _print_cases(todo)
            return 0
        start = time.perf_counter()

        def train(case: Case) -> dict:
            return sweep.body(env.rank, env.world_size, *sweep.body_args, case)

        _train_all(results, todo, train, total=total, out=out, launched=True)
        if env.rank == 0:
            _finish(sweep, results, out, total=total, start=start)
        return 0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _gather(refusal: Optional[str], env: TorchrunEnv) -> list[str]:
    """Every rank's refusal, on every rank (``rank r: ...``)."""
    import torch.distributed as dist

    everything: list = [None] * env.world_size
    dist.all_gather_object(everything, refusal)
    return [f"rank {r}: {e}" for r, e in enumerate(everything) if e is not None]


def _broadcast(value: Any) -> Any:
    """Rank 0's ``value`` on every rank."""
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
