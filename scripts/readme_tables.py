"""Regenerate the README's tables from the result files in ``docs/results/`` (``make tables``).

    python scripts/readme_tables.py            # rewrite every marked table of README.md (atomically)
    python scripts/readme_tables.py --check    # write nothing; exit 1 naming the tables that differ

A generated table is the run of ``|`` lines after a ``<!-- table: KIND FILE -->`` line; the kinds
and what each prints are in :mod:`semimig.bench.readme_tables`.  Exit status 2 with one line
naming a marker whose kind or file is bad.
"""
from __future__ import annotations

import sys

from semimig.bench.readme_tables import main
from semimig.errors import ConfigError

if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigError as err:
        print(f"readme_tables: {err}", file=sys.stderr)
        sys.exit(2)
