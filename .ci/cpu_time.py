"""Run a command and print the CPU time of it and of every process it started, orphans included.

    python .ci/cpu_time.py -- python -m pytest -q tests/unit/test_x.py

``/usr/bin/time`` counts only the descendants its child waited for; the test suite's ranks are
children of multiprocessing's forkserver, which nobody waits for.  Here this process becomes a
child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): every orphaned descendant is re-parented to it
and reaped by it, so ``RUSAGE_CHILDREN`` covers them all.  Orphans are reaped as they exit, as
init reaps them without this tool: left as zombies until the command ends, they made the suite's
"no process outlives its parent" cases fail under this tool (a zombie is still in the process
table).  Also prints the wall time and how many
processes were started (forks counted from /proc/stat's ``processes`` line: machine-wide, so only
meaningful on a quiet machine).
"""
import ctypes
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def _forks() -> int:
    with open("/proc/stat") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("processes "))


def main(argv):
    if argv and argv[0] == "--":
        argv = argv[1:]
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    forks, start = _forks(), time.monotonic()
    child = subprocess.Popen(argv)
    code = None
    while True:  # reap the command and every orphan as each exits, until none is left
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid == child.pid:
            code = os.waitstatus_to_exitcode(status)
            child.returncode = code  # reaped here: Popen must not wait for it again
    wall = time.monotonic() - start
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"cpu_time: user {use.ru_utime:.1f} s, system {use.ru_stime:.1f} s, total {use.ru_utime + use.ru_stime:.1f} s;"
          f" wall {wall:.1f} s; processes started (machine-wide) {_forks() - forks}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
