"""``semimig plan`` handler, driven through its own argparse subparser."""
from __future__ import annotations

import argparse
import json

import pytest

from semimig.allocation import DeviceProfile, ProbeResult, SpeedCurve, allocate
from semimig.allocation.cli import add_plan_subcommand, curves_from_spec, profiles_to_spec


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
    assert written["ideal_iteration_time_s"] <= written["predicted_iteration_time_s"] <= written["even_iteration_time_s"]


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
        ({"devices": [{"name": "dead", "max_batch_size": 2, "peak_speed": 0.0}]}, ["--global-batch-size", "2"], "device 'dead': peak_speed must be finite and > 0"),
        ({"devices": []}, ["--global-batch-size", "2"], "empty cluster"),
        ({"devices": [{"name": "a", "peak_speed": 1.0}]}, ["--global-batch-size", "2"], "has no 'max_batch_size'"),
        ({"devices": [{"name": "a", "max_batch_size": 2}]}, ["--global-batch-size", "2"], "exactly one of 'points' and 'peak_speed'"),
        ({"devices": [{"name": "a", "max_batch_size": 2, "peak_speed": 1.0}]}, ["--global-batch-size", "-1"], "global_batch_size must be an int >= 1, got -1"),
    ],
)
def test_bad_specs_exit_2_with_message(tmp_path, capsys, spec, argv, message) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert _run(["plan", str(path), *argv]) == 2
    assert message in capsys.readouterr().err


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
