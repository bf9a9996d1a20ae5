"""What every benchmark script writes with ``--json``: its records plus the run's provenance."""
from __future__ import annotations

import json
import platform
import sys
from pathlib import Path


def write_result(path: Path, benchmark: str, argv: list[str] | None, config: dict, **fields) -> None:
    """Write ``{"benchmark", "argv", "machine", "config", **fields}`` to ``path`` (parents created)."""
    out = {
        "benchmark": benchmark,
        "argv": sys.argv[1:] if argv is None else list(argv),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "device": "cpu"},
        "config": config,
        **fields,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")
