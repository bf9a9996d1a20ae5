"""The 2-D training body on 2x2 ranks: every mode trains, Poplar follows the groups' speeds and re-plans.

Tiny runs (a few iterations of the bench ViT, emulated devices).  What is checked follows from the
speed pattern, not from recorded numbers: with group 0's rank 1 at χ = 4 and group 1 at χ = 2, a
group runs at its slowest member's speed, so Poplar gives group 1 about twice group 0's samples
(4 : 2 per sample); with SEMI, group 0's straggler sheds work (its shed share is > 0, nobody else
sheds) and group 0 becomes the faster group.  When the stragglers leave, the trigger re-plans and
the split moves back towards even.

The run config is the bench's one (:class:`~semimig.bench.config.BenchConfig` with ``allocation`` set):
its 2-D checks and derived values, and that one config serves both modes, are checked at the end.
"""
from __future__ import annotations

import pytest

from dist_harness import run_pooled  # the test run's pool of ranks: many cases per spawn
from semimig.bench.config import BenchConfig
from semimig.bench.models import VitSize
from semimig.errors import ConfigError
from semimig.bench.train2d import run_2d_cases
from semimig.hybrid import ReplanConfig

TINY = dict(size=VitSize(hidden=16, layers=1, heads=2, intermediate=32), batch=16, device_ms=40.0,
            profile_repeats=1)


@pytest.mark.slow
def test_every_mode_trains_and_poplar_follows_group_speeds() -> None:
    # 12 iterations: the controller flags a straggler only on evidence (4 decisions once it has 4
    # observations) and applies a plan once every rank agrees on it, so it sheds from about the 9th
    # iteration on; poplar+semi profiles after 14 settling passes, so its curves see SEMI's effect
    cfg = BenchConfig(allocation="poplar", epochs=1, iters_per_epoch=12, warmup_iters=1, settle_iters=14, **TINY)
    records = {r["mode"]: r for r in run_pooled(run_2d_cases, 4, cfg, cfg.all_cases(), timeout_s=600)}
    assert set(records) == {"baseline", "poplar", "semi", "poplar+semi"}
    for mode, r in records.items():
        assert 0.0 <= r["accuracy"] <= 1.0 and r["iter_time_s"] > 0 and r["epoch_time_s"] > 0, mode
        assert sum(r["group_samples"]) == cfg.global_batch_size, mode
    assert records["baseline"]["group_samples"] == [16, 16] == records["semi"]["group_samples"]
    g0, g1 = records["poplar"]["group_samples_first"]
    assert 1.6 <= g1 / g0 <= 2.5, (g0, g1)  # about 2: group 1 runs at χ = 2, group 0 at χ = 4
    shed = records["semi"]["shed_share_by_rank"]
    assert shed[1] > 0 and shed[0] == shed[2] == shed[3] == 0.0, shed  # only the χ = 4 rank sheds
    g0, g1 = records["poplar+semi"]["group_samples_first"]
    assert g0 > g1, (g0, g1)  # after SEMI, group 0 is the faster group
    # the global-batch mean loss of every iteration: Poplar's uneven split (8:24 or so, not 16:16)
    # trains the same model as the even one, to fp32 reassociation (each micro-step's loss is
    # scaled by m·D/G, so the gradient stays the global-batch mean); SEMI's pruning moves it
    import torch

    base, poplar, semi = (torch.tensor(records[m]["losses"]) for m in ("baseline", "poplar", "semi"))
    assert len(base) == 12 and bool(torch.isfinite(base).all()) and base[-1] < base[0], base
    torch.testing.assert_close(poplar, base, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(semi, base, rtol=1e-5, atol=1e-6), (semi, base)


@pytest.mark.slow
def test_stragglers_leaving_trigger_a_replan_towards_even() -> None:
    cfg = BenchConfig(allocation="poplar", modes=("poplar",), epochs=1, iters_per_epoch=14, warmup_iters=1,
                      straggler_until=4, replan=ReplanConfig(threshold=0.15, window=3, patience=2), **TINY)
    (record,) = run_pooled(run_2d_cases, 4, cfg, cfg.all_cases(), timeout_s=300)
    assert record["replans"], record
    first = record["replans"][0]
    # group 0 lost its χ = 4 rank (now 4x faster than its curve), group 1 its χ = 2 ranks (2x)
    assert first["scales"][0] == pytest.approx(0.25, rel=0.1) and first["scales"][1] == pytest.approx(0.5, rel=0.1)
    before, after = record["group_samples_first"], record["group_samples"]
    assert before[1] > before[0] and abs(after[0] - after[1]) <= 2, (before, after)


def test_config_refuses_bad_values_by_name() -> None:
    """The 2-D checks (Hybrid2DConfig's before the one run config), now BenchConfig's with allocation set."""
    grid = {"allocation": "poplar"}
    with pytest.raises(ConfigError, match="zero_stage=1 needs precision 'bf16'"):
        BenchConfig(**grid, zero_stage=1)
    with pytest.raises(ConfigError, match=r"group_chis needs dp=2 rows of tp=2 slowdowns"):
        BenchConfig(**grid, group_chis=((1.0, 2.0),))
    with pytest.raises(ConfigError, match="group_chis must be a finite number >= 1 and <= 100, got 0.5"):
        BenchConfig(**grid, group_chis=((1.0, 0.5), (1.0, 1.0)))
    with pytest.raises(ConfigError, match=r"modes\[0\] must be one of"):
        BenchConfig(**grid, modes=("fast",))
    with pytest.raises(ConfigError, match="straggler_until needs one slowdown per group"):
        BenchConfig(**grid, group_chis=((2.0, 4.0), (1.0, 1.0)), straggler_until=3)
    assert BenchConfig(**grid).grid_chis() == ((1.0, 4.0), (2.0, 2.0))
    assert BenchConfig(**grid, tp=4, dp=3, size=VitSize(hidden=64, heads=4, intermediate=128)).grid_chis() == (
        (1.0, 4.0, 1.0, 1.0), (2.0, 2.0, 2.0, 2.0), (1.0, 1.0, 1.0, 1.0))


@pytest.mark.parametrize("kwargs,message", [
    ({"allocation": "uneven"}, "allocation must be one of (None, 'even', 'poplar'), got 'uneven'"),
    ({"allocation": "even", "modes": ("baseline", "poplar")}, "modes[1] must be one of ('baseline', 'semi')"),
    ({"allocation": "poplar", "modes": ("zero-pri",)}, "modes[0] must be one of"),
    ({"allocation": "poplar", "chis": (1.0, 4.0)}, "chis=(1.0, 4.0) is read by the TP benchmark only"),
    ({"allocation": "poplar", "pattern": "multi"}, "pattern='multi' is read by the TP benchmark only"),
    ({"allocation": "poplar", "theta_iter": 1e-3}, "theta_iter=0.001 is read by the TP benchmark only"),
    ({"allocation": "poplar", "device": "cuda", "compute": "measured"}, "trains on CPU ranks only"),
    ({"allocation": "poplar", "batch": 1}, "batch must be an int >= 2 and <= 1000, got 1"),
    ({"allocation": "poplar", "compute": "emulated", "device_ms": 5000.0, "timeout_s": 10.0},
     "timeout_s=10 is shorter than the slowest rank's emulated GEMM time per iteration (20 s)"),
    ({"allocation": "poplar", "profile_batches": (8, 500)}, "profile_batches must be an int >= 1 and <= 128, got 500"),
    ({"allocation": "poplar", "straggler_until": 0}, "straggler_until must be an int >= 1 or None, got 0"),
    ({"group_chis": ((1.0, 4.0),)}, "group_chis=((1.0, 4.0),) is read by the 2-D mode only"),
    ({"zero_stage": 1, "precision": "bf16"}, "zero_stage=1 is read by the 2-D mode only"),
    ({"replan": ReplanConfig(window=2)}, "is read by the 2-D mode only"),
    ({"settle_iters": 0}, "settle_iters=0 is read by the 2-D mode only"),
])
def test_each_mode_refuses_what_only_the_other_reads(kwargs, message) -> None:
    """A setting the run would ignore is refused by name, never dropped in silence (TP fields in the 2-D
    mode, 2-D fields in the TP benchmark), and the 2-D mode's own bounds hold."""
    with pytest.raises(ConfigError) as err:
        BenchConfig(**kwargs)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_one_bench_config_serves_both_modes() -> None:
    """One BenchConfig: with allocation None the TP benchmark's defaults and cases as before the merge;
    with allocation set, what Hybrid2DConfig gave (its values recorded from it before it was removed)."""
    from semimig.bench.config import EMULATED_SIZE, GRID_SETTINGS, MEASURED_SIZE, MODES_2D, TP_SETTINGS
    from semimig.controller.runtime import MODES

    tp = BenchConfig()
    assert (tp.allocation, tp.modes, tp.seeds, tp.dp, tp.epochs, tp.iters_per_epoch) == (
        None, MODES, (0, 1, 2), 1, 4, 25)
    assert tp.all_cases()[:2] == [("baseline", 1.0, 0, None), ("zero-rd", 1.0, 0, None)] and len(tp.all_cases()) == 63
    assert tuple(tp.settings()) == TP_SETTINGS and "allocation" not in tp.settings()

    grid = BenchConfig(allocation="poplar")
    assert (grid.modes, grid.seeds, grid.dp, grid.epochs, grid.iters_per_epoch) == (MODES_2D, (0,), 2, 2, 10)
    assert grid.size == EMULATED_SIZE and grid.compute == "emulated" and grid.device_ms == 60.0
    assert grid.grid_chis() == ((1.0, 4.0), (2.0, 2.0)) and grid.profile_sizes() == (32, 64)
    assert grid.global_batch_size == 128 and grid.tokens == 1088 and grid.world == 4
    assert grid.all_cases() == [(m, None, 0, None) for m in ("baseline", "poplar", "semi", "poplar+semi")]
    assert grid.timeout_s == 120.0 and grid.longest_wait_s() == pytest.approx(0.24)  # chi 4 x 60 ms
    assert tuple(grid.settings()) == GRID_SETTINGS and "chis" not in grid.settings()
    assert grid.settings()["compute"] == "emulated" and "timing" not in grid.settings()

    wide = BenchConfig(allocation="poplar", tp=4, dp=3, batch=40, size=VitSize(hidden=64, heads=4, intermediate=128))
    assert wide.grid_chis() == ((1.0, 4.0, 1.0, 1.0), (2.0, 2.0, 2.0, 2.0), (1.0, 1.0, 1.0, 1.0))
    assert (wide.profile_sizes(), wide.global_batch_size, wide.tokens, wide.world) == ((20, 40), 120, 680, 12)

    even = BenchConfig(allocation="even", tp=1, dp=4, batch=7, seeds=(3, 1), modes=("semi", "baseline"),
                       profile_batches=(5, 20))
    assert even.grid_chis() == ((1.0,), (2.0,), (1.0,), (1.0,)) and even.profile_sizes() == (5, 20)
    assert even.global_batch_size == 28 and even.tokens == 119
    assert [(m, s) for m, _, s, _ in even.all_cases()] == [("semi", 3), ("baseline", 3), ("semi", 1), ("baseline", 1)]
    assert BenchConfig(allocation="even").modes == ("baseline", "semi")
    assert BenchConfig(allocation="poplar", compute="measured").size == MEASURED_SIZE  # by compute, as the TP mode
