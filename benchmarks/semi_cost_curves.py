"""What SEMI's cost model sees for the bench ViT: pretest samples, fitted curves and Eq. 2's β.

    .venv/bin/python benchmarks/semi_cost_curves.py [--tp 4] [--device-ms 80]

Runs the real pretest (``semimig.controller.pretest``) on ``tp`` gloo ranks with the shapes of
``semimig bench``'s ViT (hidden 64, 2 layers, 17 tokens x batch 64; the dense output head left
out) and the same emulated device, then prints the curves at the shed share of chi = 4 and 8
and the β that Eq. 2 gives for a single straggler.  Seconds are per iteration.
"""
from __future__ import annotations

import argparse
import json

from semimig.launch import run_on_ranks


def _body(rank: int, world: int, device_ms: float) -> dict:
    from semimig.bench.config import BenchConfig
    from semimig.controller.curves import CostCurves
    from semimig.controller.plan import solve_beta
    from semimig.controller.pretest import REFERENCE_COLUMNS, measure_cost_samples
    from semimig.straggler import BusyMeter, StragglerConfig, StragglerInjector

    cfg = BenchConfig(tp=world, device_ms=device_ms)
    m, h, i = cfg.tokens, cfg.size.hidden, cfg.size.intermediate
    # per ViT layer: query, key, value (column), attention output (row), intermediate (column), output (row)
    shapes = ([(m, h // world, h)] * 3 + [(m, h, h // world), (m, i // world, h), (m, h, i // world)]) * cfg.size.layers
    emulated = StragglerConfig.from_cli(f"none:mode=emulated:flops={cfg.device_flops_per_second():.6g}")
    samples = measure_cost_samples(shapes, None, gemm_timer=BusyMeter(StragglerInjector(emulated, rank, world)))
    curves = CostCurves.fit(omega1_seconds=samples["omega1"], omega2_samples=samples["omega2"],
                            phi1_samples=samples["phi1"], phi2_samples=samples["phi2"])
    out = {"tp": world, "device_ms": device_ms, "curves": curves.to_dict(), "at_chi": {}}
    for chi in (4.0, 8.0):
        n = REFERENCE_COLUMNS * (1.0 - 1.0 / chi)
        out["at_chi"][f"{chi:g}"] = {
            "shed_columns": n, "omega1_plus_omega2_s": curves.omega1 + curves.omega2(n),
            "phi1_s": curves.phi1(n), "phi2_s": curves.phi2(n / (world - 1)),
            "eq2_beta": solve_beta(n, world, curves)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp", type=int, default=4)
    parser.add_argument("--device-ms", type=float, default=80.0)
    args = parser.parse_args()
    if args.tp < 2:
        parser.error(f"--tp must be >= 2 (migration needs a receiver), got {args.tp}")
    from semimig.bench.config import BenchConfig

    try:  # the ranks build the same config: refuse bad values here, before any rank starts
        BenchConfig(tp=args.tp, device_ms=args.device_ms)
    except ValueError as err:
        parser.error(str(err))
    print(json.dumps(run_on_ranks(_body, args.tp, args.device_ms, timeout_s=300), indent=1))


if __name__ == "__main__":
    main()
