"""``benchmarks/time_to_loss.py``'s layouts: tp x dp ranks, each held to a share of a core, one of them
the straggler at an absolute fraction; the command lines it builds, its refusals and the job's limit."""
import sys

import pytest

from semimig.bench.time_to_loss import exact_limit
from semimig.errors import ConfigError


@pytest.fixture(scope="module")
def ttl():
    from scripts import load_script

    return load_script("benchmarks/time_to_loss.py", "time_to_loss_layout")


def _parse(ttl, tmp_path, *flags):
    return ttl.parse_args(["--straggler", "real", "--json", str(tmp_path / "r.json"), "--heads", "16",
                           "--kv-heads", "8", "--modes", "healthy,off,reshard,semi", *flags])


def _value(cmd, flag, start=0):
    return cmd[cmd.index(flag, start) + 1]


@pytest.mark.parametrize("layout, tp", [(["--tp", "4"], "4"), (["--tp", "2", "--dp", "2"], "2")])
def test_four_ranks_on_half_a_core_each_with_the_straggler_at_an_eighth(ttl, tmp_path, layout, tp):
    args = _parse(ttl, tmp_path, *layout, "--share", "0.5")
    assert (args.world, args.straggler_rank, args.share, args.fraction) == (4, 3, 0.5, 0.125)
    for mode, fraction in (("healthy", "0.5"), ("off", "0.125"), ("reshard", "0.125")):
        cmd = ttl.command(args, mode, tmp_path / f"{mode}.json")
        sep = cmd.index("--")
        throttle, launched = cmd[:sep], cmd[sep + 1:]
        assert throttle[1:4] == ["-m", "semimig.cli", "throttle"] and "--pin" in throttle
        assert (_value(throttle, "--rank"), _value(throttle, "--fraction"), _value(throttle, "--share")) == \
            ("3", fraction, "0.5")
        assert _value(launched, "--nproc_per_node") == "4" and _value(launched, "--tp") == tp
        assert _value(launched, "--balance") == {"healthy": "off"}.get(mode, mode)


def test_the_default_layout_is_tp_2_with_rank_1_at_a_quarter_of_its_own_core(ttl, tmp_path):
    args = _parse(ttl, tmp_path, "--share", "1")
    assert (args.tp, args.dp, args.world, args.straggler_rank, args.fraction) == (2, 1, 2, 1, 0.25)
    cmd = ttl.command(args, "reshard", tmp_path / "r.json")
    throttle = cmd[:cmd.index("--")]
    assert "--share" not in throttle and (_value(throttle, "--rank"), _value(throttle, "--fraction")) == ("1", "0.25")
    assert _value(cmd, "--nproc_per_node") == "2" and _value(cmd, "--tp") == "2"
    assert _value(ttl.command(args, "healthy", tmp_path / "h.json"), "--fraction") == "1"


def test_eight_ranks_at_a_quarter_core_with_the_straggler_at_a_sixteenth(ttl, tmp_path):
    args = _parse(ttl, tmp_path, "--tp", "8", "--share", "0.25", "--straggler-rank", "5")
    cmd = ttl.command(args, "reshard", tmp_path / "r.json")
    assert (_value(cmd, "--rank"), _value(cmd, "--fraction"), _value(cmd, "--share")) == ("5", "0.0625", "0.25")
    assert _value(cmd, "--nproc_per_node") == "8" and _value(cmd, "--tp") == "8"
    assert ttl.layout(args) == {"tp": 8, "dp": 1, "world": 8, "cores": args.cores, "straggler_rank": 5,
                                "share": 0.25, "fraction": 0.0625}
    assert ttl.straggler_chi(args, {}) == 4.0


def test_a_straggler_that_moves_throttles_the_listed_ranks_in_turn(ttl, tmp_path):
    """``--straggler-rank 0,1 --pattern 30:0``: the throttle gets both ranks (in turn) and the pattern; the
    layout records the list; the limit is the one-straggler limit in every phase (one rank at a time)."""
    args = _parse(ttl, tmp_path, "--straggler-rank", "0,1", "--pattern", "30:0")
    assert args.straggler_rank == [0, 1]
    cmd = ttl.command(args, "reshard", tmp_path / "r.json")
    throttle = cmd[:cmd.index("--")]
    assert (_value(throttle, "--rank"), _value(throttle, "--fraction"), _value(throttle, "--pattern")) == \
        ("0,1", "0.25", "30:0")
    assert ttl.layout(args)["straggler_rank"] == [0, 1]
    assert ttl.straggler_spec(args).startswith("ranks 0,1 in turn at 0.25 of a core")
    assert ttl.straggler_chi(args, {}) == 4.0


def test_a_straggler_that_moves_among_four_ranks_at_half_a_core(ttl, tmp_path):
    """tp 4 on two cores: the pattern's ranks return to the share between their phases (``semimig throttle``
    gets ``--share`` with the pattern); the limit is the one-straggler limit of four ranks."""
    args = _parse(ttl, tmp_path, "--tp", "4", "--share", "0.5", "--straggler-rank", "3,1", "--pattern", "30:0")
    cmd = ttl.command(args, "reshard", tmp_path / "r.json")
    throttle = cmd[:cmd.index("--")]
    assert (_value(throttle, "--rank"), _value(throttle, "--fraction"), _value(throttle, "--share"),
            _value(throttle, "--pattern")) == ("3,1", "0.125", "0.5", "30:0")
    assert ttl.straggler_chi(args, {}) == 4.0


def test_two_stragglers_of_different_speeds_each_take_their_own_fraction(ttl, tmp_path):
    """``--straggler-rank 2,3 --fraction 0.25,0.125`` at tp 4 on half a core each: the throttle gets both ranks with
    their fractions and no pattern; the layout and the spec record both; the job's limit counts both slowdowns
    (2x and 4x: 4 / (2 + 1/2 + 1/4))."""
    args = _parse(ttl, tmp_path, "--tp", "4", "--share", "0.5", "--straggler-rank", "2,3", "--fraction", "0.25,0.125")
    assert (args.straggler_rank, args.fraction) == ([2, 3], (0.25, 0.125))
    throttle = (cmd := ttl.command(args, "reshard", tmp_path / "r.json"))[:cmd.index("--")]
    assert (_value(throttle, "--rank"), _value(throttle, "--fraction"), _value(throttle, "--share")) == \
        ("2,3", "0.25,0.125", "0.5") and "--pattern" not in throttle
    assert _value(ttl.command(args, "healthy", tmp_path / "h.json"), "--fraction") == "0.5"
    assert ttl.layout(args)["fraction"] == [0.25, 0.125] and ttl.layout(args)["straggler_rank"] == [2, 3]
    assert ttl.straggler_spec(args) == "ranks 2,3 at 0.25, 0.125 of a core, every other rank at 0.5"
    assert ttl.straggler_chi(args, {}) == [2.0, 4.0]
    assert exact_limit(ttl.straggler_chi(args, {}), args.world) == pytest.approx(4 / 2.75)


def test_several_stragglers_at_one_fraction_are_each_held_to_it(ttl, tmp_path):
    args = _parse(ttl, tmp_path, "--tp", "4", "--share", "0.5", "--straggler-rank", "1,3", "--fraction", "0.25")
    throttle = (cmd := ttl.command(args, "off", tmp_path / "o.json"))[:cmd.index("--")]
    assert (_value(throttle, "--rank"), _value(throttle, "--fraction")) == ("1,3", "0.25,0.25") and "--pattern" not in throttle
    assert ttl.straggler_spec(args) == "ranks 1,3 at 0.25, 0.25 of a core, every other rank at 0.5"
    assert ttl.straggler_chi(args, {}) == [2.0, 2.0]
    assert exact_limit(ttl.straggler_chi(args, {}), args.world) == pytest.approx(4 / 3)
    default = _parse(ttl, tmp_path, "--tp", "4", "--share", "0.5", "--straggler-rank", "1,3")  # a quarter of the share each
    assert default.fraction == (0.125, 0.125) and ttl.straggler_chi(default, {}) == [4.0, 4.0]


def test_the_default_share_splits_the_cores_when_the_ranks_outnumber_them(ttl):
    assert [ttl.default_share(w, 2) for w in (2, 4, 8)] == [1.0, 0.5, 0.25]
    assert ttl.default_share(4, 4) == 1.0 and ttl.default_share(3, 2) == pytest.approx(2 / 3)


def test_the_jobs_limit_with_several_slow_ranks_is_its_total_speed():
    assert exact_limit([2.0, 4.0], 4) == pytest.approx(4 / (2 + 0.5 + 0.25))
    assert exact_limit([4.0, 4.0], 8) == pytest.approx(8 / 6.5)
    assert exact_limit([2.0, 4.0], 2) == pytest.approx(2 / 0.75)  # every rank slow: their total speed still
    assert exact_limit(4.0, 1) == pytest.approx(4.0)
    with pytest.raises(ConfigError, match="1..4 slow ranks of 4, got 5"):
        exact_limit([2.0] * 5, 4)
    with pytest.raises(ConfigError, match=r"chi\[1\]"):
        exact_limit([2.0, 0.5], 4)


@pytest.mark.parametrize("ranks, chi, limit", [(4, 4.0, 16 / 13), (8, 4.0, 32 / 29), (2, 4.0, 1.6), (4, 1.0, 1.0)])
def test_the_jobs_limit_with_one_of_n_ranks_chi_times_slower(ranks, chi, limit):
    assert exact_limit([chi], ranks) == pytest.approx(limit)
    # n / (n - 1 + 1/chi): the job's speed is the sum of its ranks' speeds
    assert exact_limit(chi, ranks) == pytest.approx(limit)
    assert exact_limit(chi, ranks) == pytest.approx(ranks / (ranks - 1 + 1 / chi))


@pytest.mark.parametrize("flags, said", [
    (["--tp", "0"], "--tp must be >= 1, got 0"),
    (["--dp", "0"], "--dp must be >= 1, got 0"),
    (["--tp", "4", "--dp", "4"], "--tp 4 --dp 4 launches 16 rank(s): a run needs 2..8"),
    (["--tp", "1"], "--tp 1 --dp 1 launches 1 rank(s)"),
    (["--tp", "4", "--straggler-rank", "4"], "--straggler-rank must be a rank of the 4 launched (0..3), got 4"),
    (["--straggler-rank", "-1"], "--straggler-rank must name ranks >= 0, got '-1'"),
    (["--straggler-rank", "1,1", "--pattern", "30:0"], "--straggler-rank '1,1' lists a rank twice"),
    (["--tp", "4", "--straggler-rank", "2,3", "--fraction", "0.25,0.125,0.1"],
     "--fraction 0.25,0.125,0.1 gives 3 fractions for --straggler-rank 2,3's 2 rank(s)"),
    (["--tp", "4", "--fraction", "0.25,0.125"], "gives several fractions for one straggler rank (3)"),
    (["--straggler-rank", "0,1", "--fraction", "0.25,0.125", "--pattern", "30:0"], "give one fraction"),
    (["--tp", "4", "--share", "0.5", "--straggler-rank", "2,3", "--fraction", "0.25,0.6"],
     "--fraction 0.6 is above --share 0.5"),
    (["--straggler-rank", "0,1", "--fraction", "0.25,0.125"], "--straggler-rank 0,1 slows all 2 ranks"),
    (["--tp", "4", "--share", "0.5", "--straggler-rank", "2,3", "--fraction", "0.6,1.5"], "--fraction 0.6 is above"),
    (["--fraction", "0.25,x"], "--fraction: a share of a core, or one per straggler rank (e.g. 0.25 or 0.25,0.125), got '0.25,x'"),
    (["--straggler-rank", "0,2", "--pattern", "30:0"], "--straggler-rank must be a rank of the 2 launched (0..1), got 2"),
    (["--share", "0"], "--share must be in (0, 1], got 0.0"),
    (["--share", "1.5"], "--share must be in (0, 1], got 1.5"),
    (["--tp", "4", "--share", "0.5", "--fraction", "0.6"], "--fraction 0.6 is above --share 0.5"),
    (["--tp", "4", "--share", "0.5", "--modes", "healthy,uneven"], "mode uneven: its run of llm_run.py would be refused"),
])
def test_layout_refusals_are_one_line_before_any_run(ttl, tmp_path, capsys, flags, said):
    with pytest.raises(SystemExit) as exit_info:
        _parse(ttl, tmp_path, *flags)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and said in err[0], err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags, said", [
    (["--tp", "4"], "--tp 4 --dp 1: --straggler device runs tp 2 x dp 1 only"),
    (["--dp", "2"], "--tp 2 --dp 2: --straggler device runs tp 2 x dp 1 only"),
    (["--share", "0.5"], "--share 0.5 applies to no run"),
    (["--straggler-rank", "1"], "--straggler-rank 1 applies to no run"),
])
def test_the_emulated_stragglers_keep_tp_2_and_refuse_the_real_throttles_flags(ttl, tmp_path, capsys, flags, said):
    with pytest.raises(SystemExit) as exit_info:
        ttl.parse_args(["--straggler", "device", "--json", str(tmp_path / "r.json"), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and said in err[0], err


def test_device_vs_throttle_still_builds_tp_2_commands(tmp_path):
    from scripts import load_script

    dvt = load_script("benchmarks/device_vs_throttle.py", "device_vs_throttle_layout")
    args = dvt.parse_args(["--json", str(tmp_path / "d.json")])
    cmd = load_script("benchmarks/time_to_loss.py", "time_to_loss_layout_dvt").command(args, "off", tmp_path / "x.json")
    assert cmd[:2] == [sys.executable, "-m"] and "--share" not in cmd
    assert (_value(cmd, "--rank"), _value(cmd, "--nproc_per_node"), _value(cmd, "--tp")) == ("1", "2", "2")


def test_batch_split_reaches_the_balancing_modes_of_replicas_only(ttl, tmp_path):
    args = _parse(ttl, tmp_path, "--tp", "2", "--dp", "2", "--batch-split", "poplar")
    for mode in ("healthy", "off", "reshard", "semi"):
        cmd = ttl.command(args, mode, tmp_path / f"{mode}.json")
        split = _value(cmd, "--batch-split") if "--batch-split" in cmd else None
        assert split == ("poplar" if mode in ("reshard", "semi") else None), (mode, cmd)


def test_max_micro_batch_reaches_the_split_runs_only(ttl, tmp_path):
    args = _parse(ttl, tmp_path, "--tp", "2", "--dp", "2", "--batch-split", "poplar", "--max-micro-batch", "8")
    for mode in ("healthy", "reshard"):
        cmd = ttl.command(args, mode, tmp_path / f"{mode}.json")
        cap = _value(cmd, "--max-micro-batch") if "--max-micro-batch" in cmd else None
        assert cap == ("8" if mode == "reshard" else None), (mode, cmd)


@pytest.mark.parametrize("argv", [["--dp", "2", "--max-micro-batch", "8"],            # no --batch-split
                                  ["--dp", "2", "--batch-split", "poplar", "--max-micro-batch", "0"]])
def test_max_micro_batch_without_a_split_or_below_one_is_refused(ttl, tmp_path, capsys, argv):
    with pytest.raises(SystemExit):
        _parse(ttl, tmp_path, "--tp", "2", *argv)
    assert "--max-micro-batch" in capsys.readouterr().err


def test_batch_split_without_replicas_is_refused(ttl, tmp_path, capsys):
    with pytest.raises(SystemExit):
        _parse(ttl, tmp_path, "--tp", "4", "--batch-split", "poplar")
    assert "--batch-split poplar applies to no run" in capsys.readouterr().err
