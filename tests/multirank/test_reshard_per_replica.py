"""Re-sharding with a plan per data-parallel replica through ``semimig.enable``: tp 2 x dp 2 on gloo.

Under plain DP (``zero_stage=0``) every rank runs one re-shard policy per replica on that replica's
own rows (:class:`semimig.resharder.Resharder`), and a decision of any replica moves every replica
at once (:func:`semimig.shardformer.replicas.apply_replica_plans`).  Four gloo ranks, a small Llama,
each replica on its own batches:

- an emulated 8x whole-device straggler on replica 1's TP rank 1 only (the probe off, so the steps'
  rows decide): replica 1 moves to a plan giving rank 1 fewer units, replica 0 stays even, every
  rank records the same moves, and the run equals, weight for weight, Colossal-AI trained with the
  same plans applied by hand at the same steps (the cross-layout reduction's exactness against a
  dense reference is tests/multirank/test_replica_plans.py's); its losses are those of the run
  that never moves within fp32 reassociation;
- no straggler: nothing moves and losses and weights are Colossal-AI's bit for bit;
- ZeRO-1 (bf16): the replicas share one plan, the slowest rank per TP position's (the straggler in
  replica 1 moves replica 0 too), and global rank 0 says why once at INFO.
"""
from __future__ import annotations

import logging

import torch

from dist_harness import run_pooled
from tiny_lms import boost_lm, reshardable_llama

BLOCK = 32
STEPS = 14
LOSS_TOL = dict(atol=1e-4, rtol=1e-4)  # fp32, AdamW: an uneven split reorders sums over the MLP and heads
STRAGGLER = "fixed:1:8:scope=device"
EVEN = ((8, 8), (1, 1))  # (MLP blocks, KV groups) per TP rank: 512 / 32 blocks and 2 KV heads over tp 2


def _batch(dp_rank, step):
    gen = torch.Generator().manual_seed(3000 + 2 * step + dp_rank)  # each replica on its own data
    ids = torch.randint(0, 128, (4, 32), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def _boosted(zero_stage=0):
    from semimig.resharder import even_reshardable_plan
    from semimig.shardformer import SemiMigPolicy

    model = reshardable_llama(128, 512)
    policy = SemiMigPolicy(shard_plan=even_reshardable_plan(model.config, 2, block_size=BLOCK))
    booster, model, optimizer, plugin = boost_lm(model, policy=policy, zero_stage=zero_stage,
                                                 precision="bf16" if zero_stage else "fp32")
    return plugin, booster, model, optimizer


def _weights(model):
    return {n: p.detach().float().clone() for n, p in model.unwrap().named_parameters()}


def _plans(units):
    from semimig.shardformer import UnevenPlan

    return tuple(UnevenPlan(mlp_units=m, kv_units=k, block_size=BLOCK) for m, k in units)


def _run(straggler=None, *, replay=None, steps=STEPS):
    """``replay=None``: ``semimig.enable(mode="reshard")`` with ``straggler`` on replica 1 only; else
    Colossal-AI alone, moved after step ``i`` to ``replay[i]`` (every replica's units) where it changes.
    Returns (dp rank, losses, plans after each step, summary, weights)."""
    import semimig
    from semimig.controller.reshard import ReshardConfig
    from semimig.shardformer.replicas import apply_replica_plans

    plugin, booster, model, optimizer = _boosted()
    dp_rank = plugin.dp_group.rank()
    balancer = None
    if replay is None:
        # the noise test opened and the probe off: the steps' per-replica rows decide, on a
        # loaded machine too — what is tested is the per-replica wiring and exactness, not the policy's patience
        opened = dict(noise_z=0.0) if straggler else {}
        balancer = semimig.enable(model, plugin, optimizer=optimizer, mode="reshard",
                                  straggler=straggler if dp_rank == 1 else None,
                                  reshard=ReshardConfig(window=6, horizon=steps, probe=0.0, **opened))
    losses, plans = [], []
    held = [EVEN] * 2
    try:
        for step in range(steps):
            loss = model(**_batch(dp_rank, step)).loss
            booster.backward(loss, optimizer)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss.detach()))
            if balancer is not None:
                plans.append([(p.mlp_units, p.kv_units) for p in balancer.resharder.plans])
            elif list(replay[step]) != held:
                apply_replica_plans(model, optimizer, _plans(replay[step]))
                held = list(replay[step])
        summary = balancer.reshard_summary if balancer is not None else None
    finally:
        if balancer is not None:
            balancer.close()
    return dp_rank, losses, plans, summary, _weights(model)


def _body(rank, world):
    import torch.distributed as dist

    out = {"straggler": _run(STRAGGLER), "calm": _run(None)}
    every = [None] * world
    dist.all_gather_object(every, [(o[0], o[2], o[3]) for o in out.values()])
    replay = every[0][0][1]  # every replica's plans after each step, as rank 0 recorded them
    out["replay"] = _run(replay=replay)
    out["plain"] = _run(replay=[[EVEN] * 2] * STEPS)  # the even plan throughout: nothing applied
    dist.all_gather_object(every, out)
    return every


def test_each_replica_plans_for_itself_and_trains_exactly():
    every = run_pooled(_body, 4, timeout_s=600)
    events = [out["straggler"][3]["events"] for out in every]
    assert events[0], f"no re-plan under an 8x straggler on replica 1's rank 1: {every[0]['straggler'][3]}"
    keys = [[(e["step"], e.get("replica"), e["mlp_units"], e["kv_units"]) for e in ev] for ev in events]
    assert all(k == keys[0] for k in keys), f"the ranks recorded different moves: {keys}"
    assert all(e.get("replica") == 1 for e in events[0]), f"replica 0 moved without a straggler: {keys[0]}"
    first = events[0][0]
    assert first["mlp_units"][1] < first["mlp_units"][0], first
    final = every[0]["straggler"][2][-1]
    assert final[0] == EVEN, f"replica 0 left the even plan: {final}"
    for out in every:
        dp_rank, losses, plans, summary, weights = out["straggler"]
        assert plans == every[0]["straggler"][2] and summary["plans"] == every[0]["straggler"][3]["plans"]
        assert summary["plan"] == summary["plans"][dp_rank]
        _, replay_losses, _, _, replay_weights = out["replay"]
        assert losses == replay_losses, "the moves of enable() and by hand trained differently"
        for name, tensor in weights.items():
            torch.testing.assert_close(tensor, replay_weights[name], rtol=0, atol=0, msg=name)
        _, plain_losses, _, _, plain_weights = out["plain"]
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(plain_losses), **LOSS_TOL)
        _, calm_losses, _, calm_summary, calm_weights = out["calm"]
        assert calm_summary["replans"] == 0, calm_summary
        assert calm_losses == plain_losses  # nothing moves: Colossal-AI's, bit for bit
        for name, tensor in calm_weights.items():
            assert torch.equal(tensor, plain_weights[name]), name
    assert every[0]["plain"][1] != every[2]["plain"][1]  # the replicas trained on different data


ZERO_STEPS = 10


def _zero_body(rank, world):
    """ZeRO-1 (bf16), the straggler on replica 1, the steps' rows deciding (as in :func:`_run`): one shared plan."""
    import torch.distributed as dist

    import semimig
    from semimig.controller.reshard import ReshardConfig

    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    handler = Keep(level=logging.INFO)
    log = logging.getLogger("semimig.resharder")
    log.addHandler(handler)
    old_level = log.level
    log.setLevel(logging.INFO)
    try:
        plugin, booster, model, optimizer = _boosted(zero_stage=1)
        dp_rank = plugin.dp_group.rank()
        balancer = semimig.enable(model, plugin, optimizer=optimizer, mode="reshard",
                                  straggler=STRAGGLER if dp_rank == 1 else None,
                                  reshard=ReshardConfig(window=6, horizon=ZERO_STEPS, probe=0.0, noise_z=0.0))
        try:
            for step in range(ZERO_STEPS):
                loss = model(**_batch(dp_rank, step)).loss
                booster.backward(loss, optimizer)
                optimizer.step()
                optimizer.zero_grad()
            summary = balancer.reshard_summary
            per_replica = balancer.resharder.per_replica
        finally:
            balancer.close()
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
    every = [None] * world
    dist.all_gather_object(every, (dp_rank, summary, per_replica, lines))
    return every


def test_zero_keeps_one_shared_plan_and_says_why():
    every = run_pooled(_zero_body, 4, timeout_s=600)
    assert not any(out[2] for out in every)
    summaries = [out[1] for out in every]
    assert "plans" not in summaries[0]
    assert all(s["plan"] == summaries[0]["plan"] for s in summaries), [s["plan"] for s in summaries]
    events = summaries[0]["events"]
    assert events and "replica" not in events[0], every[0][3]
    assert events[0]["mlp_units"][1] < events[0]["mlp_units"][0], events[0]  # replica 1's slow rank, in both
    why = [[line for line in out[3] if "share one plan" in line] for out in every]
    assert len(why[0]) == 1 and "equal shapes across the data-parallel group" in why[0][0], every[0][3]
    assert not any(why[1:]), "only global rank 0 says it"
