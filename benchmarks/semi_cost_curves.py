"""What SEMI's cost model sees for the bench ViT: pretest samples, fitted curves and Eq. 2's β.

    .venv/bin/python benchmarks/semi_cost_curves.py [--tp 2] [--compute measured|emulated] [--chi 4,8]

Runs the real pretest (``semimig.controller.pretest``) on ``tp`` gloo ranks with the shapes of
``semimig bench``'s ViT for that compute mode (the dense output head left out), once per χ with
rank 1 slowed by χ exactly as the bench injects it, and prints the curves at the shed share of
that χ (``1 − 1/χ``) and the β Eq. 2 gives for a single straggler.  One currency (DESIGN §3a):
with ``--compute measured`` every compute cost is measured wall time (the straggler's injected
slowdown included) and Φ1 is the wall time of real gloo collectives; with ``--compute emulated``
the compute costs are emulated device time (which charges FLOPs only, so Ω = 0) and Φ1 is still
real traffic.  Seconds are per iteration.
"""
from __future__ import annotations

import argparse
import json

from semimig.launch import run_on_ranks


def _shapes(cfg) -> list[tuple[int, int, int]]:
    """``(M, N, K)`` of every semimig GEMM of one rank: per ViT layer q, k, v and intermediate
    (column: ``N`` split), attention output and output (row: ``K`` split)."""
    m, h, i, e = cfg.tokens, cfg.size.hidden, cfg.size.intermediate, cfg.tp
    return ([(m, h // e, h)] * 3 + [(m, h, h // e), (m, i // e, h), (m, h, i // e)]) * cfg.size.layers


def _body(rank: int, world: int, compute: str, device_ms: float, chis: tuple[float, ...]) -> dict:
    import torch

    from semimig.bench.config import BenchConfig
    from semimig.controller.curves import CostCurves
    from semimig.controller.plan import solve_beta
    from semimig.controller.pretest import REFERENCE_COLUMNS, measure_cost_samples
    from semimig.straggler import BusyMeter, StragglerInjector

    torch.set_num_threads(1)
    cfg = BenchConfig(tp=world, compute=compute, device_ms=device_ms)
    out = {"tp": world, "compute": compute, "size": str(cfg.size), "at_chi": {}}
    if compute == "emulated":
        out["device_ms"] = device_ms
    for chi in chis:
        meter = BusyMeter(StragglerInjector(cfg.straggler(chi), rank, world))  # rank 1 at chi (pattern fixed)
        samples = measure_cost_samples(_shapes(cfg), None if world == 1 else torch.distributed.group.WORLD,
                                       gemm_timer=meter)
        curves = CostCurves.fit(omega1_seconds=samples["omega1"], omega2_samples=samples["omega2"],
                                phi1_samples=samples["phi1"], phi2_samples=samples["phi2"])
        n = REFERENCE_COLUMNS * (1.0 - 1.0 / chi)
        out["at_chi"][f"{chi:g}"] = {
            "curves": curves.to_dict(), "shed_columns": n,
            "omega1_plus_omega2_s": curves.omega1 + curves.omega2(n),
            "phi1_s": curves.phi1(n), "phi2_s": curves.phi2(n / (world - 1)),
            "eq2_beta": solve_beta(n, world, curves)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--compute", choices=("measured", "emulated"), default="measured")
    parser.add_argument("--device-ms", type=float, default=80.0, help="emulated device time per iteration (ms)")
    parser.add_argument("--chi", default="4,8", help="slowdowns of rank 1, comma-separated")
    args = parser.parse_args()
    if args.tp < 2:
        parser.error(f"--tp must be >= 2 (migration needs a receiver), got {args.tp}")
    from semimig.bench.config import BenchConfig
    from semimig.errors import ConfigError

    try:  # the ranks build the same config: refuse bad values here, before any rank starts
        chis = tuple(float(c) for c in args.chi.split(","))
        BenchConfig(tp=args.tp, compute=args.compute, device_ms=args.device_ms, chis=(1.0,) + chis)
    except (ConfigError, ValueError) as err:
        parser.error(str(err))
    if args.compute == "measured" and args.tp > __import__("os").cpu_count():
        parser.error(f"--compute measured needs one core per rank: --tp {args.tp} > {__import__('os').cpu_count()} "
                     "cores; use --compute emulated")
    print(json.dumps(run_on_ranks(_body, args.tp, args.compute, args.device_ms, chis, timeout_s=600), indent=1))


if __name__ == "__main__":
    main()
