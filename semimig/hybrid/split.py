"""The data-parallel side of ``semimig.enable``: :class:`BatchSplit`, Poplar's batch plan across DP groups.

    balancer = semimig.enable(model, plugin, optimizer=optimizer, mode="semi",
                              batch=BatchSplit(global_batch_size=64))
    for global_batch in loader:                                  # the same global batch on every rank
        run_iteration(booster, model, optimizer, balancer.micro_batches(global_batch), loss_fn,
                      zero_stage=plugin.zero_stage)              # this DP group's rows, losses scaled
        optimizer.step()                                         # hooked: SEMI step, then the batch plan
        optimizer.zero_grad()

Every TP group of the ``HybridParallelPlugin`` is one Poplar device (DESIGN §6): its ranks take
the same rows of the global batch, and its time is its slowest member's busy time after SEMI
balanced it.  Where its speed comes from:

- ``curves`` given (one :class:`~semimig.allocation.speed.SpeedCurve` per DP group, e.g. from
  :func:`~semimig.hybrid.profile_group_curves`): Poplar's plan from the first iteration.
- ``curves=None`` (default): no profiling pass.  Every group starts on the same curve, a constant
  speed ``s_0`` samples/s up to ``max_batch_size`` (so the first plan is the even split), and the
  re-plan trigger (:mod:`.replan`) calibrates it from training itself: group ``g``'s measured
  time ``T_g`` over the plan's prediction ``P_g = b_g/s_0`` is ``m_g``, and at iteration
  ``window + patience − 1`` (the first full window, confirmed ``patience`` times; whatever the
  ``m_g``, so no threshold can hide a difference of speeds) each curve becomes
  ``τ_g(b) = m_g·b/s_0`` — the speed ``b_g/T_g`` the group showed — and Poplar splits the batch in
  proportion.  A curve with one point says nothing about how speed changes with the batch size;
  a profile does.

Nothing here changes the gradients: each micro-step's loss is scaled by ``m·D/G``
(:meth:`~semimig.allocation.data.MicroBatch.scale_loss`), so the DP-averaged gradient is the
global-batch mean whatever the split (tests/multirank/test_hybrid_gradients.py, tests/multirank/test_enable_batch.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from semimig._validate import check_choice, check_int, check_number
from semimig.allocation.speed import SpeedCurve
from semimig.errors import ConfigError
from semimig.hybrid.replan import ReplanConfig

__all__ = ["BatchSplit", "CALIBRATION_SPEED"]

ALLOCATIONS = ("even", "poplar")
"""How a global batch is split between DP groups (``BatchSplit.allocation``, ``HybridBalancer``)."""
CALIBRATION_SPEED = 1.0
"""``s_0``: the samples per second every group's uncalibrated curve assumes (any value works: the
first re-plan replaces it by the measured speed, unconditionally; 1 sample/s keeps ``m_g`` = seconds per
sample)."""


@dataclass(frozen=True, kw_only=True)
class BatchSplit:
    """How ``semimig.enable(..., batch=...)`` splits each global batch between the DP groups (module doc).

    ``global_batch_size``     samples per iteration over all DP groups (every rank passes the same batch);
    ``allocation``            ``"poplar"`` (faster groups take more samples) or ``"even"`` (never re-planned);
    ``curves``                one speed curve per DP group, or ``None``: calibrated from the first iterations;
    ``max_batch_size``        with ``curves=None``: the largest micro-batch a group may run (memory);
                              default the whole global batch (no accumulation);
    ``replan``                when a group's speed moves, re-plan (``None``: keep the first plan; with
                              ``curves=None`` and ``poplar`` the trigger is what calibrates, so it is required);
    ``comm_time_s``           Poplar's collective seconds per iteration (ZeRO-0/1) or micro-step (ZeRO-2);
    ``max_accumulation_steps`` cap on micro-steps per iteration (``None``: none);
    ``memory_bytes``          bytes each rank may hold under a plan the joint planner chooses (``mode="reshard"``
                              with ``dp_size > 1`` and ``zero_stage=0``: :meth:`capacity`); ``None``: on CUDA the
                              device's free memory plus what this process holds at ``enable``, elsewhere unlimited.
    """

    global_batch_size: int
    allocation: str = "poplar"
    curves: Optional[tuple[SpeedCurve, ...]] = None
    max_batch_size: Optional[int] = None
    replan: Optional[ReplanConfig] = field(default_factory=ReplanConfig)
    comm_time_s: float = 0.0
    max_accumulation_steps: Optional[int] = None
    memory_bytes: Optional[float] = None

    def __post_init__(self) -> None:
        check_int("BatchSplit.global_batch_size", self.global_batch_size, minimum=1)
        check_choice("BatchSplit.allocation", self.allocation, ALLOCATIONS)
        check_int("BatchSplit.max_batch_size", self.max_batch_size, minimum=1, allow_none=True)
        check_number("BatchSplit.comm_time_s", self.comm_time_s, minimum=0.0)
        check_int("BatchSplit.max_accumulation_steps", self.max_accumulation_steps, minimum=1, allow_none=True)
        if self.memory_bytes is not None and self.memory_bytes != math.inf:
            check_number("BatchSplit.memory_bytes", self.memory_bytes, minimum=0.0, low_open=True)
        if self.replan is not None and not isinstance(self.replan, ReplanConfig):
            raise ConfigError(f"BatchSplit.replan must be a ReplanConfig or None, got {self.replan!r}")
        if self.curves is not None:
            if isinstance(self.curves, (str, bytes)) or not isinstance(self.curves, (tuple, list)) or not self.curves:
                raise ConfigError(f"BatchSplit.curves must be a non-empty tuple of SpeedCurve (one per data-parallel "
                                  f"group) or None, got {self.curves!r}")
            for g, curve in enumerate(self.curves):
                if not isinstance(curve, SpeedCurve):
                    raise ConfigError(f"BatchSplit.curves[{g}] must be a SpeedCurve, got {type(curve).__name__}")
            object.__setattr__(self, "curves", tuple(self.curves))
            if self.max_batch_size is not None:
                raise ConfigError("BatchSplit.max_batch_size is for curves=None: a profiled curve carries its own "
                                  "max_batch_size")
        elif self.allocation == "poplar" and self.replan is None:
            raise ConfigError("BatchSplit(curves=None, allocation='poplar') learns each group's speed through its "
                              "re-plan trigger: give replan=ReplanConfig(...) (not None), or profiled curves")

    @property
    def calibrates(self) -> bool:
        """No profile: the first re-plan sets every group's speed from measurement."""
        return self.curves is None and self.allocation == "poplar"

    def capacity(self, device: Any = None) -> float:
        """This rank's bytes for the joint planner: ``memory_bytes`` when given; else on a CUDA ``device`` the
        free memory plus what this process's allocator holds now (the model and optimizer state already
        in it count against the plan's bytes too), elsewhere ``math.inf``."""
        if self.memory_bytes is not None:
            return float(self.memory_bytes)
        import torch

        if device is None or torch.device(device).type != "cuda":
            return math.inf
        free, _ = torch.cuda.mem_get_info(device)
        return float(free + torch.cuda.memory_reserved(device))

    def curves_for(self, dp_size: int) -> tuple[SpeedCurve, ...]:
        """One curve per DP group: the given ones (their count checked), or the uncalibrated start."""
        check_int("dp_size", dp_size, minimum=1)
        if self.curves is not None:
            if len(self.curves) != dp_size:
                raise ConfigError(f"BatchSplit.curves has {len(self.curves)} curves, the plugin has {dp_size} "
                                  "data-parallel groups: give one per group")
            return self.curves
        largest = self.max_batch_size if self.max_batch_size is not None else self.global_batch_size
        return tuple(SpeedCurve.constant(peak_speed=CALIBRATION_SPEED, max_batch_size=largest, name=f"group{g}")
                     for g in range(dp_size))

    def hybrid_balancer(self, plugin: Any, *, controller: Any) -> Any:
        """The :class:`~semimig.hybrid.HybridBalancer` this split runs on ``plugin`` (collective: reads the grid)."""
        from semimig.hybrid.balancer import HybridBalancer
        from semimig.hybrid.layout import GridLayout

        layout = GridLayout.from_plugin(plugin)
        return HybridBalancer(plugin, layout=layout, curves=self.curves_for(layout.dp_size),
                              global_batch_size=self.global_batch_size, controller=controller,
                              allocation=self.allocation, replan=self.replan, comm_time_s=self.comm_time_s,
                              max_accumulation_steps=self.max_accumulation_steps, calibrating=self.calibrates)
