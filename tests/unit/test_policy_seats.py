"""A slow rank's seat in a dimension's reductions (semimig.controller.policy.propose): a reduction runs
at the pace of its slowest member, so a slow rank given a unit or two of a dimension can cost the step
more in that dimension's collectives than the compute it takes off the others.  Checked on the pure
proposal: with the collectives' seconds measured, the slow rank is taken out of every dimension; with
none measured the compute-only plan (which seats it) stands; no slow rank: nothing changes."""
from __future__ import annotations

import pytest

from semimig.controller.policy.propose import propose, seat_delta, seat_reading, seat_scale, shares
from semimig.controller.policy.records import ReshardSample
from semimig.sharding.plan import ShardPlan
from semimig.sharding.solver import StepModel

MODEL = StepModel(speeds=(1.0, 1.0, 1.0, 0.25), replicated=0.1, shardable=3.6)
WEIGHTS = (0.7, 0.3)
NOW = (ShardPlan(units=(8, 8, 7, 1)), ShardPlan(units=(3, 2, 2, 1)))  # rank 3 seated in both dimensions


def _propose(comm: float, unseat=frozenset({3})):
    return propose(MODEL, NOW, WEIGHTS, slow=True, min_units=0, margin=0.03, unseat=unseat, comm=comm)


def test_the_scale_counts_each_dimension_at_its_slowest_member():
    assert seat_scale(MODEL.speeds, NOW) == pytest.approx(12.0)  # two kinds and the vocabulary at rank 3's pace
    out = (ShardPlan(units=(8, 8, 8, 0)), ShardPlan(units=(3, 3, 2, 0)))
    assert seat_scale(MODEL.speeds, out) == pytest.approx(6.0)  # rank 3 still sits in the vocabulary's
    assert seat_scale(MODEL.speeds, out, idle_free=True) == pytest.approx(3.0)  # unless it skips the step
    assert seat_delta(MODEL.speeds, NOW, out, 0.2) == pytest.approx(0.2 * (6.0 - 12.0) / 12.0)
    assert seat_delta(MODEL.speeds, NOW, out, 0.0) == 0.0


def test_without_measured_collectives_the_compute_plan_seats_the_slow_rank():
    plan = _propose(0.0)
    assert any(p.units[3] > 0 for p in plan)  # the compute-only optimum gives it work it can finish in time


def test_measured_collectives_take_the_slow_rank_out_of_every_dimension():
    plan = _propose(0.5)
    assert all(p.units[3] == 0 for p in plan), plan
    assert [sum(p.units) for p in plan] == [24, 8]
    # the step it predicts beats the compute-only plan's, seats counted
    compute_only = _propose(0.0)

    def cost(c):
        return MODEL.step(shares(WEIGHTS, c)) + seat_delta(MODEL.speeds, NOW, c, 0.5)
    assert cost(plan) < cost(compute_only)


def test_a_seat_worth_less_than_the_compute_it_takes_off_stays():
    """Two MLP units off the slow rank cost the others more compute than its MLP seat costs at 0.2 s."""
    plan = _propose(0.2)
    assert plan[0].units[3] > 0 and plan[1].units[3] == 0


def test_a_rank_outside_the_slow_set_is_never_unseated():
    assert _propose(0.2, unseat=frozenset()) == _propose(0.0, unseat=frozenset())


def test_no_slow_rank_keeps_the_even_plan():
    even_model = StepModel(speeds=(1.0,) * 4, replicated=0.1, shardable=3.6)
    even = (ShardPlan(units=(6, 6, 6, 6)), ShardPlan(units=(2, 2, 2, 2)))
    assert propose(even_model, even, WEIGHTS, slow=False, min_units=0, margin=0.03, comm=0.2) == even


def test_the_reading_is_the_least_seated_rank_s_time_in_collectives():
    """Rank 3 seated and last to arrive: the others' collectives hold their wait for its compute, its own
    the transfer alone; emptied, it waits for the sums and the seated ranks' least is read."""
    steps = [ReshardSample((1.0, 1.0, 1.0, 2.0), (0.5,) * 4, (0.9, 1.0, 0.95, 0.1 + 0.01 * i)) for i in range(3)]
    assert seat_reading(steps, NOW) == pytest.approx(0.11)
    out = (ShardPlan(units=(8, 8, 8, 0)), ShardPlan(units=(3, 3, 2, 0)))
    assert seat_reading(steps, out) == pytest.approx(0.9)
    assert seat_reading([], NOW) == 0.0


def test_seats_that_outweigh_the_compute_still_give_a_proposal():
    """Collectives measured far longer than the compute (tiny GEMMs, a loaded machine) can price the
    candidate that unseats the slow rank below zero seconds; the fewest-seats choice within the margin
    then still has that candidate (an empty choice was a crash inside the policy's bet)."""
    plans = (ShardPlan.even(32, 2), ShardPlan.even(4, 2))
    model = StepModel(speeds=(1.0, 0.2), replicated=0.2, shardable=1.6, idle_free=True)
    for comm in (1.0, 100.0):
        proposal = propose(model, plans, (0.8, 0.2), slow=True, min_units=0, margin=0.03, unseat=frozenset({1}),
                           comm=comm)
        assert [p.units[1] for p in proposal] == [0, 0], comm
