"""SEMI-migration controller: pure decision core, pretest, and the per-iteration runtime."""
from semimig.controller.config import ControllerConfig
from semimig.controller.curves import CostCurves, Curve, fit_constant, fit_curve
from semimig.controller.plan import GroupPlan, RankAction, decide_plan, solve_beta

__all__ = ["ControllerConfig", "CostCurves", "Curve", "GroupPlan", "RankAction", "decide_plan", "fit_constant",
           "fit_curve", "solve_beta", "BalanceConfig", "BalanceController", "MODES"]


def __getattr__(name):
    # The runtime needs the layers (and so colossalai); import it only when asked for.
    if name in ("BalanceConfig", "BalanceController", "MODES", "StepReport"):
        from semimig.controller import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
