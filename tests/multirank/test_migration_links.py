"""Broadcast-reduce's ``direct`` algorithm: the straggler's link carries each byte once, results unchanged.

Every movement of :mod:`semimig.migration.exchange` runs under the ``direct`` and the ``tree``
algorithm (and scatter-gather) on the same data, on 3 and 4 gloo ranks:

- copies (``share_block``, ``share_whole``, ``return_block``) must be bit-equal across algorithms;
- ``return_sum`` must equal, bit for bit, the order the direct algorithm documents
  (``own + ((p_0 + p_1) + ...)`` over the active receivers), computed locally, and the tree's
  within fp32 reassociation; with integer-valued data every order is exact, so all three agree bit for bit;
- the counted bytes of the straggler's link are the block once (out for a broadcast, in for a
  reduce), and each receiver's counted bytes are what its messages really carry.

A layer-level case checks outputs and gradients of both MLP layers under ``direct`` against ``tree``.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_harness import run_on_ranks

ROWS = 5


def _parts(world, count, integer):
    """Every rank's data, the same on every rank: the straggler's block and each rank's full-shape part."""
    g = torch.Generator().manual_seed(7)
    draw = (lambda *s: torch.randint(-50, 50, s, generator=g).float()) if integer else \
        (lambda *s: torch.randn(*s, generator=g))
    block = draw(ROWS, count)
    whole = draw(3, ROWS, 4)
    sums = [draw(ROWS, 6) for _ in range(world)]
    slices = [draw(ROWS, count) for _ in range(world)]  # receiver r's part of the returned block (its columns)
    return block, whole, sums, slices


def _movements(rank, world, straggler, count, integer):
    from semimig.comm.traffic import count_traffic
    from semimig.migration.exchange import make_exchange
    from semimig.migration.layout import MigrationLayout

    share = MigrationLayout.build(world, count, {straggler: count}).shares[0]
    active = [(r, s) for r, s in zip(share.receivers, share.ranges) if s[1] > s[0]]
    block, whole, sums, slices = _parts(world, count, integer)
    span = share.range_of(rank)
    out = {}
    for name, ex in (("direct", make_exchange("broadcast-reduce", dist.group.WORLD)),
                     ("tree", make_exchange("broadcast-reduce", dist.group.WORLD, algorithm="tree")),
                     ("sg", make_exchange("scatter-gather", dist.group.WORLD))):
        got = {}
        with count_traffic() as counter:
            blk, off = ex.share_block(block if rank == straggler else None, share, (ROWS, count), torch.float32,
                                      torch.device("cpu"))
            if span is not None and span[1] > span[0]:
                got["block"] = blk[:, span[0] - off:span[1] - off].clone()
            w = ex.share_whole(whole.clone() if rank == straggler else torch.zeros_like(whole), share)
            if span is not None and span[1] > span[0]:
                got["whole"] = w.clone()
            part = slices[rank][:, span[0]:span[1]].clone() if span is not None and span[1] > span[0] else None
            back = ex.return_block(part, share, (ROWS, count), torch.float32, torch.device("cpu"))
            if rank == straggler:
                got["return_block"] = back
            active_part = span is not None and span[1] > span[0]
            if rank == straggler or active_part or ex.policy == "broadcast-reduce":
                buf = sums[rank].clone() if (rank == straggler or active_part) else torch.zeros_like(sums[rank])
                ex.return_sum(buf, share)
                if rank == straggler:
                    got["return_sum"] = buf
        got["traffic"] = counter.totals()
        out[name] = got
    assert out["direct"]["traffic"].keys() <= {"broadcast", "reduce"}
    return rank, [r for r, _ in active], out


def _reference(world, straggler, count, integer, receivers):
    block, whole, sums, slices = _parts(world, count, integer)
    total = sums[receivers[0]].clone()
    for r in receivers[1:]:
        total.add_(sums[r])
    return block, whole, slices, sums[straggler] + total


@pytest.mark.parametrize("world,straggler,count", [(3, 1, 7), (4, 1, 9), (4, 3, 2)])
@pytest.mark.parametrize("integer", [False, True])
def test_direct_movements_equal_the_tree_and_carry_each_byte_once(world, straggler, count, integer):
    from semimig.migration.layout import MigrationLayout

    import pickle

    results = pickle.loads(run_on_ranks(_all_ranks, world, straggler, count, integer, timeout_s=60))
    share = MigrationLayout.build(world, count, {straggler: count}).shares[0]
    for rank, receivers, out in results:
        block, whole, slices, expected_sum = _reference(world, straggler, count, integer, receivers)
        span = share.range_of(rank)
        if rank == straggler:
            ref_block = torch.zeros(ROWS, count)
            for r, (a, b) in zip(share.receivers, share.ranges):
                ref_block[:, a:b] = slices[r][:, a:b]
            for name in out:
                assert torch.equal(out[name]["return_block"], ref_block), name
            assert torch.equal(out["direct"]["return_sum"], expected_sum)  # the documented order, bit for bit
            torch.testing.assert_close(out["tree"]["return_sum"], expected_sum, rtol=1e-6, atol=1e-5)
            if integer:
                assert torch.equal(out["tree"]["return_sum"], expected_sum)
                assert torch.equal(out["sg"]["return_sum"], expected_sum)
            t = out["direct"]["traffic"]
            b_block, b_whole, b_sum = 4 * ROWS * count, 4 * whole.numel(), 4 * ROWS * 6
            # the straggler's link: each block once, out for the broadcasts, in for the reduces
            assert t["broadcast"]["out_bytes"] == b_block + b_whole and t["broadcast"]["in_bytes"] == 0
            assert t["reduce"]["in_bytes"] == b_block + b_sum and t["reduce"]["out_bytes"] == 0
            assert t["broadcast"]["calls"] == 2 and t["reduce"]["calls"] == 2
            assert t["broadcast"]["payload_bytes"] == b_block + b_whole
            sg = out["sg"]["traffic"]
            assert sg["send"]["out_bytes"] == b_block + len(receivers) * b_whole  # what direct saves
        elif span is not None and span[1] > span[0]:
            for name in out:
                assert torch.equal(out[name]["block"], block[:, span[0]:span[1]]), name
                assert torch.equal(out[name]["whole"], whole), name
            t = out["direct"]["traffic"]
            n, i = len(receivers), receivers.index(rank)
            chunk = len(torch.tensor_split(torch.empty(whole.numel()), n)[i]) * 4
            sum_chunk = len(torch.tensor_split(torch.empty(ROWS * 6), n)[i]) * 4
            assert t["broadcast"]["in_bytes"] == 4 * ROWS * (span[1] - span[0]) + 4 * whole.numel()
            assert t["broadcast"]["out_bytes"] == (n - 1) * chunk
            assert t["reduce"]["out_bytes"] == 4 * ROWS * (span[1] - span[0]) + 4 * ROWS * 6
            assert t["reduce"]["in_bytes"] == (n - 1) * sum_chunk
        else:  # an inactive receiver takes no part in the direct movements
            assert out["direct"]["traffic"] == {}


def _all_ranks(rank, world, straggler, count, integer):
    """Every rank's results, pickled plainly (tensors through the result pipe would go by shared memory)."""
    import pickle

    return pickle.dumps(_gather(_movements(rank, world, straggler, count, integer)))


def _gather(value):
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


# ----------------------------------------------------------------------------- layers
def _layer_body(rank, world, kind, migrate):
    import copy

    import torch.nn as nn

    import semimig.nn as snn
    from semimig.migration.exchange import make_exchange
    from semimig.migration.layout import MigrationLayout
    from semimig.nn import LayerDirective

    torch.manual_seed(0)
    k = 12
    dense = nn.Linear(k, 8 * world) if kind == "col" else nn.Linear(k * world, 8)
    x = torch.randn(2, 3, dense.in_features)
    results = {}
    for algorithm in ("direct", "tree"):
        cls = snn.Linear1D_Col if kind == "col" else snn.Linear1D_Row
        extra = {} if kind == "col" else {"parallel_input": False}
        layer = cls.from_native_module(copy.deepcopy(dense), dist.group.WORLD, **extra)
        ex = make_exchange("broadcast-reduce", dist.group.WORLD, algorithm=algorithm)
        assert ex.algorithm == algorithm
        layer.directive = LayerDirective(iteration=0, layout=MigrationLayout.build(world, k, migrate), exchange=ex)
        xi = x.clone().requires_grad_(True)
        y = layer(xi)
        (y * torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape).cos()).sum().backward()
        results[algorithm] = (y.detach(), xi.grad, layer.weight.grad)
    for a, b in zip(results["direct"], results["tree"]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-5)
    return True


@pytest.mark.parametrize("kind", ["col", "row"])
def test_layers_under_direct_equal_the_tree(kind):
    assert run_on_ranks(_layer_body, 4, kind, {1: 7, 2: 2}, timeout_s=60)


def _choice_body(rank, world):
    from semimig.migration.exchange import make_exchange

    return make_exchange("broadcast-reduce", dist.group.WORLD).algorithm


def test_two_ranks_keep_the_tree_and_bad_algorithms_are_refused():
    from semimig.migration.exchange import make_exchange

    assert run_on_ranks(_choice_body, 2, timeout_s=60) == "tree"  # one receiver: the same single message
    assert run_on_ranks(_choice_body, 3, timeout_s=60) == "direct"
    with pytest.raises(ValueError, match="exchange algorithm must be one of .* got 'ring'"):
        make_exchange("broadcast-reduce", None, algorithm="ring")


# ----------------------------------------------------------------------------- on real links
def _netns_reason() -> str:
    import os

    if os.geteuid() != 0:
        return "not root: network namespaces need root"
    from semimig.cluster.netns import NetnsError, Unsupported, check_support

    try:
        check_support()
    except (Unsupported, NetnsError) as err:
        return f"no network namespace support: {err}"
    return ""


def _ours() -> set[str]:
    """Namespaces and links of emulated clusters (``smc-`` names) that exist now."""
    import json
    import subprocess

    ns = {line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                                   check=True).stdout.splitlines() if line.strip()}
    links = {entry["ifname"] for entry in json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True,
                                                                    text=True, check=True).stdout)}
    return {name for name in ns | links if name.startswith("smc-")}


@pytest.mark.skipif(bool(_netns_reason()), reason=_netns_reason() or "ok")
@pytest.mark.mutex("netns")  # reads the machine's namespaces before and after, as test_cluster does
def test_the_straggler_interface_carries_each_block_once_under_direct(tmp_path, monkeypatch):
    """The benchmark on 3 emulated nodes (rank 1's link 1 Gbit/s): the interface counters of the
    straggler's link, less the all-reduces' (gamma = 0), match the counted migration bytes under
    broadcast-reduce direct (TCP headers and acknowledgements aside), and scatter-gather's
    straggler receives more.  Nothing of the cluster is left afterwards, whatever happens."""
    import importlib
    import json
    import sys
    from pathlib import Path

    bench_dir = Path(__file__).resolve().parents[2] / "benchmarks"
    monkeypatch.syspath_prepend(str(bench_dir))
    for name in ("migration_bench", "migration_report", "migration_ranks"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    bench = importlib.import_module("migration_bench")
    before = _ours()
    out = tmp_path / "m.json"
    argv = ["--json", str(out), "--straggler-link-gbit", "1", "--world", "3", "--hidden", "96", "--tokens", "128",
            "--blocks", "1", "--rounds", "1", "--iters", "1", "--warmup", "0", "--movement-iters", "0",
            "--link-iters", "0", "--link-bytes-iters", "2", "--timeout", "150"]
    try:
        assert bench.main(argv) == 0
    finally:
        assert _ours() <= before, f"left behind: {_ours() - before}"
    result = json.loads(out.read_text())
    assert result["config"]["br_algorithm"] == "direct"
    records = {(r["policy"], r["gamma"]): r for r in result["records"]}
    links = {(lb["policy"], lb["gamma"]): lb for lb in result["link_bytes"]}
    for policy in ("broadcast-reduce", "scatter-gather"):
        zero = links[policy, 0.0]
        for gamma in (0.5, 1.0):
            counted = records[policy, gamma]["straggler_link"]
            lb = links[policy, gamma]
            for key, measured in (("out_bytes", lb["tx_bytes"][1] - zero["tx_bytes"][1]),
                                  ("in_bytes", lb["rx_bytes"][1] - zero["rx_bytes"][1])):
                assert counted[key] * 0.97 <= measured <= counted[key] * 1.15 + 4096, (policy, gamma, key, measured,
                                                                                       counted)
    assert links["scatter-gather", 1.0]["rx_bytes"][1] > 1.3 * links["broadcast-reduce", 1.0]["rx_bytes"][1]


def _subgroup_body(rank, world):
    """A tensor-parallel group of global ranks [1, 2, 3] (group ranks 0..2), as in a 2-D run."""
    from semimig.comm import primitives as P

    group = dist.new_group([1, 2, 3])
    if rank == 0:
        return None
    me = P.group_rank(group)
    whole = torch.arange(11.0) if me == 2 else torch.zeros(11)
    P.broadcast_direct_(whole, 2, [0, 1], group)  # root: group rank 2 = global rank 3
    part = torch.full((7,), float(me + 1))
    P.reduce_direct_(part, 2, [0, 1], group)
    return _sub_gather(group, (whole.tolist(), part.tolist()))


def _sub_gather(group, value):
    out = [None] * 3
    dist.all_gather_object(out, value, group=group)
    return out


def test_direct_movements_address_peers_by_group_rank_in_a_subgroup():
    outcomes = run_on_ranks(_subgroup_body_all, 4, timeout_s=60)
    assert [w for w, _ in outcomes] == [list(map(float, range(11)))] * 3
    assert outcomes[2][1] == [6.0] * 7 and outcomes[0][1] == [1.0] * 7  # root: 3 + 1 + 2; senders unchanged


def _subgroup_body_all(rank, world):
    got = _subgroup_body(rank, world)
    everyone = [None] * world
    dist.all_gather_object(everyone, got)
    return everyone[1]
