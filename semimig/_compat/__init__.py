"""Colossal-AI compatibility, in three parts that change for different reasons:

- :mod:`.version`: the supported release range and :func:`check_colossalai_version`, which
  enforces it (a new Colossal-AI release is checked against it);
- :mod:`.cpu_shim`: :func:`apply_cpu_shim`, which fills the gaps of Colossal-AI's CPU accelerator
  on the paths semimig uses, each only where a probe shows it broken (a release that fixes one
  keeps its own code);
- :mod:`.private`: Colossal-AI's private collectives the drop-in layers call
  (``from semimig._compat import split_forward_gather_backward``), imported in this one place.

Third-party warnings
--------------------
:func:`quiet_third_party` (defined in :mod:`semimig._quiet`, which imports neither torch nor
colossalai, so that ``semimig --help`` stays quick) hides the third-party warnings that say
nothing about a semimig run: tensornvme and apex missing (Colossal-AI, at import), DDP's
``broadcast_buffers`` deprecation (raised through Colossal-AI's plugin, once per rank), torch's
renamed collectives that Colossal-AI's ZeRO still calls, and the bitsandbytes kernel probe (a
log record).  Each is matched by package, message and mechanism;
:mod:`semimig._quiet` says why each is harmless.  ``semimig`` calls it first thing (``-v`` shows
them again); scripts call ``quiet_third_party()`` before importing Colossal-AI.

Importing this package is cheap: it imports torch, not colossalai.
"""
from __future__ import annotations

from typing import Any

from semimig._compat.cpu_shim import apply_cpu_shim
from semimig._compat.private import PRIVATE_OPERATIONS, private_operation
from semimig._compat.version import (BELOW_COLOSSALAI, MIN_COLOSSALAI, TESTED_COLOSSALAI, ColossalAIVersionError,
                                     check_colossalai_version, supported_range)
from semimig._quiet import quiet_third_party  # noqa: F401  (re-exported: see "Third-party warnings")

__all__ = ["BELOW_COLOSSALAI", "MIN_COLOSSALAI", "PRIVATE_OPERATIONS", "TESTED_COLOSSALAI", "ColossalAIVersionError",
           "apply_cpu_shim", "check_colossalai_version", "quiet_third_party", "supported_range"]


def __getattr__(name: str) -> Any:
    return private_operation(name)
