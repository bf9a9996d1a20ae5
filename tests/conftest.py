"""pytest configuration shared by every test module.

- The session's rank pools (tests/rank_pool.py) are retired at the end of the run, and the
  terminal summary says how many pools were started and how many cases they served.
- Every process the suite starts writes its temporary files under one directory of its own
  (``TMPDIR``), removed when the run ends: torchrun's agents leave a ``torchelastic_*`` log
  directory per run and multiprocessing a ``pymp-*`` one, which piled up in ``/tmp`` before.
- ``make test-fast`` runs ``-m "not slow"``: besides the cases marked ``slow`` in their modules,
  a case counts as slow when its module is in :data:`SLOW_MODULES` (end-to-end training, ranks
  started by fixtures or helpers, subprocess or torchrun runs) or when its own source starts ranks
  or processes (:data:`SPAWNS`), so the edit loop stays under 90 s; ``make test`` runs them all.
"""
import inspect
import os
import shutil
import tempfile

import pytest

# Triton's interpreter must be chosen before triton is imported anywhere.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

SLOW_MODULES = frozenset({
    "test_plugin_matrix.py", "test_checkpoint.py", "test_never_hurts.py", "test_hybrid_train.py",
    "test_launch.py", "test_uneven_policy.py", "test_rank_pool.py",
})
# Cases whose ranks or processes start in a fixture or helper (not seen by SPAWNS), by function name.
SLOW_CASES = frozenset({
    "test_bench_writes_json_and_plots", "test_two_node_allreduce_shaped_and_cleaned",
    "test_largest_accepted_curve_allocates", "test_without_shim_sharding_a_model_with_dropout_fails",
    "test_tiny_run_writes_sane_records", "test_throttle_limits_a_busy_child_and_changes_at_run_time",
    "test_uneven_mlp_tp2_fp32", "test_uneven_mlp_tp4_fp32", "test_uneven_mlp_tp2_bf16",
})


SPAWNS = ("run_on_ranks(", "run_pooled(", "subprocess.", "Popen(", "torchrun", "_torchrun(", "run_throttled(")


def _spawns(item) -> bool:
    try:
        source = inspect.getsource(item.function)
    except (AttributeError, OSError, TypeError):
        return False
    return any(marker in source for marker in SPAWNS)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW_MODULES or item.originalname in SLOW_CASES or _spawns(item):
            item.add_marker(pytest.mark.slow)


_PRIVATE_TMP = None


def pytest_configure(config):
    global _PRIVATE_TMP
    _PRIVATE_TMP = tempfile.mkdtemp(prefix="semimig-tests-")
    os.environ["TMPDIR"] = _PRIVATE_TMP


def pytest_unconfigure(config):
    if _PRIVATE_TMP is not None:
        shutil.rmtree(_PRIVATE_TMP, ignore_errors=True)


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
