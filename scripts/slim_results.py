"""Drop the per-rank traces from saved ``semimig bench`` JSONs, keeping what the report and plots read.

    python scripts/slim_results.py docs/results/*.json              # rewrite in place (atomically)
    python scripts/slim_results.py --out slim/ docs/results/*.json  # write copies into slim/
    python scripts/slim_results.py --check docs/results/*.json      # list what would shrink; write nothing

Each record loses ``trajectory.by_rank`` and ``trajectory.decisions``
(:data:`semimig.bench.results.TRACE_KEYS`), what ``semimig bench`` now keeps only with
``--full-trace``; its summaries and ``trajectory.iter_time_s`` stay, and every other key of the
file (``summary``, ``machine``, ``config``, ``status``, ``sources`` ...) is written back
unchanged.  Files without ``records`` (other benchmarks' JSONs) and records without traces are
left alone.  Exit status 0, or 2 with one line naming a file that is not JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from semimig._io import write_json
from semimig.bench.results import slim_record


def slim(data: dict) -> tuple[dict, int]:
    """``data`` with every record slimmed, and how many records lost a trace."""
    records = data.get("records")
    if not isinstance(records, list):
        return data, 0
    slimmed = [slim_record(r) if isinstance(r, dict) else r for r in records]
    changed = sum(a is not b for a, b in zip(records, slimmed))
    return ({**data, "records": slimmed} if changed else data), changed


def _size(data: dict) -> int:
    return len(json.dumps(data, indent=2, default=str).encode())  # as write_json writes it


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="slim_results.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="saved semimig bench / report JSONs")
    parser.add_argument("--out", type=Path, default=None, help="write slimmed copies here (default: in place)")
    parser.add_argument("--check", action="store_true", help="report what would shrink; write nothing")
    args = parser.parse_args(argv)
    for path in args.files:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            print(f"slim_results.py: error: {path}: {err}", file=sys.stderr)
            return 2
        if not isinstance(data, dict):
            print(f"{path}: not a results object, left alone")
            continue
        new, changed = slim(data)
        before = path.stat().st_size
        if not changed:
            print(f"{path}: {before / 1e6:.2f} MB, no per-rank traces")
            continue
        after = _size(new)
        target = path if args.out is None else args.out / path.name
        verb = "would write" if args.check else "wrote"
        print(f"{path}: {before / 1e6:.2f} MB -> {after / 1e6:.2f} MB ({changed} records slimmed); {verb} {target}")
        if not args.check:
            write_json(target, new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
