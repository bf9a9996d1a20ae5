"""The data-parallel exchanges run over the DP group, asynchronously, read a step later.

:class:`~semimig.comm.lagged.LaggedRows` on a real gloo group: every rank reads, at step ``k``,
exactly the rows every rank posted at ``k - 1``.  A tp 2 x dp 2 :class:`HybridBalancer`: each
step's collectives run on its TP group or its DP group, never on the whole world, and every rank
reads the same group times, those of the step before (each group's slowest member's).
"""
import contextlib

import torch.distributed as dist

from dist_harness import run_pooled

COLLECTIVES = ("all_gather", "all_reduce", "broadcast", "barrier", "all_gather_object", "reduce_scatter")


@contextlib.contextmanager
def _groups_used():
    """The ``group`` argument of every torch.distributed collective called inside (None: the world)."""
    groups, originals = [], {name: getattr(dist, name) for name in COLLECTIVES}

    def recorder(real):
        def call(*args, **kwargs):
            groups.append(kwargs.get("group"))
            return real(*args, **kwargs)
        return call

    for name, real in originals.items():
        setattr(dist, name, recorder(real))
    try:
        yield groups
    finally:
        for name, real in originals.items():
            setattr(dist, name, real)


def _lagged_body(rank, world):
    from semimig.comm.lagged import LaggedRows

    lagged, seen = LaggedRows(dist.group.WORLD), []
    for step in range(4):
        seen.append(lagged.exchange([rank, step, 0.5 * rank * step], tag=("mine", step)))
    final = lagged.collect()
    assert lagged.collect() is None  # nothing stays in flight
    assert seen[0] is None
    for step in range(1, 4):
        rows, tag = seen[step]
        assert tag == ("mine", step - 1)
        assert rows == [[r, step - 1, 0.5 * r * (step - 1)] for r in range(world)]
    assert final[0] == [[r, 3, 1.5 * r] for r in range(world)]


def test_every_rank_reads_the_rows_posted_a_step_before():
    run_pooled(_lagged_body, 2, timeout_s=60)


def _hybrid_body(rank, world):
    from colossalai.booster.plugin import HybridParallelPlugin

    from semimig.allocation.speed import SpeedCurve
    from semimig.hybrid import HybridBalancer
    from semimig.hybrid.replan import ReplanConfig

    plugin = HybridParallelPlugin(tp_size=2, pp_size=1, zero_stage=0, precision="fp32")
    curves = [SpeedCurve.constant(peak_speed=1.0, max_batch_size=12, name=f"group{g}") for g in range(2)]
    box = {"step": 0}
    balancer = HybridBalancer(plugin, curves=curves, global_batch_size=12, replan=ReplanConfig(),
                              busy_source=lambda: 0.01 * (rank + 1) * (box["step"] + 1))
    reports = []
    with _groups_used() as groups:
        for step in range(4):
            box["step"] = step
            reports.append(balancer.step())
    allowed = {id(plugin.tp_group), id(plugin.dp_group)}
    assert groups and all(g is not None and id(g) in allowed for g in groups), groups
    group_of_rank = balancer.layout.group_of_rank
    out = [r.group_busy_s for r in reports]
    assert out[0] == ()  # nothing measured a step before
    for step in range(1, 4):  # each group's slowest member at the step before
        expected = tuple(max(0.01 * (r + 1) * step for r in range(world) if group_of_rank[r] == g) for g in range(2))
        assert out[step] == expected, (step, out[step], expected)
    every = [None] * world
    dist.all_gather_object(every, out)
    return every


def test_the_hybrid_step_exchanges_over_tp_and_dp_groups_lagged_a_step():
    every = run_pooled(_hybrid_body, 4, timeout_s=120)
    assert all(out == every[0] for out in every), every  # every rank decides on the same rows
