"""What one ``semimig bench`` run trains and measures (frozen, validated)."""
from __future__ import annotations

from dataclasses import dataclass, field

from semimig.bench.models import VitSize
from semimig.controller.runtime import MODES
from semimig.resizing.config import ResizingConfig

PATTERNS = ("fixed", "round-robin", "multi")


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """One benchmark sweep: every mode × chi × seed trains the same ViT on digits."""

    modes: tuple[str, ...] = MODES
    """Balancing modes (``baseline`` = Colossal-AI's own layers with the same injection)."""
    chis: tuple[float, ...] = (1.0, 4.0, 8.0)
    """Slowdown factors of the straggler(s); ``multi`` scales its per-rank factors by chi/8."""
    seeds: tuple[int, ...] = (0, 1, 2)
    tp: int = 2
    dp: int = 1
    pattern: str = "fixed"
    """``fixed`` (rank ``straggler_rank``), ``round-robin`` (rank = epoch % tp, paper) or
    ``multi`` (ranks 0..tp-1 with factors ``multi_chis``, paper Fig. 11)."""
    straggler_rank: int = 1
    multi_chis: tuple[float, ...] = (8.0, 6.0, 4.0, 2.0)
    """Pattern ``multi``: rank r's slowdown at chi = 8 (scaled by chi/8, at least 1); entries
    beyond ``tp`` are unused, missing ranks are not slowed."""
    lambdas: tuple[int, ...] = ()
    """λ sweep (paper Fig. 11, pattern ``multi``): besides ``modes``, train ``semi`` with exactly
    λ migrating stragglers (the rest resize) at every chi > 1, for each λ listed."""
    epochs: int = 4
    iters_per_epoch: int = 25
    batch: int = 64
    lr: float = 1e-3
    """Peak learning rate of the one-cycle schedule (AdamW) over ``epochs * iters_per_epoch``."""
    device_ms: float = 60.0
    """Emulated device time of one rank's linear GEMMs per iteration at chi = 1 (milliseconds):
    the GEMMs of every rank sleep as long as a device of that speed would compute (see
    ``semimig.straggler.injection``, mode ``emulated``)."""
    device: str = "cpu"
    """``cpu``: gloo ranks with the emulated device (``device_ms``).  ``cuda``: one NCCL rank per
    GPU, real device time, the straggler slowed by ``(chi - 1)`` × its measured GEMM time."""
    theta_iter: float = ResizingConfig.theta_iter
    """PriDiff micro-threshold (``ResizingConfig.theta_iter``; the paper's default 1e-3).  Used by
    the ``zero-pridiff-*`` modes only: a column is a pruning candidate when its weight moved less
    than ``iters_per_epoch * theta_iter`` (mean absolute change) over the last epoch."""
    warmup_iters: int = 3
    """Iterations left out of the timing (pretest, first plans)."""
    size: VitSize = field(default_factory=lambda: VitSize(hidden=64, layers=2, heads=4, intermediate=256))

    def __post_init__(self) -> None:
        for mode in self.modes:
            if mode not in MODES:
                raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
        if not self.modes:
            raise ValueError("modes must not be empty")
        for chi in self.chis:
            if not chi >= 1:
                raise ValueError(f"chi values must be >= 1, got {chi}")
        if self.pattern not in PATTERNS:
            raise ValueError(f"pattern must be one of {PATTERNS}, got {self.pattern!r}")
        for name in ("tp", "dp", "epochs", "iters_per_epoch", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.pattern == "fixed" and not 0 <= self.straggler_rank < self.tp:
            raise ValueError(f"straggler_rank={self.straggler_rank} is outside the TP group of size {self.tp}")
        if self.tp < 2 and self.pattern != "fixed":
            raise ValueError(f"pattern {self.pattern!r} needs tp >= 2, got tp={self.tp}")
        if self.size.hidden % self.tp or self.size.intermediate % self.tp or self.size.heads % self.tp:
            raise ValueError(f"hidden={self.size.hidden}, intermediate={self.size.intermediate} and "
                             f"heads={self.size.heads} must all be divisible by tp={self.tp}")
        if self.batch * self.dp > 1000:
            raise ValueError(f"batch*dp={self.batch * self.dp} exceeds what digits' 1347 training images "
                             "can serve per iteration (keep it <= 1000)")
        for lam in self.lambdas:
            if isinstance(lam, bool) or not isinstance(lam, int) or not 0 <= lam < self.tp:
                raise ValueError(f"lambda values count migrating stragglers: ints in [0, tp={self.tp}), got {lam!r}")
        if self.lambdas and self.pattern != "multi":
            raise ValueError(f"a lambda sweep needs several stragglers (pattern 'multi'), got pattern {self.pattern!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if not self.seeds or not self.chis:
            raise ValueError(f"seeds and chis must not be empty, got seeds={self.seeds} chis={self.chis}")
        for seed in self.seeds:
            if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
                raise ValueError(f"seeds must be ints in [0, 2**32), got {seed!r}")
        if self.pattern == "multi" and (not self.multi_chis or any(not c >= 1 for c in self.multi_chis)):
            raise ValueError(f"multi_chis are per-rank slowdowns: non-empty, each >= 1, got {self.multi_chis}")
        ResizingConfig(theta_iter=self.theta_iter)  # its check, its message
        if not self.device_ms > 0:
            raise ValueError(f"device_ms must be > 0, got {self.device_ms}")
        if self.warmup_iters >= self.epochs * self.iters_per_epoch:
            raise ValueError(f"warmup_iters={self.warmup_iters} leaves no timed iteration "
                             f"(epochs*iters_per_epoch={self.epochs * self.iters_per_epoch})")

    @property
    def world(self) -> int:
        return self.tp * self.dp

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    def cases(self, chi: float, seed: int) -> list[tuple[str, float, int, int | None]]:
        """``(mode, chi, seed, λ)`` to train for one chi and seed: every mode, then the λ sweep."""
        sweep = [("semi", chi, seed, lam) for lam in self.lambdas] if chi != 1.0 else []
        return [(mode, chi, seed, None) for mode in self.modes] + sweep

    def straggler_spec(self, chi: float) -> str:
        """The injection (CLI grammar of :class:`StragglerConfig`) for this pattern at ``chi``."""
        if chi == 1.0:
            return "none"
        if self.pattern == "fixed":
            return f"fixed:{self.straggler_rank}:{chi:g}"
        if self.pattern == "round-robin":
            return f"round-robin:{chi:g}"
        pairs = [f"{r}={max(1.0, c * chi / 8.0):g}" for r, c in enumerate(self.multi_chis[: self.tp])]
        return "multi:" + ",".join(pairs)

    @property
    def tokens(self) -> int:
        """Tokens per batch, the ``M`` of every GEMM: patches of the 8x8 image plus the CLS token."""
        return self.batch * ((8 // self.size.patch) ** 2 + 1)

    def gemm_flops_per_rank(self) -> float:
        """FLOPs of one rank's tensor-parallel linear GEMMs per iteration (forward + 2 backward)."""
        h, i = self.size.hidden, self.size.intermediate
        per_layer = 2 * self.tokens * (4 * h * h + 2 * h * i) / self.tp
        return 3 * per_layer * self.size.layers

    def device_flops_per_second(self) -> float:
        """The emulated device rate that makes one iteration's GEMMs take ``device_ms``."""
        return self.gemm_flops_per_rank() / (self.device_ms / 1000.0)
