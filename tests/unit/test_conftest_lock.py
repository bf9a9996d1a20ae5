"""The suite's CPU lock under xdist (tests/conftest.py ``_cpu_lock``): a ``serial`` case runs alone.

Three processes, ordered by what each one logs when it holds the lock: a shared holder, then an
exclusive request (it must wait for the holder), then a shared request made while the exclusive
one waits (it must wait behind it: without the turnstile it would join the first holder at once).
"""
import multiprocessing as mp
import time

from conftest import _cpu_lock, _mutex


def _hold(directory, exclusive, name, seconds, log):
    """Log ``(time, event)`` while holding the lock: a Queue's feeder thread may deliver one process's
    "out" after the next holder's "in", so the order is the monotonic clock's (system-wide), not the
    queue's (CI once read ['exclusive in', 'shared-1 out', ...])."""
    with _cpu_lock(directory, exclusive=exclusive):
        log.put((time.monotonic(), f"{name} in"))
        time.sleep(seconds)
        log.put((time.monotonic(), f"{name} out"))


def test_an_exclusive_case_waits_for_the_holders_and_new_cases_wait_for_it(tmp_path):
    ctx = mp.get_context("fork")
    log = ctx.Queue()
    first = ctx.Process(target=_hold, args=(str(tmp_path), False, "shared-1", 1.0, log))
    first.start()
    assert log.get(timeout=30)[1] == "shared-1 in"
    exclusive = ctx.Process(target=_hold, args=(str(tmp_path), True, "exclusive", 0.3, log))
    exclusive.start()
    time.sleep(0.5)  # the exclusive request is now waiting (the holder keeps the lock 1 s)
    late = ctx.Process(target=_hold, args=(str(tmp_path), False, "shared-2", 0.0, log))
    late.start()
    order = [event for _, event in sorted(log.get(timeout=30) for _ in range(5))]
    for p in (first, exclusive, late):
        p.join(timeout=30)
        assert p.exitcode == 0
    assert order == ["shared-1 out", "exclusive in", "exclusive out", "shared-2 in", "shared-2 out"], order


def _hold_mutex(directory, name, who, log):
    with _mutex(directory, name):
        log.put(f"{who} in")
        time.sleep(0.5)
        log.put(f"{who} out")


def test_cases_of_one_mutex_never_overlap_and_of_two_do(tmp_path):
    ctx = mp.get_context("fork")
    for names, overlap in ((("netns", "netns"), False), (("netns", "other"), True)):
        log = ctx.Queue()
        procs = [ctx.Process(target=_hold_mutex, args=(str(tmp_path), name, f"p{i}", log))
                 for i, name in enumerate(names)]
        for p in procs:
            p.start()
        order = [log.get(timeout=30).split()[1] for _ in range(4)]
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
        assert (order[:2] == ["in", "in"]) is overlap, (names, order)


def test_shared_cases_hold_the_lock_together(tmp_path):
    ctx = mp.get_context("fork")
    log = ctx.Queue()
    procs = [ctx.Process(target=_hold, args=(str(tmp_path), False, f"s{i}", 0.5, log)) for i in range(2)]
    for p in procs:
        p.start()
    order = [event for _, event in sorted(log.get(timeout=30) for _ in range(4))]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert [e.split()[1] for e in order[:2]] == ["in", "in"], order  # both in before either is out
