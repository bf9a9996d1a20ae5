"""pytest configuration shared by every test module.

- The session's rank pools (tests/rank_pool.py) are retired at the end of the run, and the
  terminal summary says how many pools were started and how many cases they served.
- ``make test-fast`` runs ``-m "not slow"``: besides the cases marked ``slow`` in their modules,
  every case of the modules in :data:`SLOW_MODULES` counts as slow (whole modules of end-to-end
  training, subprocess or torchrun runs), so the edit loop stays under 90 s.
"""
import os

import pytest

# Triton's interpreter must be chosen before triton is imported anywhere.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

SLOW_MODULES = frozenset({
    "test_plugin_matrix.py", "test_checkpoint.py", "test_never_hurts.py", "test_hybrid_train.py",
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


def pytest_sessionfinish(session, exitstatus):
    import sys

    if "rank_pool" in sys.modules:
        sys.modules["rank_pool"].shutdown_pools()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    import sys

    stats = sys.modules["rank_pool"].pool_stats() if "rank_pool" in sys.modules else {}
    if stats.get("spawned"):
        terminalreporter.write_line(f"rank pools: {stats['spawned']} started, {stats['cases']} cases served, "
                                    f"{stats['failures']} retired by a failure")
