"""The DDP gradient all-reduce's wait timed as communication (semimig.straggler.ddp_wait) on gloo.

- exact: a small MLP under torch DDP (buckets of a few parameters each), three SGD steps on each rank's
  own rows, with semimig's hook equals DDP without a hook bit for bit (gradients and weights), over 2 and
  3 ranks (3: ``mul_(1/3)`` and ``div_(3)`` round differently, and DDP's ``batched_grad_copy`` divides),
  and both equal one dense process on all the rows within reassociation;
- ordering: when the region closes, the gradients already hold the all-reduced means (DDP's finalize
  has run) and when it opens they do not;
- the wait: rank 1 sleeps before every backward; rank 0's comm holds that wait and its compute does
  not (the gross bounds: more than half the sleep, on the median of the steps);
- a re-plan (tp 2 x dp 2, a small Llama, a plan per replica between two steps) keeps the hook on the
  rebuilt reducer, and the run equals the same run without it bit for bit; a user's hook is still refused.
"""
from __future__ import annotations

import statistics
import time

import pytest
import torch

from dist_harness import run_pooled

ROWS, IN, HIDDEN, OUT = 6, 12, 24, 5
STEPS = 3
DELAY_S = 0.4
TIMEOUT_S = 120


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN),
                               torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def _rows(step, rank):
    gen = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(ROWS, IN, generator=gen), torch.randn(ROWS, OUT, generator=gen)


def _ddp(**kwargs):
    # a bucket cap below one layer's bytes: one bucket per few parameters, so the last bucket is not the only one
    return torch.nn.parallel.DistributedDataParallel(_mlp(), bucket_cap_mb=0.001, **kwargs)


def _train(rank, hooked, clock=None, **ddp_kwargs):
    from semimig.straggler import ddp_wait
    from semimig.straggler.clock import HostClock

    model = _ddp(**ddp_kwargs)
    states = ddp_wait.install(model, clock or HostClock(lag=0)) if hooked else []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads = []
    for step in range(STEPS):
        x, y = _rows(step, rank)
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
        optimizer.zero_grad()
    return states, grads, [p.detach().clone() for p in model.parameters()]


def _exact_body(rank, world, ddp_kwargs):
    states, grads, weights = _train(rank, True, **ddp_kwargs)
    _, plain_grads, plain_weights = _train(rank, False, **ddp_kwargs)
    return dict(hooked=len(states), buckets=[s.buckets for s in states], waits=[s.waits for s in states],
                equal=all(torch.equal(a, b) for g, h in zip(grads, plain_grads) for a, b in zip(g, h))
                and all(torch.equal(a, b) for a, b in zip(weights, plain_weights)), weights=weights)


def _dense(world):
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        xs, ys = zip(*(_rows(step, r) for r in range(world)))
        torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("world,ddp_kwargs", [(2, {}), (3, {}), (3, dict(batched_grad_copy=True)),
                                              (2, dict(gradient_as_bucket_view=True))],
                         ids=["2-ranks", "3-ranks-mul", "3-ranks-batched-div", "2-ranks-grad-as-bucket-view"])
def test_the_hook_reduces_bit_for_bit_as_ddp_does(world, ddp_kwargs):
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(x * (1.0 / 3), x / 3)  # at 3 ranks the two scalings are told apart
    out = run_pooled(_exact_body, world, ddp_kwargs, timeout_s=TIMEOUT_S)
    assert out["hooked"] == 1
    assert out["buckets"][0] > STEPS, out  # several buckets per backward, all through the hook
    assert out["waits"] == [STEPS]
    assert out["equal"], f"the hook's reduction differs from DDP's own at {world} ranks {ddp_kwargs}"
    for value, expected in zip(out["weights"], _dense(world)):
        torch.testing.assert_close(value, expected, atol=1e-6, rtol=1e-5)


def _refused_body(rank, world):
    from semimig.straggler import ddp_wait
    from semimig.straggler.clock import HostClock

    return len(ddp_wait.install(_ddp(gradient_as_bucket_view=True), HostClock(lag=0)))


def test_no_hook_where_ddp_itself_rounds_two_ways():
    assert run_pooled(_refused_body, 3, timeout_s=TIMEOUT_S) == 0


class _Recording:
    """A host step clock that keeps the gradients of ``model`` seen when a ``"comm"`` region opens and closes, and
    the order every region opened and closed in."""

    def __init__(self, model):
        from semimig.straggler.clock import HostClock

        class Clock(HostClock):
            def start(clock, kind):
                self.kinds.append(("start", kind))
                if kind == "comm":
                    self.opened.append([p.grad.clone() for p in model.parameters()])
                super().start(kind)

            def stop(clock, kind):
                self.kinds.append(("stop", kind))
                if kind == "comm":
                    self.closed.append([p.grad.clone() for p in model.parameters()])
                super().stop(kind)

        self.opened, self.closed, self.kinds = [], [], []
        self.clock = Clock(lag=0)


def _order_body(rank, world):
    from semimig.straggler import ddp_wait

    model = _ddp()
    recording = _Recording(model)
    ddp_wait.install(model, recording.clock)
    x, y = _rows(0, rank)
    torch.nn.functional.mse_loss(model(x), y).backward()
    reduced = [p.grad.clone() for p in model.parameters()]
    return dict(closed=[torch.equal(a, b) for a, b in zip(recording.closed[0], reduced)],
                opened=[torch.equal(a, b) for a, b in zip(recording.opened[0], reduced)],
                regions=(len(recording.opened), len(recording.closed)), kinds=recording.kinds)


def test_the_region_closes_after_ddp_finalized_the_reduction():
    out = run_pooled(_order_body, 2, timeout_s=TIMEOUT_S)
    assert out["regions"] == (1, 1)
    # the data-parallel wait's own region nests inside the comm one: opened after it, closed before it
    assert out["kinds"] == [("start", "comm"), ("start", "dp"), ("stop", "dp"), ("stop", "comm")], out["kinds"]
    assert all(out["closed"]), "the region closed before DDP's finalize wrote the means into the gradients"
    assert not all(out["opened"]), "the gradients held the means before the last bucket's reduction"


def _wait_body(rank, world):
    from semimig.straggler import ddp_wait
    from semimig.straggler.clock import HostClock

    clock = HostClock(lag=0)
    model = _ddp()
    ddp_wait.install(model, clock)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    times = []
    for step in range(4):
        x, y = _rows(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if rank == 1:
            time.sleep(DELAY_S)  # the slow replica: its own work before the backward
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(clock.step())
    comm = statistics.median(t.comm_s for t in times[1:])
    compute = statistics.median(t.compute_s for t in times[1:])
    dp = statistics.median(t.dp_s for t in times[1:])
    every = [None] * world
    torch.distributed.all_gather_object(every, (comm, compute, dp))
    return every


def test_the_fast_replica_reads_its_wait_for_the_slow_one_as_communication():
    (fast_comm, fast_compute, fast_dp), (slow_comm, slow_compute, slow_dp) = run_pooled(_wait_body, 2,
                                                                                        timeout_s=TIMEOUT_S)
    assert fast_comm > DELAY_S / 2, (fast_comm, slow_comm)
    assert slow_comm < DELAY_S / 2, (fast_comm, slow_comm)
    assert fast_compute < slow_compute - DELAY_S / 2, (fast_compute, slow_compute)
    # the wait is the data-parallel one, told apart from the other collectives (a part of them)
    assert DELAY_S / 2 < fast_dp <= fast_comm and slow_dp <= slow_comm and slow_dp < DELAY_S / 2, (fast_dp, slow_dp)


# ------------------------------------------------------------------------------------------ a re-plan
BLOCK = 32
EVEN = ((4, 4), (2, 2))  # (mlp blocks, kv groups) per TP rank
THREE_ONE = ((6, 2), (3, 1))


def _plan(units):
    from semimig.shardformer import UnevenPlan

    return UnevenPlan(mlp_units=units[0], kv_units=units[1], block_size=BLOCK)


def _replan_run(hooked, between):
    from semimig.shardformer import SemiMigPolicy
    from semimig.shardformer.replicas import apply_replica_plans
    from semimig.straggler import ddp_wait
    from semimig.straggler.clock import HostClock
    from tiny_lms import SEQ, VOCAB, boost_lm, tiny_lm

    model = tiny_lm("llama")
    booster, model, optimizer, plugin = boost_lm(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1,
                                                                                  momentum=0.9),
                                                 policy=SemiMigPolicy(shard_plan=_plan(EVEN)))
    clock = HostClock(lag=0)
    states = ddp_wait.install(model, clock) if hooked else []
    d = plugin.dp_group.rank()
    losses, buckets, comm = [], [], []
    for step in range(2):
        if step == 1:
            apply_replica_plans(model, optimizer, [_plan(p) for p in between])
        gen = torch.Generator().manual_seed(3000 + step)
        ids = torch.randint(0, VOCAB, (8, SEQ), generator=gen)[4 * d:4 * d + 4]
        loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        buckets.append(sum(s.buckets for s in states))
        comm.append(clock.step().comm_s)
    weights = {n: p.detach().clone() for n, p in model.unwrap().named_parameters()}
    return dict(losses=losses, buckets=buckets, comm=comm, weights=weights)


def _replan_body(rank, world, between):
    return _replan_run(True, between), _replan_run(False, between)


@pytest.mark.parametrize("between", [(EVEN, THREE_ONE), (THREE_ONE, THREE_ONE)], ids=["plan-per-replica", "one-plan"])
def test_a_replan_keeps_the_hook_and_the_run_exact(between):
    hooked, plain = run_pooled(_replan_body, 4, between, timeout_s=300)
    assert hooked["buckets"][0] > 0 and hooked["buckets"][1] > hooked["buckets"][0], hooked["buckets"]
    assert hooked["comm"][1] > 0.0
    assert hooked["losses"] == plain["losses"]
    for name, value in hooked["weights"].items():
        assert torch.equal(value, plain["weights"][name]), name


def _user_hook_body(rank, world):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from semimig.errors import ConfigError
    from semimig.shardformer import SemiMigPolicy
    from semimig.shardformer.replicas import apply_replica_plans
    from semimig.straggler import ddp_wait
    from semimig.straggler.clock import HostClock
    from tiny_lms import boost_lm, tiny_lm

    model = tiny_lm("llama")
    _, model, optimizer, plugin = boost_lm(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                           policy=SemiMigPolicy(shard_plan=_plan(EVEN)))
    ddp = next(m for m in model.modules() if isinstance(m, torch.nn.parallel.DistributedDataParallel))
    ddp.register_comm_hook(plugin.dp_group, allreduce_hook)
    installed = len(ddp_wait.install(model, HostClock(lag=0)))
    try:
        apply_replica_plans(model, optimizer, [_plan(EVEN), _plan(THREE_ONE)])
    except ConfigError as err:
        return installed, str(err)
    return installed, None


def test_a_users_hook_is_still_refused_by_a_replan():
    installed, message = run_pooled(_user_hook_body, 4, timeout_s=300)
    assert installed == 0
    assert message is not None and "communication hook" in message
