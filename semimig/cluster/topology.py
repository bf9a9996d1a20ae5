"""The plan of an emulated cluster: names, addresses, link shaping and launch commands (pure data).

An emulated cluster of ``N`` nodes on one Linux machine::

          node 0 (netns smc-<id>-n0)          node k (netns smc-<id>-n<k>)
       lo + smc-<id>-n0 10.213.x.100          lo + smc-<id>-n<k> 10.213.x.(100+k)
                   |  tbf rate G0 (uplink)             |  tbf rate Gk
                   |                                   |
       smc-<id>-h0 (root ns)  tbf rate G0  ...  smc-<id>-h<k>  tbf rate Gk (downlink)
                   \\________ bridge smc-<id>-b (root ns, no address) ________/

Each node is a network namespace joined to a bridge by a veth pair; node ``k``'s link is shaped
on both ends (``tbf`` at rate ``G_k`` on the node end for what it sends, on the bridge end for
what it receives; with a delay ``D`` a ``netem`` qdisc is the root and ``tbf`` its child), so a
message from node ``a`` to node ``b`` crosses ``a``'s uplink and ``b``'s downlink: it moves at
``min(G_a, G_b)`` and, with a delay, arrives ``2 D`` later.  Ranks of one node share its namespace
(and talk over its loopback, unshaped), the shape of a real cluster: fast inside a node, a NIC
between nodes.  The bridge has no address, so the root namespace gets no route to the subnet and
no packet of the cluster can leave it.

Names carry the run id ``<id>`` (``[a-z0-9]{1,6}``): interfaces ``smc-<id>-b`` (bridge),
``smc-<id>-h<k>`` (bridge end of node ``k``'s veth), ``smc-<id>-n<k>`` (node end), at most
``4 + 6 + 2 + 2 = 14`` characters (Linux allows 15), namespaces ``smc-<id>-n<k>``.  The owner's pid
is recorded in each interface's alias and in ``/run/semimig-cluster/<id>/state.json``
(:mod:`semimig.cluster.netns`), which is how a crashed run's leftovers are told from a live run's.

Addresses: ``10.213.x.(100 + k)/24`` for ``k < 64`` (three digits each, so sorting the addresses
as strings sorts the nodes; torchrun's c10d rendezvous ranks its agents in that order, so node
``k`` holds global ranks ``k P .. k P + P - 1``), ``x`` chosen so that the subnet overlaps no route
or address of the machine and no other live run's subnet.
"""
from __future__ import annotations

import ipaddress
import re
import secrets
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from semimig._validate import check_int, check_number
from semimig.errors import ConfigError

__all__ = ["ClusterConfig", "ClusterPlan", "NodePlan", "Step", "MAX_NODES", "RDZV_PORT", "RUN_ID_RE",
           "choose_subnet", "new_run_id", "parse_name", "plan_cluster", "tbf_burst_bytes"]

MAX_NODES = 64
RDZV_PORT = 29400
"""The rendezvous port on node 0: a fresh namespace has every port free."""
RUN_ID_RE = re.compile(r"[a-z0-9]{1,6}")
SUBNET_BASE = "10.213"
FIRST_HOST = 100
PREFIX = "smc-"
_NAME_RE = re.compile(r"smc-([a-z0-9]{1,6})-(b|h\d{1,2}|n\d{1,2})")
ALIAS = "semimig-cluster"
"""First word of the alias of every root-namespace interface a run makes (then ``run=<id> pid=<p> start=<t>``)."""
TBF_LATENCY_MS = 50
"""tbf's queue bound: packets that would wait longer are dropped (TCP backs off, as on a NIC)."""


def new_run_id() -> str:
    """A random run id: 5 hex digits (``16^5`` ids; a clash with a live run is refused, not shared)."""
    return secrets.token_hex(3)[:5]


def parse_name(name: str) -> Optional[tuple[str, str]]:
    """``(run_id, role)`` of an interface or namespace name this module makes (role ``b``, ``h<k>``,
    ``n<k>``), ``None`` for any other name."""
    m = _NAME_RE.fullmatch(name)
    return (m.group(1), m.group(2)) if m else None


def tbf_burst_bytes(gbit: float) -> int:
    """tbf bucket size: 1 ms of the rate, at least 64 KiB (a full GSO segment must fit in the bucket).
    A bucket of several ms lets a message of a few MiB through whole, well above the rate; one of a
    few hundred µs leaves the kernel's timer granularity holding a large transfer well below it;
    1 ms keeps small and large messages within about 10 % of the rate."""
    return max(64 * 1024, int(gbit * 1e9 / 8 * 1e-3))


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """What ``semimig cluster`` emulates."""

    nodes: int
    """``N``: emulated nodes (network namespaces), 1 .. 64."""
    nproc_per_node: int = 1
    """``P``: ranks per node (they share the node's namespace)."""
    link_gbit: float
    """``G``: rate of every node's link in Gbit/s, each direction."""
    link_delay_ms: float = 0.0
    """``D``: delay of every node's link per direction (node to node: ``2 D``); needs ``sch_netem``."""
    straggler_link_gbit: Optional[float] = None
    """``G1``: rate of the straggler node's link (``None``: every link at ``G``)."""
    straggler_node: Optional[int] = None
    """Which node's link is ``G1`` (default: the last node, ``N - 1``)."""

    def __post_init__(self) -> None:
        check_int("--nodes", self.nodes, minimum=1, maximum=MAX_NODES)
        check_int("--nproc-per-node", self.nproc_per_node, minimum=1, maximum=64)
        check_number("--link-gbit", self.link_gbit, minimum=0.001, maximum=400.0)
        check_number("--link-delay-ms", self.link_delay_ms, minimum=0.0, maximum=10_000.0)
        check_number("--straggler-link-gbit", self.straggler_link_gbit, minimum=0.001, maximum=400.0, allow_none=True)
        check_int("--straggler-node", self.straggler_node, minimum=0, maximum=self.nodes - 1, allow_none=True)
        if self.straggler_node is not None and self.straggler_link_gbit is None:
            raise ConfigError(f"--straggler-node {self.straggler_node} names a node but --straggler-link-gbit is not set")

    def node_gbit(self, k: int) -> float:
        """The link rate of node ``k``."""
        slow = self.nodes - 1 if self.straggler_node is None else self.straggler_node
        return self.straggler_link_gbit if self.straggler_link_gbit is not None and k == slow else self.link_gbit


@dataclass(frozen=True)
class Step:
    """One command that makes something, and the command that undoes it (``None``: undone with
    what it belongs to, e.g. a qdisc goes with its interface)."""

    argv: tuple[str, ...]
    undo: Optional[tuple[str, ...]] = None


@dataclass(frozen=True, kw_only=True)
class NodePlan:
    """One emulated node."""

    index: int
    netns: str
    host_if: str
    """Bridge end of the veth pair (root namespace)."""
    node_if: str
    """Node end of the veth pair (inside ``netns``)."""
    address: str
    gbit: float


@dataclass(frozen=True, kw_only=True)
class ClusterPlan:
    """Everything one run makes, in order; undone in reverse order."""

    run_id: str
    config: ClusterConfig
    subnet: str
    bridge: str
    nodes: tuple[NodePlan, ...]
    rdzv_endpoint: str
    steps: tuple[Step, ...] = field(repr=False)

    def names(self) -> dict[str, list[str]]:
        """``{"netns": [...], "links": [...]}``: every namespace and root-namespace interface of the run."""
        return {"netns": [n.netns for n in self.nodes], "links": [self.bridge] + [n.host_if for n in self.nodes]}

    def describe(self) -> str:
        """The topology in a few lines, for the launcher to print."""
        cfg = self.config
        delay = f", delay {cfg.link_delay_ms:g} ms per link direction (node to node {2 * cfg.link_delay_ms:g} ms)" \
            if cfg.link_delay_ms else ""
        lines = [f"semimig cluster {self.run_id}: {cfg.nodes} nodes x {cfg.nproc_per_node} ranks, bridge "
                 f"{self.bridge}, subnet {self.subnet}{delay}, rendezvous {self.rdzv_endpoint}"]
        for n in self.nodes:
            first = n.index * cfg.nproc_per_node
            lines.append(f"  node {n.index}: netns {n.netns}, {n.node_if} {n.address}, link {n.gbit:g} Gbit/s "
                         f"each way, ranks {first}..{first + cfg.nproc_per_node - 1}")
        return "\n".join(lines)

    def agent_command(self, k: int, python: str, script: str, args: Sequence[str],
                      log_dir: Optional[str] = None) -> list[str]:
        """Node ``k``'s torchrun agent (run inside its namespace): c10d rendezvous on node 0, which
        hosts the store (``is_host`` stated, not guessed from hostnames the namespaces share);
        ``log_dir``: torchrun's log directory (its default is a ``/tmp/torchelastic_*`` it leaves behind)."""
        node = self.nodes[k]
        cfg = self.config
        logs = ["--log-dir", f"{log_dir}/node{k}"] if log_dir else []
        return ["ip", "netns", "exec", node.netns, python, "-m", "torch.distributed.run",
                "--nnodes", str(cfg.nodes), "--nproc-per-node", str(cfg.nproc_per_node),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", self.rdzv_endpoint, "--rdzv-id", f"smc-{self.run_id}",
                "--rdzv-conf", f"is_host={1 if k == 0 else 0},join_timeout=120", "--local-addr", node.address,
                "--max-restarts", "0", *logs, script, *args]

    def agent_env(self, k: int) -> dict[str, str]:
        """Environment added for node ``k``'s agent and its ranks."""
        node = self.nodes[k]
        return {"GLOO_SOCKET_IFNAME": node.node_if, "TP_SOCKET_IFNAME": node.node_if,
                "SEMIMIG_CLUSTER_RUN": self.run_id, "SEMIMIG_CLUSTER_NODE": str(k),
                "SEMIMIG_CLUSTER_NODES": str(self.config.nodes), "SEMIMIG_CLUSTER_IF": node.node_if,
                "SEMIMIG_CLUSTER_ADDRS": ",".join(n.address for n in self.nodes),
                "SEMIMIG_CLUSTER_NETNS": node.netns}


def choose_subnet(used: Iterable[str], run_id: str) -> str:
    """A ``10.213.x.0/24`` overlapping none of ``used`` (networks or addresses as text), starting at a
    place drawn from the run id; :class:`ConfigError` if all 256 are taken."""
    taken = [ipaddress.ip_network(u, strict=False) for u in used]
    start = int.from_bytes(run_id.encode(), "big") % 256
    for i in range(256):
        net = ipaddress.ip_network(f"{SUBNET_BASE}.{(start + i) % 256}.0/24")
        if not any(net.overlaps(t) for t in taken if t.version == 4):
            return str(net)
    raise ConfigError(f"no free subnet in {SUBNET_BASE}.0.0/16: every /24 overlaps a route or a live run")


def _shape(dev: str, netns: Optional[str], gbit: float, delay_ms: float) -> list[Step]:
    """qdiscs of one veth end: tbf at ``gbit`` (as the child of a netem delay when ``delay_ms``)."""
    tc = ("tc",) + (("-n", netns) if netns else ()) + ("qdisc", "add", "dev", dev)
    tbf = ("tbf", "rate", f"{gbit * 1e6:.0f}kbit", "burst", str(tbf_burst_bytes(gbit)), "latency", f"{TBF_LATENCY_MS}ms")
    if not delay_ms:
        return [Step(tc + ("root", "handle", "1:") + tbf)]
    return [Step(tc + ("root", "handle", "1:", "netem", "delay", f"{delay_ms * 1000:.0f}us", "limit", "100000")),
            Step(tc + ("parent", "1:1", "handle", "10:") + tbf)]


def plan_cluster(config: ClusterConfig, run_id: str, subnet: str, *, owner: str = "") -> ClusterPlan:
    """The names, addresses and ``ip``/``tc`` steps of one run (nothing is executed here); ``owner``
    (e.g. ``pid=123 start=456``) goes into each root-namespace interface's alias."""
    if not isinstance(run_id, str) or not RUN_ID_RE.fullmatch(run_id):
        raise ConfigError(f"--run-id must be 1-6 characters of [a-z0-9], got {run_id!r}")
    net = ipaddress.ip_network(subnet)
    if net.prefixlen != 24 or net.version != 4:
        raise ConfigError(f"subnet must be an IPv4 /24, got {subnet!r}")
    bridge = f"{PREFIX}{run_id}-b"
    nodes = tuple(NodePlan(index=k, netns=f"{PREFIX}{run_id}-n{k}", host_if=f"{PREFIX}{run_id}-h{k}",
                           node_if=f"{PREFIX}{run_id}-n{k}", address=str(net.network_address + FIRST_HOST + k),
                           gbit=config.node_gbit(k))
                  for k in range(config.nodes))
    steps = [Step(("ip", "link", "add", bridge, "type", "bridge"), ("ip", "link", "del", bridge)),
             Step(("ip", "link", "set", bridge, "alias", f"{ALIAS} run={run_id} {owner}".strip())),
             Step(("ip", "link", "set", bridge, "up"))]
    for n in nodes:
        steps += [
            Step(("ip", "netns", "add", n.netns), ("ip", "netns", "del", n.netns)),
            Step(("ip", "link", "add", n.host_if, "type", "veth", "peer", "name", n.node_if, "netns", n.netns),
                 ("ip", "link", "del", n.host_if)),
            Step(("ip", "link", "set", n.host_if, "alias", f"{ALIAS} run={run_id} {owner}".strip())),
            Step(("ip", "link", "set", n.host_if, "master", bridge, "up")),
            Step(("ip", "-n", n.netns, "link", "set", "lo", "up")),
            Step(("ip", "-n", n.netns, "addr", "add", f"{n.address}/24", "dev", n.node_if)),
            Step(("ip", "-n", n.netns, "link", "set", n.node_if, "up")),
        ]
        steps += _shape(n.node_if, n.netns, n.gbit, config.link_delay_ms)  # what node k sends
        steps += _shape(n.host_if, None, n.gbit, config.link_delay_ms)  # what node k receives
    return ClusterPlan(run_id=run_id, config=config, subnet=str(net), bridge=bridge, nodes=nodes,
                       rdzv_endpoint=f"{nodes[0].address}:{RDZV_PORT}", steps=tuple(steps))
