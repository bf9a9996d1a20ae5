"""The real CPU throttle (semimig.straggler.throttle) and its launcher (``semimig throttle``).

Rates are measured from the child's own CPU time (psutil) over wall time.  The quota is an upper
bound the kernel enforces, so the upper tolerances are tight-ish; the lower ones are loose because
other work on this shared 2-core machine can take CPU from the child as well.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from semimig.errors import ConfigError
from semimig.straggler.throttle import (
    NAME_PREFIX,
    CpuController,
    CpuThrottle,
    ThrottlePattern,
    ThrottleUnavailable,
    find_cpu_controller,
    pin_to_core,
    remove_stale_throttles,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": REPO}


def _controller_or_skip() -> CpuController:
    if not sys.platform.startswith("linux"):
        pytest.skip("cgroup throttling needs Linux")
    try:
        controller = find_cpu_controller()
    except ThrottleUnavailable as err:
        pytest.skip(f"no cgroup cpu controller: {err}")
    if os.geteuid() != 0:
        pytest.skip("cgroup throttling needs root")
    return controller


@pytest.fixture
def controller() -> CpuController:
    return _controller_or_skip()


def _ours(controller: CpuController) -> set:
    return {n for n in os.listdir(controller.root) if n.startswith(f"{NAME_PREFIX}{os.getpid()}-")}


def _busy_child() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _cpu_rate(pid: int, seconds: float) -> float:
    """CPU seconds per wall second of ``pid`` over ``seconds``."""
    import psutil

    proc = psutil.Process(pid)
    c0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
    time.sleep(seconds)
    return (sum(proc.cpu_times()[:2]) - c0) / (time.monotonic() - t0)


# -- the pure schedule ---------------------------------------------------------------------------

def test_pattern_schedule_starts_throttled_and_repeats():
    p = ThrottlePattern.parse("20:40", fraction=0.25)
    assert (p.on_s, p.off_s, p.fraction) == (20.0, 40.0, 0.25)
    expected = {0.0: 0.25, 19.99: 0.25, 20.0: 1.0, 59.99: 1.0, 60.0: 0.25, 79.0: 0.25, 80.5: 1.0, -3.0: 0.25}
    for t, f in expected.items():
        assert p.fraction_at(t) == f, t
    assert [p.next_change(t) for t in (0.0, 19.0, 20.0, 59.0, 60.0)] == [20.0, 20.0, 60.0, 60.0, 80.0]
    always = ThrottlePattern(on_s=5, off_s=0, fraction=0.5)
    assert always.fraction_at(1e6) == 0.5 and always.next_change(3.0) == float("inf")


def test_ranks_in_turn_take_the_throttled_phases_one_at_a_time():
    """Three ranks in turn: at every instant at most one is throttled (exactly one with no free phase), each
    for ``on_s`` in every cycle of ``n·(on_s + off_s)``; the switching times are where the schedule changes."""
    for on_s, off_s in ((10.0, 0.0), (10.0, 5.0)):
        turns = ThrottlePattern(on_s=on_s, off_s=off_s, fraction=0.25).in_turn(3)
        cycle = 3 * (on_s + off_s)
        grid = [i * 0.25 for i in range(int(2 * cycle / 0.25))]
        for t in grid:
            throttled = [j for j, p in enumerate(turns) if p.fraction_at(t) < 1.0]
            phase = int(t // (on_s + off_s)) % 3
            in_on = (t % (on_s + off_s)) < on_s
            assert throttled == ([phase] if in_on else []), (on_s, off_s, t, throttled)
        for p in turns:
            for t in grid:
                edge = p.next_change(t)
                assert edge > t and p.fraction_at(edge) != p.fraction_at(t), (p.turn, t, edge)
                assert all(p.fraction_at(u) == p.fraction_at(t) for u in grid if t <= u < edge), (p.turn, t, edge)


@pytest.mark.parametrize("kwargs", [{"turn": 2, "turns": 2}, {"turn": -1, "turns": 2}, {"turns": 0}])
def test_a_turn_outside_the_ranks_in_turn_is_refused(kwargs):
    with pytest.raises(ConfigError, match="pattern turn"):
        ThrottlePattern(on_s=1.0, off_s=0.0, fraction=0.5, **kwargs)


def test_the_free_phases_return_to_the_share_the_rank_is_held_to():
    p = ThrottlePattern(on_s=2.0, off_s=4.0, fraction=0.125, free=0.5)
    assert [p.fraction_at(t) for t in (0.0, 1.9, 2.0, 5.9, 6.0)] == [0.125, 0.125, 0.5, 0.5, 0.125]
    with pytest.raises(ConfigError, match="free fraction 0.1 is below the throttled one 0.125"):
        ThrottlePattern(on_s=2.0, off_s=4.0, fraction=0.125, free=0.1)


@pytest.mark.parametrize("text", ["20", "a:b", "20:40:1", "0:5", "-1:5", "5:-1"])
def test_pattern_refuses_bad_text(text):
    with pytest.raises(ConfigError, match="pattern"):
        ThrottlePattern.parse(text, fraction=0.25)


@pytest.mark.parametrize("kwargs", [{"fraction": 0.0}, {"fraction": 1.5}, {"fraction": True},
                                    {"period_us": 999}, {"period_us": 2_000_000}])
def test_throttle_refuses_bad_settings(kwargs):
    with pytest.raises(ConfigError):
        CpuThrottle(**{"fraction": 0.5, **kwargs})


# -- refusals --------------------------------------------------------------------------------------

def test_no_cpu_controller_is_one_line(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n")
    with pytest.raises(ThrottleUnavailable) as err:
        find_cpu_controller(str(mounts))
    assert "\n" not in str(err.value) and "no cgroup cpu controller mounted" in str(err.value)


def test_missing_controller_root_is_one_line(tmp_path):
    missing = CpuController(version=1, root=str(tmp_path / "absent"))
    with pytest.raises(ThrottleUnavailable) as err:
        CpuThrottle(0.5, controller=missing).open()
    assert "\n" not in str(err.value) and "cannot create a cgroup under" in str(err.value)


def test_not_root_is_refused_in_one_line(controller):
    # imports happen as root (nobody may not read this Python's stdlib); then the process becomes
    # 'nobody' and tries to make a throttle
    code = textwrap.dedent("""
        import numbers, os
        from semimig.straggler.throttle import CpuThrottle, ThrottleUnavailable
        os.setgid(65534); os.setuid(65534)
        try:
            CpuThrottle(0.5).open()
        except ThrottleUnavailable as err:
            print("REFUSED", err)
    """)
    out = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("REFUSED"), (out.stdout, out.stderr)
    assert "permission denied" in lines[0] and "root" in lines[0]
    assert "Traceback" not in out.stderr


# -- the real throttle ------------------------------------------------------------------------------

def test_throttle_limits_a_busy_child_and_changes_at_run_time(controller):
    child = _busy_child()
    try:
        with CpuThrottle(0.25, controller=controller) as throttle:
            throttle.attach(child.pid)
            assert throttle.pids() == [child.pid]
            throttled = _cpu_rate(child.pid, 1.5)
            assert 0.15 <= throttled <= 0.40, throttled
            assert throttle.stats()["nr_throttled"] > 0
            throttle.set_fraction(1.0)
            with open(os.path.join(throttle.path, "cpu.cfs_quota_us" if controller.version == 1 else "cpu.max")) as f:
                assert f.read().split()[0] in ("-1", "max")
            throttled_before = throttle.stats()["nr_throttled"]
            free = _cpu_rate(child.pid, 1.0)
            # unlimited: the kernel parks it no more; its rate is whatever the shared machine leaves it
            assert throttle.stats()["nr_throttled"] == throttled_before, (throttled, free)
            throttle.set_fraction(0.1)   # below 1000/4000: the period is lengthened, the limit still holds
            assert throttle.period_us == 10_000
            assert _cpu_rate(child.pid, 1.0) <= 0.2
            path = throttle.path
        assert not os.path.exists(path)
        assert child.poll() is None, "the child outlives the throttle, unthrottled"
    finally:
        child.kill()
        child.wait()


def test_cleanup_after_normal_exit_and_exception(controller):
    before = _ours(controller)
    with CpuThrottle(0.5, controller=controller) as throttle:
        assert os.path.isdir(throttle.path)
    assert _ours(controller) == before
    child = _busy_child()
    try:
        with pytest.raises(KeyError):
            with CpuThrottle(0.5, controller=controller) as throttle:
                throttle.attach(child.pid)
                raise KeyError("boom")
        assert _ours(controller) == before
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_cleanup_when_the_owner_gets_a_signal(controller, signum):
    code = textwrap.dedent("""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGINT, signal.default_int_handler)   # even if started with SIGINT ignored
        from semimig.straggler.throttle import CpuThrottle
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        print(busy.pid, flush=True)
        with CpuThrottle(0.25) as throttle:
            throttle.attach(busy.pid)
            print(throttle.path, flush=True)
            time.sleep(60)
    """)
    owner = subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE, text=True)
    busy_pid = None
    try:
        busy_pid = int(owner.stdout.readline())
        path = owner.stdout.readline().strip()
        assert os.path.isdir(path)
        owner.send_signal(signum)
        rc = owner.wait(timeout=90)  # 30 s once ran out in a loaded CI (not reproduced alone)
        assert rc == -signum, rc          # it still dies of the signal (handlers re-deliver it)
        assert not os.path.exists(path)
        assert not [n for n in os.listdir(controller.root) if n.startswith(f"{NAME_PREFIX}{owner.pid}-")]
    finally:
        owner.kill()
        if busy_pid is not None:
            os.kill(busy_pid, signal.SIGKILL)


def test_remove_stale_throttles_only_removes_dead_owners(controller):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = os.path.join(controller.root, f"{NAME_PREFIX}{dead.pid}-abcd1234")
    live = os.path.join(controller.root, f"{NAME_PREFIX}{os.getpid()}-abcd1234")
    child = _busy_child()
    try:
        os.mkdir(stale)
        os.mkdir(live)
        with open(os.path.join(stale, "cgroup.procs"), "w") as f:
            f.write(str(child.pid))   # a process left inside a crashed run's throttle
        removed = remove_stale_throttles(controller)
        assert stale in removed and not os.path.exists(stale)
        assert os.path.isdir(live) and live not in removed
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()
        for path in (stale, live):
            if os.path.isdir(path):
                os.rmdir(path)


def test_pin_to_core_pins_every_thread():
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity here")
    code = "import threading, time\nfor _ in range(3): threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        core = sorted(os.sched_getaffinity(0))[-1]
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{child.pid}/task")) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        tids = pin_to_core(child.pid, core)
        assert len(tids) == 4
        assert all(os.sched_getaffinity(tid) == {core} for tid in tids)
    finally:
        child.kill()
        child.wait()


# -- the launcher -----------------------------------------------------------------------------------

FAKE_LAUNCHER = r"""
import os, subprocess, sys
WORKER = r'''
import os, sys, time
t0, c0 = time.monotonic(), time.process_time()
while time.monotonic() - t0 < 1.0:
    pass
line = "rank %s cpu %.3f cores %s\n" % (os.environ["RANK"], time.process_time() - c0, sorted(os.sched_getaffinity(0)))
os.write(1, line.encode())   # one write: the two workers share the pipe
'''
workers = [subprocess.Popen([sys.executable, "-c", WORKER],
                            env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in (0, 1)]
codes = [w.wait() for w in workers]
sys.exit(3 if codes == [0, 0] else 1)
"""


def test_cli_throttles_rank_1_of_a_fake_launcher(controller, tmp_path):
    script = tmp_path / "fake_torchrun.py"
    script.write_text(FAKE_LAUNCHER)
    # the subcommand alone (python -m semimig.cli throttle is the same parser, with the others loaded)
    cmd = [sys.executable, "-m", "semimig.straggler.throttle_cli", "--rank", "1", "--fraction", "0.25", "--pin",
           "--", sys.executable, str(script)]
    before = set(os.listdir(controller.root))
    out = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, (out.stdout, out.stderr)      # the command's own exit status
    announced = [line for line in out.stderr.splitlines() if line.startswith("semimig throttle: pid")]
    assert len(announced) == 1 and "RANK 1" in announced[0] and "period 4000 us" in announced[0], out.stderr
    reports = re.findall(r"^rank (\d) cpu ([\d.]+) cores (\[[\d, ]*\])$", out.stdout, flags=re.M)
    assert len(reports) == 2, (out.stdout, out.stderr)
    cpu = {int(r): float(c) for r, c, _ in reports}
    cores = {int(r): k for r, _, k in reports}
    allowed = sorted(os.sched_getaffinity(0))
    # rank 1 ran 1 s of wall time at <= 0.25 of a core (+ the poll before it was attached)
    assert cpu[1] <= 0.45, cpu
    assert cores == {r: str([allowed[r % len(allowed)]]) for r in (0, 1)}, cores
    assert {n for n in os.listdir(controller.root) if n.startswith(NAME_PREFIX)} <= before


def test_cli_help_imports_no_torch():
    code = ("import contextlib, io, sys\nfrom semimig.straggler.throttle_cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    try:\n        main(['--help'])\n    except SystemExit:\n        pass\n"
            "print('--pattern' in out.getvalue(), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "False"], (out.stdout, out.stderr)


def test_cli_refusals_are_one_line(capsys):
    from semimig.straggler.throttle_cli import main

    assert main(["--rank", "1", "--fraction", "0.25", "--"]) == 2
    assert main(["--rank", "1", "--fraction", "0.25", "--pattern", "x", "--", "true"]) == 2
    assert main(["--rank", "1", "--fraction", "1.5", "--", "true"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert [e.split(":")[0] for e in errors] == ["semimig throttle"] * 3, errors
    assert "command" in errors[0] and "pattern" in errors[1] and "fraction" in errors[2]


def test_run_throttled_with_a_pattern_and_timeout(controller, caplog, tmp_path):
    """A pattern switches the fraction at run time; a timeout ends the command with 124, no cgroup
    left; the switch log holds the start and every switch, alternating, in time order."""
    from semimig.straggler.throttle_cli import run_throttled

    lines = []
    before = set(os.listdir(controller.root))
    # the command itself is the rank-0 worker ('env' sets RANK, then execs the busy loop)
    argv = ["env", "RANK=0", sys.executable, "-c", "while True: pass"]
    log = tmp_path / "switches.json"
    started = time.time()
    with caplog.at_level("INFO", logger="semimig.straggler.throttle"):
        rc = run_throttled(argv, rank=0, fraction=0.25, pattern=ThrottlePattern(on_s=0.3, off_s=0.3, fraction=0.25),
                           pin=False, timeout_s=1.5, announce=lines.append, switch_log=str(log))
    assert rc == 124
    switches = json.loads(log.read_text())
    assert len(switches) >= 3 and [s["fraction"] for s in switches[:3]] == [0.25, 1.0, 0.25], switches
    times = [s["unix_s"] for s in switches]
    assert started <= times[0] and times == sorted(times) and time.time() >= times[-1]
    assert all(0.2 < b - a < 0.6 for a, b in zip(times, times[1:])), times
    assert len(lines) == 1 and "pattern 0.3s at 0.25 of a core / 0.3s free" in lines[0], lines
    changes = [r.getMessage() for r in caplog.records if "throttle pattern at" in r.getMessage()]
    assert any("0.25 -> 1" in m for m in changes) and any("1 -> 0.25" in m for m in changes), changes
    assert {n for n in os.listdir(controller.root) if n.startswith(NAME_PREFIX)} <= before


def test_a_pattern_after_a_file_starts_when_the_file_appears(controller, tmp_path):
    """The rank runs free until the file exists (a run's start-up), then the pattern starts throttled.
    The file is the command's own output (the example's ``--started-file``), as the benchmark runs it."""
    from semimig.straggler.throttle_cli import run_throttled

    flag, log = tmp_path / "started", tmp_path / "switches.json"
    worker = f"import pathlib, time; time.sleep(0.8); pathlib.Path({str(flag)!r}).touch(); time.sleep(1.2)"
    started = time.time()
    rc = run_throttled(["env", "RANK=0", sys.executable, "-c", worker, "--started-file", str(flag)], rank=0,
                       fraction=0.25,
                       pattern=ThrottlePattern(on_s=0.5, off_s=0.5, fraction=0.25), pin=False,
                       announce=lambda line: None, switch_log=str(log), pattern_after=str(flag))
    assert rc == 0
    switches = json.loads(log.read_text())
    assert switches and switches[0]["fraction"] == 0.25
    assert switches[0]["unix_s"] >= flag.stat().st_mtime >= started + 0.7  # not before the file appeared
    assert switches[0]["unix_s"] - flag.stat().st_mtime < 1.0  # and soon after it (the watcher's poll)


TURN_LAUNCHER = r"""
import os, subprocess, sys
WORKER = "import time\nt0 = time.monotonic()\nwhile time.monotonic() - t0 < 2.4:\n    pass\n"
workers = [subprocess.Popen([sys.executable, "-c", WORKER], env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r)})
           for r in (0, 1)]
sys.exit(0 if [w.wait() for w in workers] == [0, 0] else 1)
"""


def test_two_ranks_in_turn_share_one_straggler_and_log_each_switch(controller, tmp_path):
    """``--rank 1,0 --pattern 0.4:0``: one cgroup per rank, the pattern starting once both are attached,
    rank 1 throttled first; the switch log holds each rank's start at one instant and then alternates
    ranks, so that at every instant exactly one rank is throttled; no cgroup left."""
    from semimig.straggler.throttle_cli import run_throttled

    script, log, lines = tmp_path / "fake_torchrun.py", tmp_path / "switches.json", []
    script.write_text(TURN_LAUNCHER)
    before = {n for n in os.listdir(controller.root) if n.startswith(NAME_PREFIX)}
    rc = run_throttled([sys.executable, str(script)], rank="1,0", fraction=0.25,
                       pattern=ThrottlePattern(on_s=0.4, off_s=0.0, fraction=0.25), pin=True,
                       announce=lines.append, switch_log=str(log))
    assert rc == 0
    assert sorted(int(re.search(r"RANK (\d)", line).group(1)) for line in lines) == [0, 1], lines
    assert any("turn 1 of 2" in line and "RANK 1" in line for line in lines), lines
    switches = json.loads(log.read_text())
    first = sorted(switches[:2], key=lambda s: s["rank"])
    assert [(s["rank"], s["fraction"], s["held"]) for s in first] == [(0, 1.0, False), (1, 0.25, True)], switches
    assert first[0]["unix_s"] == pytest.approx(first[1]["unix_s"], abs=0.05)
    moves = []  # the switches of one move come within a few ms of each other (two drivers, one origin)
    for s in switches:
        if moves and s["unix_s"] - moves[-1][-1]["unix_s"] < 0.1:
            moves[-1].append(s)
        else:
            moves.append([s])
    state = {}
    for move in moves:
        state.update({s["rank"]: s["fraction"] for s in move})
        assert sorted(state.items()) in ([(0, 1.0), (1, 0.25)], [(0, 0.25), (1, 1.0)]), moves
    assert len(moves) >= 4, moves  # 2.4 s of work over 0.4 s phases: the straggler moves several times
    assert all(0.3 < b[0]["unix_s"] - a[0]["unix_s"] < 0.6 for a, b in zip(moves, moves[1:])), moves
    assert {n for n in os.listdir(controller.root) if n.startswith(NAME_PREFIX)} <= before


def test_ranks_in_turn_under_a_share_return_to_it_between_their_phases(controller, tmp_path):
    """``--share 0.5 --rank 1,0 --pattern 0.4:0 --fraction 0.125``: a rank's free phases run at the share every
    other rank is held to, not at a whole core; the switch log's ``held`` tells the phases apart."""
    from semimig.straggler.throttle_cli import run_throttled

    script, log = tmp_path / "fake_torchrun.py", tmp_path / "switches.json"
    script.write_text(TURN_LAUNCHER)
    rc = run_throttled([sys.executable, str(script)], rank="1,0", fraction=0.125, share=0.5,
                       pattern=ThrottlePattern(on_s=0.4, off_s=0.0, fraction=0.125), announce=lambda line: None,
                       switch_log=str(log))
    assert rc == 0
    switches = json.loads(log.read_text())
    assert len(switches) >= 4 and {s["fraction"] for s in switches} == {0.125, 0.5}, switches
    assert all(s["held"] == (s["fraction"] == 0.125) for s in switches), switches


SPEEDS_LAUNCHER = r"""
import os, subprocess, sys
WORKER = ("import sys, time\nt0 = time.monotonic()\nwhile time.monotonic() - t0 < 2.4:\n    pass\n"
          "open(sys.argv[1], 'w').write(repr((time.process_time(), time.monotonic() - t0)))\n")
out = sys.argv[1]
workers = [subprocess.Popen([sys.executable, "-c", WORKER, os.path.join(out, f"cpu{r}")],
                            env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in (0, 1)]
sys.exit(0 if [w.wait() for w in workers] == [0, 0] else 1)
"""


def test_ranks_of_different_fractions_are_each_held_to_their_own(controller, tmp_path):
    """``--rank 1,0 --fraction 0.25,0.5``: two stragglers of different speeds, each rank in a cgroup of its own at
    the fraction listed beside it: each runs at most its own share of a core (the kernel's quota), rank 0 more
    than rank 1's share allows; no cgroup left."""
    from semimig.straggler.throttle_cli import run_throttled

    script, lines = tmp_path / "fake_torchrun.py", []
    script.write_text(SPEEDS_LAUNCHER)
    before = {n for n in os.listdir(controller.root) if n.startswith(NAME_PREFIX)}
    rc = run_throttled([sys.executable, str(script), str(tmp_path)], rank="1,0", fraction="0.25,0.5", pin=True,
                       announce=lines.append)
    assert rc == 0
    said = {int(re.search(r"RANK (\d)", line).group(1)): re.search(r"fraction ([\d.]+)", line).group(1) for line in lines}
    assert said == {0: "0.5", 1: "0.25"}, lines
    rate = {r: (lambda cpu, wall: cpu / wall)(*eval((tmp_path / f"cpu{r}").read_text())) for r in (0, 1)}
    assert rate[1] < 0.25 * 1.2 + 0.03 and rate[0] < 0.5 * 1.2 + 0.03, rate
    assert rate[0] > 0.25 * 1.2 + 0.03, rate
    assert {n for n in os.listdir(controller.root) if n.startswith(NAME_PREFIX)} <= before


@pytest.mark.parametrize("flags, said", [
    (["--rank", "0,1", "--fraction", "0.25,0.5,0.5"], "gives 3 fractions for 2 rank(s)"),
    (["--rank", "0,1", "--fraction", "0.25,x"], "one per rank"),
    (["--rank", "0", "--fraction", "1.5"], "(0, 1]"),
    (["--rank", "0,1", "--fraction", "0.25,0.5", "--pattern", "1:1"], "take one straggler's phases in turn"),
    (["--rank", "0,1", "--fraction", "0.25,0.5", "--share", "0.4"], "--fraction 0.5 is above --share 0.4: rank 1"),
])
def test_bad_fraction_lists_are_refused_in_one_line(flags, said, tmp_path, capsys):
    from semimig.straggler.throttle_cli import main

    marker = tmp_path / "ran"
    assert main([*flags, "--", "touch", str(marker)]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("semimig throttle: error: ") and said in errors[0], errors
    assert not marker.exists()


@pytest.mark.parametrize("flags, said", [
    (["--rank", "0,0"], "lists a rank twice"),
    (["--rank", "0,x"], "comma-separated ranks"),
    (["--rank", "-1"], "ranks >= 0"),
])
def test_bad_rank_lists_are_refused_in_one_line(flags, said, tmp_path, capsys):
    from semimig.straggler.throttle_cli import main

    marker = tmp_path / "ran"
    assert main([*flags, "--fraction", "0.25", "--", "touch", str(marker)]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("semimig throttle: error: --rank") and said in errors[0], errors
    assert not marker.exists()


def test_a_switch_log_without_a_pattern_is_refused_before_anything_starts(tmp_path):
    from semimig.straggler.throttle_cli import run_throttled

    marker = tmp_path / "ran"
    with pytest.raises(ConfigError, match="--switch-log .* needs --pattern"):
        run_throttled(["touch", str(marker)], rank=1, fraction=0.5, switch_log=str(tmp_path / "s.json"))
    with pytest.raises(ConfigError, match="--switch-log"):
        run_throttled(["touch", str(marker)], rank=1, fraction=0.5, switch_log=str(tmp_path),
                      pattern=ThrottlePattern(on_s=1, off_s=1, fraction=0.5))
    with pytest.raises(ConfigError, match="--pattern-after .* needs --pattern"):
        run_throttled(["touch", str(marker)], rank=1, fraction=0.5, pattern_after=str(tmp_path / "go"))
    with pytest.raises(ConfigError, match="exists already"):
        run_throttled(["touch", str(marker)], rank=1, fraction=0.5, pattern_after=str(tmp_path),
                      pattern=ThrottlePattern(on_s=1, off_s=1, fraction=0.5))
    assert not marker.exists()


def test_semimig_command_registers_throttle(capsys):
    # slow while building the semimig parser imports the other subcommands' modules (torch, colossalai)
    from semimig.cli import main

    assert main(["throttle", "--rank", "0", "--fraction", "0.5", "--"]) == 2
    assert "a command to run is required" in capsys.readouterr().err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_cli_forwards_a_signal_and_leaves_no_cgroup(controller, signum):
    cmd = [sys.executable, "-m", "semimig.straggler.throttle_cli", "--rank", "1", "--fraction", "0.5", "--",
           "env", "RANK=1", sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"]
    launcher = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout.readline() == "ready\n"    # past Python's start-up: SIGINT raises in sleep
        line = launcher.stderr.readline()
        assert line.startswith("semimig throttle: pid"), line
        path = line.rsplit("cgroup ", 1)[1].strip()
        assert os.path.isdir(path)
        launcher.send_signal(signum)
        assert launcher.wait(timeout=30) == 128 + signum   # the command died of the forwarded signal
        assert not os.path.exists(path)
    finally:
        launcher.kill()
        launcher.wait()


def test_run_throttled_kills_a_command_that_ignores_sigterm(controller, tmp_path, monkeypatch):
    """Past the grace after --timeout's SIGTERM, the command and its workers in process groups
    of their own (as torchrun starts them) are killed; nothing of them survives, no cgroup is left."""
    from semimig.straggler import throttle_cli

    monkeypatch.setattr(throttle_cli, "KILL_GRACE_S", 0.5)
    pids = tmp_path / "pids"
    code = textwrap.dedent(f"""
        import os, signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], process_group=0,
                                  env={{**os.environ, "RANK": "0"}})
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{worker.pid}}")
        time.sleep(60)
    """)
    lines = []
    before = set(os.listdir(controller.root))
    rc = throttle_cli.run_throttled([sys.executable, "-c", code], rank=0, fraction=0.5, pin=False,
                                    timeout_s=1.5, announce=lines.append)
    assert rc == 124
    assert len(lines) == 1 and "RANK 0" in lines[0], lines
    launcher_pid, worker_pid = map(int, pids.read_text().split())
    time.sleep(0.2)
    import psutil

    survivors = [pid for pid in (launcher_pid, worker_pid)
                 if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors
    assert {n for n in os.listdir(controller.root) if n.startswith(NAME_PREFIX)} <= before


def test_a_forked_child_does_not_remove_its_parents_throttle(controller):
    with CpuThrottle(0.5, controller=controller) as throttle:
        pid = os.fork()
        if pid == 0:   # the child inherits the throttle, the atexit hook and the SIGTERM handler
            try:
                throttle.close()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert os.path.isdir(throttle.path)
        path = throttle.path
    assert not os.path.exists(path)


def test_a_command_that_cannot_run_is_refused_in_one_line_with_the_shells_code(controller, tmp_path, capsys):
    from semimig.straggler.throttle_cli import main

    not_executable = tmp_path / "script.sh"
    not_executable.write_text("#!/bin/sh\nexit 0\n")  # mode 0644: exists, cannot be executed
    assert main(["--rank", "1", "--fraction", "0.5", "--", str(not_executable)]) == 126
    assert main(["--rank", "1", "--fraction", "0.5", "--", str(tmp_path / "missing")]) == 127
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 2 and all(line.startswith("semimig throttle: error: cannot run") for line in err), err
    assert not [d for d in os.listdir(controller.root) if d.startswith("semimig-throttle-")]


SHARE_LAUNCHER = r"""
import os, subprocess, sys
WORKER = r'''
import os, sys, time
root = sys.argv[1]
deadline = time.monotonic() + 20.0
while time.monotonic() < deadline:   # until the launcher has moved this process into its rank's cgroup
    line = [l for l in open("/proc/self/cgroup").read().splitlines() if "cpu" in l.split(":")[1].split(",")][0]
    path = os.path.join(root, line.split(":", 2)[2].lstrip("/"))
    if os.path.basename(path).startswith("semimig-throttle-"):
        break
    time.sleep(0.02)
time.sleep(0.3)   # the launcher pins this worker on its next poll
quota = open(os.path.join(path, "cpu.cfs_quota_us")).read().strip()
period = open(os.path.join(path, "cpu.cfs_period_us")).read().strip()
line = "rank %s cgroup %s quota %s period %s cores %s\n" % (
    os.environ["RANK"], path, quota, period, sorted(os.sched_getaffinity(0)))
os.write(1, line.encode())   # one write: the workers share the pipe
'''
world = int(sys.argv[2])
workers = [subprocess.Popen([sys.executable, "-c", WORKER, sys.argv[1]],
                            env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(world)]
sys.exit(0 if [w.wait() for w in workers] == [0] * world else 1)
"""


@pytest.mark.parametrize("world, share, fraction, straggler, periods", [
    (4, 0.5, 0.125, 3, {"share": ("2000", "4000"), "straggler": ("1000", "8000")}),
    (8, 0.25, 0.0625, 5, {"share": ("1000", "4000"), "straggler": ("1000", "16000")}),
])
def test_share_puts_every_rank_in_a_cgroup_of_its_own_and_removes_them_all(controller, tmp_path, world, share,
                                                                           fraction, straggler, periods):
    """``--share``: each rank its own cgroup at the share (the straggler at its absolute fraction, its
    period lengthened where the quota would be under 1000 us), each pinned to core rank mod ncpu;
    every cgroup gone when the command ends."""
    if controller.version != 1:
        pytest.skip("the workers read the v1 cpu.cfs_* files")
    script = tmp_path / "fake_torchrun.py"
    script.write_text(SHARE_LAUNCHER)
    cmd = [sys.executable, "-m", "semimig.straggler.throttle_cli", "--rank", str(straggler), "--fraction",
           str(fraction), "--share", str(share), "--", sys.executable, str(script), controller.root, str(world)]
    before = {n for n in os.listdir(controller.root) if n.startswith(NAME_PREFIX)}
    out = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (out.stdout, out.stderr)
    reports = re.findall(r"^rank (\d) cgroup (\S+) quota (\d+) period (\d+) cores (\[[\d, ]*\])$", out.stdout,
                         flags=re.M)
    assert sorted(int(r[0]) for r in reports) == list(range(world)), (out.stdout, out.stderr)
    allowed = sorted(os.sched_getaffinity(0))
    for rank, path, quota, period, cores in reports:
        kind = "straggler" if int(rank) == straggler else "share"
        assert (quota, period) == periods[kind], (rank, quota, period)
        assert cores == str([allowed[int(rank) % len(allowed)]]), (rank, cores)
        assert not os.path.exists(path), path
    assert len({path for _, path, *_ in reports}) == world            # one cgroup per rank
    announced = [line for line in out.stderr.splitlines() if line.startswith("semimig throttle: pid")]
    assert len(announced) == world, out.stderr
    assert {n for n in os.listdir(controller.root) if n.startswith(NAME_PREFIX)} <= before


@pytest.mark.parametrize("flags, said", [
    (["--share", "0"], "--share must be a finite number > 0 and <= 1, got 0.0"),
    (["--share", "1.5"], "--share must be a finite number > 0 and <= 1, got 1.5"),
    (["--share", "0.1"], "--fraction 0.25 is above --share 0.1"),
    (["--share", "0.5", "--pattern", "2:2", "--fraction", "0.6"], "--fraction 0.6 is above --share 0.5"),
])
def test_share_refusals_are_one_line_and_start_nothing(flags, said, tmp_path, capsys):
    from semimig.straggler.throttle_cli import main

    marker = tmp_path / "ran"
    assert main(["--rank", "1", "--fraction", "0.25", *flags, "--", "touch", str(marker)]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("semimig throttle: error: ") and said in errors[0], errors
    assert not marker.exists()
