"""Re-sharding with data-parallel replicas: tp = 2 x dp = 2 under plain DP, a plan per replica (DESIGN §8).

Every rank gathers every replica's rows over the DP group (a step late) and runs one re-shard policy
per replica on that replica's own rows, so all ranks take every replica's decision alike; a move of
any replica moves the world at once (:func:`semimig.shardformer.replicas.apply_replica_plans`).  Under
ZeRO the replicas share one plan, chosen for the slowest rank at each TP position
(:func:`semimig.resharder.slowest_per_position`; tests/multirank/test_reshard_per_replica.py).

- pure: the selection per position (relative to each replica's fastest rank, so a replica with
  more samples is not taken for a slow one);
- four gloo ranks, a small Llama, DDP across the two replicas, each DP rank on its own batches:
  a straggler on replica 0's TP rank 1 only (``fixed:1:8:scope=device``) makes replica 0 re-plan,
  rank 1 holding fewer units, while replica 1 stays even; every rank records the same moves, and
  training goes on exactly (the losses of ``mode="off"`` within fp32 reassociation: an uneven split
  reorders the sums over the intermediate dimension and the heads); with no straggler nothing moves
  and the run is ``off``'s bit for bit.  The device probe and a batch split (Poplar) compose with it.
"""
from __future__ import annotations

import pytest
import torch

from dist_harness import run_pooled
from semimig.errors import ConfigError
from semimig.resharder import slowest_per_position
from semimig.shardformer import UnevenPlan
from tiny_lms import boost_lm, reshardable_llama, split_step, train_steps

BLOCK = 32
STEPS = 14
LOSS_TOL = dict(atol=1e-4, rtol=1e-4)  # as tests/multirank/test_reshard_enable.py: fp32, 14 AdamW steps


def _row(tp_rank, dp_rank, compute, shardable, comm=0.01, gemm=None):
    return [tp_rank, dp_rank, compute, shardable, comm, shardable * 0.9 if gemm is None else gemm, 0.0]


def test_one_replica_is_passed_through_unchanged():
    rows = [_row(1, 0, 4.0, 3.0), _row(0, 0, 1.0, 0.8)]
    assert slowest_per_position(rows, tp=2) == [_row(0, 0, 1.0, 0.8), _row(1, 0, 4.0, 3.0)]


def test_each_position_takes_the_replica_where_it_is_slowest_relative_to_its_own_fastest():
    # replica 0: rank 1 four times slower; replica 1: healthy, but every time doubled (twice the samples)
    rows = [_row(0, 0, 1.0, 0.8), _row(1, 0, 4.0, 3.2), _row(0, 1, 2.0, 1.6), _row(1, 1, 2.0, 1.6)]
    out = slowest_per_position(rows, tp=2)
    assert [int(r[1]) for r in out] == [0, 0]  # position 0: a tie (1.0 in both) goes to replica 0
    base = (1.0 + 2.0) / 2  # the mean of the replicas' fastest computes; replica 0's rows scale by 1.5
    assert out[1][2] == pytest.approx(4.0 * base) and out[1][3] == pytest.approx(3.2 * base)
    assert out[1][4] == 0.01  # seconds in collectives are not rescaled
    # the slow rank in the replica with more samples: its relative slowness, not its raw seconds, counts
    rows = [_row(0, 0, 1.0, 0.8), _row(1, 0, 1.5, 1.2), _row(0, 1, 2.0, 1.6), _row(1, 1, 6.0, 4.8)]
    assert [int(r[1]) for r in slowest_per_position(rows, tp=2)] == [0, 1]


def test_rows_that_stop_after_compute_are_read_as_full_ones():
    """The device probe's rows hold only ``[tp_rank, dp_rank, compute]``: the same choice and scale."""
    full = [_row(0, 0, 1.0, 0.8), _row(1, 0, 4.0, 3.2), _row(0, 1, 2.0, 1.6), _row(1, 1, 2.0, 1.6)]
    short = [row[:3] for row in full]
    assert slowest_per_position(short, tp=2) == [row[:3] for row in slowest_per_position(full, tp=2)]


def test_a_grid_with_a_missing_rank_is_refused_by_name():
    with pytest.raises(ConfigError, match="every replica needs one row per TP rank 0..1"):
        slowest_per_position([_row(0, 0, 1.0, 0.8), _row(1, 0, 2.0, 1.6), _row(0, 1, 1.0, 0.8)], tp=2)


def _batches(dp_rank):
    def batch(step):
        gen = torch.Generator().manual_seed(1000 + 2 * step + dp_rank)  # each replica on its own data
        ids = torch.randint(0, 128, (4, 32), generator=gen)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    return batch


def _boosted():
    """tp 2 x dp 2 (fp32): (plugin, booster, model, optimizer), the model in units re-sharding can move."""
    from semimig.resharder import even_reshardable_plan
    from semimig.shardformer import SemiMigPolicy

    model = reshardable_llama(128, 512)
    policy = SemiMigPolicy(shard_plan=even_reshardable_plan(model.config, 2, block_size=BLOCK))
    booster, model, optimizer, plugin = boost_lm(model, policy=policy)
    return plugin, booster, model, optimizer


def _train(mode, straggler_on_replica_0):
    import semimig
    from semimig.controller.reshard import ReshardConfig

    plugin, booster, model, optimizer = _boosted()
    dp_rank = plugin.dp_group.rank()
    straggler = straggler_on_replica_0 if dp_rank == 0 else None
    # the policy's defaults: the device probe finds the whole-device straggler before the first step (its
    # clock slows the probe too), and the noise test keeps a loaded machine's jitter from moving the other
    balancer = semimig.enable(model, plugin, optimizer=optimizer, mode=mode, straggler=straggler,
                              reshard=ReshardConfig(window=6, horizon=STEPS))
    try:
        losses = train_steps(booster, model, optimizer, range(STEPS), batch=_batches(dp_rank))
        summary = balancer.reshard_summary
    finally:
        balancer.close()
    return dp_rank, losses, summary


def _replicas_body(rank, world):
    import torch.distributed as dist

    out = {"off": _train("off", None), "reshard": _train("reshard", "fixed:1:8:scope=device"),
           "calm": _train("reshard", None)}
    every = [None] * world
    dist.all_gather_object(every, out)
    return every


def test_the_slow_replica_re_plans_alone_and_every_replica_trains_exactly():
    every = run_pooled(_replicas_body, 4, timeout_s=600)
    events = [out["reshard"][2]["events"] for out in every]
    assert events[0], f"no re-plan under an 8x straggler on replica 0's rank 1: {every[0]['reshard'][2]}"
    keys = [[(e["step"], e["replica"], e["mlp_units"], e["kv_units"]) for e in ev] for ev in events]
    assert all(k == keys[0] for k in keys), f"the ranks recorded different moves: {keys}"
    assert all(e["replica"] == 0 for e in events[0]), f"the healthy replica moved: {keys[0]}"
    first = events[0][0]
    assert first["mlp_units"][1] < first["mlp_units"][0], first
    plans = every[0]["reshard"][2]["plans"]
    assert all(out["reshard"][2]["plans"] == plans for out in every), plans
    assert plans[1] == str(UnevenPlan(mlp_units=(8, 8), kv_units=(1, 1), block_size=BLOCK)), plans  # still even
    for out in every:
        dp_rank, healthy, _ = out["off"]
        assert out["reshard"][0] == dp_rank
        torch.testing.assert_close(torch.tensor(out["reshard"][1]), torch.tensor(healthy), **LOSS_TOL)
        assert out["calm"][2]["replans"] == 0 and out["calm"][1] == healthy, out["calm"][2]  # nothing moves, bit for bit
    # the two replicas trained on different data: their losses differ, so both were checked
    assert every[0]["off"][1] != every[2]["off"][1]


PROBE_STEPS = 3


def _probe_body(rank, world):
    """Every rank's re-plans and losses with the device probe at its defaults (tolerance, agreement):
    an 8x whole-device straggler on replica 0's TP rank 1 only; and ``off`` for the losses."""
    import torch.distributed as dist

    import semimig
    from semimig.controller.reshard import ReshardConfig

    out = {}
    for mode in ("off", "reshard"):
        plugin, booster, model, optimizer = _boosted()
        dp_rank = plugin.dp_group.rank()
        balancer = semimig.enable(model, plugin, optimizer=optimizer, mode=mode,
                                  straggler="fixed:1:8:scope=device" if dp_rank == 0 else None,
                                  reshard=ReshardConfig(window=6, horizon=STEPS))
        try:
            losses = train_steps(booster, model, optimizer, range(PROBE_STEPS), batch=_batches(dp_rank))
            out[mode] = (dp_rank, losses, balancer.reshard_summary)
        finally:
            balancer.close()
    every = [None] * world
    dist.all_gather_object(every, out)
    return every


def test_the_device_probe_reads_each_replica_and_only_the_slow_one_moves_before_the_first_step():
    """With replicas the probe runs in every TP group at once and every replica's times are gathered
    over the world (``Resharder._replica_probes``): each replica's policy profiles its own, so with the
    straggler in replica 0 only, replica 0 moves before step 0, rank 1 holding fewer units, replica 1
    stays even, every rank records the same move, and both train as ``off`` does (the calm run with
    the probe on is the test above's ``calm``)."""
    every = run_pooled(_probe_body, 4, timeout_s=600)
    events = [out["reshard"][2]["events"] for out in every]
    assert all(events), f"a rank recorded no re-plan: {events}"
    firsts = [(ev[0]["step"], ev[0]["replica"], ev[0]["mlp_units"], ev[0]["kv_units"]) for ev in events]
    assert all(f == firsts[0] for f in firsts), f"the ranks recorded different moves: {firsts}"
    step, replica, mlp, kv = firsts[0]
    assert step == -1 and replica == 0 and "device probe" in events[0][0]["reason"], events[0][0]
    assert mlp[1] < mlp[0] and kv[1] <= kv[0], firsts[0]
    assert all(e["replica"] == 0 for e in events[0]), events[0]
    for out in every:
        dp_rank, healthy, _ = out["off"]
        assert out["reshard"][0] == dp_rank
        torch.testing.assert_close(torch.tensor(out["reshard"][1]), torch.tensor(healthy), **LOSS_TOL)


GLOBAL_BATCH = 12
SPLIT_STEPS = 20  # Poplar calibrates at iteration 4 and moves samples: the re-plan's window may restart there


def _global_batch(step):
    gen = torch.Generator().manual_seed(5000 + step)  # the same global batch on every rank
    ids = torch.randint(0, 128, (GLOBAL_BATCH, 32), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def _train_split(mode, straggler_on_replica_0):
    """``enable(..., batch=BatchSplit(...))`` with re-sharding: the global-batch mean loss per step."""
    import semimig
    from semimig.controller.reshard import ReshardConfig
    from semimig.hybrid import ReplanConfig

    plugin, booster, model, optimizer = _boosted()
    straggler = straggler_on_replica_0 if plugin.dp_group.rank() == 0 else None
    balancer = semimig.enable(model, plugin, optimizer=optimizer, mode=mode, straggler=straggler,
                              # stability and noise tests opened wide: Poplar moves samples at iteration 4 and a
                              # loaded machine's noise must not keep an 8x straggler from being re-planned —
                              # what is tested is the composition (agreement, exactness), not the policy's patience
                              reshard=ReshardConfig(window=6, horizon=SPLIT_STEPS, noise_z=0.0),
                              batch=semimig.BatchSplit(global_batch_size=GLOBAL_BATCH,
                                                       replan=ReplanConfig(window=3, patience=2)))
    losses, splits = [], []
    try:
        for step in range(SPLIT_STEPS):
            splits.append(balancer.batch_plan.samples)
            losses.append(split_step(booster, model, optimizer, balancer, plugin, _global_batch(step)))
        return losses, splits, balancer.reshard_summary
    finally:
        balancer.close()


def _split_body(rank, world):
    import torch.distributed as dist

    out = {"off": _train_split("off", None), "reshard": _train_split("reshard", "fixed:1:8:scope=device")}
    every = [None] * world
    dist.all_gather_object(every, out)
    return every


def test_a_batch_split_and_re_sharding_compose_and_train_the_global_batch_exactly():
    every = run_pooled(_split_body, 4, timeout_s=600)
    keys = [[(e["step"], e["replica"], e["mlp_units"]) for e in out["reshard"][2]["events"]] for out in every]
    assert keys[0] and all(k == keys[0] for k in keys), f"re-plans differ or none: {keys}"
    # the slow replica moves first; what the joint planner then gives the healthy one is its call on
    # measured compute, which on four ranks sharing two cores carries the ranks' unequal waits in
    # Colossal-AI's own collectives (docs/limitations.md): not asserted here
    assert keys[0][0][1] == 0, f"the first re-plan is not the slow replica's: {keys[0]}"
    for out in every:
        off, reshard = out["off"][0], out["reshard"][0]
        torch.testing.assert_close(torch.tensor(reshard), torch.tensor(off), **LOSS_TOL)
    slow, fast = every[0]["reshard"][1][-1]
    # the replica with the straggler never gets more samples while the straggler works in its step; once its
    # plan gives the straggler no unit, the straggler skips the step (semimig.shardformer.skip) and that
    # replica runs on its healthy rank alone: no slower than a replica of healthy ranks, the split the planner's
    last = [e for e in every[0]["reshard"][2]["events"] if e["replica"] == 0][-1]
    skips = last["mlp_units"][1] == 0 and last["kv_units"][1] == 0
    assert skips or slow <= fast, f"Poplar gave the replica with the straggler more samples: {(slow, fast)}"
