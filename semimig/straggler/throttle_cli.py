"""``semimig throttle``: run a command and throttle its worker of one rank, or several (a real CPU straggler).

    semimig [-v] throttle --rank R[,R...] --fraction F[,F...] [--share S] [--period-us P]
                          [--pattern ON:OFF [--pattern-after PATH] [--switch-log F]]
                          [--pin] [--timeout S] -- COMMAND ARGS...

e.g. ``semimig throttle --rank 1 --fraction 0.25 --pin -- torchrun --nproc_per_node 2 train.py``.
COMMAND starts in its own process group.  Its descendants are watched (every ``poll_s``); one whose
environment has ``RANK == R`` (``LOCAL_RANK`` where ``RANK`` is absent) is attached to a
:class:`~semimig.straggler.throttle.CpuThrottle` as soon as it appears, together with any process
it started before that (they share the rank's quota; later children follow by themselves).
``--pin`` pins every worker (all threads) to core ``LOCAL_RANK mod ncpu`` of the cores this
launcher may use.  ``--share S`` holds every other rank too, each in a cgroup of its own at ``S``
of a core (``--fraction`` stays absolute: ``--share 0.5 --fraction 0.125`` makes rank R four times
slower than the others), and pins every worker as ``--pin`` does: more ranks than cores, each
with a known share of one (``F <= S``; with ``--pattern`` its free phases return to ``S``).  ``--pattern ON:OFF``
throttles for ON seconds then frees for OFF, repeating,
from the moment the worker is attached (or, with ``--pattern-after PATH``, from the moment PATH
exists: the rank runs free until then); ``--switch-log FILE`` writes the wall-clock times of its
switches there when COMMAND ends (to match a run's steps with the phases; an existing file needs
``--overwrite``, and it may not be one of COMMAND's own output paths).  Several ranks (``--rank 0,1``)
each get a cgroup of their own: all at ``F``, each at its own (``--rank 2,3 --fraction 0.25,0.125``: two
stragglers of different speeds), or with ``--pattern`` a straggler that moves, the ranks
taking the throttled phases in turn in the order listed (``--rank 0,1 --pattern 30:0``: rank 0 for 30 s,
then rank 1 for 30 s, ...; the pattern starts once every listed rank is attached).  SIGINT, SIGTERM, SIGHUP
and SIGQUIT are forwarded to COMMAND's process group (SIGKILL follows if it is still running 10 s
later); COMMAND gets SIGTERM if the launcher itself is killed, SIGKILL included
(:func:`semimig._lifetime.die_with_parent`); every cgroup is removed on every exit path, and
leftovers of crashed runs are removed first.

Exit status: COMMAND's (128 + N when it died of signal N, 124 after ``--timeout``); 128 + N when the
launcher got signal N before COMMAND started (it is not started then); 1 when COMMAND
succeeded but nothing was throttled as asked (no process of rank R appeared, or the
``--pattern-after`` file never did), said in one line; 2 with a one-line message when the flags
cannot apply (a rank outside the world COMMAND launches, ``torchrun --nproc_per_node N``) or a
throttle cannot be made here (nothing is started then).
:func:`run_throttled` is the same launcher for benchmarks.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from semimig._io import check_apart, check_new_file, write_json
from semimig._lifetime import END_SIGNALS, own_group_dying_with_parent
from semimig._validate import check_bool, check_number
from semimig.errors import ConfigError
from semimig.straggler.throttle import (
    DEFAULT_PERIOD_US,
    CpuController,
    CpuThrottle,
    PatternDriver,
    ThrottlePattern,
    pin_to_core,
    remove_stale_throttles,
)
from semimig.straggler.throttle_args import (command_outputs, fractions_text, launched_world, parse_fractions,
                                             parse_ranks, ranks_text)

__all__ = ["add_throttle_subcommand", "run_throttled", "parse_ranks"]

logger = logging.getLogger(__name__)

KILL_GRACE_S = 10.0


def _rank_env(proc: Any) -> Optional[Dict[str, int]]:
    """``{"rank": .., "local_rank": ..}`` from a process's environment, or None (no rank / unreadable)."""
    import psutil

    try:
        env = proc.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return None
    rank, local = env.get("RANK", env.get("LOCAL_RANK")), env.get("LOCAL_RANK", env.get("RANK"))
    try:
        return None if rank is None else {"rank": int(rank), "local_rank": int(local)}
    except ValueError:
        return None


class _Watcher:
    """The per-poll work: find ranked descendants, attach each throttled rank's to its own throttle (and,
    with ``share_throttle``, every other rank's to a cgroup of its own), pin workers, start the patterns."""

    def __init__(self, root_pid: int, throttles: Dict[int, CpuThrottle], *, pin: bool,
                 patterns: Optional[Dict[int, ThrottlePattern]], announce: Callable[[str], None],
                 on_switch: Optional[Callable[[int, float, float], None]] = None,
                 pattern_after: Optional[str] = None,
                 share_throttle: Optional[Callable[[], CpuThrottle]] = None, world: Optional[int] = None) -> None:
        import psutil

        self._root = psutil.Process(root_pid)
        self._throttles, self._pin, self._patterns = throttles, pin, patterns
        self._announce, self._on_switch, self._pattern_after = announce, on_switch, pattern_after
        self._share_throttle, self._world = share_throttle, world
        self._cpus = sorted(os.sched_getaffinity(0))
        self._ranked: Dict[int, Dict[str, int]] = {}
        self._pinned: Dict[int, set] = {}
        self.shares: Dict[int, CpuThrottle] = {}
        """With ``share_throttle``: every other rank seen so far and its own throttle."""
        self.drivers: List[PatternDriver] = []
        """The patterns' drivers, one per throttled rank, started together (from one origin)."""
        self.attached: set = set()
        """The throttled ranks a process of which has been attached (and announced)."""

    @property
    def found(self) -> bool:
        """Whether a process of every throttled rank has been attached."""
        return len(self.attached) == len(self._throttles)

    @property
    def started(self) -> bool:
        """Whether the patterns run (``True`` without one)."""
        return self._patterns is None or bool(self.drivers)

    @property
    def settled(self) -> bool:
        """Whether every rank asked for has been attached (polling may slow down then): the throttled
        ranks, and with ``share_throttle`` and a known world every other rank as well."""
        if not self.found:
            return False
        others = None if self._world is None else self._world - len(self._throttles)
        return self._share_throttle is None or others is None or len(self.shares) >= others

    def _start_patterns(self) -> None:
        """Every throttled rank's pattern from one origin, once all of them are attached (and, with
        ``pattern_after``, the file exists): a straggler in turn keeps one rank throttled at a time."""
        if self.started or not self.found:
            return
        if self._pattern_after is not None:
            if not os.path.exists(self._pattern_after):
                return
            logger.info("throttle: %s appeared; the pattern starts", self._pattern_after)
        origin = time.monotonic()
        for rank, throttle in sorted(self._throttles.items()):
            report = None if self._on_switch is None else functools.partial(self._on_switch, rank)
            self.drivers.append(PatternDriver(throttle, self._patterns[rank], on_switch=report).start(origin))

    def poll(self) -> None:
        import psutil

        self._start_patterns()

        try:
            procs = [self._root] + self._root.children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for proc in procs:
            if proc.pid not in self._ranked:
                info = _rank_env(proc)
                if info is None:
                    continue
                self._ranked[proc.pid] = info
                if info["rank"] in self._throttles:
                    self._attach(proc.pid, info)
                elif self._share_throttle is not None:
                    self._attach_share(proc.pid, info)
            if self._pin:
                self._pin_new_threads(proc.pid, self._ranked[proc.pid]["local_rank"])

    def _attach(self, pid: int, info: Dict[str, int]) -> None:
        rank = info["rank"]
        throttle = self._throttles[rank]
        try:
            throttle.attach(pid)
        except ProcessLookupError:
            return
        if rank in self.attached:
            logger.info("throttle: pid %d (RANK %d) joins %s", pid, rank, throttle.path)
            return
        self.attached.add(rank)
        pattern = None if self._patterns is None else self._patterns[rank]
        if pattern is not None:
            what = f"pattern {pattern.on_s:g}s at {pattern.fraction:g} of a core / {pattern.off_s:g}s free"
            if pattern.turns > 1:
                what += f", turn {pattern.turn + 1} of {pattern.turns}"
        elif throttle.fraction >= 1.0:
            what = "fraction 1 (unlimited)"
        else:
            what = f"fraction {throttle.fraction:g} of a core"
        self._announce(f"semimig throttle: pid {pid} (RANK {rank}, LOCAL_RANK {info['local_rank']}) "
                       f"throttled, {what}, period {throttle.period_us} us, cgroup {throttle.path}")
        self._start_patterns()

    def _attach_share(self, pid: int, info: Dict[str, int]) -> None:
        """Into the cgroup of ``info``'s rank (made at its first process; later ones join it)."""
        throttle = self.shares.get(info["rank"])
        first = throttle is None
        if first:
            throttle = self.shares[info["rank"]] = self._share_throttle()
        try:
            throttle.attach(pid)
        except ProcessLookupError:
            return
        if first:
            self._announce(f"semimig throttle: pid {pid} (RANK {info['rank']}, LOCAL_RANK {info['local_rank']}) "
                           f"held to its share, {throttle.fraction:g} of a core, period {throttle.period_us} us, "
                           f"cgroup {throttle.path}")
        else:
            logger.info("throttle: pid %d (RANK %d) joins %s", pid, info["rank"], throttle.path)

    def _pin_new_threads(self, pid: int, local_rank: int) -> None:
        core = self._cpus[local_rank % len(self._cpus)]
        try:
            tids = {int(t) for t in os.listdir(f"/proc/{pid}/task")}
        except FileNotFoundError:
            return
        done = self._pinned.setdefault(pid, set())
        if tids - done:
            if not done:
                logger.info("throttle: pid %d (LOCAL_RANK %d) pinned to core %d", pid, local_rank, core)
            try:
                done.update(pin_to_core(pid, core))
            except OSError as err:
                logger.warning("cannot pin pid %d to core %d: %s", pid, core, err)
                done.update(tids)


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group and every descendant (torchrun starts its workers in process groups of their own)."""
    import psutil

    try:
        descendants = psutil.Process(pid).children(recursive=True)  # before the root dies and they are re-parented
    except psutil.NoSuchProcess:
        descendants = []
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for child in descendants:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run_throttled(argv: Sequence[str], *, rank: Any, fraction: Any, period_us: int = DEFAULT_PERIOD_US,
                  pattern: Optional[ThrottlePattern] = None, pin: bool = True, timeout_s: Optional[float] = None,
                  poll_s: float = 0.05, controller: Optional[CpuController] = None,
                  announce: Optional[Callable[[str], None]] = None, switch_log: Optional[str] = None,
                  pattern_after: Optional[str] = None, overwrite: bool = False,
                  share: Optional[float] = None) -> int:
    """Run ``argv`` with its rank-``rank`` worker throttled (module docstring); returns the exit status.

    ``rank``: one rank or several (:func:`parse_ranks`), each in a cgroup of its own: all at ``fraction``, each
    at its own where ``fraction`` gives one per rank (:func:`parse_fractions`), or with a ``pattern`` taking its
    throttled phases in turn, in the order listed (a straggler that moves:
    :meth:`~semimig.straggler.throttle.ThrottlePattern.in_turn`).
    ``pattern`` (its own fraction) replaces ``fraction`` when given.  ``announce`` receives the one
    line saying what was throttled (default: logged at INFO).  ThrottleUnavailable is raised before
    anything starts when no throttle can be made.  Signals are forwarded only when called from the
    main thread.  ``switch_log`` (with a ``pattern`` only): a JSON file written when the command
    ends, ``[{"unix_s": .., "fraction": .., "rank": .., "held": ..}, ...]``, each rank's start and every switch (checked
    writable before the command starts).  ``pattern_after`` (with a ``pattern`` only): the rank runs
    free until this path exists, then the pattern starts (a run's training, not its start-up).
    ``overwrite``: replace an existing ``switch_log``.  Each switch's ``held`` says whether it throttled its
    rank (set the pattern's fraction) or freed it.  A command that succeeds with nothing throttled
    as asked returns 1 (module docstring).  ``share`` (in (0, 1], at least ``fraction``): every other
    rank in a cgroup of its own at this share of a core, each made when the rank's first process
    appears, all removed on every exit path; it implies ``pin``, and a ``pattern``'s free phases return to it.
    """
    argv = [str(a) for a in argv]
    if not argv:
        raise ConfigError("command must not be empty, got []")
    ranks = parse_ranks(rank)
    fractions = dict(zip(ranks, parse_fractions(fraction, len(ranks))))
    if pattern is not None and len(set(fractions.values())) > 1:
        raise ConfigError(f"--fraction {fractions_text(list(fractions.values()))} gives the ranks different "
                          f"fractions, but --pattern's ranks take one "
                          "straggler's phases in turn: give one fraction")
    check_bool("pin", pin)
    if share is not None:
        share = check_number("--share", share, minimum=0.0, maximum=1.0, low_open=True)
    check_number("timeout_s", timeout_s, minimum=0.0, low_open=True, allow_none=True)
    check_number("poll_s", poll_s, minimum=0.0, low_open=True)
    announce = announce or logger.info
    world = launched_world(argv)
    missing = [r for r in ranks if world is not None and r >= world]
    if missing:
        raise ConfigError(f"--rank {missing[0]} does not exist: the command launches {world} rank(s), 0..{world - 1}")
    if world is not None and share is not None and len(ranks) == world:
        raise ConfigError(f"--share {share:g} holds the ranks not throttled, and --rank {ranks_text(ranks)} "
                          f"throttles all {world}: drop --share or a rank")
    if switch_log is not None:
        if pattern is None:
            raise ConfigError(f"--switch-log {switch_log} records a pattern's switches: it needs --pattern")
        check_new_file(switch_log, "--switch-log", overwrite=overwrite)
        watched = None if pattern_after is None else os.path.realpath(pattern_after)
        outputs = [(flag, path) for flag, path in command_outputs(argv)  # the file --pattern-after waits for:
                   if os.path.realpath(path) != watched]  # the command writes it for that (--started-file)
        check_apart([("--switch-log", switch_log), ("--pattern-after", pattern_after), *outputs])
    if pattern is not None and pattern.fraction >= 1.0:
        raise ConfigError(f"--pattern with --fraction {pattern.fraction:g}: the throttled phases would be free too; "
                          "give a fraction below 1")
    if pattern_after is not None:
        if pattern is None:
            raise ConfigError(f"--pattern-after {pattern_after} delays a pattern: it needs --pattern")
        if os.path.exists(pattern_after):
            raise ConfigError(f"--pattern-after {pattern_after} exists already: the pattern would start at once")
    if share is not None:
        if pattern is not None:
            fractions = dict.fromkeys(ranks, pattern.fraction)
        above = [r for r in ranks if fractions[r] > share]
        if above:
            raise ConfigError(f"--fraction {fractions[above[0]]:g} is above --share {share:g}: rank {above[0]} would be "
                              "the fastest, not a straggler; give a fraction <= the share")
        if pattern is not None:  # its free phases return to the share every other rank is held to
            pattern = dataclasses.replace(pattern, free=share)
        pin = True  # a share of a core means one core: every rank on its own (LOCAL_RANK mod ncpu)
    switches: List[Dict[str, float]] = []

    patterns = None if pattern is None else dict(zip(ranks, pattern.in_turn(len(ranks))))
    first = {r: (patterns[r].free if pattern_after is not None else patterns[r].fraction_at(0.0)) if patterns
             else fractions[r] for r in ranks}
    kill_at: List[float] = []
    pending: List[int] = []  # signals that arrive before the command has started
    proc: Optional[subprocess.Popen] = None

    def forward(signum: int, _frame: object) -> None:
        if proc is None:
            pending.append(signum)
            return
        logger.info("throttle: forwarding signal %d to process group %d", signum, proc.pid)
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass
        kill_at.append(time.monotonic() + KILL_GRACE_S)

    # Before the first cgroup exists and until the last is gone, an ending signal is this handler's: a
    # launcher ended by the default action in between would leave its cgroup to the next run's reaping.
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, forward) for s in END_SIGNALS}
    try:
        with contextlib.ExitStack() as owned, contextlib.ExitStack() as shares:
            throttles = {r: owned.enter_context(CpuThrottle(first[r], period_us=period_us, controller=controller,
                                                            handle_signals=False)) for r in ranks}
            # after the throttle exists, so that an unusable cgroup refuses before anything is started
            for path in remove_stale_throttles(controller):
                logger.warning("removed a stale throttle cgroup left by a dead run: %s", path)
            if pending:  # ended before the command started: it never starts
                logger.info("throttle: signal %d before %s started; not starting it", pending[0], argv[0])
                return 128 + pending[0]
            proc = subprocess.Popen(argv, preexec_fn=own_group_dying_with_parent())
            for signum in pending:  # arrived between the check and Popen
                forward(signum, None)
            share_throttle = None if share is None else lambda: shares.enter_context(CpuThrottle(
                share, period_us=period_us, controller=controller, handle_signals=False))
            watcher = _Watcher(proc.pid, throttles, pin=pin, patterns=patterns, announce=announce,
                               on_switch=lambda r, unix_s, f: switches.append({
                                   "unix_s": unix_s, "fraction": f, "rank": r, "held": f == patterns[r].fraction}),
                               pattern_after=pattern_after, share_throttle=share_throttle, world=world)
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            timed_out = False
            try:
                while proc.poll() is None:
                    watcher.poll()
                    now = time.monotonic()
                    if deadline is not None and now > deadline and not timed_out:
                        logger.warning("throttle: %s ran past %g s; terminating it", argv[0], timeout_s)
                        timed_out = True
                        forward(signal.SIGTERM, None)
                    if kill_at and now > min(kill_at):
                        kill_at.clear()
                        logger.warning("throttle: %s still running %g s after a signal; killing it", argv[0],
                                       KILL_GRACE_S)
                        _kill_tree(proc.pid)
                    time.sleep(poll_s if not watcher.settled else max(poll_s, 0.25))
            finally:
                if proc.poll() is None:   # we are leaving on an exception: do not leave the command running
                    _kill_tree(proc.pid)
                    proc.wait()
                for driver in watcher.drivers:
                    driver.stop()
                if switch_log is not None:
                    write_json(switch_log, sorted(switches, key=lambda s: s["unix_s"]))
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    status = 124 if timed_out else _exit_status(proc.returncode)
    idle = None
    absent = [r for r in ranks if r not in watcher.attached]
    if absent:
        idle = (f"no process with RANK {ranks_text(absent)} appeared; "
                + ("nothing was throttled" if len(absent) == len(ranks) else "it was not throttled")
                + ("" if pattern is None or len(ranks) == 1 else " and the pattern never started"))
    elif pattern_after is not None and not watcher.started:
        idle = f"--pattern-after {pattern_after} never appeared; the pattern never started"
    if idle is not None:
        announce(f"semimig throttle: error: {idle}")
        if status == 0:
            return 1
    return status


def add_throttle_subcommand(subparsers: Any) -> None:
    """Register ``throttle`` on an ``argparse`` subparsers object; its handler is ``args.func``."""
    parser = subparsers.add_parser("throttle", help="run a command with one rank's worker CPU-throttled "
                                   "(a real straggler; Linux cgroups, root)", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", required=True, metavar="R[,R...]",
                        help="throttle the process whose RANK is this (several: each in a cgroup of its own, all at "
                             "--fraction or each at its own, or with --pattern taking its throttled phases in turn: a "
                             "straggler that moves)")
    parser.add_argument("--fraction", required=True, metavar="F[,F...]",
                        help="share of one core it may use, (0, 1]; one per --rank for ranks of different speeds")
    parser.add_argument("--share", type=float, default=None, metavar="S",
                        help="every other rank in a cgroup of its own at S of a core, (0, 1], >= --fraction "
                             "(more ranks than cores; implies --pin)")
    parser.add_argument("--period-us", type=int, default=DEFAULT_PERIOD_US,
                        help=f"CFS period in microseconds (default {DEFAULT_PERIOD_US})")
    parser.add_argument("--pattern", default=None, help="ON:OFF seconds: throttled ON, free OFF, repeating")
    parser.add_argument("--pin", action="store_true", help="pin each worker to core LOCAL_RANK mod ncpu")
    parser.add_argument("--pattern-after", default=None, metavar="PATH",
                        help="with --pattern: run free until PATH exists, then start the pattern "
                             "(e.g. the example's --started-file: throttle the training, not the start-up)")
    parser.add_argument("--switch-log", default=None, metavar="FILE",
                        help="with --pattern: write the pattern's switch times (unix seconds, fraction) here as JSON")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --switch-log file")
    parser.add_argument("--timeout", type=float, default=None, help="terminate COMMAND after this many seconds")
    parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log at INFO level")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    parser.set_defaults(func=run_throttle_cli)


def run_throttle_cli(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    try:
        if not command:
            raise ConfigError("a command to run is required after --, got none")
        fractions = parse_fractions(args.fraction, len(parse_ranks(args.rank)))
        pattern = None if args.pattern is None else ThrottlePattern.parse(args.pattern, fraction=fractions[0])
        return run_throttled(command, rank=args.rank, fraction=fractions, period_us=args.period_us,
                             pattern=pattern, pin=args.pin, timeout_s=args.timeout, switch_log=args.switch_log,
                             share=args.share,
                             pattern_after=args.pattern_after, overwrite=args.overwrite,
                             announce=lambda line: print(line, file=sys.stderr, flush=True))
    except ConfigError as err:
        print(f"semimig throttle: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # not found (127), not executable (126), ...: the shell's codes
        print(f"semimig throttle: error: cannot run {command[0]!r}: {err.strerror}", file=sys.stderr)
        return 127 if isinstance(err, FileNotFoundError) else 126


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m semimig.straggler.throttle_cli ...`` = ``semimig throttle ...`` (no other subcommand loaded)."""
    parser = argparse.ArgumentParser(prog="semimig")
    add_throttle_subcommand(parser.add_subparsers(dest="command_name", required=True))
    args = parser.parse_args(["throttle", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
