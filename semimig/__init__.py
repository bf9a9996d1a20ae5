"""semimig: straggler-tolerant 1D tensor parallelism for Colossal-AI.

    from semimig.nn import Linear1D_Col, Linear1D_Row        # drop-in layers
    from semimig.shardformer import SemiMigPolicy             # or swap them in by policy
    from semimig.controller import BalanceController, BalanceConfig   # re-plan every iteration
    balancer = semimig.enable(model, plugin, optimizer=optimizer)     # or all of it, one call
    balancer = semimig.enable(..., batch=semimig.BatchSplit(global_batch_size=64))  # + Poplar across DP groups

Importing ``semimig`` itself is cheap and changes nothing in Colossal-AI; ``semimig.nn`` checks
the Colossal-AI version and applies the CPU compatibility shim (:mod:`semimig._compat`);
``semimig.enable`` (:mod:`semimig.balancer`) and ``semimig.BatchSplit`` (:mod:`semimig.hybrid.split`)
are imported on first use.
"""
__version__ = "0.1.0"

from semimig.errors import ConfigError, PlanDisagreement  # noqa: E402  (cheap: no torch import)

__all__ = ["BatchSplit", "ConfigError", "PlanDisagreement", "__version__", "enable"]


def __getattr__(name: str):
    # semimig.enable (semimig.balancer) needs the layers (and so colossalai); import it only when asked for.
    if name == "enable":
        from semimig.balancer import enable

        return enable
    if name == "BatchSplit":
        from semimig.hybrid.split import BatchSplit

        return BatchSplit
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
