"""``benchmarks/sequence_split.py``'s scoring: the sequence region split evenly runs at the slow rank's pace,
split by speed at the group's, and the GEMMs' region is the planner's plan either way."""
import pytest

from semimig.sharding.solver import StepModel, predicted_step, solve_plan


@pytest.fixture(scope="module")
def bench():
    from scripts import load_script

    return load_script("benchmarks/sequence_split.py", "sequence_split_bench")


@pytest.mark.parametrize("tp, chi, share", [(2, 4.0, 0.05), (4, 8.0, 0.01), (8, 2.0, 0.10)])
def test_the_even_split_waits_for_the_slow_rank_and_the_split_by_speed_for_the_group(bench, tp, chi, share):
    row = bench.score(tp, chi, share)
    speeds = (1.0,) * (tp - 1) + (1.0 / chi,)
    gemms = StepModel(speeds=speeds, replicated=0.0, shardable=tp * (1.0 - share))
    gemm_s = predicted_step(gemms, solve_plan(gemms, total_units=bench.UNITS))
    assert row["gemm_region"] == pytest.approx(gemm_s)
    assert row["even_split_step"] == pytest.approx(gemm_s + share * chi)
    assert row["split_by_speed_step"] == pytest.approx(gemm_s + share * tp / (tp - 1 + 1.0 / chi))
    assert row["gain"] > 0.0


def test_with_no_slow_rank_the_split_does_not_matter(bench):
    row = bench.score(4, 1.0, 0.05)
    assert row["gain"] == pytest.approx(0.0)
    assert row["even_split_step"] == pytest.approx(1.0)
    assert row["plan"] == [8, 8, 8, 8]


def test_a_bad_repeat_count_is_refused_by_name(bench, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--repeats", "0"])
    assert exit_.value.code == 2
    assert "--repeats must be at least 1, got 0" in capsys.readouterr().err
