"""``semimig plan`` handler, driven through its own argparse subparser."""
from __future__ import annotations

import argparse
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semimig.allocation import DeviceProfile, ProbeResult, SpeedCurve, allocate
from semimig.allocation.cli import add_plan_subcommand
from semimig.allocation.spec import curves_from_spec, profiles_to_spec


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="semimig")
    add_plan_subcommand(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_plan_from_device_specs(tmp_path, capsys) -> None:
    spec = {
        "comm_time_s": 0.01,
        "devices": [
            {"name": "fast", "max_batch_size": 16, "peak_speed": 400.0},
            {"name": "slow", "max_batch_size": 8, "points": [[1, 0.02], [4, 0.05], [8, 0.09]]},
        ],
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    out = tmp_path / "plan.json"
    assert _run(["plan", str(path), "--global-batch-size", "40", "--zero-stage", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "fast" in printed and "slow" in printed and "ideal" in printed
    written = json.loads(out.read_text())
    expected = allocate(
        [SpeedCurve.constant(peak_speed=400.0, max_batch_size=16, name="fast"),
         SpeedCurve.from_points([(1, 0.02), (4, 0.05), (8, 0.09)], max_batch_size=8, name="slow")],
        40, zero_stage=1, comm_time_s=0.01,
    )
    assert [d["samples"] for d in written["devices"]] == list(expected.samples)
    assert written["predicted_iteration_time_s"] == pytest.approx(expected.predicted_iteration_time_s)
    assert written["ideal_iteration_time_s"] <= written["integer_iteration_time_s"] <= written["predicted_iteration_time_s"]
    assert written["predicted_iteration_time_s"] <= written["even_iteration_time_s"]


def test_plan_from_measured_profile(tmp_path, capsys) -> None:
    probes = tuple(ProbeResult(batch_size=b, time_s=0.01 + 0.002 * b, collective_s=0.001, peak_bytes=100 * b, before_bytes=10) for b in (1, 2, 4))
    profiles = [DeviceProfile(name=f"rank{r}", max_batch_size=4, probes=probes) for r in range(2)]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profiles_to_spec(profiles, comm_time_s=0.02)))
    curves, comm = curves_from_spec(json.loads(path.read_text()))
    assert comm == 0.02
    assert curves[0].time(2) == pytest.approx(0.01 + 0.004 - 0.001)  # collective time subtracted
    assert _run(["plan", str(path), "--global-batch-size", "10", "--zero-stage", "2"]) == 0
    assert "ZeRO-2" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("spec", "argv", "message"),
    [
        ({"devices": [{"name": "a", "max_batch_size": 2, "peak_speed": 1.0}]}, ["--global-batch-size", "9", "--max-accumulation-steps", "4"], "global_batch_size=9 exceeds"),
        ({"devices": [{"name": "dead", "max_batch_size": 2, "peak_speed": 0.0}]}, ["--global-batch-size", "2"], "devices[0].peak_speed (samples/s) must be a finite number >= 1e-09 and <= 1e+09, got 0.0"),
        ({"devices": []}, ["--global-batch-size", "2"], "empty cluster"),
        ({"devices": [{"name": "a", "peak_speed": 1.0}]}, ["--global-batch-size", "2"], "has no 'max_batch_size'"),
        ({"devices": [{"name": "a", "max_batch_size": 2}]}, ["--global-batch-size", "2"], "exactly one of 'points' and 'peak_speed'"),
        ({"devices": [{"name": "a", "max_batch_size": 2, "peak_speed": 1.0}]}, ["--global-batch-size", "-1"], "--global-batch-size must be an int >= 1 and <= 2147483647, got -1"),
    ],
)
def test_bad_specs_exit_2_with_message(tmp_path, capsys, spec, argv, message) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert _run(["plan", str(path), *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("spec", "argv", "message"),
    [
        # 10**11 would ask numpy for 745 GiB: refused by the curve's documented bound
        ([{"name": "a", "max_batch_size": 10**11, "peak_speed": 1.0}], [], "devices[0].max_batch_size must be an int >= 1 and <= 1048576, got 100000000000"),
        ([{"name": "a", "max_batch_size": 4, "peak_speed": 5e-324}], [], "devices[0].peak_speed (samples/s) must be a finite number >= 1e-09"),
        ([{"name": "a", "max_batch_size": 4, "peak_speed": "fast"}], [], "devices[0].peak_speed (samples/s) must be a finite number >= 1e-09 and <= 1e+09, got 'fast'"),
        ([{"name": "a", "max_batch_size": True, "peak_speed": 1.0}], [], "devices[0].max_batch_size must be an int >= 1 and <= 1048576, got True"),
        ([{"name": "a", "max_batch_size": 4, "peak_speed": 1.0, "speed": 2}], [], "devices[0] has unknown key(s) ['speed']"),
        ({"devices": [{"max_batch_size": 4, "peak_speed": 1.0}], "comm_time": 0.1}, [], "spec has unknown key(s) ['comm_time']"),
        ({"devices": [{"max_batch_size": 4, "peak_speed": 1.0}], "comm_time_s": -1}, [], "comm_time_s must be a finite number >= 0, got -1"),
        ({"devices": "all"}, [], "devices must be a list, got 'all'"),
        ("a100", [], "spec must be a list of devices or an object with 'devices', got 'a100'"),
        ([3], [], "devices[0] must be an object, got 3"),
        ([{"name": 7, "max_batch_size": 4, "peak_speed": 1.0}], [], "devices[0].name must be a non-empty string, got 7"),
        ([{"max_batch_size": 4, "points": []}], [], "devices[0].points must be a non-empty list of [batch_size, seconds], got []"),
        ([{"max_batch_size": 4, "points": [[1, 0.1, 3]]}], [], "devices[0].points[0] must be [batch_size, seconds], got [1, 0.1, 3]"),
        ([{"max_batch_size": 4, "points": [[1.5, 0.1]]}], [], "devices[0].points[0][0] (batch size) must be an int >= 1 and <= 1048576, got 1.5"),
        ([{"max_batch_size": 4, "points": [[1, 0]]}], [], "devices[0].points[0][1] (seconds) must be a finite number >= 1e-09 and <= 1e+09, got 0"),
        ([{"max_batch_size": 4, "points": [[1, 0.1], [1, 0.2]]}], [], "devices[0].points repeats a batch size: [1, 1]"),
        ([{"max_batch_size": 4, "points": [[8, 0.1]]}], [], "devices[0].points has batch size 8 above max_batch_size=4"),
        ([{"max_batch_size": 4, "peak_speed": 1.0}], ["--comm-time", "nan"], "--comm-time must be a finite number >= 0 or None, got nan"),
        ([{"max_batch_size": 4, "peak_speed": 1.0}], ["--max-accumulation-steps", "0"], "--max-accumulation-steps must be an int >= 1 or None, got 0"),
        ([{"max_batch_size": 4, "peak_speed": 1.0}], ["--global-batch-size", "99999999999"], "--global-batch-size must be an int >= 1 and <= 2147483647, got 99999999999"),
    ],
)
def test_schema_errors_are_one_line_naming_key_and_value(tmp_path, capsys, spec, argv, message) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    argv = argv if "--global-batch-size" in argv else ["--global-batch-size", "4", *argv]
    assert _run(["plan", str(path), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1, err


def test_deeply_nested_or_binary_spec_is_refused_in_one_line(tmp_path, capsys) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert _run(["plan", str(deep), "--global-batch-size", "2"]) == 2
    assert "nests too deeply" in capsys.readouterr().err
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    assert _run(["plan", str(binary), "--global-batch-size", "2"]) == 2
    assert "is not UTF-8 text" in capsys.readouterr().err


def test_missing_file_exits_2(tmp_path, capsys) -> None:
    assert _run(["plan", str(tmp_path / "nope.json"), "--global-batch-size", "2"]) == 2
    assert "nope.json" in capsys.readouterr().err


def test_not_json_names_the_file(tmp_path, capsys) -> None:
    path = tmp_path / "spec.json"
    path.write_text("not json")
    assert _run(["plan", str(path), "--global-batch-size", "2"]) == 2
    assert f"spec {path} is not JSON: Expecting value" in capsys.readouterr().err


def test_unwritable_json_out_exits_2(tmp_path, capsys) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps([{"name": "a", "max_batch_size": 4, "peak_speed": 10.0}]))
    out = tmp_path / "missing-dir" / "plan.json"
    assert _run(["plan", str(path), "--global-batch-size", "2", "--json", str(out)]) == 2
    assert f"cannot write --json {out}" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- fuzz
_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.text(max_size=5),
                          st.floats(allow_nan=True, allow_infinity=True))
_json_values = st.recursive(_json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                   st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                            max_leaves=6)
_device = st.fixed_dictionaries(
    {},
    optional={"name": _json_values, "max_batch_size": st.one_of(st.integers(-3, 10**12), _json_values),
              "peak_speed": st.one_of(st.floats(allow_nan=True, allow_infinity=True), _json_values),
              "points": st.one_of(st.lists(st.lists(st.one_of(st.integers(-2, 40), st.floats()), max_size=3), max_size=4),
                                  _json_values),
              "interpolation": st.one_of(st.sampled_from(["linear", "spline"]), _json_values)},
)
_spec = st.one_of(st.lists(_device, max_size=3),
                  st.fixed_dictionaries({"devices": st.one_of(st.lists(_device, max_size=3), _json_values)},
                                        optional={"comm_time_s": _json_values, "extra": _json_values}),
                  _json_values)


@settings(max_examples=150, deadline=None)
@given(_spec, st.integers(-5, 3000), st.sampled_from([0, 1, 2, 3]))
def test_any_json_spec_plans_or_exits_2_with_one_line(tmp_path_factory, spec, gbs, stage) -> None:
    """Whatever the JSON holds: exit 0 with a plan, or exit 2 with one line on stderr — never a traceback."""
    import contextlib
    import io

    path = tmp_path_factory.mktemp("fuzz") / "spec.json"
    path.write_text(json.dumps(spec))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = _run(["plan", str(path), "--global-batch-size", str(gbs), "--zero-stage", str(stage)])
    assert status in (0, 2)
    if status == 2:
        message = err.getvalue()
        assert message.startswith("semimig plan: error: ") and message.count("\n") == 1, message
