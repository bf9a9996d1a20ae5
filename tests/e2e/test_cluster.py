"""``semimig cluster``: the pure plan, and real runs on network namespaces (root only).

The real runs launch 2 emulated nodes of 1 rank each (torchrun, gloo) and check what the run
leaves behind with ``ip netns list``, ``ip link``, ``tc qdisc`` and ``/run/semimig-cluster``
before and after: nothing, after success, after the job fails, after SIGTERM and after SIGINT to
the launcher.  A crashed owner (SIGKILL) leaves its network behind; :func:`reap_stale` removes it
and leaves a live run's alone.  Timing is checked loosely (the machine is shared): a 4 MB
broadcast over 0.2 Gbit/s links needs 0.168 s on the wire, so it must take >= 0.1 s.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from semimig.cluster.topology import ClusterConfig, parse_name, plan_cluster, choose_subnet, tbf_burst_bytes
from semimig.errors import ConfigError

from example_ranks import run_example

# the cases read the machine's namespaces and links before and after: never two at once (xdist)
pytestmark = pytest.mark.mutex("netns")

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------ pure plan
@pytest.mark.parametrize("nodes", [1, 2, 8, 64])
def test_plan_names_unique_short_and_carry_the_run_id(nodes):
    cfg = ClusterConfig(nodes=nodes, nproc_per_node=2, link_gbit=10, straggler_link_gbit=1, straggler_node=0)
    plan = plan_cluster(cfg, "ab12z9", "10.213.7.0/24")
    ifnames = [plan.bridge] + [n.host_if for n in plan.nodes] + [n.node_if for n in plan.nodes]
    root_ifs = [plan.bridge] + [n.host_if for n in plan.nodes]
    assert len(set(root_ifs)) == len(root_ifs)
    assert len({n.node_if for n in plan.nodes}) == nodes and len({n.netns for n in plan.nodes}) == nodes
    assert all(len(name) <= 15 and "ab12z9" in name for name in ifnames)
    assert all(parse_name(name)[0] == "ab12z9" for name in ifnames + [n.netns for n in plan.nodes])
    addresses = [n.address for n in plan.nodes]
    assert len(set(addresses)) == nodes and all(a.startswith("10.213.7.") for a in addresses)
    assert sorted(addresses) == addresses  # string order = node order: c10d ranks nodes in this order
    assert [n.gbit for n in plan.nodes] == [1.0] + [10.0] * (nodes - 1)
    assert plan.rdzv_endpoint == f"{addresses[0]}:29400"
    # every made thing has an undo, and the steps name only this run's interfaces
    undone = [s.undo for s in plan.steps if s.undo]
    assert len(undone) == 1 + 2 * nodes
    for step in plan.steps:
        if "dev" in step.argv:
            assert parse_name(step.argv[step.argv.index("dev") + 1])[0] == "ab12z9"


def test_plan_shapes_both_ends_and_default_straggler_is_last_node():
    cfg = ClusterConfig(nodes=3, link_gbit=2, straggler_link_gbit=0.5)
    plan = plan_cluster(cfg, "x1", "10.213.9.0/24", owner="pid=1 start=2")
    assert [n.gbit for n in plan.nodes] == [2.0, 2.0, 0.5]
    tbf = [s.argv for s in plan.steps if "tbf" in s.argv]
    assert len(tbf) == 6  # node end and bridge end of each veth
    assert sum("500000kbit" in a for a in tbf) == 2
    delayed = plan_cluster(ClusterConfig(nodes=2, link_gbit=1, link_delay_ms=2), "x1", "10.213.9.0/24")
    assert sum("netem" in s.argv for s in delayed.steps) == 4
    assert tbf_burst_bytes(0.5) == 64 * 1024 and tbf_burst_bytes(100) == 12_500_000
    assert "node 2" in plan.describe() and "0.5 Gbit/s" in plan.describe()


def test_the_agents_torchrun_logs_go_where_the_launcher_removes_them():
    plan = plan_cluster(ClusterConfig(nodes=2, link_gbit=1), "x1", "10.213.9.0/24")
    cmd = plan.agent_command(1, "python", "train.py", ["--steps", "3"], log_dir="/run/semimig-cluster/x1/torchrun")
    assert cmd[cmd.index("--log-dir") + 1] == "/run/semimig-cluster/x1/torchrun/node1"
    assert cmd.index("--log-dir") < cmd.index("train.py") and cmd[-2:] == ["--steps", "3"]
    assert "--log-dir" not in plan.agent_command(0, "python", "train.py", [])  # torchrun's default


def test_parse_name_rejects_foreign_names():
    for name in ("eth0", "smc-", "smc-ABC-b", "smc-abcdefg-b", "smc-ab-x1", "docker0", "smc-ab-h123"):
        assert parse_name(name) is None


def test_choose_subnet_avoids_used_networks():
    used = [f"10.213.{i}.0/24" for i in range(255)] + ["192.0.2.0/24"]
    assert choose_subnet(used, "zz") == "10.213.255.0/24"
    assert choose_subnet(["10.213.0.0/17"], "a") .startswith("10.213.")
    assert int(choose_subnet(["10.213.0.0/17"], "a").split(".")[2]) >= 128
    with pytest.raises(ConfigError, match="no free subnet"):
        choose_subnet(["10.0.0.0/8"], "a")


@pytest.mark.parametrize("kwargs, match", [
    (dict(nodes=0, link_gbit=1), "--nodes"),
    (dict(nodes=2, link_gbit=0), "--link-gbit"),
    (dict(nodes=2, link_gbit=1, link_delay_ms=-1), "--link-delay-ms"),
    (dict(nodes=2, link_gbit=1, straggler_link_gbit=1, straggler_node=2), "--straggler-node"),
    (dict(nodes=2, link_gbit=1, straggler_node=1), "--straggler-link-gbit is not set"),
])
def test_config_refuses_bad_values(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ClusterConfig(**kwargs)


def test_bad_run_id_is_refused():
    with pytest.raises(ConfigError, match="--run-id"):
        plan_cluster(ClusterConfig(nodes=1, link_gbit=1), "Bad_Id", "10.213.0.0/24")


def test_not_root_says_so_and_exits_2(monkeypatch, capsys):
    from semimig.cluster import cli

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["--nodes", "2", "--link-gbit", "1", "--", "x.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs root" in err[0]


# ------------------------------------------------------------------------------------- real runs
def _netns_reason() -> str:
    if os.geteuid() != 0:
        return "not root: network namespaces need root"
    from semimig.cluster.netns import NetnsError, Unsupported, check_support, run

    try:
        check_support()
        name = f"smc-p{secrets.token_hex(2)}-n0"
        run(["ip", "netns", "add", name])
        run(["ip", "netns", "del", name])
    except (Unsupported, NetnsError) as err:
        return f"no network namespace support: {err}"
    return ""


_REASON = _netns_reason()
needs_netns = pytest.mark.skipif(bool(_REASON), reason=_REASON or "ok")


def _snapshot() -> dict[str, set]:
    ns = {line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                                   check=True).stdout.splitlines() if line.strip()}
    links = {l["ifname"] for l in json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True,
                                                            check=True).stdout)}
    qdiscs = {(q["dev"], q["kind"]) for q in json.loads(subprocess.run(["tc", "-j", "qdisc", "show"],
                                                                        capture_output=True, text=True).stdout)}
    return {"netns": ns, "links": links, "qdiscs": qdiscs}


def _assert_clean(before: dict[str, set], run_id: str) -> None:
    after = _snapshot()
    for key in after:
        mine = {x for x in after[key] if run_id in str(x)}
        assert not mine, f"{key} of run {run_id} left behind: {mine}"
        assert after[key] <= before[key] | {x for x in after[key] if "smc-" not in str(x)}, \
            f"new {key}: {after[key] - before[key]}"
    assert not Path(f"/run/semimig-cluster/{run_id}").exists()  # with torchrun's logs (--log-dir) inside


def _launcher(run_id: str, script: Path, *args: str, gbit: float = 1.0, grace: float = 5.0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "semimig.cluster.cli", "--nodes", "2", "--link-gbit", str(gbit),
                             "--run-id", run_id, "--timeout", "90", "--grace", str(grace), "--", str(script), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)


def _rid() -> str:
    return "t" + secrets.token_hex(2)


ALLREDUCE = """
import os, sys, time, datetime, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
r, w = dist.get_rank(), dist.get_world_size()
assert os.environ["SEMIMIG_CLUSTER_NODE"] == str(r), "rank r must sit on node r"
t = torch.full((3,), float(r + 1))
dist.all_reduce(t)
assert t.tolist() == [3.0] * 3, t
buf = torch.full((1 << 20,), float(r))  # 4 MB
seconds = []
for _ in range(2):
    dist.barrier(); s = time.perf_counter(); dist.broadcast(buf, 0); dist.barrier()
    seconds.append(time.perf_counter() - s)
assert buf.sum().item() == 0.0
print(f"RESULT rank={r} node={os.environ['SEMIMIG_CLUSTER_NODE']} if={os.environ['GLOO_SOCKET_IFNAME']} "
      f"bcast_s={min(seconds):.4f}", flush=True)
dist.destroy_process_group()
"""


@needs_netns
def test_two_node_allreduce_shaped_and_cleaned(tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    run_id, before = _rid(), _snapshot()
    proc = _launcher(run_id, script, gbit=0.2)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert f"semimig cluster {run_id}: 2 nodes x 1 ranks" in out and "0.2 Gbit/s" in out
    # two ranks write to one pipe: their lines may interleave, so match the fields, not lines
    results = re.findall(r"RESULT rank=(\d+) node=(\d+) if=(\S+?) bcast_s=(\d+\.\d{4})", out)
    assert len(results) == 2, out
    assert sorted(rank for rank, *_ in results) == ["0", "1"]
    for rank, node, ifname, bcast_s in results:
        assert node == rank and ifname == f"smc-{run_id}-n{node}"
        # 4 MiB at 0.2 Gbit/s is 0.168 s on the wire; unshaped veth moves it in ~ 2 ms
        assert float(bcast_s) >= 0.1, results
    _assert_clean(before, run_id)


@needs_netns
def test_failed_job_returns_its_code_and_cleans(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nsys.exit(3 if os.environ['SEMIMIG_CLUSTER_NODE'] == '1' else 0)\n")
    run_id, before = _rid(), _snapshot()
    # the healthy node's agent waits in torchrun's exit barrier for the failed one: it is stopped after the
    # grace (SIGTERM, then SIGKILL a grace later), so a short grace keeps the case short
    proc = _launcher(run_id, script, grace=1.0)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out  # torchrun's agent exits 1 when a rank fails
    assert "an agent exited with 1; the others get 1 s" in out, out
    _assert_clean(before, run_id)


SLEEPER = """
import os, sys, time
open(os.path.join(sys.argv[1], os.environ["SEMIMIG_CLUSTER_NODE"]), "w").close()
time.sleep(120)
"""


def _wait_ready(folder: Path, count: int, procs, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(list(folder.iterdir())) < count:
        assert time.monotonic() < deadline, "the ranks did not start"
        assert all(p.poll() is None for p in procs), [p.communicate()[0] for p in procs if p.poll() is not None]
        time.sleep(0.2)


@needs_netns
def test_sigterm_and_sigint_to_the_launcher_clean_up_and_sigkill_is_reaped(tmp_path):
    """SIGTERM / SIGINT: the launcher stops the job and removes its network.  SIGKILL: nothing runs
    in the launcher; its agents get SIGTERM (parent-death signal) and end with their ranks, and its
    network stays until the next reap removes it."""
    from semimig.cluster.netns import reap_stale

    script = tmp_path / "sleep.py"
    script.write_text(SLEEPER)
    before = _snapshot()
    runs = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
        ready = tmp_path / sig.name
        ready.mkdir()
        run_id = _rid()
        runs.append((sig, run_id, ready, _launcher(run_id, script, str(ready))))
    for sig, run_id, ready, proc in runs:
        _wait_ready(ready, 2, [proc])
    for sig, run_id, ready, proc in runs:
        proc.send_signal(sig)
    killed_id = runs[-1][1]
    runs[-1][3].wait(timeout=10)  # its agents hold its stdout open until the reap kills them
    deadline = time.monotonic() + 30
    while [p for k in (0, 1) for p in subprocess.run(["ip", "netns", "pids", f"smc-{killed_id}-n{k}"],
                                                     capture_output=True, text=True).stdout.split()]:
        assert time.monotonic() < deadline, "the agents of a SIGKILLed launcher still run"
        time.sleep(0.5)
    orphans: list[int] = []
    outs = [proc.communicate(timeout=60)[0] for _, _, _, proc in runs[:-1]]
    assert killed_id in reap_stale()
    outs.append(runs[-1][3].communicate(timeout=30)[0])
    time.sleep(0.5)
    assert not [p for p in orphans if Path(f"/proc/{p}").exists() and "Z" not in
                Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]], "reaped run's processes survive"
    for (sig, run_id, ready, proc), out in zip(runs, outs):
        assert proc.returncode == (128 + sig if sig != signal.SIGKILL else -sig), out
        if sig != signal.SIGKILL:
            assert f"interrupted by {sig.name}" in out
        _assert_clean(before, run_id)


CRASHER = """
import sys, time
from semimig.cluster.netns import Cluster
from semimig.cluster.topology import ClusterConfig
plan = Cluster(ClusterConfig(nodes=2, link_gbit=1), sys.argv[1]).__enter__()
print("ready", flush=True)
time.sleep(120)
"""


@needs_netns
def test_reap_stale_removes_a_dead_owners_network_and_not_a_live_ones(tmp_path):
    from semimig.cluster.netns import leftovers, reap_stale

    before = _snapshot()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    dead_id, live_id = _rid(), _rid()
    procs = {rid: subprocess.Popen([sys.executable, "-c", CRASHER, rid], env=env, stdout=subprocess.PIPE, text=True)
             for rid in (dead_id, live_id)}
    try:
        for rid, proc in procs.items():
            assert proc.stdout.readline().strip() == "ready"
        procs[dead_id].kill()  # SIGKILL: no cleanup runs
        procs[dead_id].wait(timeout=10)
        left = leftovers(dead_id)[dead_id]
        assert len(left["netns"]) == 2 and len(left["links"]) == 3 and left["qdiscs"]
        reaped = reap_stale()
        assert dead_id in reaped and live_id not in reaped
        assert leftovers(dead_id) == {}
        assert not Path(f"/run/semimig-cluster/{dead_id}").exists()
        live = leftovers(live_id)[live_id]
        assert len(live["netns"]) == 2 and len(live["links"]) == 3
    finally:
        procs[live_id].kill()
        procs[live_id].wait(timeout=10)
    from semimig.cluster import cli

    assert cli.main(["--reap-stale"]) == 0  # now dead too
    _assert_clean(before, dead_id)
    _assert_clean(before, live_id)


def test_migration_bench_refuses_two_ranks_on_a_cluster(tmp_path, monkeypatch, capsys):
    """With 2 ranks both schemes move the same bytes: the cluster mode needs e >= 3."""
    import importlib

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.delitem(sys.modules, "migration_bench", raising=False)
    bench = importlib.import_module("migration_bench")
    argv = ["--json", str(tmp_path / "m.json"), "--straggler-link-gbit", "1", "--world", "2"]
    assert bench.main(argv) == 2
    assert "--world must be >= 3" in capsys.readouterr().err


PINGER = """
import os, socket, sys, time
node, addrs = int(os.environ["SEMIMIG_CLUSTER_NODE"]), os.environ["SEMIMIG_CLUSTER_ADDRS"].split(",")
if node == 0:
    srv = socket.create_server((addrs[0], 29611)); srv.settimeout(60)
    conn, _ = srv.accept()
    for _ in range(5):
        conn.sendall(conn.recv(1))
else:
    for _ in range(300):
        try:
            conn = socket.create_connection((addrs[0], 29611), timeout=5); break
        except OSError:
            time.sleep(0.1)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(5):
        s = time.perf_counter(); conn.sendall(b"x"); conn.recv(1); rtts.append(time.perf_counter() - s)
    print(f"RTT_MS {min(rtts) * 1e3:.2f}", flush=True)
"""


@needs_netns
def test_link_delay_or_a_plain_refusal_without_netem(tmp_path):
    """--link-delay-ms D puts D on each link direction: node to node and back crosses 4 of them.
    Without sch_netem the launcher says so in one line, exits 2 and leaves nothing."""
    script = tmp_path / "ping.py"
    script.write_text(PINGER)
    run_id, before = _rid(), _snapshot()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "semimig.cluster.cli", "--nodes", "2", "--link-gbit", "1",
                           "--link-delay-ms", "5", "--run-id", run_id, "--timeout", "90", "--", str(script)],
                          env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    if proc.returncode == 2:
        assert "netem" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    else:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rtt = float(proc.stdout.split("RTT_MS ")[1].split()[0])
        assert rtt >= 4 * 5 * 0.9, proc.stdout
    _assert_clean(before, run_id)


# ------------------------------------------------------------------------------ the example on 2 nodes
LLM_FLAGS = ["--hidden", "32", "--layers", "2", "--seq-len", "16", "--batch-size", "4", "--lr", "1e-2",
             "--log-every", "5", "--timeout-s", "60", "--data", "synthetic", "--eval-batches", "2", "--eval-every", "0",
             "--straggler", "fixed:1:4", "--steps", "20"]


def _losses(done, out: Path) -> list[float]:
    """``done``: a ``subprocess.CompletedProcess`` or an :class:`example_ranks.ExampleRun`."""
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return json.loads(out.read_text())["losses"]


@needs_netns
@pytest.mark.slow
def test_finetune_example_on_two_emulated_nodes_trains_like_one_node(tmp_path):
    """``semimig cluster --nodes 2 --nproc-per-node 1 --link-gbit 1 -- benchmarks/llm_run.py --straggler
    fixed:1:4 --steps 20 --balance mig``: TP across the shaped link, rank 1 migrating columns to rank 0
    over it, and the same losses as 2 ranks on one node (fp32, the example tests' tolerance).
    ``mig`` balances by migration only, which is exact, so the controller's timing-dependent
    decisions cannot change the losses (``semi`` may resize, which is lossy).  About 80 s on the
    shared 2-core machine: two short training runs.  20 steps: the controller flags from about step 7
    on a quiet machine (its noise window and patience), later when the first steps are slow, so the
    test asks for rank 1's decision to shed, migrating to rank 0 once its plan is in force."""
    balance = "mig"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    script, flags = str(ROOT / "benchmarks" / "llm_run.py"), [*LLM_FLAGS, "--balance", balance]
    run_id, before = _rid(), _snapshot()
    try:
        cluster = subprocess.run([sys.executable, "-m", "semimig.cluster.cli", "--nodes", "2", "--nproc-per-node", "1",
                                  "--link-gbit", "1", "--run-id", run_id, "--timeout", "150", "--", script, *flags,
                                  "--json", str(tmp_path / "cluster.json")],
                                 env=env, capture_output=True, text=True, timeout=200, cwd=ROOT)
    finally:
        _assert_clean(before, run_id)
    # the one-node reference: the same script's 2 ranks forked with torchrun's environment (the cluster run
    # above is the launcher under test; tests/example_ranks.py)
    one = run_example([*flags, "--json", str(tmp_path / "one.json")], ranks=2, timeout_s=200, env=env)
    on_cluster, on_one = _losses(cluster, tmp_path / "cluster.json"), _losses(one, tmp_path / "one.json")
    assert "1 Gbit/s" in cluster.stdout and len(on_cluster) == 20
    # the decision, with its split once applied (a late decision is logged before its plan is in force)
    assert re.search(r"rank 1 sheds [1-9][0-9.]*%|migrate [1-9][0-9.]*% to \[0\]", cluster.stdout + cluster.stderr), \
        cluster.stderr[-3000:]
    import torch

    torch.testing.assert_close(torch.tensor(on_cluster), torch.tensor(on_one), atol=1e-5, rtol=1e-3)


@needs_netns
@pytest.mark.slow
def test_2d_hybrid_on_two_emulated_nodes_trains_like_one_node(tmp_path):
    """The 2-D hybrid across 2 emulated nodes: ``semimig cluster --nodes 2
    --nproc-per-node 2 --link-gbit 1 -- semimig/__main__.py bench --tp 2 --dp 2 --allocation poplar``
    keeps each TP group inside a node and the data-parallel gradient all-reduce on the shaped link,
    with the default stragglers (rank 1 of group 0 at χ = 4, group 1 at χ = 2, emulated devices).
    Baseline (even batches) and Poplar (batches by measured group speed) are exact, so every
    iteration's global-batch mean loss of both equals the one-node baseline's to fp32
    reassociation, whatever split the profiles chose; Poplar gives the slower group fewer samples."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    flags = ["bench", "--tp", "2", "--dp", "2", "--allocation", "poplar", "--modes", "baseline,poplar",
             "--compute", "emulated", "--device-ms", "40", "--epochs", "1", "--iters-per-epoch", "4", "--seeds", "0",
             "--no-plots"]
    run_id, before = _rid(), _snapshot()
    try:
        cluster = subprocess.run([sys.executable, "-m", "semimig.cluster.cli", "--nodes", "2", "--nproc-per-node", "2",
                                  "--link-gbit", "1", "--run-id", run_id, "--timeout", "200", "--",
                                  str(ROOT / "semimig" / "__main__.py"), *flags, "--json", str(tmp_path / "cluster.json")],
                                 env=env, capture_output=True, text=True, timeout=260, cwd=ROOT)
    finally:
        _assert_clean(before, run_id)
    # the one-node reference in this process (its ranks forked from the preloaded forkserver; the cluster run
    # above is the launch under test): the same command line, without an interpreter start and its imports
    from semimig.cli import main

    one_node = [*flags[:flags.index("--modes") + 1], "baseline", *flags[flags.index("--modes") + 2:]]
    assert main([*one_node, "--json", str(tmp_path / "one.json")]) == 0
    assert cluster.returncode == 0, (cluster.stdout + cluster.stderr)[-4000:]
    records = {name: {r["mode"]: r for r in json.loads((tmp_path / f"{name}.json").read_text())["records"]}
               for name in ("cluster", "one")}
    assert "1 Gbit/s" in cluster.stdout and "the launcher's 4 ranks" in cluster.stdout
    import torch

    on_one = torch.tensor(records["one"]["baseline"]["losses"])
    assert len(on_one) == 4 and bool(torch.isfinite(on_one).all())
    for mode in ("baseline", "poplar"):
        torch.testing.assert_close(torch.tensor(records["cluster"][mode]["losses"]), on_one, rtol=1e-5, atol=1e-6)
    g0, g1 = records["cluster"]["poplar"]["group_samples_first"]
    assert g0 < g1, (g0, g1)  # group 0 holds the χ = 4 rank: the slower group
