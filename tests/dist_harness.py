"""The test suite's multi-rank harness: :func:`semimig.launch.run_on_ranks` (gloo, short timeouts)."""
from semimig.launch import free_port, run_on_ranks

__all__ = ["free_port", "run_on_ranks"]
