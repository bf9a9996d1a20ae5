"""What one ``semimig bench`` run trains and measures (frozen, validated where it enters): :class:`BenchConfig`.

One run config for both benchmarks of the harness (the 2-D hybrid is a mode of the one training
loop, DESIGN §7, not a second copy):

    allocation None         the TP benchmark: every mode x chi x seed on ``tp x dp`` ranks, a
                            straggler inside each TP group (``pattern``; the paper's Figs. 9-11)
    allocation "even"       the 2-D mode: ``tp x dp`` ranks, TP rank ``t`` of DP group
    allocation "poplar"     ``g`` slowed by ``grid_chis()[g][t]``; even batches, or Poplar's plan
                            across the DP groups (profiled per TP group, re-planned when one moves)

2-D modes (:data:`MODES_2D`; ``even`` compares the first and third), each a
``HybridParallelPlugin(tp_size=tp, zero_stage=z)`` training the bench ViT on digits with the same
global batch sequence:

    baseline      even batches, Colossal-AI's policy, stragglers injected by the baseline hooks
    poplar        Poplar's batch plan across the DP groups (profiled per TP group), re-planned
    semi          even batches, the SEMI controller in every TP group
    poplar+semi   both: the groups' speeds are profiled after SEMI balanced them

2-D speed pattern: ``group_chis[g][t]`` is the slowdown of TP rank ``t`` of DP group ``g``; empty,
the default: group 1 at half speed (all its ranks χ = 2) and rank 1 of group 0 at χ = 4.

A field only one mode reads (TP: ``chis``, ``pattern``, ``straggler_rank``, ``scope``,
``multi_chis``, ``lambdas``, ``theta_iter``; 2-D: ``zero_stage``, ``precision``, ``group_chis``,
``settle_iters``, ``profile_batches``, ``profile_repeats``, ``replan``, ``straggler_until``) must keep
its default in the other: a setting the run would ignore is refused, never dropped in silence.  Five
shared fields default per mode (``None``, resolved where the config is built): ``modes`` (TP: all of
:data:`MODES`; 2-D: the allocation's), ``seeds`` ((0, 1, 2); (0,)), ``dp`` (1; 2), ``epochs`` (4; 2)
and ``iters_per_epoch`` (25; 10).  :meth:`BenchConfig.settings` is what a results file saves: the
mode's own fields only, so files of either mode written before the merge still resume and merge.

Compute modes (``compute``):

    emulated  every rank's linear GEMMs take ``chi * flops / rate`` seconds of sleep, the rate set so
              that one rank's GEMMs take ``device_ms`` per iteration at chi = 1 (the host compute is
              small beside it).  Ranks that sleep do not compete for cores, so 4 ranks run on 2.
    measured  nothing is modelled but the straggler: each rank runs its real GEMMs on one thread and
              its busy time is the measured time of the work it did; a straggler sleeps
              ``(chi - 1) x`` its own measured GEMM time (the paper's method).  Needs one core per
              rank; ``--device cuda`` is always measured.

Bounds, and why:

- ``chi <= 100`` (:data:`semimig.straggler.injection.MAX_CHI`, the injector's own bound; also each
  ``group_chis`` entry): the paper sweeps chi <= 8; balancing can hide at most chi = 1 / (1 - gamma_max)
  = 10 at gamma_max = 0.9; beyond 100 a rank is dead, not slow, and the baseline case would take 100x
  its chi = 1 time (chi = 1e6 "slept for ever").
- ``device_ms <= 10000``: ten seconds of emulated GEMM per iteration already makes one case of the
  default 100 iterations last 17 minutes; larger values are typos.
- The collective timeout must outlast the longest wait a rank can cause: the slowest rank's emulated
  GEMM time of one iteration, ``max chi * device_ms``; a timeout shorter than that is refused.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional

from semimig._validate import check_bool, check_choice, check_int, check_number
from semimig.bench.choices import MODES_2D, RESHARD_MODES
from semimig.models import VitSize
from semimig.controller.runtime import MODES
from semimig.errors import ConfigError
from semimig.hybrid.replan import ReplanConfig
from semimig.resizing.config import ResizingConfig
from semimig.straggler.injection import MAX_CHI, SCOPES, StragglerConfig

PATTERNS = ("fixed", "round-robin", "multi")
COMPUTES = ("emulated", "measured")
DEVICES = ("cpu", "cuda")
PRECISIONS = ("fp32", "bf16")
MODES_BY_ALLOCATION = {"even": ("baseline", "semi"), "poplar": MODES_2D}
"""The 2-D modes each ``allocation`` compares (``even`` has no Poplar plan to show)."""
ALLOCATIONS = tuple(MODES_BY_ALLOCATION)
DEVICE_MS_MAX = 10_000.0
TIMEOUT_MAX_S = 86_400.0
MAX_WORLD = 64
RESHARD_BLOCKS_PER_RANK = 8
"""Mode ``reshard``: MLP blocks per rank of the even plan (:meth:`BenchConfig.reshard_plan`)."""
EMULATED_SIZE = VitSize(hidden=64, layers=2, heads=4, intermediate=256)
"""Emulated mode: the GEMM time is slept, so the model only needs to learn digits."""
MEASURED_SIZE = VitSize(hidden=256, layers=1, heads=4, intermediate=1536)
"""Measured mode: wide enough that the tensor-parallel GEMMs take most of a CPU iteration (each
record's ``busy_share_by_rank`` at chi = 1 is that share, measured), one layer so that the command
line's experiments (18 and 28 cases of 100 iterations) stay under ten minutes on two cores; reaches
~93 % test accuracy in 100 iterations (the 2-layer 256x1024 model: the same accuracy at twice the
time per iteration)."""

TP_SETTINGS = ("modes", "chis", "seeds", "tp", "dp", "pattern", "straggler_rank", "scope", "multi_chis", "lambdas",
               "epochs", "iters_per_epoch", "batch", "lr", "compute", "device_ms", "device", "theta_iter",
               "warmup_iters", "evaluate", "timeout_s", "size")
"""The fields the TP benchmark reads: what its results file saves (in this order)."""
GRID_SETTINGS = ("tp", "dp", "zero_stage", "precision", "modes", "seeds", "group_chis", "compute", "device_ms",
                 "batch", "epochs", "iters_per_epoch", "warmup_iters", "lr", "settle_iters", "profile_batches",
                 "profile_repeats", "replan", "straggler_until", "size", "allocation", "timeout_s", "device",
                 "evaluate")
"""The fields the 2-D mode reads: what its results file saves (in the order files written before the merge have)."""


def mode_defaults(allocation: Optional[str]) -> dict:
    """What a ``None`` of the shared fields that default per mode becomes: the TP benchmark's (``allocation``
    None) or the 2-D mode's (a short run of the allocation's modes on two DP groups)."""
    if allocation is None:
        return {"modes": MODES, "seeds": (0, 1, 2), "dp": 1, "epochs": 4, "iters_per_epoch": 25}
    return {"modes": MODES_BY_ALLOCATION[allocation], "seeds": (0,), "dp": 2, "epochs": 2, "iters_per_epoch": 10}


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


def _is_sequence(value) -> bool:
    return isinstance(value, (tuple, list)) and not isinstance(value, (str, bytes))


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """One ``semimig bench`` run: the TP benchmark or, with ``allocation``, the 2-D mode (module docstring)."""

    allocation: Optional[str] = None
    """``None``: the TP benchmark.  ``even`` or ``poplar``: the 2-D mode, even batches or Poplar's plan
    across the DP groups (:data:`MODES_BY_ALLOCATION`: the modes each compares)."""

    # ------------------------------------------------------------------ both modes
    modes: Optional[tuple[str, ...]] = None
    """Balancing modes (``baseline`` = Colossal-AI's own layers with the same injection; TP also
    ``reshard``, uneven shards re-planned for the slow rank); ``None``: every mode of the run's kind
    but ``reshard`` (:data:`MODES`; 2-D: ``MODES_BY_ALLOCATION[allocation]``)."""
    seeds: Optional[tuple[int, ...]] = None
    """Seeds of the model and the data order, each in [0, 2**32); ``None``: (0, 1, 2), 2-D (0,)."""
    tp: int = 2
    """Ranks of a tensor-parallel group, in [1, 64]; the ViT's hidden, intermediate and heads divide by it."""
    dp: Optional[int] = None
    """Data-parallel groups, ``tp * dp <= 64`` ranks; ``None``: 1, 2-D 2 (the least Poplar splits over)."""
    epochs: Optional[int] = None
    """Epochs of ``iters_per_epoch`` iterations, in [1, 10000]; ``None``: 4, 2-D 2."""
    iters_per_epoch: Optional[int] = None
    """Iterations per epoch, in [1, 100000]; ``None``: 25, 2-D 10."""
    batch: int = 64
    """Samples per DP group per iteration (2-D: of the even split), the global batch ``batch * dp <= 1000``
    (digits has 1347 training images); 2-D needs >= 2, since Poplar profiles at ``batch // 2`` and ``batch``."""
    lr: float = 1e-3
    """Peak learning rate of the one-cycle schedule (AdamW) over ``epochs * iters_per_epoch``, in (0, 1]."""
    compute: str = "emulated"
    """``emulated`` or ``measured`` (module docstring); ``device="cuda"`` needs ``measured``."""
    device_ms: float = 60.0
    """Emulated mode: device time of one rank's linear GEMMs per iteration at chi = 1 (ms; 2-D: at the even
    batch), in (0, 10000]."""
    device: str = "cpu"
    """``cpu``: gloo ranks.  ``cuda``: one NCCL rank per GPU, real device time (measured; TP benchmark only)."""
    warmup_iters: int = 3
    """Iterations left out of the timing (pretest, first plans); at least one iteration stays timed."""
    evaluate: bool = True
    """Measure test accuracy after training; ``False`` (``--quick``) reports time only, since a few
    dozen iterations leave the model at chance and an accuracy column would show noise."""
    timeout_s: Optional[float] = None
    """Collective timeout of every process group (seconds): a frozen or dead rank ends the run
    within it.  ``None``: sized to the work (:meth:`default_timeout_s`)."""
    size: Optional[VitSize] = None
    """The ViT; ``None``: :data:`EMULATED_SIZE` or :data:`MEASURED_SIZE` by ``compute``."""

    # ------------------------------------------------------------------ the TP benchmark only
    chis: tuple[float, ...] = (1.0, 4.0, 8.0)
    """Slowdown factors of the straggler(s), each in [1, 100]; ``multi`` scales its per-rank
    factors by chi/8."""
    pattern: str = "fixed"
    """``fixed`` (rank ``straggler_rank``), ``round-robin`` (rank = epoch % tp, paper) or
    ``multi`` (ranks 0..tp-1 with factors ``multi_chis``, paper Fig. 11)."""
    straggler_rank: int = 1
    """Pattern ``fixed``: the straggler's TP rank, in [0, tp) (the other patterns ignore it; at most 63, a
    rank of the largest group)."""
    scope: str = "gemm"
    """What of a straggler is slow: ``gemm`` (its linear GEMMs, the paper's method) or ``device``
    (all of its work between collectives, :mod:`semimig.straggler.device`; measured compute only)."""
    multi_chis: tuple[float, ...] = (8.0, 6.0, 4.0, 2.0)
    """Pattern ``multi``: rank r's slowdown at chi = 8 (scaled by chi/8, at least 1); entries
    beyond ``tp`` are unused, missing ranks are not slowed."""
    lambdas: tuple[int, ...] = ()
    """λ sweep (paper Fig. 11, pattern ``multi``): besides ``modes``, train ``semi`` with exactly
    λ migrating stragglers (the rest resize) at every chi > 1, for each λ listed."""
    theta_iter: Optional[float] = None
    """PriDiff's threshold, read by the ``zero-pridiff-*`` modes: ``None`` keeps
    :class:`ResizingConfig`'s default (a threshold relative to each layer's median column change);
    a number selects the paper's absolute threshold ``iters_per_epoch * theta_iter``."""

    # ------------------------------------------------------------------ the 2-D mode only
    zero_stage: int = 0
    """``HybridParallelPlugin``'s ZeRO stage: 0, 1 or 2 (2 runs Poplar's lockstep plan)."""
    precision: str = "fp32"
    """``fp32`` or ``bf16``; Colossal-AI runs ZeRO (stage 1, 2) only in fp16/bf16."""
    group_chis: tuple[tuple[float, ...], ...] = ()
    """Per DP group, per TP rank slowdown in [1, 100] (``dp`` rows of ``tp``); empty for the default
    pattern (module docstring, :meth:`grid_chis`)."""
    settle_iters: int = 8
    """Modes with SEMI: untimed forward/backward passes at the even batch before profiling, so the
    profile sees each group after SEMI balanced it; in [0, 10000]."""
    profile_batches: tuple[int, ...] = ()
    """Batch sizes each group is profiled at (Poplar), each in [1, batch * dp]; empty: ``batch // 2`` and
    ``batch`` (:meth:`profile_sizes`)."""
    profile_repeats: int = 2
    """Timed passes per profiled batch size, in [1, 100]."""
    replan: ReplanConfig = field(default_factory=ReplanConfig)
    """When the batch plan is recomputed (:class:`semimig.hybrid.ReplanConfig`)."""
    straggler_until: Optional[int] = None
    """When set (>= 1), the slowdowns of ``group_chis`` apply only to iterations before it and every rank
    runs at χ = 1 after (stragglers that leave, to show re-planning); each group's slowed ranks
    must then share one χ.  Iterations count the busy source's steps (SEMI: the controller's,
    profiling passes included)."""

    def __post_init__(self) -> None:
        check_choice("allocation", self.allocation, (None, *ALLOCATIONS))
        grid = self.allocation is not None
        for name, default in mode_defaults(self.allocation).items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
        self._check_shared(grid)
        self._check_tp_fields()
        self._check_grid_fields()
        if grid:
            self._check_grid_mode()
        else:
            self._check_tp_mode()
        self._check_timeout()

    # ------------------------------------------------------------------ checks
    def _check_shared(self, grid: bool) -> None:
        modes = MODES_BY_ALLOCATION[self.allocation] if grid else MODES + RESHARD_MODES
        object.__setattr__(self, "modes", _check_sweep("modes", self.modes, lambda n, v: check_choice(n, v, modes)))
        chis = _check_sweep("chis", self.chis, lambda n, v: check_number(n, v, minimum=1.0, maximum=MAX_CHI))
        object.__setattr__(self, "chis", tuple(float(c) for c in chis))  # a TP axis: checked with the others
        object.__setattr__(self, "seeds", _check_sweep(
            "seeds", self.seeds, lambda n, v: check_int(n, v, minimum=0, maximum=2**32 - 1)))
        check_int("tp", self.tp, minimum=1, maximum=MAX_WORLD)
        check_int("dp", self.dp, minimum=1, maximum=MAX_WORLD)
        if self.tp * self.dp > MAX_WORLD:
            raise ConfigError(f"tp*dp = {self.tp * self.dp} ranks exceeds {MAX_WORLD}")
        check_choice("compute", self.compute, COMPUTES)
        check_choice("device", self.device, DEVICES)
        for name, maximum in (("epochs", 10_000), ("iters_per_epoch", 100_000), ("warmup_iters", 100_000)):
            check_int(name, getattr(self, name), minimum=0 if name == "warmup_iters" else 1, maximum=maximum)
        check_int("batch", self.batch, minimum=2 if grid else 1, maximum=1000)
        check_number("lr", self.lr, minimum=0.0, maximum=1.0, low_open=True)
        check_number("device_ms", self.device_ms, minimum=0.0, maximum=DEVICE_MS_MAX, low_open=True)
        check_bool("evaluate", self.evaluate)
        if self.size is None:
            object.__setattr__(self, "size", MEASURED_SIZE if self.compute == "measured" else EMULATED_SIZE)
        if not isinstance(self.size, VitSize):
            raise ConfigError(f"size must be a VitSize, got {self.size!r}")
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

    def _check_tp_fields(self) -> None:
        """Each TP-only field by itself (its type and range; ``chis`` with the other sweep axes); how they go
        together: :meth:`_check_tp_mode`."""
        check_choice("pattern", self.pattern, PATTERNS)
        check_int("straggler_rank", self.straggler_rank, minimum=0, maximum=MAX_WORLD - 1)
        check_choice("scope", self.scope, SCOPES)
        if not _is_sequence(self.multi_chis):
            raise ConfigError(f"multi_chis must be a non-empty tuple of per-rank slowdowns, got {self.multi_chis!r}")
        for i, chi in enumerate(self.multi_chis):  # per rank: repeats are fine (two ranks at chi 4)
            check_number(f"multi_chis[{i}]", chi, minimum=1.0, maximum=MAX_CHI)
        object.__setattr__(self, "multi_chis", tuple(float(c) for c in self.multi_chis))
        if not _is_sequence(self.lambdas):
            raise ConfigError(f"lambdas must be a tuple of ints, got {self.lambdas!r}")
        object.__setattr__(self, "lambdas", () if not self.lambdas else _check_sweep(
            "lambdas", self.lambdas, lambda n, v: check_int(n, v, minimum=0, maximum=MAX_WORLD - 1)))
        check_number("theta_iter", self.theta_iter, minimum=0.0, allow_none=True)

    def _check_grid_fields(self) -> None:
        """Each 2-D-only field by itself (its type and range); how they go together: :meth:`_check_grid_mode`."""
        check_choice("zero_stage", self.zero_stage, (0, 1, 2))
        check_choice("precision", self.precision, PRECISIONS)
        if not _is_sequence(self.group_chis) or not all(_is_sequence(row) for row in self.group_chis):
            raise ConfigError(f"group_chis must be a tuple of per-group tuples of slowdowns, got {self.group_chis!r}")
        for row in self.group_chis:
            for chi in row:
                check_number("group_chis", chi, minimum=1.0, maximum=MAX_CHI)
        object.__setattr__(self, "group_chis", tuple(tuple(float(c) for c in row) for row in self.group_chis))
        check_int("settle_iters", self.settle_iters, minimum=0, maximum=10_000)
        if not _is_sequence(self.profile_batches):
            raise ConfigError(f"profile_batches must be a tuple of batch sizes, got {self.profile_batches!r}")
        for b in self.profile_batches:
            check_int("profile_batches", b, minimum=1, maximum=self.batch * self.dp)
        object.__setattr__(self, "profile_batches", tuple(int(b) for b in self.profile_batches))
        check_int("profile_repeats", self.profile_repeats, minimum=1, maximum=100)
        if not isinstance(self.replan, ReplanConfig):
            raise ConfigError(f"replan must be a ReplanConfig, got {self.replan!r}")
        check_int("straggler_until", self.straggler_until, minimum=1, allow_none=True)

    def _keep_defaults(self, names, why: str) -> None:
        """Refuse any of ``names`` (fields the other mode reads) that is not at its default, saying ``why``."""
        defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                    for f in dataclasses.fields(self)}
        for name in names:
            if getattr(self, name) != defaults[name]:
                raise ConfigError(f"{name}={getattr(self, name)!r} {why}")

    def _check_tp_mode(self) -> None:
        self._keep_defaults((n for n in GRID_SETTINGS if n not in TP_SETTINGS and n != "allocation"),
                            "is read by the 2-D mode only: give allocation 'even' or 'poplar' (the TP benchmark "
                            "would ignore it)")
        if self.scope == "device" and self.compute != "measured":
            raise ConfigError("scope 'device' slows a rank's real work between collectives: compute must be "
                              f"'measured', got {self.compute!r}")
        if self.device == "cuda" and self.compute != "measured":
            raise ConfigError("device 'cuda' measures real device time: compute must be 'measured', "
                              f"got {self.compute!r}")
        if self.pattern == "fixed" and self.straggler_rank >= self.tp:
            raise ConfigError(f"straggler_rank={self.straggler_rank} is outside the TP group of size {self.tp}")
        if self.tp < 2 and self.pattern != "fixed":
            raise ConfigError(f"pattern {self.pattern!r} needs tp >= 2, got tp={self.tp}")
        if self.pattern == "multi" and not self.multi_chis:
            raise ConfigError(f"multi_chis must be a non-empty tuple of per-rank slowdowns, got {self.multi_chis!r}")
        if "reshard" in self.modes:
            self.reshard_plan()  # a ConfigError naming the size or tp that cannot be re-planned
        if self.lambdas:
            _check_sweep("lambdas", self.lambdas, lambda n, v: check_int(n, v, minimum=0, maximum=self.tp - 1))
            if self.pattern != "multi":
                raise ConfigError(f"a lambda sweep needs several stragglers (pattern 'multi'), got pattern "
                                  f"{self.pattern!r}")

    def _check_grid_mode(self) -> None:
        self._keep_defaults((n for n in TP_SETTINGS if n not in GRID_SETTINGS),
                            f"is read by the TP benchmark only, not by the 2-D mode (allocation {self.allocation!r}; "
                            "its slowdowns are group_chis)")
        if self.device != "cpu":
            raise ConfigError(f"device={self.device!r}: the 2-D mode (allocation {self.allocation!r}) trains on CPU "
                              "ranks only")
        if self.zero_stage > 0 and self.precision == "fp32":
            raise ConfigError(f"zero_stage={self.zero_stage} needs precision 'bf16': Colossal-AI's "
                              "HybridParallelPlugin runs ZeRO only in fp16/bf16")
        if self.group_chis and (len(self.group_chis) != self.dp or any(len(row) != self.tp for row in self.group_chis)):
            raise ConfigError(f"group_chis needs dp={self.dp} rows of tp={self.tp} slowdowns, got {self.group_chis!r}")
        if self.straggler_until is not None:
            for g, row in enumerate(self.grid_chis()):
                if len({c for c in row if c != 1.0}) > 1:
                    raise ConfigError(f"straggler_until needs one slowdown per group, group {g} has {row}")

    def _check_timeout(self) -> None:
        if self.timeout_s is None:
            object.__setattr__(self, "timeout_s", self.default_timeout_s())
        check_number("timeout_s", self.timeout_s, minimum=1.0, maximum=TIMEOUT_MAX_S)
        if self.compute != "emulated" or self.longest_wait_s() < self.timeout_s:
            return
        if self.allocation is not None:
            raise ConfigError(f"timeout_s={self.timeout_s:g} is shorter than the slowest rank's emulated GEMM time "
                              f"per iteration ({self.longest_wait_s():g} s): raise --timeout-s")
        raise ConfigError(f"timeout_s={self.timeout_s:g} is shorter than the straggler's emulated GEMM time per "
                          f"iteration (chi {self.max_chi:g} x device_ms {self.device_ms:g} = "
                          f"{self.longest_wait_s():g} s): raise --timeout-s or lower --chi / --device-ms")

    # ------------------------------------------------------------------ derived: both modes
    def settings(self) -> dict:
        """The fields this mode reads, as JSON-ready values: what its results file saves and ``--resume``
        compares (:data:`TP_SETTINGS` or :data:`GRID_SETTINGS`)."""
        values = dataclasses.asdict(self)
        return {name: values[name] for name in (TP_SETTINGS if self.allocation is None else GRID_SETTINGS)}

    @property
    def world(self) -> int:
        return self.tp * self.dp

    @property
    def global_batch_size(self) -> int:
        """Samples per iteration over all DP groups."""
        return self.batch * self.dp

    @property
    def max_chi(self) -> float:
        """The largest slowdown any rank gets in this run."""
        if self.allocation is not None:
            return max(max(row) for row in self.grid_chis())
        multi = max(self.multi_chis[: self.tp], default=1.0) / 8.0 if self.pattern == "multi" else 1.0
        return max(max(self.chis), max(self.chis) * multi)

    def longest_wait_s(self) -> float:
        """Emulated mode: the slowest rank's GEMM time of one iteration, the longest a peer can wait on it."""
        return self.max_chi * self.device_ms / 1000.0 if self.compute == "emulated" else 0.0

    def default_timeout_s(self) -> float:
        """Minutes, sized to the work: 120 s, or ten of the longest emulated waits if that is more;
        measured: 300 s (a CPU iteration of the measured model takes well under a second at chi = 1)."""
        if self.compute == "measured":
            return 300.0
        return float(min(TIMEOUT_MAX_S, max(120.0, math.ceil(10 * self.longest_wait_s()))))

    def all_cases(self) -> list[tuple[str, Optional[float], int, Optional[int]]]:
        """Every case of the run as ``(mode, chi, seed, λ)``, in the order they are trained: TP, grouped by
        seed then chi (:meth:`cases`); 2-D, ``(mode, None, seed, None)`` with one seed's modes side by side."""
        if self.allocation is not None:
            return [(mode, None, seed, None) for seed in self.seeds for mode in self.modes]
        return [case for seed in self.seeds for chi in self.chis for case in self.cases(chi, seed)]

    @property
    def tokens(self) -> int:
        """Tokens per batch (2-D: per even batch), the ``M`` of every GEMM: patches of the 8x8 image plus CLS."""
        return self.batch * ((8 // self.size.patch) ** 2 + 1)

    def gemm_flops_per_rank(self) -> float:
        """FLOPs of one rank's tensor-parallel linear GEMMs per iteration (forward + 2 backward)."""
        h, i = self.size.hidden, self.size.intermediate
        per_layer = 2 * self.tokens * (4 * h * h + 2 * h * i) / self.tp
        return 3 * per_layer * self.size.layers

    def device_flops_per_second(self) -> float:
        """The emulated device rate that makes one iteration's GEMMs take ``device_ms``."""
        return self.gemm_flops_per_rank() / (self.device_ms / 1000.0)

    # ------------------------------------------------------------------ derived: the TP benchmark
    def cases(self, chi: float, seed: int) -> list[tuple[str, float, int, int | None]]:
        """TP: ``(mode, chi, seed, λ)`` to train for one chi and seed: every mode, then the λ sweep."""
        sweep = [("semi", chi, seed, lam) for lam in self.lambdas] if chi != 1.0 else []
        return [(mode, chi, seed, None) for mode in self.modes] + sweep

    def straggler(self, chi: float) -> StragglerConfig:
        """TP: the injected straggler of this pattern at ``chi``, in this compute mode (typed, never a
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

    def reshard_plan(self):
        """TP mode ``reshard``: the even plan in units the ViT is built with so that it can re-plan
        (:class:`~semimig.shardformer.UnevenPlan`): its heads as KV groups (``heads / tp`` each) and
        the MLP intermediate in :data:`RESHARD_BLOCKS_PER_RANK` blocks per rank, so a plan can move
        an eighth of a rank's MLP at a time; :class:`ConfigError` naming the value that does not fit."""
        from semimig.shardformer import UnevenPlan

        s, blocks = self.size, RESHARD_BLOCKS_PER_RANK * self.tp
        if self.tp < 2:
            raise ConfigError(f"mode 'reshard' moves shards between tensor-parallel ranks: tp must be >= 2, "
                              f"got tp={self.tp}")
        if s.intermediate % blocks:
            raise ConfigError(f"mode 'reshard' cuts the MLP intermediate size into {RESHARD_BLOCKS_PER_RANK} blocks "
                              f"per rank: intermediate={s.intermediate} is not divisible by {blocks} (tp={self.tp})")
        return UnevenPlan(mlp_units=(RESHARD_BLOCKS_PER_RANK,) * self.tp, kv_units=(s.heads // self.tp,) * self.tp,
                          block_size=s.intermediate // blocks)

    def resizing(self) -> ResizingConfig:
        """TP: the resizing settings of the balanced modes (the zero-* modes set their own variant)."""
        if self.theta_iter is None:
            return ResizingConfig()
        return ResizingConfig(theta_mode="absolute", theta_iter=self.theta_iter)

    # ------------------------------------------------------------------ derived: the 2-D mode
    def grid_chis(self) -> tuple[tuple[float, ...], ...]:
        """2-D: the slowdown of every TP rank of every DP group, ``[dp][tp]``: ``group_chis``, or the
        default pattern (module docstring)."""
        if self.group_chis:
            return self.group_chis
        rows = [[1.0] * self.tp for _ in range(self.dp)]
        if self.tp > 1:
            rows[0][1] = 4.0
        if self.dp > 1:
            rows[1] = [2.0] * self.tp
        return tuple(tuple(row) for row in rows)

    def profile_sizes(self) -> tuple[int, ...]:
        """2-D: the batch sizes each group is profiled at: ``profile_batches``, or ``batch // 2`` and ``batch``."""
        return self.profile_batches or tuple(sorted({max(1, self.batch // 2), self.batch}))


__all__ = ["BenchConfig", "ALLOCATIONS", "COMPUTES", "DEVICE_MS_MAX", "EMULATED_SIZE", "GRID_SETTINGS", "MAX_CHI",
           "MEASURED_SIZE", "MODES_2D", "MODES_BY_ALLOCATION", "PATTERNS", "PRECISIONS", "RESHARD_BLOCKS_PER_RANK",
           "TP_SETTINGS", "mode_defaults"]
