"""What the benchmark scripts share: the ``--json`` flag, the refusal of a bad command line, what
``--json`` writes (the records plus the run's provenance) and the one interleaved timer.

One way for every script, so that a bad output path is refused alike everywhere (by name, exit 2,
before any work: not after an hour of measuring) and every result file says which benchmark wrote
it, with which arguments, on which machine and with which configuration.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Hashable, Optional

from semimig._io import check_output_file, write_json
from semimig.errors import ConfigError

PROVENANCE = ("benchmark", "argv", "machine", "config")
"""The keys :func:`write_result` adds to every result file (a result's own fields may not use them)."""


def output_problem(path: Optional[Path], flag: str = "--json") -> Optional[str]:
    """``None`` when ``flag PATH`` can be written (checked before any work), else the one-line reason."""
    if path is None:
        return None
    try:
        check_output_file(path, flag)
    except ConfigError as err:
        return str(err)
    return None


class OutputPath(argparse.Action):
    """An output file flag whose path is checked as it is parsed: a path that cannot be written is
    refused through ``parser.error`` (exit 2, the flag named), before the script does any work."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Path,
                 option_string: Optional[str] = None) -> None:
        problem = output_problem(values, option_string or self.dest)
        if problem:
            parser.error(problem)
        setattr(namespace, self.dest, values)


def add_json_flag(parser: argparse.ArgumentParser, *, required: bool, help: str) -> None:
    """``--json PATH`` (a :class:`~pathlib.Path`, ``None`` when not given), refused at parse time
    when it cannot be written (:class:`OutputPath`) or when it (or another :class:`OutputPath` flag of the
    parser, a ``--plot``) names an existing file and ``--overwrite`` (added here too) is not given: a
    benchmark's result is hours of measurement, and a reused name must not replace an earlier one
    silently.  The check runs once the whole command line is parsed, so the two
    flags may come in either order."""
    parser.add_argument("--json", type=Path, required=required, default=None, action=OutputPath, help=help)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --json (or other output) file")
    parse_known_args = parser.parse_known_args

    def checked(args=None, namespace=None):
        parsed, extras = parse_known_args(args, namespace)
        for action in parser._actions:  # --json and every other OutputPath flag (a --plot)
            path = getattr(parsed, action.dest, None) if isinstance(action, OutputPath) else None
            if path is not None and Path(path).exists() and not parsed.overwrite:
                parser.error(f"{action.option_strings[0]} {path} exists: pass --overwrite to replace it, or choose "
                             "another path")
        return parsed, extras

    parser.parse_known_args = checked  # parse_args goes through it


def refuse(script: str, message: object) -> int:
    """Say ``<script>: error: <message>`` on stderr, as argparse does, and return 2 (a refused
    command line's exit status): for what a script checks after parsing (its config)."""
    print(f"{script}: error: {message}", file=sys.stderr)
    return 2


def write_result(path: Path, benchmark: str, argv: list[str] | None, config: dict, *, device: str = "cpu",
                 indent: int = 2, **fields) -> Path:
    """Write ``{"benchmark", "argv", "machine", "config", **fields}`` to ``path`` atomically (parents
    created); returns ``path``.

    ``fields`` stay at the top level, so a result file keeps the shape its readers expect and gains
    the provenance keys beside it; ``argv`` ``None`` is this process's command line; ``device`` is
    what the measured work ran on.  A field named like a provenance key is refused by name.
    """
    clash = sorted(set(PROVENANCE) & fields.keys())
    if clash:
        raise ValueError(f"result fields {clash} would overwrite the provenance keys {list(PROVENANCE)}")
    argv = sys.argv[1:] if argv is None else list(argv)
    out = {
        "benchmark": benchmark,
        "argv": argv,
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "device": device},
        "config": config,
        **fields,
    }
    out.setdefault("provenance", provenance(Path(sys.argv[0]), argv, device=device))
    return write_json(path, out, indent=indent)


def provenance(script: Path, argv: list[str], *, device: str) -> dict:
    """``{"command", "commit", "machine", "date"}`` of this run, as every file under ``docs/results/``
    states them (``make tables`` checks it): the command relative to the repository, the checked-out
    commit (``+dirty`` when the tree has uncommitted changes), the machine in words, the UTC date."""
    root = Path(__file__).resolve().parent.parent
    try:
        script = script.resolve().relative_to(root)
    except ValueError:
        pass
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    commit = git("rev-parse", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"
    import torch  # the benchmarks all have it; imported here so the flag checks above stay light

    machine = f"{os.cpu_count()}-core {platform.machine()} host, torch {torch.__version__}, {device}"
    if device == "cuda" and torch.cuda.is_available():
        machine += f" ({torch.cuda.get_device_name(0)})"
    return {"command": shlex.join(["python", str(script), *argv]), "commit": commit, "machine": machine,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}


def interleaved_ms(fns: dict[Hashable, Callable[[], object]], reps: int, *, warmup: int = 1) -> dict[Hashable, list[float]]:
    """Milliseconds of one call of each callable, per repetition, the callables interleaved.

    After ``warmup`` untimed calls of each, every repetition calls every callable once, starting
    one later in the order than the repetition before (repetition ``r`` starts at ``r mod n``), so
    a change of the machine's load or of what the caches hold hits every callable alike and no
    callable always runs right after the same neighbour.  Ratios of medians of these lists are
    what the benchmarks report side by side.
    """
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    samples: dict[Hashable, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            start = time.perf_counter()
            fns[name]()
            samples[name].append((time.perf_counter() - start) * 1e3)
    return samples
