"""What every benchmark script writes with ``--json``: its records plus the run's provenance."""
from __future__ import annotations

import platform
import sys
from pathlib import Path
from typing import Optional

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
