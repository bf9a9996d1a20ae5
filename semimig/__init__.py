"""semimig: straggler-tolerant 1D tensor parallelism for Colossal-AI.

    from semimig.nn import Linear1D_Col, Linear1D_Row        # drop-in layers
    from semimig.shardformer import SemiMigPolicy             # or swap them in by policy
    from semimig.controller import BalanceController, BalanceConfig   # re-plan every iteration

Importing ``semimig`` itself is cheap and changes nothing in Colossal-AI; ``semimig.nn`` checks
the Colossal-AI version and applies the CPU compatibility shim (:mod:`semimig._compat`).
"""
__version__ = "0.1.0"

from semimig.errors import ConfigError, PlanDisagreement  # noqa: E402  (cheap: no torch import)

__all__ = ["ConfigError", "PlanDisagreement", "__version__"]
