"""semimig's own error types: what a user-reachable bad input raises.

Every value semimig refuses (a config field, a CLI flag, a JSON key, a keep plan) raises
:class:`ConfigError` with the field and the bad value in the message.  It subclasses both
``ValueError`` and ``TypeError``, so code that caught either before keeps working, and a caller
can catch semimig's refusals apart from bugs::

    try:
        BalanceConfig(mode="fast")
    except semimig.ConfigError as err:
        print(err)          # mode must be one of (...), got 'fast'

:class:`PlanDisagreement` is raised on every rank of a group whose ranks hold different plans
(DESIGN §3a): it names the ranks and the differing fields.  :class:`RankFailure` (in
:mod:`semimig.launch`) reports a rank that raised, died or froze.
"""
from __future__ import annotations

__all__ = ["ConfigError", "PlanDisagreement"]


class ConfigError(ValueError, TypeError):
    """A user-reachable input semimig refuses; the message names the input and its bad value."""


class PlanDisagreement(RuntimeError):
    """The ranks of a group hold different plans; the message names the ranks and the fields."""
