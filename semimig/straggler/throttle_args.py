"""The launcher's reading of its own flags and of the command it runs (:mod:`semimig.straggler.throttle_cli`):
the ranks to throttle, the world a ``torchrun`` line launches, the command's output paths."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from semimig._validate import check_int
from semimig.errors import ConfigError

__all__ = ["parse_ranks", "parse_fractions", "ranks_text", "fractions_text", "launched_world", "command_outputs"]


def parse_ranks(value: Any, flag: str = "--rank") -> Tuple[int, ...]:
    """The throttled ranks: an int, a sequence of them or ``"R[,R...]"``, each ``>= 0`` and listed once;
    :class:`ConfigError` naming ``flag`` and the bad value otherwise."""
    items = value.split(",") if isinstance(value, str) else [value] if not isinstance(value, (list, tuple)) else value
    ranks = []
    for item in items:
        try:
            ranks.append(int(item.strip()) if isinstance(item, str) else check_int(flag, item, minimum=0))
        except ValueError:
            raise ConfigError(f"{flag} must be a rank or comma-separated ranks (e.g. 1 or 0,1), got {value!r}") from None
    if not ranks or any(r < 0 for r in ranks):
        raise ConfigError(f"{flag} must name ranks >= 0, got {value!r}")
    if len(set(ranks)) != len(ranks):
        raise ConfigError(f"{flag} {value!r} lists a rank twice")
    return tuple(ranks)


def parse_fractions(value: Any, count: int, flag: str = "--fraction") -> Tuple[float, ...]:
    """One share of a core, in (0, 1], per throttled rank: a number for all ``count`` of them, or one per rank
    (a sequence or ``"F[,F...]"``, in the order the ranks are listed); :class:`ConfigError` naming ``flag``
    and the bad value otherwise."""
    items = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else [value]
    fractions = []
    for item in items:
        try:
            f = float(item.strip()) if isinstance(item, str) else item
        except ValueError:
            f = None
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 < f <= 1.0:
            raise ConfigError(f"{flag} must be a share of a core in (0, 1], or one per rank (e.g. 0.25 or 0.25,0.125), "
                              f"got {value!r}")
        fractions.append(float(f))
    if len(fractions) == 1:
        return tuple(fractions) * count
    if len(fractions) != count:
        raise ConfigError(f"{flag} {value!r} gives {len(fractions)} fractions for {count} rank(s): give one, or one per rank")
    return tuple(fractions)


def ranks_text(ranks: Any) -> str:
    """``3`` or ``0,1``: ranks as ``--rank`` takes them (one rank, or several)."""
    return ",".join(map(str, ranks)) if isinstance(ranks, (list, tuple)) else str(ranks)


def fractions_text(fractions: Any) -> str:
    """``0.25`` or ``0.25,0.125``: fractions as ``--fraction`` takes them (one, or one per rank)."""
    return ",".join(f"{f:g}" for f in (fractions if isinstance(fractions, (list, tuple)) else (fractions,)))


_OUTPUT_WORDS = ("json", "log", "out", "save", "plot", "csv", "file", "trace")


def command_outputs(argv: Sequence[str]) -> List[tuple]:
    """``(flag, path)`` of the output-looking flags of a command line (``--json F``, ``--log-file=F``):
    what ``--switch-log`` must not share a path with."""
    found = []
    for i, word in enumerate(argv):
        if not word.startswith("--"):
            continue
        flag, eq, value = word.partition("=")
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        if any(w in flag for w in _OUTPUT_WORDS) and value and not value.startswith("-"):
            found.append((f"the command's {flag}", value))
    return found


def launched_world(argv: Sequence[str]) -> Optional[int]:
    """The world size a ``torchrun`` / ``python -m torch.distributed.run`` command line states
    (``--nproc_per_node N`` times a fixed ``--nnodes M``), else ``None`` (not stated, or elastic)."""
    words = list(argv)
    launcher = bool(words) and os.path.basename(words[0]) in ("torchrun", "colossalai")
    if "torch.distributed.run" in words or "torch.distributed.launch" in words:
        launcher = True
    if not launcher or "--hosts" in words or "--hostfile" in words:  # colossalai run over hosts: not stated
        return None
    values: Dict[str, str] = {}
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        key = flag.replace("-", "_")
        if key in ("__nproc_per_node", "__nnodes"):
            values.setdefault(key, value if eq else (words[i + 1] if i + 1 < len(words) else ""))
    nproc, nnodes = values.get("__nproc_per_node"), values.get("__nnodes", "1")
    if nproc is None or not nproc.isdigit() or not nnodes.isdigit():
        return None
    return int(nproc) * int(nnodes)
