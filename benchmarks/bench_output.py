"""What the benchmark scripts share: the one interleaved timer, and what ``--json`` writes (the
records plus the run's provenance)."""
from __future__ import annotations

import platform
import sys
import time
from pathlib import Path
from typing import Callable, Hashable, Optional

from semimig._io import check_output_file, write_json
from semimig.errors import ConfigError


def output_problem(path: Optional[Path]) -> Optional[str]:
    """``None`` when ``--json PATH`` can be written (checked before any work), else the one-line reason."""
    if path is None:
        return None
    try:
        check_output_file(path, "--json")
    except ConfigError as err:
        return str(err)
    return None


def write_result(path: Path, benchmark: str, argv: list[str] | None, config: dict, **fields) -> None:
    """Write ``{"benchmark", "argv", "machine", "config", **fields}`` to ``path`` atomically (parents created)."""
    out = {
        "benchmark": benchmark,
        "argv": sys.argv[1:] if argv is None else list(argv),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "device": "cpu"},
        "config": config,
        **fields,
    }
    write_json(path, out)
    print(f"wrote {path}")


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
