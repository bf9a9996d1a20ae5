"""``semimig plan``: print the Poplar allocation for a JSON of device specs or a measured profile.

    semimig plan SPEC.json --global-batch-size 256 --zero-stage 1 [--comm-time 0.05]
                 [--max-accumulation-steps 8] [--json PLAN.json]

SPEC's schema is in :mod:`semimig.allocation.spec` (a list of devices, each with ``max_batch_size``
and one of ``peak_speed`` or ``points``; a measured profile is the same file).  ``--comm-time``
overrides the file's ``comm_time_s``.

Prints the plan table, then the even-split baseline's iteration time and the two bounds no
allocation beats (:mod:`semimig.allocation.bounds`): the continuous ideal and the integer optimum.
Exit status 0, or 2 with a one-line message on stderr naming the bad key, flag or value.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import TYPE_CHECKING, Any

from semimig._io import check_input_file, check_new_file, write_json
from semimig._validate import check_int, check_number
from semimig.errors import ConfigError

if TYPE_CHECKING:  # the allocation modules import torch: imported where a plan is made, not for --help
    from semimig.allocation.request import AllocationRequest

logger = logging.getLogger(__name__)


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
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    parser.set_defaults(func=run_plan)


def _read_spec(path: str) -> Any:
    """The parsed JSON file, or a ConfigError naming the file and what is wrong with it."""
    check_input_file(path, "spec")  # a FIFO or a directory: refused, never opened
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as err:
        raise ConfigError(f"cannot read spec {path}: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"spec {path} is not UTF-8 text: {err.reason} at byte {err.start}") from err
    except json.JSONDecodeError as err:
        raise ConfigError(f"spec {path} is not JSON: {err}") from err
    except RecursionError as err:
        raise ConfigError(f"spec {path} nests too deeply to be a device list") from err


def _request(args: argparse.Namespace) -> AllocationRequest:
    """The flags checked (named as typed) and the spec read into one allocation request.

    ``--json`` is checked first, before the spec is read: never the spec itself, never a directory
    or a FIFO, its directory writable, an existing file only with ``--overwrite``.
    """
    from semimig.allocation.request import MAX_GLOBAL_BATCH_SIZE, AllocationRequest
    from semimig.allocation.spec import curves_from_spec

    if args.json_out:
        check_new_file(args.json_out, "--json", overwrite=args.overwrite, inputs=[args.spec])
    gbs = check_int("--global-batch-size", args.global_batch_size, minimum=1, maximum=MAX_GLOBAL_BATCH_SIZE)
    steps = check_int("--max-accumulation-steps", args.max_accumulation_steps, minimum=1, allow_none=True)
    flag_comm = check_number("--comm-time", args.comm_time, minimum=0.0, allow_none=True)
    curves, spec_comm = curves_from_spec(_read_spec(args.spec))
    comm = next((c for c in (flag_comm, spec_comm) if c is not None), 0.0)
    return AllocationRequest(curves=curves, global_batch_size=gbs, zero_stage=args.zero_stage, comm_time_s=comm,
                             max_accumulation_steps=steps)


def run_plan(args: argparse.Namespace) -> int:
    """Handler of ``semimig plan``; returns the exit status."""
    from semimig.allocation.allocate import even_plan, poplar_plan
    from semimig.allocation.bounds import ideal_time, integer_time

    try:
        request = _request(args)
        plan, ideal, integer = poplar_plan(request), ideal_time(request), integer_time(request)
    except ConfigError as err:
        print(f"semimig plan: error: {err}", file=sys.stderr)
        return 2
    try:
        even_time = even_plan(request).predicted_iteration_time_s
        even_text = f"predicted iteration {even_time:.4g} s"
    except ConfigError as err:  # the baseline may not fit the step cap; the plan still stands
        even_time, even_text = None, f"not possible ({err})"
    print(plan.format_table())
    print(f"even split: {even_text}")
    print(f"bounds (speed model): ideal {ideal:.4g} s (continuous), integer {integer:.4g} s (whole samples and micro-steps)")
    if args.json_out:
        out = plan.to_dict()
        out.update(even_iteration_time_s=even_time, ideal_iteration_time_s=ideal,
                   integer_iteration_time_s=integer)
        try:
            write_json(args.json_out, out)
        except OSError as err:
            print(f"semimig plan: error: cannot write --json {args.json_out}: {err.strerror}", file=sys.stderr)
            return 2
    return 0
