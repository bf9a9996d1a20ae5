"""The test suite's multi-rank harness.

- :func:`run_on_ranks` (:func:`semimig.launch.run_on_ranks`): fresh ranks and a fresh gloo group
  per call, for cases that need a fresh process (their own process group, signals to a rank, the
  launcher's own behaviour).
- :func:`run_pooled` (:mod:`rank_pool`): the same contract on the test run's pool of ranks of that
  world size, many cases per spawn; a failing or hanging case fails itself and retires the pool.
"""
import signal

from rank_pool import run_pooled
from semimig.launch import free_port, run_on_ranks

__all__ = ["free_port", "run_on_ranks", "run_pooled", "sigint_as_from_a_terminal"]


def sigint_as_from_a_terminal() -> None:
    """``preexec_fn`` for a child the case sends SIGINT: start it with SIGINT at its default.

    A shell without job control starts background commands with SIGINT ignored (``cmd &`` in a
    script, ``nohup``), a child inherits that, and Python then installs no ``KeyboardInterrupt``
    handler: a case about what Ctrl-C does would test the shell that started the suite instead.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
