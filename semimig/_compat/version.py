"""Colossal-AI's supported release range, and the check that enforces it.

semimig subclasses ``colossalai.shardformer.layer.Linear1D_Col/Row`` (and ``ParallelModule``),
hands their constructors the keyword arguments Colossal-AI's own policies pass
(``fp8_communication``, ``use_zbv``), wraps
``colossalai.shardformer.policies.auto_policy.get_autopolicy`` and mirrors
``colossalai.legacy.nn.Linear1D_Col/Row``.  Those layers took their present constructor and
forward in 0.4.7 (``use_zbv`` arrived there); from 0.4.7 to 0.5.0 they, the ``_operation``
module behind them, ``ParallelModule``, the legacy 1D layers and launch, the CPU accelerator
and the legacy seed manager are unchanged.  0.6 is excluded until checked: 0.x minor releases
have changed these signatures before.  :func:`check_colossalai_version` enforces
``MIN_COLOSSALAI <= colossalai.__version__ < BELOW_COLOSSALAI``.
"""
from __future__ import annotations

MIN_COLOSSALAI = "0.4.7"
"""Oldest supported Colossal-AI release (inclusive)."""
BELOW_COLOSSALAI = "0.6.0"
"""First Colossal-AI release that is no longer supported (exclusive)."""
TESTED_COLOSSALAI = "0.5.0"
"""The release the test suite runs against."""


class ColossalAIVersionError(ImportError):
    """Colossal-AI is missing or its version is outside ``[MIN_COLOSSALAI, BELOW_COLOSSALAI)``."""


def supported_range() -> str:
    """The supported range as a pip specifier: ``">=0.4.7,<0.6.0"``."""
    return f">={MIN_COLOSSALAI},<{BELOW_COLOSSALAI}"


def check_colossalai_version() -> str:
    """Return ``colossalai.__version__`` if it lies in :func:`supported_range`, else raise.

    Reads the version Colossal-AI reports about itself; importing the top-level ``colossalai``
    package is the only cost, and every caller needs it imported anyway.

    Raises:
        ColossalAIVersionError: colossalai cannot be imported, its version does not parse, or
            it is outside the range.  The message names the version found and the range.
    """
    from packaging.version import InvalidVersion, Version

    wanted = f"semimig needs colossalai{supported_range()} (tested with {TESTED_COLOSSALAI})"
    try:
        import colossalai
    except ImportError as exc:
        raise ColossalAIVersionError(f"{wanted}, but it cannot be imported: {exc}") from exc
    found = str(getattr(colossalai, "__version__", "<no __version__>"))
    try:
        version = Version(found)
    except InvalidVersion as exc:
        raise ColossalAIVersionError(f"{wanted}, but colossalai reports version {found!r}") from exc
    release = Version(version.base_version)  # 0.6.0rc1 counts as 0.6.0, so it is refused
    if not Version(MIN_COLOSSALAI) <= release < Version(BELOW_COLOSSALAI):
        raise ColossalAIVersionError(
            f"{wanted}, but found colossalai {found} at {getattr(colossalai, '__file__', '?')}; "
            f"install it with `pip install --no-deps colossalai=={TESTED_COLOSSALAI}`"
        )
    return found
