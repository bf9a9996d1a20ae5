"""The world sizes the multi-rank cases run at, in one place.

Every tensor-parallel case runs at 2 ranks.  A case whose reference does not depend on the size
(Colossal-AI's own layers or policy on the same group, a dense model in one process) adds 4 ranks
where 4 test something 2 do not (a shard of a single head, a row layer summing four partials) and
cost a few seconds; the end-to-end runs stay at 2.
"""
from __future__ import annotations

TP_SIZES = (2, 4)


def tp_id(value: object) -> str:
    """A case id: ``tp2`` for a world size, the value itself otherwise (``ids=tp_id`` in a parametrize)."""
    return f"tp{value}" if isinstance(value, int) else str(value)
