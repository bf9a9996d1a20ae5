"""What one 2-D run trains and measures (frozen, validated): :class:`Hybrid2DConfig`.

Modes (:data:`MODES_2D`), each a ``HybridParallelPlugin(tp_size=tp, zero_stage=z)`` on ``tp·dp``
ranks training the bench ViT on digits with the same global batch sequence:

    baseline      even batches, Colossal-AI's policy, stragglers injected by the baseline hooks
    poplar        Poplar's batch plan across the DP groups (profiled per TP group), re-planned
    semi          even batches, the SEMI controller in every TP group
    poplar+semi   both: the groups' speeds are profiled after SEMI balanced them

Speed pattern: ``group_chis[g][t]`` is the slowdown of TP rank ``t`` of DP group ``g``.  Default
(issue 18): group 1 at half speed (all its ranks χ = 2) and rank 1 of group 0 at χ = 4; other
groups and ranks χ = 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from semimig._validate import check_choice, check_int, check_number
from semimig.models import VitSize
from semimig.errors import ConfigError
from semimig.hybrid.replan import ReplanConfig

__all__ = ["MODES_2D", "TIMINGS", "Hybrid2DConfig"]

MODES_2D = ("baseline", "poplar", "semi", "poplar+semi")
TIMINGS = ("emulated", "measured")
PRECISIONS = ("fp32", "bf16")
_MAX_CHI = 100.0  # beyond it an emulated GEMM sleeps for minutes


@dataclass(frozen=True, kw_only=True)
class Hybrid2DConfig:
    """One 2-D sweep: every mode trains the same ViT from the same seed (module docstring)."""

    tp: int = 2
    dp: int = 2
    zero_stage: int = 0
    """``HybridParallelPlugin``'s ZeRO stage: 0, 1 or 2 (2 runs Poplar's lockstep plan)."""
    precision: str = "fp32"
    """``fp32`` or ``bf16``; Colossal-AI runs ZeRO (stage 1, 2) only in fp16/bf16."""
    modes: tuple[str, ...] = MODES_2D
    seeds: tuple[int, ...] = (0,)
    group_chis: tuple[tuple[float, ...], ...] = ()
    """Per DP group, per TP rank slowdown; empty for the default pattern (module docstring)."""
    timing: str = "emulated"
    """``emulated``: every rank's GEMMs sleep as long as a device of the emulated speed would
    compute (``device_ms``), χ times longer on a straggler; ``measured``: real GEMM time, a
    straggler sleeps ``(χ - 1)`` times it (sensible only with no more ranks than cores)."""
    device_ms: float = 60.0
    """Emulated GEMM time of one rank per iteration at the even batch and χ = 1 (milliseconds)."""
    batch: int = 64
    """Samples per DP group per iteration of the even split; the global batch is ``batch · dp``."""
    epochs: int = 2
    iters_per_epoch: int = 10
    warmup_iters: int = 3
    """Iterations left out of the iteration-time median (first plans, pretest)."""
    lr: float = 1e-3
    """Peak learning rate of the one-cycle schedule (AdamW)."""
    settle_iters: int = 8
    """Modes with SEMI: untimed forward/backward passes at the even batch before profiling, so the
    profile sees each group after SEMI balanced it."""
    profile_batches: tuple[int, ...] = ()
    """Batch sizes each group is profiled at (Poplar); empty: ``batch // 2`` and ``batch``."""
    profile_repeats: int = 2
    replan: ReplanConfig = field(default_factory=ReplanConfig)
    straggler_until: Optional[int] = None
    """When set, the slowdowns of ``group_chis`` apply only to iterations before it and every rank
    runs at χ = 1 after (stragglers that leave, to show re-planning); each group's slowed ranks
    must then share one χ.  Iterations count the busy source's steps (SEMI: the controller's,
    profiling passes included)."""
    size: VitSize = field(default_factory=lambda: VitSize(hidden=64, layers=2, heads=4, intermediate=256))

    def __post_init__(self) -> None:
        check_int("tp", self.tp, minimum=1, maximum=64)
        check_int("dp", self.dp, minimum=1, maximum=64)
        check_choice("zero_stage", self.zero_stage, (0, 1, 2))
        check_choice("precision", self.precision, PRECISIONS)
        if self.zero_stage > 0 and self.precision == "fp32":
            raise ConfigError(f"zero_stage={self.zero_stage} needs precision 'bf16': Colossal-AI's "
                              "HybridParallelPlugin runs ZeRO only in fp16/bf16")
        if not self.modes or isinstance(self.modes, str):
            raise ConfigError(f"modes must be a non-empty tuple of {MODES_2D}, got {self.modes!r}")
        for mode in self.modes:
            check_choice("modes", mode, MODES_2D)
        if len(set(self.modes)) != len(self.modes):
            raise ConfigError(f"modes must not repeat, got {self.modes!r}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be a non-empty tuple without repeats, got {self.seeds!r}")
        for seed in self.seeds:
            check_int("seeds", seed, minimum=0, maximum=2**32 - 1)
        check_choice("timing", self.timing, TIMINGS)
        check_number("device_ms", self.device_ms, minimum=0.0, maximum=60_000.0, low_open=True)
        check_int("batch", self.batch, minimum=2)
        if self.batch * self.dp > 1000:
            raise ConfigError(f"batch*dp={self.batch * self.dp} exceeds what digits' 1347 training images "
                              "can serve per iteration (keep it <= 1000)")
        check_int("epochs", self.epochs, minimum=1, maximum=10_000)
        check_int("iters_per_epoch", self.iters_per_epoch, minimum=1, maximum=100_000)
        check_int("warmup_iters", self.warmup_iters, minimum=0, maximum=self.epochs * self.iters_per_epoch - 1)
        check_number("lr", self.lr, minimum=0.0, maximum=10.0, low_open=True)
        check_int("settle_iters", self.settle_iters, minimum=0, maximum=10_000)
        check_int("profile_repeats", self.profile_repeats, minimum=1, maximum=100)
        for b in self.profile_batches:
            check_int("profile_batches", b, minimum=1, maximum=self.batch * self.dp)
        if not isinstance(self.replan, ReplanConfig):
            raise ConfigError(f"replan must be a ReplanConfig, got {self.replan!r}")
        if not isinstance(self.size, VitSize):
            raise ConfigError(f"size must be a VitSize, got {self.size!r}")
        if self.size.hidden % self.tp or self.size.intermediate % self.tp or self.size.heads % self.tp:
            raise ConfigError(f"hidden={self.size.hidden}, intermediate={self.size.intermediate} and "
                              f"heads={self.size.heads} must all be divisible by tp={self.tp}")
        self._check_chis()
        if self.straggler_until is not None:
            check_int("straggler_until", self.straggler_until, minimum=1)
            for g, row in enumerate(self.chis()):
                if len({c for c in row if c != 1.0}) > 1:
                    raise ConfigError(f"straggler_until needs one slowdown per group, group {g} has {row}")

    def _check_chis(self) -> None:
        if not self.group_chis:
            return
        if len(self.group_chis) != self.dp or any(len(row) != self.tp for row in self.group_chis):
            raise ConfigError(f"group_chis needs dp={self.dp} rows of tp={self.tp} slowdowns, got {self.group_chis!r}")
        for row in self.group_chis:
            for chi in row:
                check_number("group_chis", chi, minimum=1.0, maximum=_MAX_CHI)

    # ------------------------------------------------------------------ derived
    @property
    def world(self) -> int:
        return self.tp * self.dp

    @property
    def global_batch_size(self) -> int:
        return self.batch * self.dp

    def chis(self) -> tuple[tuple[float, ...], ...]:
        """``group_chis``, or the default pattern (module docstring)."""
        if self.group_chis:
            return tuple(tuple(float(c) for c in row) for row in self.group_chis)
        rows = [[1.0] * self.tp for _ in range(self.dp)]
        if self.tp > 1:
            rows[0][1] = 4.0
        if self.dp > 1:
            rows[1] = [2.0] * self.tp
        return tuple(tuple(row) for row in rows)

    def profile_sizes(self) -> tuple[int, ...]:
        return self.profile_batches or tuple(sorted({max(1, self.batch // 2), self.batch}))

    def cases(self) -> list[tuple[str, int]]:
        """``(mode, seed)`` for every mode and seed, modes innermost (one seed's modes side by side)."""
        return [(mode, seed) for seed in self.seeds for mode in self.modes]

    @property
    def tokens(self) -> int:
        """Tokens of one even batch: the ``M`` of every GEMM (patches of the 8x8 image plus CLS)."""
        return self.batch * ((8 // self.size.patch) ** 2 + 1)
