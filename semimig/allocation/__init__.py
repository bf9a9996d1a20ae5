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
"""
from semimig.allocation.allocate import allocate, allocate_even, even_plan, poplar_plan
from semimig.allocation.bounds import ideal_iteration_time, ideal_time, integer_time, max_samples_within
from semimig.allocation.collectives import CollectiveClock, measure_collective_time, timed_collectives
from semimig.allocation.colossal import DataParallelInfo, check_plan, data_parallel_info, run_iteration
from semimig.allocation.data import (
    HeteroBatchSampler,
    HeteroDataLoader,
    MicroBatch,
    loss_scale,
    partition_global_batch,
)
from semimig.allocation.device import ModelStepDevice
from semimig.allocation.memory import (
    LinearMemoryFit,
    SavedActivationMeter,
    model_state_bytes,
    one_batch_estimate,
    optimizer_state_bytes,
)
from semimig.allocation.plan import AllocationPlan, DevicePlan
from semimig.allocation.request import AllocationRequest
from semimig.allocation.profiler import DeviceProfile, ProbeResult, ProfilerConfig, gather_profiles, profile_device
from semimig.allocation.simulate import SimulatedOutOfMemoryError, SimulatedSpeed, SlowedModule
from semimig.allocation.speed import SpeedCurve

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
    "profile_device",
    "run_iteration",
    "timed_collectives",
]
