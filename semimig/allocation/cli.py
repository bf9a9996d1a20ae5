"""``semimig plan``: print the Poplar allocation for a JSON of device specs or a measured profile.

    semimig plan SPEC.json --global-batch-size 256 --zero-stage 1 [--comm-time 0.05]
                 [--max-accumulation-steps 8] [--json PLAN.json]

SPEC is either a list of devices or ``{"devices": [...], "comm_time_s": ...}``.  A device is

    {"name": "a100", "max_batch_size": 64, "peak_speed": 900.0}           constant speed, samples/s
    {"name": "v100", "max_batch_size": 32, "points": [[1, 0.004], ...]}   (batch, seconds) per micro-step

A measured profile is the same file: :func:`profiles_to_spec` writes the profiles of
:func:`~.profiler.profile_device` this way (each with ``points`` and ``max_batch_size``, plus the
raw probes, which are ignored here).  ``--comm-time`` overrides the file's ``comm_time_s``.

Prints the plan table, then the even-split baseline's and the speed model's ideal iteration time.
Exit status 0, or 2 with a message on stderr for a bad spec or an infeasible request.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from typing import Any, Optional, Sequence

from semimig.allocation.allocate import allocate, allocate_even, ideal_iteration_time
from semimig.allocation.profiler import DeviceProfile
from semimig.allocation.speed import SpeedCurve

logger = logging.getLogger(__name__)


def curves_from_spec(spec: Any) -> tuple[list[SpeedCurve], Optional[float]]:
    """Speed curves (and the spec's ``comm_time_s``, if any) from a parsed SPEC (module docs)."""
    comm: Optional[float] = None
    if isinstance(spec, dict):
        if "devices" not in spec:
            raise ValueError(f"spec must have a 'devices' list, got keys {sorted(spec)}")
        comm = spec.get("comm_time_s")
        devices = spec["devices"]
    else:
        devices = spec
    if not isinstance(devices, list):
        raise ValueError(f"'devices' must be a list, got {type(devices).__name__}")
    curves = []
    for i, device in enumerate(devices):
        if not isinstance(device, dict):
            raise ValueError(f"device {i} must be an object, got {device!r}")
        name = str(device.get("name", f"device{i}"))
        if "max_batch_size" not in device:
            raise ValueError(f"device {i} ({name!r}) has no 'max_batch_size'")
        max_batch = device["max_batch_size"]
        if ("points" in device) == ("peak_speed" in device):
            raise ValueError(f"device {i} ({name!r}) needs exactly one of 'points' and 'peak_speed'")
        if "peak_speed" in device:
            curves.append(SpeedCurve.constant(peak_speed=device["peak_speed"], max_batch_size=max_batch, name=name))
        else:
            points = device["points"]
            if not isinstance(points, list) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in points):
                raise ValueError(f"device {i} ({name!r}): 'points' must be a list of [batch_size, seconds], got {points!r}")
            if any(not isinstance(b, int) or isinstance(b, bool) for b, _ in points):
                raise ValueError(f"device {i} ({name!r}): batch sizes in 'points' must be ints, got {points!r}")
            curves.append(SpeedCurve.from_points([(b, t) for b, t in points], max_batch_size=max_batch, name=name))
    return curves, comm


def profiles_to_spec(profiles: Sequence[DeviceProfile], *, comm_time_s: float = 0.0) -> dict[str, Any]:
    """A SPEC (module docs) holding measured profiles, readable by ``semimig plan``."""
    return {"comm_time_s": comm_time_s, "devices": [p.to_dict() for p in profiles]}


def add_plan_subcommand(subparsers: Any) -> None:
    """Register ``plan`` on an ``argparse`` subparsers object; its handler is ``args.func``."""
    parser = subparsers.add_parser(
        "plan",
        help="print the Poplar batch allocation for device specs or a measured profile",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("spec", help="JSON file: device specs or a measured profile")
    parser.add_argument("--global-batch-size", type=int, required=True, help="samples per iteration")
    parser.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=1, help="ZeRO stage (default 1)")
    parser.add_argument("--comm-time", type=float, default=None, help="collective seconds (per iteration for ZeRO-0/1, per micro-step for 2/3)")
    parser.add_argument("--max-accumulation-steps", type=int, default=None, help="cap on micro-steps per iteration")
    parser.add_argument("--json", dest="json_out", default=None, help="also write the plan as JSON to this path")
    parser.set_defaults(func=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    """Handler of ``semimig plan``; returns the exit status."""
    try:
        with open(args.spec, encoding="utf-8") as f:
            try:
                spec = json.load(f)
            except json.JSONDecodeError as err:
                raise ValueError(f"spec {args.spec} is not JSON: {err}") from err
        curves, spec_comm = curves_from_spec(spec)
        comm = args.comm_time if args.comm_time is not None else (spec_comm if spec_comm is not None else 0.0)
        if not (isinstance(comm, (int, float)) and math.isfinite(comm)):
            raise ValueError(f"comm_time_s must be a finite number, got {comm!r}")
        kwargs = dict(zero_stage=args.zero_stage, comm_time_s=float(comm), max_accumulation_steps=args.max_accumulation_steps)
        plan = allocate(curves, args.global_batch_size, **kwargs)
        even = allocate_even(curves, args.global_batch_size, **kwargs)
        ideal = ideal_iteration_time(curves, args.global_batch_size, **kwargs)
    except (OSError, json.JSONDecodeError, ValueError) as err:
        print(f"semimig plan: error: {err}", file=sys.stderr)
        return 2
    print(plan.format_table())
    print(f"even split: predicted iteration {even.predicted_iteration_time_s:.4g} s")
    print(f"ideal (speed model): {ideal:.4g} s")
    if args.json_out:
        out = plan.to_dict()
        out["even_iteration_time_s"] = even.predicted_iteration_time_s
        out["ideal_iteration_time_s"] = ideal
        try:
            with open(args.json_out, "w", encoding="utf-8") as f:
                json.dump(out, f, indent=2)
        except OSError as err:
            print(f"semimig plan: error: cannot write --json {args.json_out}: {err.strerror}", file=sys.stderr)
            return 2
    return 0
