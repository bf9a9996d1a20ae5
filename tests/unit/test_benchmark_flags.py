"""The benchmark scripts' command lines: bad values and clashing outputs refused before any run
(otherwise each case would fail, or lose a file, after the work)."""
import pytest


def _script(name: str):
    from scripts import load_script

    return load_script(f"benchmarks/{name}.py", f"{name}_under_test")


@pytest.mark.parametrize("flags, said", [
    (["--steps", "0"], "--steps must be >= 1, got 0"), (["--repeats", "0"], "--repeats must be >= 1, got 0"),
    (["--chi", "0"], "--chi must be in [1, 100], got 0"),
    (["--plot", "{tmp}/r.txt"], "a figure is written as"),
    (["--plot", "{tmp}/r.json"], "are one path"),
])
def test_time_to_loss_refuses_a_zero_or_a_clashing_plot_instead_of_replacing_it(flags, said, tmp_path, capsys):
    """Found by review: 0 was silently replaced by the default (``x or default``), and a plot path equal to
    ``--json`` or in a format matplotlib cannot write failed or destroyed the JSON after the whole run."""
    argv = ["--straggler", "device", "--json", str(tmp_path / "r.json"), *[f.format(tmp=tmp_path) for f in flags]]
    with pytest.raises(SystemExit) as exit_info:
        _script("time_to_loss").parse_args(argv)
    assert exit_info.value.code == 2 and said in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    args = _script("time_to_loss").parse_args(["--straggler", "device", "--json", str(tmp_path / "r.json"),
                                                "--plot", str(tmp_path / "r.png")])
    assert (args.steps, args.repeats, args.chi) == (60, 3, 4.0)


def test_device_vs_throttle_builds_its_run_commands_and_refuses_a_zero_fraction(tmp_path, capsys):
    """Found by review: every invocation crashed in ``time_to_loss.command`` (no ``args.reflex``), and
    ``--fraction 0`` divided by zero before its bounds were checked."""
    dvt, ttl = _script("device_vs_throttle"), _script("time_to_loss")
    args = dvt.parse_args(["--json", str(tmp_path / "d.json")])
    assert args.chi == 4.0
    for straggler, mode in (("real", "healthy"), ("real", "off"), ("device", "off")):
        args.straggler = straggler
        cmd = ttl.command(args, mode, tmp_path / "x.json")
        assert "--balance" in cmd and cmd[cmd.index("--balance") + 1] == "off" and "--reflex" not in cmd, cmd
    assert "fixed:1:4:scope=device" in cmd
    with pytest.raises(SystemExit) as exit_info:
        dvt.parse_args(["--json", str(tmp_path / "d.json"), "--fraction", "0"])
    assert exit_info.value.code == 2 and "--fraction must be in (0, 1], got 0.0" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["time_to_loss", "device_vs_throttle"])
@pytest.mark.parametrize("bad", ["nan", "inf", "0", "-1"])
def test_a_run_timeout_that_is_not_a_positive_finite_number_is_refused_naming_it(script, bad, tmp_path, capsys):
    """``--timeout-s`` bounds every run's wait: NaN, infinity, zero or a negative value is refused at parse
    time, before the healthy run starts (each run would otherwise be killed at once or never)."""
    argv = ["--json", str(tmp_path / "r.json"), "--timeout-s", bad]
    if script == "time_to_loss":
        argv = ["--straggler", "device", *argv]
    with pytest.raises(SystemExit) as exit_info:
        _script(script).parse_args(argv)
    assert exit_info.value.code == 2
    assert f"--timeout-s must be a finite number > 0, got {float(bad)}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags, said", [
    (["--blocks", "0"], "--blocks must be some of"), (["--gammas", "1.5"], "--gammas must be shares in [0, 1)"),
    (["--own-share", "2"], "--own-share must be in (0, 1]"), (["--steps", "0"], "--steps must be >= 1"),
    (["--seeds", "-1"], "--seeds must be"),
])
def test_block_accuracy_refuses_bad_values_before_training(flags, said, capsys):
    """Found by review: these failed with a ZeroDivisionError or a bare ValueError after the dense baseline
    had trained (200 steps a seed)."""
    with pytest.raises(SystemExit) as exit_info:
        _script("block_accuracy").main(flags)
    assert exit_info.value.code == 2 and said in capsys.readouterr().err


def test_an_existing_result_file_is_kept_unless_overwrite_is_given(tmp_path, capsys):
    """``--json`` given the name of an existing result (maybe a long run's) must not replace it silently
    after the new runs: refused at parse time, the file untouched, in every script that takes ``--json``
    through ``bench_output.add_json_flag``; ``--overwrite`` (either order) allows it."""
    import argparse

    from bench_output import add_json_flag

    earlier = tmp_path / "r.json"
    earlier.write_text('{"earlier": true}')
    for argv in (["--straggler", "device", "--json", str(earlier)], ["--json", str(earlier), "--straggler", "real"]):
        with pytest.raises(SystemExit) as exit_info:
            _script("time_to_loss").parse_args(argv)
        assert exit_info.value.code == 2
        assert f"--json {earlier} exists: pass --overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _script("device_vs_throttle").parse_args(["--json", str(earlier)])
    assert earlier.read_text() == '{"earlier": true}'
    for argv in (["--overwrite", "--straggler", "device", "--json", str(earlier)],
                 ["--straggler", "device", "--json", str(earlier), "--overwrite"]):
        assert _script("time_to_loss").parse_args(argv).overwrite is True
    parser = argparse.ArgumentParser()
    add_json_flag(parser, required=False, help="x")
    assert parser.parse_args([]).json is None  # not given: nothing to keep
    assert parser.parse_args(["--json", str(tmp_path / "new.json")]).overwrite is False


def test_the_simulator_refuses_a_replay_folder_together_with_no_replay(tmp_path, capsys):
    """``--replay DIR --no-replay`` asks for both; it is refused naming the folder instead of skipping the
    replay silently. Either flag alone is accepted."""
    script = _script("policy_sim")
    argv = ["--json", str(tmp_path / "s.json"), "--replay", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_info:
        script.parse_args([*argv, "--no-replay"])
    assert exit_info.value.code == 2
    assert f"--replay {tmp_path} and --no-replay contradict each other" in capsys.readouterr().err
    assert script.parse_args(argv).replay == tmp_path
    assert script.parse_args(["--json", str(tmp_path / "s.json"), "--no-replay"]).no_replay is True


def test_plan_at_scale_counts_a_split_groups_kv_rows_on_each_holder_and_refuses_a_unit_of_part_of_a_head(capsys):
    """The even plan's attention is what it is in units (each rank spans one group); a rank of five heads over
    groups of four spans two and computes both groups' K/V rows: ``(1 − κ)·5 + κ·2·4``.  A unit finer than a
    query head is refused naming the shape."""
    scale = _script("plan_at_scale")
    assert scale.attention_held((4,) * 8, 8, 0.2).units == pytest.approx((4.0,) * 8)
    held = scale.attention_held((5, 5, 5, 5, 4, 4, 4, 0), 8, 0.2).units
    assert held == pytest.approx((5.6, 5.6, 5.6, 5.6, 4.0, 4.0, 4.0, 0.0))
    assert scale.attention_held((2, 2, 2, 2), 4, 0.5).units == pytest.approx((2.0,) * 4)  # groups of two, aligned
    with pytest.raises(SystemExit) as exit_info:
        scale.main(["--kv-units", "32"])
    assert exit_info.value.code == 2 and "example has 16" in capsys.readouterr().err
