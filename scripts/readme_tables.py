"""Regenerate the tables of README.md and docs/results.md from docs/results/ and its index (``make tables``).

    python scripts/readme_tables.py            # rewrite every generated table (atomically)
    python scripts/readme_tables.py --check    # write nothing; exit 1 naming the tables that differ
                                               # and what the results directory lacks

A generated table is the run of ``|`` lines after a marker line (``<!-- result: ID -->``,
``<!-- results-index -->`` or ``<!-- table: KIND FILE -->``); the markers, the kinds and what each
prints are in :mod:`semimig.bench.readme_tables`.  Exit status 2 with one line naming a marker,
an index entry or a file that is bad.
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
