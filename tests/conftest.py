"""pytest configuration shared by every test module.

- The tests are laid out by what they start: ``unit/`` (one process, no process group of several
  ranks, no subprocess), ``multirank/`` (real gloo process groups of 2-4 ranks, spawned or from the
  rank pools) and ``e2e/`` (the command line, torchrun, subprocess launchers and the benchmark
  scripts end to end).  The helpers they share stay in this folder, put on ``sys.path`` here.

- The rank pools (tests/rank_pool.py) are retired at the end of the run, and the
  terminal summary says how many pools were started and how many cases they served.
- Every process the suite starts writes its temporary files under one directory of its own
  (``TMPDIR``), removed when the run ends: torchrun's agents leave a ``torchelastic_*`` log
  directory per run and multiprocessing a ``pymp-*`` one, which piled up in ``/tmp`` before.
- ``make test-fast`` runs ``-m "not slow"``: besides the cases marked ``slow`` in their modules,
  a case counts as slow when its module is in :data:`SLOW_MODULES` (end-to-end training, ranks
  started by helpers, subprocess or torchrun runs) or when its own source, or that of a fixture it
  uses, starts ranks or processes (:data:`SPAWNS`), so the edit loop stays under 90 s (42 s on the
  reference machine); ``make test`` runs them all.
- ``PYTEST_WORKERS=2 make test`` runs on two pytest-xdist workers (one per core of the reference
  machine: a third of a serial run's CPU time was idle, waiting on process start-up); not the
  default yet (README: timing-dependent cases failed under it).  The cases that assert measured
  CPU rates or sleep accuracy (:data:`SERIAL_MODULES`, marked ``serial``) must not share the
  machine: every case holds a shared lock, a ``serial`` case an exclusive one (:func:`_cpu_lock`,
  ``flock`` on files in the controller's temporary directory, with a turnstile so a waiting
  ``serial`` case is not starved), so a ``serial`` case runs alone and the others two at a time.
  Cases marked ``mutex(name)`` never run beside another of the same name (the emulated-cluster
  cases compare the machine's namespaces before and after).  (pytest-xdist's own ``loadgroup``
  does not group under pytest 9: it renames ``item._nodeid``, which pytest 9 no longer reads.)
- A ``serial`` case asserts what a rank measured of its own time (a straggler flagged, a healthy rank
  never), so a burst of load from outside the suite while it runs (the host's other tenants) is a
  real straggler to it.  It runs once more when it fails (pytest-rerunfailures, the run's summary
  lists each rerun) and fails when both runs fail: a mistake in the code under test fails every run,
  a host's passing burst one.
"""
import contextlib
import fcntl
import functools
import inspect
import os
import shutil
import sys
import tempfile

import pytest

# The shared helpers (rank_pool, dist_harness, tiny_lms, ...) live here, beside the unit/, multirank/
# and e2e/ folders; every test module imports them as top-level modules.
_TESTS = os.path.dirname(os.path.abspath(__file__))
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from _backends import backend, cpu_path  # noqa: F401 - the multi-rank modules' gloo/nccl fixtures

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
    "test_the_straggler_interface_carries_each_block_once_under_direct",  # an emulated cluster, via the benchmark
    "test_measured_run_uses_two_ranks_and_real_gemms",
})


# Cases that assert measured CPU rates or sleep accuracy, that a straggler injected in proportion to
# measured GEMM time is flagged, or that nothing is flagged on measured time with no straggler (the
# other worker's load is a real, passing straggler to them: seen flagging a healthy rank once): they
# run alone.
SERIAL_MODULES = frozenset({"test_throttle.py", "test_straggler.py", "test_device_straggler.py",
                            "test_controller_runtime.py", "test_resizing_layers.py", "test_reshard_enable.py",
                            "test_never_hurts.py", "test_controller_reactive.py", "test_hybrid_train.py",
                            "test_reshard_pipeline.py"})
SERIAL_CASES = frozenset({"test_a_straggler_is_balanced_and_summarised",
                          "test_a_whole_device_straggler_reports_the_balanced_share_of_every_rank",
                          "test_waiting_in_collectives_is_not_counted_as_compute",
                          "test_the_slow_rank_prunes_within_the_first_slow_step_and_the_fast_rank_never",
                          "test_measured_compute_slows_the_straggler_by_its_own_measured_time",
                          "test_the_joint_planner_moves_plans_and_split_together_and_trains_exactly",
                          "test_bench_reshard_moves_shards_off_a_slow_device_and_keeps_the_baselines_accuracy",
                          "test_the_slow_replica_re_plans_alone_and_every_replica_trains_exactly",
                          "test_the_joint_planner_moves_nothing_when_calm_and_never_the_healthy_replica",
                          "test_a_batch_split_trains_the_model_of_the_plain_data_parallel_run"})
SERIAL_RERUNS = 1

SPAWNS = ("run_on_ranks(", "run_pooled(", "subprocess.", "Popen(", "torchrun", "_torchrun(", "run_throttled(")


@functools.lru_cache(maxsize=None)
def _source_spawns(function) -> bool:
    """Whether ``function``'s source starts ranks or processes (:data:`SPAWNS`); once per function."""
    try:
        source = inspect.getsource(function)
    except (AttributeError, OSError, TypeError):
        return False
    return any(marker in source for marker in SPAWNS)


def _spawns(item) -> bool:
    """The case, or a fixture it uses, starts ranks or processes (a module's spawn in a shared fixture
    is paid by its first case: those cases are slow too, though their own bodies only read results)."""
    if _source_spawns(getattr(item, "function", None)):
        return True
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.values() if info is not None else ()
    return any(_source_spawns(d.func) for defs in definitions for d in defs)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW_MODULES or item.originalname in SLOW_CASES or _spawns(item):
            item.add_marker(pytest.mark.slow)
        if item.path.name in SERIAL_MODULES or item.originalname in SERIAL_CASES:
            item.add_marker(pytest.mark.serial)
        if item.get_closest_marker("serial") is not None and item.get_closest_marker("flaky") is None:
            item.add_marker(pytest.mark.flaky(reruns=SERIAL_RERUNS))


LOCKS_ENV = "SEMIMIG_TEST_LOCKS"


@contextlib.contextmanager
def _cpu_lock(directory: str, *, exclusive: bool):
    """A readers-writer lock across the xdist workers: shared for ordinary cases, exclusive for
    ``serial`` ones.  Every case passes the turnstile first; a ``serial`` case holds it while it
    waits, so no new case starts before it runs."""
    with open(os.path.join(directory, "turnstile"), "a") as gate, open(os.path.join(directory, "cpu"), "a") as cpu:
        fcntl.flock(gate, fcntl.LOCK_EX)
        if not exclusive:
            fcntl.flock(gate, fcntl.LOCK_UN)
        fcntl.flock(cpu, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if exclusive:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(cpu, fcntl.LOCK_UN)


@contextlib.contextmanager
def _mutex(directory: str, name: str):
    """Cases marked ``mutex(name)`` with the same name never run at the same time."""
    with open(os.path.join(directory, f"mutex-{name}"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The case's share of the machine under xdist (module docstring), held around its whole
    protocol: set-up (module fixtures that start runs included), call and teardown.  Nothing
    without workers."""
    directory = os.environ.get(LOCKS_ENV)
    if not directory or not hasattr(item.config, "workerinput"):
        yield
        return
    with contextlib.ExitStack() as held:
        for mark in item.iter_markers("mutex"):
            held.enter_context(_mutex(directory, mark.args[0]))
        held.enter_context(_cpu_lock(directory, exclusive=item.get_closest_marker("serial") is not None))
        yield


_PRIVATE_TMP = None


def pytest_configure(config):
    global _PRIVATE_TMP
    _PRIVATE_TMP = tempfile.mkdtemp(prefix="semimig-tests-")
    os.environ["TMPDIR"] = _PRIVATE_TMP
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist): the workers inherit it
        os.environ[LOCKS_ENV] = _PRIVATE_TMP


def pytest_unconfigure(config):
    import sys

    if "rank_pool" in sys.modules:  # the pools' ranks end before their temporary directory goes
        sys.modules["rank_pool"].shutdown_pools()
    if _PRIVATE_TMP is not None:
        shutil.rmtree(_PRIVATE_TMP, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    import sys

    stats = sys.modules["rank_pool"].pool_stats() if "rank_pool" in sys.modules else {}
    if stats.get("spawned"):
        terminalreporter.write_line(f"rank pools: {stats['spawned']} started, {stats['cases']} cases served, "
                                    f"{stats['failures']} retired by a failure")
