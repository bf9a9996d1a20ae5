"""What one ``semimig bench`` run trains and measures (frozen, validated where it enters).

Compute modes (``compute``):

    emulated  every rank's linear GEMMs take ``chi * flops / rate`` seconds of sleep, the rate set so
              that one rank's GEMMs take ``device_ms`` per iteration at chi = 1 (the host compute is
              small beside it).  Ranks that sleep do not compete for cores, so 4 ranks run on 2.
    measured  nothing is modelled but the straggler: each rank runs its real GEMMs on one thread and
              its busy time is the measured time of the work it did; a straggler sleeps
              ``(chi - 1) x`` its own measured GEMM time (the paper's method).  Needs one core per
              rank; ``--device cuda`` is always measured.

Bounds, and why:

- ``chi <= 100`` (:data:`semimig.straggler.injection.MAX_CHI`, the injector's own bound): the paper
  sweeps chi <= 8; balancing can hide at most chi = 1 / (1 - gamma_max) = 10 at gamma_max = 0.9;
  beyond 100 a rank is dead, not slow, and the baseline case would take 100x its chi = 1 time
  (chi = 1e6 "slept for ever").
- ``device_ms <= 10000``: ten seconds of emulated GEMM per iteration already makes one case of the
  default 100 iterations last 17 minutes; larger values are typos.
- The collective timeout must outlast the longest wait a rank can cause: the straggler's emulated
  GEMM time of one iteration, ``max chi * device_ms``; a timeout shorter than that is refused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from semimig._validate import check_bool, check_choice, check_int, check_number
from semimig.models import VitSize
from semimig.controller.runtime import MODES
from semimig.errors import ConfigError
from semimig.resizing.config import ResizingConfig
from semimig.straggler.injection import MAX_CHI, SCOPES, StragglerConfig

PATTERNS = ("fixed", "round-robin", "multi")
COMPUTES = ("emulated", "measured")
DEVICES = ("cpu", "cuda")
DEVICE_MS_MAX = 10_000.0
TIMEOUT_MAX_S = 86_400.0
MAX_WORLD = 64
EMULATED_SIZE = VitSize(hidden=64, layers=2, heads=4, intermediate=256)
"""Emulated mode: the GEMM time is slept, so the model only needs to learn digits."""
MEASURED_SIZE = VitSize(hidden=256, layers=1, heads=4, intermediate=1536)
"""Measured mode: wide enough that the tensor-parallel GEMMs take most of a CPU iteration (each
record's ``busy_share_by_rank`` at chi = 1 is that share, measured), one layer so that the default
run (28 cases of 100 iterations) stays near ten minutes on two cores; reaches ~93 % test accuracy
in 100 iterations (the 2-layer 256x1024 model: the same accuracy at twice the time per iteration)."""


def _check_sweep(name: str, values, check) -> tuple:
    """A non-empty tuple of distinct values, each passing ``check(item_name, value)``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (tuple, list)) or not values:
        raise ConfigError(f"{name} must be a non-empty tuple, got {values!r}")
    for i, value in enumerate(values):
        check(f"{name}[{i}]", value)
    seen = set()
    for value in values:
        if value in seen:
            raise ConfigError(f"{name} lists {value!r} twice, got {tuple(values)!r}: every case would be "
                              "trained twice")
        seen.add(value)
    return tuple(values)


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """One benchmark sweep: every mode x chi x seed trains the same ViT on digits."""

    modes: tuple[str, ...] = MODES
    """Balancing modes (``baseline`` = Colossal-AI's own layers with the same injection)."""
    chis: tuple[float, ...] = (1.0, 4.0, 8.0)
    """Slowdown factors of the straggler(s), each in [1, 100]; ``multi`` scales its per-rank
    factors by chi/8."""
    seeds: tuple[int, ...] = (0, 1, 2)
    tp: int = 2
    dp: int = 1
    pattern: str = "fixed"
    """``fixed`` (rank ``straggler_rank``), ``round-robin`` (rank = epoch % tp, paper) or
    ``multi`` (ranks 0..tp-1 with factors ``multi_chis``, paper Fig. 11)."""
    straggler_rank: int = 1
    scope: str = "gemm"
    """What of a straggler is slow: ``gemm`` (its linear GEMMs, the paper's method) or ``device``
    (all of its work between collectives, :mod:`semimig.straggler.device`; measured compute only)."""
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
    compute: str = "emulated"
    """``emulated`` or ``measured`` (module docstring); ``device="cuda"`` needs ``measured``."""
    device_ms: float = 60.0
    """Emulated mode: device time of one rank's linear GEMMs per iteration at chi = 1 (ms)."""
    device: str = "cpu"
    """``cpu``: gloo ranks.  ``cuda``: one NCCL rank per GPU, real device time (measured)."""
    theta_iter: Optional[float] = None
    """PriDiff's threshold, read by the ``zero-pridiff-*`` modes: ``None`` keeps
    :class:`ResizingConfig`'s default (a threshold relative to each layer's median column change);
    a number selects the paper's absolute threshold ``iters_per_epoch * theta_iter``."""
    warmup_iters: int = 3
    """Iterations left out of the timing (pretest, first plans)."""
    evaluate: bool = True
    """Measure test accuracy after training; ``False`` (``--quick``) reports time only, since a few
    dozen iterations leave the model at chance and an accuracy column would show noise."""
    timeout_s: Optional[float] = None
    """Collective timeout of every process group (seconds): a frozen or dead rank ends the run
    within it.  ``None``: sized to the work (:meth:`default_timeout_s`)."""
    size: Optional[VitSize] = None
    """The ViT; ``None``: :data:`EMULATED_SIZE` or :data:`MEASURED_SIZE` by ``compute``."""

    def __post_init__(self) -> None:
        modes = _check_sweep("modes", self.modes, lambda n, v: check_choice(n, v, MODES))
        object.__setattr__(self, "modes", modes)
        chis = _check_sweep("chis", self.chis, lambda n, v: check_number(n, v, minimum=1.0, maximum=MAX_CHI))
        object.__setattr__(self, "chis", tuple(float(c) for c in chis))
        object.__setattr__(self, "seeds", _check_sweep(
            "seeds", self.seeds, lambda n, v: check_int(n, v, minimum=0, maximum=2**32 - 1)))
        check_int("tp", self.tp, minimum=1, maximum=MAX_WORLD)
        check_int("dp", self.dp, minimum=1, maximum=MAX_WORLD)
        if self.tp * self.dp > MAX_WORLD:
            raise ConfigError(f"tp*dp = {self.tp * self.dp} ranks exceeds {MAX_WORLD}")
        check_choice("pattern", self.pattern, PATTERNS)
        check_int("straggler_rank", self.straggler_rank, minimum=0)
        check_choice("scope", self.scope, SCOPES)
        check_choice("compute", self.compute, COMPUTES)
        check_choice("device", self.device, DEVICES)
        if self.scope == "device" and self.compute != "measured":
            raise ConfigError("scope 'device' slows a rank's real work between collectives: compute must be "
                              f"'measured', got {self.compute!r}")
        if self.device == "cuda" and self.compute != "measured":
            raise ConfigError("device 'cuda' measures real device time: compute must be 'measured', "
                              f"got {self.compute!r}")
        for name, maximum in (("epochs", 10_000), ("iters_per_epoch", 100_000), ("batch", 1000),
                              ("warmup_iters", 100_000)):
            check_int(name, getattr(self, name), minimum=0 if name == "warmup_iters" else 1, maximum=maximum)
        check_number("lr", self.lr, minimum=0.0, maximum=1.0, low_open=True)
        check_number("device_ms", self.device_ms, minimum=0.0, maximum=DEVICE_MS_MAX, low_open=True)
        check_number("theta_iter", self.theta_iter, minimum=0.0, allow_none=True)
        check_bool("evaluate", self.evaluate)
        if self.size is None:
            object.__setattr__(self, "size", MEASURED_SIZE if self.compute == "measured" else EMULATED_SIZE)
        if not isinstance(self.size, VitSize):
            raise ConfigError(f"size must be a VitSize, got {self.size!r}")
        self._check_pattern()
        self._check_shapes()
        if self.timeout_s is None:
            object.__setattr__(self, "timeout_s", self.default_timeout_s())
        check_number("timeout_s", self.timeout_s, minimum=1.0, maximum=TIMEOUT_MAX_S)
        if self.compute == "emulated" and self.longest_wait_s() >= self.timeout_s:
            raise ConfigError(f"timeout_s={self.timeout_s:g} is shorter than the straggler's emulated GEMM time per "
                              f"iteration (chi {self.max_chi:g} x device_ms {self.device_ms:g} = "
                              f"{self.longest_wait_s():g} s): raise --timeout-s or lower --chi / --device-ms")

    def _check_pattern(self) -> None:
        if self.pattern == "fixed" and self.straggler_rank >= self.tp:
            raise ConfigError(f"straggler_rank={self.straggler_rank} is outside the TP group of size {self.tp}")
        if self.tp < 2 and self.pattern != "fixed":
            raise ConfigError(f"pattern {self.pattern!r} needs tp >= 2, got tp={self.tp}")
        if isinstance(self.multi_chis, (str, bytes)) or not isinstance(self.multi_chis, (tuple, list)) or (
                self.pattern == "multi" and not self.multi_chis):
            raise ConfigError(f"multi_chis must be a non-empty tuple of per-rank slowdowns, got {self.multi_chis!r}")
        for i, chi in enumerate(self.multi_chis):  # per rank: repeats are fine (two ranks at chi 4)
            check_number(f"multi_chis[{i}]", chi, minimum=1.0, maximum=MAX_CHI)
        object.__setattr__(self, "multi_chis", tuple(float(c) for c in self.multi_chis))
        if self.lambdas:
            _check_sweep("lambdas", self.lambdas, lambda n, v: check_int(n, v, minimum=0, maximum=self.tp - 1))
            if self.pattern != "multi":
                raise ConfigError(f"a lambda sweep needs several stragglers (pattern 'multi'), got pattern "
                                  f"{self.pattern!r}")
        elif not isinstance(self.lambdas, tuple):
            raise ConfigError(f"lambdas must be a tuple of ints, got {self.lambdas!r}")

    def _check_shapes(self) -> None:
        s = self.size
        if s.hidden % self.tp or s.intermediate % self.tp or s.heads % self.tp:
            raise ConfigError(f"hidden={s.hidden}, intermediate={s.intermediate} and heads={s.heads} must all be "
                              f"divisible by tp={self.tp}")
        if self.batch * self.dp > 1000:
            raise ConfigError(f"batch*dp={self.batch * self.dp} exceeds what digits' 1347 training images can serve "
                              "per iteration (keep it <= 1000)")
        if self.warmup_iters >= self.epochs * self.iters_per_epoch:
            raise ConfigError(f"warmup_iters={self.warmup_iters} leaves no timed iteration "
                              f"(epochs*iters_per_epoch={self.epochs * self.iters_per_epoch})")

    # ------------------------------------------------------------------ derived
    @property
    def world(self) -> int:
        return self.tp * self.dp

    @property
    def max_chi(self) -> float:
        """The largest slowdown any rank gets in this sweep."""
        multi = max(self.multi_chis[: self.tp], default=1.0) / 8.0 if self.pattern == "multi" else 1.0
        return max(max(self.chis), max(self.chis) * multi)

    def longest_wait_s(self) -> float:
        """Emulated mode: the straggler's GEMM time of one iteration, the longest a peer can wait on it."""
        return self.max_chi * self.device_ms / 1000.0 if self.compute == "emulated" else 0.0

    def default_timeout_s(self) -> float:
        """Minutes, sized to the work: 120 s, or ten of the longest emulated waits if that is more;
        measured: 300 s (a CPU iteration of the measured model takes well under a second at chi = 1)."""
        if self.compute == "measured":
            return 300.0
        return float(min(TIMEOUT_MAX_S, max(120.0, math.ceil(10 * self.longest_wait_s()))))

    def cases(self, chi: float, seed: int) -> list[tuple[str, float, int, int | None]]:
        """``(mode, chi, seed, λ)`` to train for one chi and seed: every mode, then the λ sweep."""
        sweep = [("semi", chi, seed, lam) for lam in self.lambdas] if chi != 1.0 else []
        return [(mode, chi, seed, None) for mode in self.modes] + sweep

    def all_cases(self) -> list[tuple[str, float, int, int | None]]:
        """Every case of the sweep, grouped by seed then chi (the order they are trained in)."""
        return [case for seed in self.seeds for chi in self.chis for case in self.cases(chi, seed)]

    def straggler(self, chi: float) -> StragglerConfig:
        """The injected straggler of this pattern at ``chi``, in this compute mode (typed, never a
        spec string: measured — real GEMM time, the straggler's ``scope`` slowed χ-fold; emulated —
        every GEMM sleeps its flops at :meth:`device_flops_per_second`, χ-fold on a straggler).
        ``multi`` scales each rank's factor of ``multi_chis`` by ``chi / 8`` (at least 1)."""
        timing: dict = ({"mode": "measured", "scope": self.scope} if self.compute == "measured"
                        else {"mode": "emulated", "flops_per_second": self.device_flops_per_second()})
        if chi == 1.0:
            return StragglerConfig(pattern="none", **timing)
        if self.pattern == "fixed":
            return StragglerConfig(pattern="fixed", ranks=(self.straggler_rank,), chi=(float(chi),), **timing)
        if self.pattern == "round-robin":
            return StragglerConfig(pattern="round-robin", chi=(float(chi),), **timing)
        factors = self.multi_chis[: self.tp]
        return StragglerConfig(pattern="multi", ranks=tuple(range(len(factors))),
                               chi=tuple(max(1.0, c * chi / 8.0) for c in factors), **timing)

    def resizing(self) -> ResizingConfig:
        """The resizing settings of the balanced modes (the zero-* modes set their own variant)."""
        if self.theta_iter is None:
            return ResizingConfig()
        return ResizingConfig(theta_mode="absolute", theta_iter=self.theta_iter)

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


__all__ = ["BenchConfig", "PATTERNS", "COMPUTES", "MAX_CHI", "DEVICE_MS_MAX", "EMULATED_SIZE", "MEASURED_SIZE"]
