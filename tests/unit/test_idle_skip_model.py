"""A rank holding no unit skips the step (DESIGN §8): the pure parts, single process.

- the step model with ``idle_free``: a rank with share 0 bounds no step, so at tp 4 with one rank 8x slower
  and a third of the step replicated, emptying it (``R + S/3``) beats any plan that keeps it holding
  (``R/v`` alone is ``8/3`` of a step), while without ``idle_free`` the same plan is priced at ``8R``;
- the vocabulary split over the holders is Colossal-AI's even split of ``V`` rows over ``H`` ranks
  (``⌈V/H⌉`` each, the last the rest), none for an idle rank, in rank order;
- an idle rank's row: its replicated work at the holders' pace scaled by its probe against theirs;
- the simulator's step model and oracle price an idle rank the same way, and the oracle empties a rank
  slow enough.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from semimig.controller.sim.oracle import best_plans, fixed_time
from semimig.controller.sim.scenarios import make_scenario
from semimig.controller.sim.stepmodel import Workload
from semimig.resharder.idle import IdleReader
from semimig.sharding import ShardPlan, StepModel
from semimig.shardformer.skip import vocab_sizes


def test_a_rank_holding_nothing_bounds_no_step_when_it_skips():
    rho = 1.0 / 3.0
    speeds = (1.0, 1.0, 1.0, 0.125)
    plain = StepModel.normalised(speeds, replicated_share=rho)
    skipping = StepModel.normalised(speeds, replicated_share=rho)
    skipping = type(skipping)(speeds=speeds, replicated=skipping.replicated, shardable=skipping.shardable,
                              idle_free=True)
    emptied = (1 / 3, 1 / 3, 1 / 3, 0.0)
    S = plain.shardable
    assert skipping.step(emptied) == pytest.approx(rho + S / 3)
    assert plain.step(emptied) == pytest.approx(rho / 0.125)  # the idle rank's replicated work bounds it
    assert skipping.step((0.25,) * 4) == plain.step((0.25,) * 4)  # every rank holds: nothing changes
    assert skipping.step(emptied) < min(skipping.step((p, p, p, 1 - 3 * p)) for p in np.linspace(0.26, 0.33, 8))


@pytest.mark.parametrize("rows, holders, tp, want", [
    (256, (0, 1, 2), 4, (86, 86, 84, 0)),
    (128, (0, 2, 3), 4, (43, 0, 43, 42)),
    (128, (1,), 2, (0, 128)),
    (64, (0, 1, 2, 3), 4, (16, 16, 16, 16)),
])
def test_the_vocabulary_splits_over_the_holders_as_colossal_ai_splits_it(rows, holders, tp, want):
    sizes = vocab_sizes(rows, holders, tp)
    assert sizes == want and sum(sizes) == rows
    delta = math.ceil(rows / len(holders))  # Colossal-AI's cross-entropy: holder i owns [i·delta, (i+1)·delta)
    starts = [sum(sizes[:r]) for r in holders]
    assert starts == [i * delta for i in range(len(holders))]


def test_an_idle_ranks_row_is_its_replicated_work_at_its_probed_speed():
    reader = IdleReader(size=8, n=10, base=(0.02, 0.02, 0.04, 0.02), device="cpu", dtype=None)
    # [compute, busy, comm, sleep, wall, work, gap, probe]; holders' non-shardable: 0.3, 0.3 and 0.5 s
    rows = [[1.0, 0.6, 0.1, 0.0, 1.1, 1.0, 0.1, math.nan],
            [0.9, 0.5, 0.2, 0.0, 1.1, 1.0, 0.1, math.nan],
            [1.0, 0.4, 0.1, 0.0, 1.1, 1.0, 0.1, math.nan],
            [0.01, 0.0, 1.09, 0.0, 1.1, 1.0, 0.0, 0.16]]
    out = reader.rows(rows, idle=(3,))
    assert [len(row) for row in out] == [7] * 4 and out[:3] == [row[:7] for row in rows[:3]]
    assert out[3][0] == pytest.approx(0.3 * 0.16 / 0.02)  # median holder 0.3 s, 8x the holders' probe
    assert out[3][1] == out[3][6] == 0.0
    rows[3][7] = math.nan  # a step without a probe keeps the last reading
    assert reader.rows(rows, idle=(3,))[3][0] == pytest.approx(2.4)


def test_an_idle_ranks_probe_fits_a_quarter_of_the_last_step():
    reader = IdleReader(size=8, n=50, base=(0.02, 0.08), device="cpu", dtype=None)
    assert reader.count() == 1  # nothing timed yet: the whole work could outlast the step
    reader.probe()
    assert reader.count() == 1 and not math.isnan(reader.seconds)  # a probe but no step's wall
    per = reader.seconds / reader.n  # seconds a product, scaled to the whole work
    reader.take(wall=9 * per)
    assert reader.count() == 2  # a quarter of 9 products' time, whole products
    reader.take(wall=1e6)
    assert reader.count() == reader.n  # never more than the whole work


def test_an_idle_rank_probes_once_a_row_however_many_forwards_it_skips(monkeypatch):
    """A rank that skips every forward of a step's micro-steps and of an evaluation runs the probe once
    until its row is taken: the work it times (the real ProbeWork, made for each probe) is made once a row."""
    from semimig.resharder import observe

    made = []
    real = observe.ProbeWork.__init__
    monkeypatch.setattr(observe.ProbeWork, "__init__", lambda self, *a, **k: made.append(1) or real(self, *a, **k))
    reader = IdleReader(size=8, n=50, base=(0.02, 0.08), device="cpu", dtype=None)
    for _ in range(8):  # eight forwards skipped between two rows
        reader.probe()
    assert len(made) == 1 and not math.isnan(reader.take(wall=1.0))
    reader.probe()
    reader.probe()
    assert len(made) == 2 and not math.isnan(reader.take(wall=1.0))
    assert math.isnan(reader.take(wall=1.0))  # no probe since: the row has none (rows() keeps the last one)


def test_the_simulator_prices_an_idle_rank_as_the_product_runs_it():
    base = dict(tp=4, replicated_share=1 / 3, mlp_units=16, kv_units=8, comm_share=0.0)
    speeds = (1.0, 1.0, 1.0, 0.125)
    emptied = (ShardPlan(units=(6, 5, 5, 0)), ShardPlan(units=(3, 3, 2, 0)))
    plain, skipping = Workload(**base), Workload(**base, idle_skips=True)
    assert skipping.step_seconds(emptied, speeds) < plain.step_seconds(emptied, speeds)
    assert plain.step_seconds(emptied, speeds) == pytest.approx((1 / 3) / 0.125)
    best = best_plans(skipping, speeds)
    assert best[0].units[3] == 0 and best[1].units[3] == 0
    assert skipping.step_seconds(best, speeds) < plain.step_seconds(best_plans(plain, speeds), speeds)


def test_a_scenario_with_idle_skips_is_the_same_trace():
    a, b = make_scenario(5, "persistent"), make_scenario(5, "persistent", idle_skips=True)
    assert np.array_equal(a.speeds, b.speeds) and not a.workload.idle_skips and b.workload.idle_skips
    even = a.workload.even_plans()
    assert fixed_time(a, even) == fixed_time(b, even)  # every rank holds: skipping changes nothing


def test_within_the_margin_the_policy_empties_the_slow_rank_when_it_may_skip():
    """At tp 4 with the prior replicated share 0.2 and one rank at 0.3 of the others' speed, keeping it two
    MLP blocks and a KV group predicts a step about 1.5 % under emptying it: inside the 3 % margin, so the
    plan that seats the slow rank nowhere is taken, and only where an emptied rank skips."""
    import dataclasses

    from semimig.controller.policy.propose import propose

    plans = (ShardPlan(units=(12, 12, 12, 12)), ShardPlan(units=(4, 4, 4, 4)))
    plain = StepModel.normalised((1.0, 1.0, 1.0, 0.3), replicated_share=0.2)
    skipping = dataclasses.replace(plain, idle_free=True)
    kept = propose(plain, plans, (0.7, 0.3), slow=True, min_units=0, margin=0.03, unseat={3})
    emptied = propose(skipping, plans, (0.7, 0.3), slow=True, min_units=0, margin=0.03, unseat={3})
    assert any(p.units[3] for p in kept)
    assert not any(p.units[3] for p in emptied)
    tight = propose(skipping, plans, (0.7, 0.3), slow=True, min_units=0, margin=0.0, unseat={3})
    assert any(p.units[3] for p in tight)  # no margin: the lower predicted step
