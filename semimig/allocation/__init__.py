"""Poplar-style heterogeneous batch allocation for the data-parallel / ZeRO dimension (DESIGN §6).

    profile  : profile_device(step, ...) -> DeviceProfile      (Algorithm 1; profiler, device)
    model    : DeviceProfile.curve() -> SpeedCurve             (cubic-spline speed; speed)
    allocate : allocate(curves, gbs, zero_stage=...) -> AllocationPlan   (Algorithm 2; allocate)
    bound    : ideal_time(request), integer_time(request)                (lower bounds; bounds)
    data     : HeteroDataLoader(dataset, plan, dp_rank)        (micro-batches, loss scaling; data)
    run      : run_iteration(booster, model, optimizer, ...)   (Colossal-AI plugins; colossal)

Modules: ``speed`` (curves), ``request`` (a validated allocation problem), ``plan`` (frozen plans),
``allocate`` (pure allocation), ``bounds`` (what no allocation beats), ``memory``
(peak memory, CAPTURE fit), ``collectives`` (time inside collectives), ``simulate`` (CPU speed
factors and memory caps), ``profiler`` (Algorithm 1), ``device`` (a profilable model step),
``data`` (sampler / loader / loss scale), ``colossal`` (plugins), ``cli`` (``semimig plan``).

The names above are imported on first use (PEP 562), so ``semimig.allocation.cli`` can build
``semimig plan --help`` without importing torch.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any

_WHERE = {  # public name -> the module that defines it
    "allocate": "allocate", "allocate_even": "allocate", "even_plan": "allocate", "poplar_plan": "allocate",
    "ideal_iteration_time": "bounds", "ideal_time": "bounds", "integer_time": "bounds",
    "max_samples_within": "bounds",
    "CollectiveClock": "collectives", "measure_collective_time": "collectives", "timed_collectives": "collectives",
    "DataParallelInfo": "colossal", "check_plan": "colossal", "data_parallel_info": "colossal",
    "run_iteration": "colossal",
    "HeteroBatchSampler": "data", "HeteroDataLoader": "data", "MicroBatch": "data", "loss_scale": "data",
    "partition_global_batch": "data",
    "evaluation_share": "data",
    "ModelStepDevice": "device",
    "LinearMemoryFit": "memory", "SavedActivationMeter": "memory", "model_state_bytes": "memory",
    "one_batch_estimate": "memory", "optimizer_state_bytes": "memory",
    "AllocationPlan": "plan", "DevicePlan": "plan",
    "AllocationRequest": "request",
    "DeviceProfile": "profiler", "ProbeResult": "profiler", "ProfilerConfig": "profiler",
    "gather_profiles": "profiler", "profile_device": "profiler",
    "SimulatedOutOfMemoryError": "simulate", "SimulatedSpeed": "simulate", "SlowedModule": "simulate",
    "SpeedCurve": "speed",
}

__all__ = [
    "AllocationPlan",
    "AllocationRequest",
    "CollectiveClock",
    "DataParallelInfo",
    "DevicePlan",
    "DeviceProfile",
    "HeteroBatchSampler",
    "HeteroDataLoader",
    "LinearMemoryFit",
    "MicroBatch",
    "ModelStepDevice",
    "ProbeResult",
    "ProfilerConfig",
    "SavedActivationMeter",
    "SimulatedOutOfMemoryError",
    "SimulatedSpeed",
    "SlowedModule",
    "SpeedCurve",
    "allocate",
    "allocate_even",
    "check_plan",
    "data_parallel_info",
    "gather_profiles",
    "even_plan",
    "ideal_iteration_time",
    "ideal_time",
    "integer_time",
    "max_samples_within",
    "poplar_plan",
    "loss_scale",
    "measure_collective_time",
    "model_state_bytes",
    "one_batch_estimate",
    "optimizer_state_bytes",
    "partition_global_batch",
    "evaluation_share",
    "profile_device",
    "run_iteration",
    "timed_collectives",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """This package, whose ``allocate`` stays the function when the submodule ``allocate`` loads.

    Importing a submodule binds it on its package; the eager imports this file had bound the
    function over it, and ``semimig.allocation.allocate`` is read as the function elsewhere.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "allocate" and isinstance(value, types.ModuleType):
            value = value.allocate
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
