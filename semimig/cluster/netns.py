"""The ``ip``/``tc`` calls of an emulated cluster, with a cleanup stack and a reaper for crashed runs.

:class:`Cluster` makes what a :class:`~semimig.cluster.topology.ClusterPlan` lists and undoes it in
reverse order on every way out of its ``with`` block; every command has a timeout and every wait a
bound.  Ownership: before anything is made, ``/run/semimig-cluster/<id>/state.json`` records the
owner's pid and its start time (``/proc/<pid>/stat`` field 22, so a recycled pid is not mistaken
for the owner), the subnet and the names; the root-namespace interfaces also carry the owner in
their alias.  A run is *stale* when no live process matches its recorded owner (or nothing records
one); :func:`reap_stale` removes a stale run's namespaces (after killing the processes still in
them: they belong to the crashed run), interfaces and state, and never touches a live run's.
The reaper, the subnet choice and the state write happen under one file lock, so two launchers
starting at once neither reap each other nor pick the same subnet.
"""
from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, Optional

from semimig.cluster.topology import ClusterConfig, ClusterPlan, choose_subnet, parse_name, plan_cluster

__all__ = ["Cluster", "NetnsError", "Unsupported", "STATE_DIR", "check_support", "kill_netns_pids", "leftovers",
           "owner_token", "reap_stale"]

log = logging.getLogger(__name__)
STATE_DIR = Path("/run/semimig-cluster")
CMD_TIMEOUT_S = 15.0


class NetnsError(RuntimeError):
    """An ``ip`` or ``tc`` command failed; the message has the command and its stderr."""


class Unsupported(NetnsError):
    """This machine cannot emulate the cluster (not root, no ``ip``/``tc``, no netns, no qdisc)."""


def check_support() -> None:
    """Raise :class:`Unsupported` (one line saying why) unless root with ``ip``, ``tc`` and netns."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        raise Unsupported("semimig cluster needs root (network namespaces, veth, bridge, tc); run it as root")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise Unsupported(f"semimig cluster needs the '{tool}' command (iproute2), not found on PATH")
    if not Path("/proc/self/ns/net").exists():
        raise Unsupported("semimig cluster needs network namespaces: /proc/self/ns/net is missing")


def run(argv, *, timeout_s: float = CMD_TIMEOUT_S, check: bool = True) -> str:
    """Run one command; its stdout.  :class:`NetnsError` on failure (``check``) or timeout."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise NetnsError(f"'{' '.join(argv)}' did not finish within {timeout_s:g} s") from None
    except OSError as err:
        raise NetnsError(f"'{' '.join(argv)}' could not start: {err}") from None
    if check and done.returncode != 0:
        err = done.stderr.strip().splitlines()
        raise NetnsError(f"'{' '.join(argv)}' failed: {err[-1] if err else f'exit {done.returncode}'}")
    return done.stdout


# ------------------------------------------------------------------------------------- ownership
def _start_time(pid: int) -> Optional[str]:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks), ``None`` if no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[19]


def owner_token(pid: Optional[int] = None) -> dict:
    """``{"pid": p, "start": t}`` of ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "start": _start_time(pid)}


def _alive(owner: Optional[dict]) -> bool:
    return bool(owner) and owner.get("start") is not None and _start_time(int(owner["pid"])) == owner["start"]


def _alias_owner(alias: str) -> Optional[dict]:
    fields = dict(part.split("=", 1) for part in alias.split()[1:] if "=" in part)
    if "pid" in fields and fields["pid"].isdigit():
        return {"pid": int(fields["pid"]), "start": fields.get("start")}
    return None


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as lock:
        deadline = time.monotonic() + 60.0
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise NetnsError(f"{STATE_DIR / '.lock'} stayed locked for 60 s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_state(run_id: str) -> Optional[dict]:
    try:
        return json.loads((STATE_DIR / run_id / "state.json").read_text())
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------- inventory
def leftovers(run_id: Optional[str] = None) -> dict[str, dict[str, list]]:
    """``{run_id: {"netns": [...], "links": [(name, alias)...], "qdiscs": [dev...]}}``: what exists now
    of runs (all, or ``run_id``'s), found by name."""
    found: dict[str, dict[str, list]] = {}

    def entry(rid: str) -> dict[str, list]:
        return found.setdefault(rid, {"netns": [], "links": [], "qdiscs": []})

    for line in run(["ip", "netns", "list"]).splitlines():
        name = line.split()[0] if line.split() else ""
        parsed = parse_name(name)
        if parsed and (run_id is None or parsed[0] == run_id):
            entry(parsed[0])["netns"].append(name)
    for link in json.loads(run(["ip", "-j", "-d", "link", "show"]) or "[]"):
        parsed = parse_name(link.get("ifname", ""))
        if parsed and parsed[1][0] in "bh" and (run_id is None or parsed[0] == run_id):
            entry(parsed[0])["links"].append((link["ifname"], link.get("ifalias", "")))
    for q in json.loads(run(["tc", "-j", "qdisc", "show"]) or "[]"):
        parsed = parse_name(q.get("dev", ""))
        if parsed and (run_id is None or parsed[0] == run_id) and q.get("kind") not in ("noqueue",):
            entry(parsed[0])["qdiscs"].append(q["dev"])
    return found


def kill_netns_pids(netns: str) -> int:
    """SIGKILL every process inside ``netns`` (only a run's own agents and ranks live there)."""
    pids = [int(p) for p in run(["ip", "netns", "pids", netns], check=False).split() if p.isdigit()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def _remove_run(run_id: str, netns: list[str], links: list[str]) -> None:
    """Delete a run's processes, veths, namespaces, bridge (in that order) and state; errors logged."""
    for ns in netns:
        kill_netns_pids(ns)
    for name in sorted(links, key=lambda n: n.endswith("-b")):  # veths first, the bridge last
        with contextlib.suppress(NetnsError):
            run(["ip", "link", "del", name])
    for ns in netns:
        with contextlib.suppress(NetnsError):
            run(["ip", "netns", "del", ns])
    shutil.rmtree(STATE_DIR / run_id, ignore_errors=True)


def reap_stale() -> list[str]:
    """Remove the leftovers of every run whose owner is dead; return their ids.  A run is live when
    its state file or an interface alias names a live owner (pid with the recorded start time)."""
    reaped = []
    with _locked():
        found = leftovers()
        ids = set(found) | {p.name for p in STATE_DIR.iterdir() if p.is_dir()}
        for rid in sorted(ids):
            state = _read_state(rid)
            things = found.get(rid, {"netns": [], "links": []})
            owners = [state.get("owner")] if state else []
            owners += [_alias_owner(alias) for _, alias in things["links"]]
            if any(_alive(o) for o in owners if o):
                continue
            names = {n for n, _ in things["links"]}
            netns = set(things["netns"])
            if state:
                names |= set(state.get("links", []))
                netns |= set(state.get("netns", []))
            dead = sorted({o["pid"] for o in owners if o})
            log.warning("removing the leftovers of crashed run %s (owner pid %s, gone): %s", rid, dead or "unknown",
                        sorted(names | netns))
            _remove_run(rid, sorted(netns), sorted(names))
            reaped.append(rid)
    return reaped


def _used_subnets() -> list[str]:
    """Every IPv4 route and address of the root namespace, and every live run's subnet."""
    used = []
    for table in (["ip", "-4", "-j", "route", "show", "table", "all"], ["ip", "-4", "-j", "addr", "show"]):
        for item in json.loads(run(table) or "[]"):
            if "dst" in item and item["dst"] not in ("default", ""):
                used.append(item["dst"])
            for a in item.get("addr_info", []):
                used.append(f"{a['local']}/{a.get('prefixlen', 32)}")
    for p in STATE_DIR.iterdir():
        state = _read_state(p.name) if p.is_dir() else None
        if state and state.get("subnet"):
            used.append(state["subnet"])
    return [u for u in used if _is_net(u)]


def _is_net(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
        return True
    except ValueError:
        return False


# --------------------------------------------------------------------------------------- cluster
class Cluster:
    """``with Cluster(config, run_id) as plan:`` makes the namespaces, links and qdiscs; leaving the
    block (normally or by any exception) kills what still runs inside them and removes all of it."""

    def __init__(self, config: ClusterConfig, run_id: str) -> None:
        self.config = config
        self.run_id = run_id
        self.plan: Optional[ClusterPlan] = None
        self._undo: list[tuple[str, ...]] = []
        self._state_written = False

    def __enter__(self) -> ClusterPlan:
        check_support()
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self.plan

    def __exit__(self, *exc) -> None:
        self.close()

    def _setup(self) -> None:
        owner = owner_token()
        reap_stale()
        with _locked():
            state = _read_state(self.run_id)
            if state is not None or leftovers(self.run_id):
                raise NetnsError(f"run id {self.run_id!r} is in use by a live run (owner {state and state.get('owner')}); "
                                 "choose another --run-id")
            subnet = choose_subnet(_used_subnets(), self.run_id)
            self.plan = plan_cluster(self.config, self.run_id, subnet, owner=f"pid={owner['pid']} start={owner['start']}")
            try:
                (STATE_DIR / self.run_id).mkdir(mode=0o700)
            except FileExistsError:  # a run that crashed between mkdir and its state file
                raise NetnsError(f"run id {self.run_id!r} is in use ({STATE_DIR / self.run_id} exists without a "
                                 "state file); choose another --run-id or run semimig cluster --reap-stale") from None
            self._state_written = True
            names = self.plan.names()
            (STATE_DIR / self.run_id / "state.json").write_text(json.dumps(
                {"run_id": self.run_id, "owner": owner, "subnet": subnet, **names}))
        for step in self.plan.steps:
            if step.undo is not None:  # first: a signal between the command and this line must not leak it
                self._undo.append(step.undo)
            try:
                run(step.argv)
            except NetnsError as err:
                if "qdisc kind is unknown" in str(err):
                    kind = "netem" if "netem" in step.argv else "tbf"
                    raise Unsupported(f"semimig cluster needs the '{kind}' qdisc (kernel module sch_{kind}), "
                                      f"which this kernel lacks" + (": drop --link-delay-ms" if kind == "netem" else "")) \
                        from None
                if step.argv[:3] == ("ip", "netns", "add") or "veth" in step.argv or "bridge" in step.argv:
                    raise Unsupported(f"semimig cluster cannot make its network here: {err}") from None
                raise

    def close(self) -> None:
        """Undo everything made so far, in reverse order (idempotent; errors are logged, not raised)."""
        if self.plan is not None:
            for node in self.plan.nodes:
                with contextlib.suppress(NetnsError):
                    if any(u == ("ip", "netns", "del", node.netns) for u in self._undo):
                        kill_netns_pids(node.netns)
        while self._undo:
            undo = self._undo.pop()
            try:
                run(undo)
            except NetnsError as err:  # e.g. the step it undoes never ran, or went with its veth
                log.debug("cleanup: %s", err)
        if self._state_written:
            with contextlib.suppress(NetnsError):  # belt and braces: anything of this run still there
                left = leftovers(self.run_id).get(self.run_id)
                if left:
                    log.warning("cleanup: removing what the undo stack missed: %s", left)
                    _remove_run(self.run_id, left["netns"], [name for name, _ in left["links"]])
            shutil.rmtree(STATE_DIR / self.run_id, ignore_errors=True)
            self._state_written = False
