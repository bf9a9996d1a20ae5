"""A re-plan as the run reports it, and its log lines (TP rank 0 of the replica that moved)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["ReplanEvent", "log_measured", "log_replan"]

logger = logging.getLogger(__name__)


@dataclass
class ReplanEvent:
    """One re-plan as the run reports it (JSON-friendly through :meth:`as_dict`)."""

    step: int
    plan: str
    mlp_units: tuple
    kv_units: tuple
    predicted_s: float
    before_s: float
    bytes_moved: int
    move_s: float
    reason: str
    measured_s: Optional[float] = None
    """Measured step (max compute + min communication, window median) once a full window ran under it."""
    extra: dict = field(default_factory=dict)
    replica: Optional[int] = None
    """The data-parallel replica that moved (a plan per replica); ``None``: every replica, one plan."""

    def as_dict(self) -> dict:
        out = {"step": self.step, "plan": self.plan, "mlp_units": list(self.mlp_units),
               "kv_units": list(self.kv_units), "predicted_s": self.predicted_s, "before_s": self.before_s,
               "measured_s": self.measured_s, "bytes_moved": self.bytes_moved, "move_s": self.move_s,
               "reason": self.reason}
        if self.replica is not None:
            out["replica"] = self.replica
        return out



def log_replan(event: ReplanEvent, new: Any, decision: Any) -> None:
    """One INFO line for a move: the plan, the speed ratios, the step before and the predicted one,
    the move's bytes and seconds, the policy's reason."""
    who = "" if event.replica is None else f" of replica {event.replica}"
    ratios = "/".join(f"{s:.2f}" for s in decision.speed_ratios)
    if event.step < 0:
        logger.info("semimig re-plan%s before the first step: %s (speed ratios %s); predicted step %.2fx the even "
                    "one; moved %.2f MB in %.3f s (%s)", who, new, ratios, decision.predicted_s,
                    event.bytes_moved / 1e6, event.move_s, decision.reason)
    else:
        logger.info("semimig re-plan%s at step %d: %s (speed ratios %s); step %.4f s -> predicted %.4f s; moved "
                    "%.2f MB in %.3f s (%s)", who, event.step, new, ratios, decision.current_s,
                    decision.predicted_s, event.bytes_moved / 1e6, event.move_s, decision.reason)


def log_measured(event: ReplanEvent, steps: int) -> None:
    """One INFO line once a re-plan's step is measured (over ``steps`` steps): beside the predicted one."""
    who = "" if event.replica is None else f" of replica {event.replica}"
    if event.step < 0:  # the probe's: predicted relative to the even step
        logger.info("semimig re-plan%s before the first step: measured step %.4f s over the first %d steps under "
                    "it (predicted %.2fx the even step)", who, event.measured_s, steps, event.predicted_s)
    else:
        logger.info("semimig re-plan%s of step %d: measured step %.4f s over the next %d steps (predicted %.4f s, "
                    "%.4f s before)", who, event.step, event.measured_s, steps, event.predicted_s, event.before_s)
