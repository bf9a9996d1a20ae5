"""Injected stragglers (benchmarks, tests) and per-rank busy-time measurement."""
from semimig.straggler.busy import BusyMeter, BusyStats
from semimig.straggler.injection import (
    StragglerConfig,
    StragglerInjector,
    calibrate_cuda_sleep_rate,
    calibrate_flops_per_second,
)

__all__ = ["BusyMeter", "BusyStats", "StragglerConfig", "StragglerInjector", "calibrate_cuda_sleep_rate",
           "calibrate_flops_per_second"]
