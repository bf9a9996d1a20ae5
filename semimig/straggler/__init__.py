"""Injected stragglers (benchmarks, tests), a real CPU throttle, and per-rank busy-time measurement.

The names below are imported on first use, so ``semimig.straggler.throttle`` (no torch) stays cheap.
"""
import importlib

_WHERE = {
    "BusyMeter": "semimig.straggler.busy",
    "BusyStats": "semimig.straggler.busy",
    "CudaEventClock": "semimig.straggler.clock",
    "HostClock": "semimig.straggler.clock",
    "StepClock": "semimig.straggler.clock",
    "StepTimes": "semimig.straggler.clock",
    "make_clock": "semimig.straggler.clock",
    "DeviceHealth": "semimig.straggler.nvml",
    "HealthWatch": "semimig.straggler.nvml",
    "StragglerConfig": "semimig.straggler.injection",
    "StragglerInjector": "semimig.straggler.injection",
    "calibrate_cuda_sleep_rate": "semimig.straggler.injection",
    "calibrate_flops_per_second": "semimig.straggler.injection",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
