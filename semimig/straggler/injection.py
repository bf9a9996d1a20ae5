"""Straggler injection: make chosen TP ranks' linear GEMMs ``chi`` times slower.

The paper simulates a straggler by sleeping inside its linear-layer GEMMs.  Here the injected
delay is proportional to the work the GEMM actually did, so a pruned GEMM is delayed less::

    measured mode : delay = (chi - 1) * t_gemm                 t_gemm measured wall time
    flops mode    : delay = (chi - 1) * flops / flops_per_second   deterministic, calibrated rate
    emulated mode : delay = chi * flops / flops_per_second         every rank, stragglers or not

``emulated`` makes *every* rank's GEMMs take the time of a nominal device of
``flops_per_second`` (a straggler ``chi`` times that), on top of the small real host compute.
CPU benchmarks use it: sleeping ranks do not compete for the machine's few cores, just as GPUs
do not, so the structure of a GPU iteration (compute on each device, waits in collectives) is
reproduced on a 2-core machine with 4 ranks.

A GEMM that took ``t_gemm`` therefore occupies the rank for ``chi * t_gemm`` (measured mode),
exactly what a ``chi`` times slower device would need.  On CPU the delay is ``time.sleep``; on
CUDA it is a device-side spin (``torch.cuda._sleep``) enqueued on the current stream, so it sits
on the stream like real slow compute and later kernels queue behind it.  (The CPU sleep spins its
last 0.2 ms, since ``time.sleep`` alone overshoots by ~0.1 ms.)

Patterns (who straggles when; ``epoch`` and the global ``iteration`` come from
:meth:`StragglerInjector.set_position`):

    none        nobody
    fixed       the listed ranks, always, all with the same chi
    round-robin rank ``epoch % group_size``, one straggler at a time (paper, Sec. V)
    multi       several ranks, each with its own chi (paper Fig. 11)
    burst       the listed ranks, during iterations with ``iteration % burst_every < burst_length``

Compact CLI grammar (:meth:`StragglerConfig.from_cli`), segments separated by ``:``::

    none
    fixed:<ranks>:<chi>              fixed:1:4          fixed:1,3:2.5
    round-robin:<chi>                round-robin:8
    multi:<rank>=<chi>,...           multi:0=8,1=6,2=4,3=2
    burst:<ranks>:<chi>:every=<n>:len=<m>   burst:1:4:every=10:len=3

followed on any pattern by optional ``key=value`` segments: ``mode=measured|flops`` and
``flops=<rate in FLOP/s>`` (required by ``mode=flops``), e.g. ``fixed:1:4:mode=flops:flops=2e10``,
and ``scope=gemm|device``.

Scope (what of the straggler is slow):

    gemm    only its semimig / Colossal-AI linear GEMMs (the paper's method; the default)
    device  all of its work: every span between two collectives takes chi times as long,
            communication unchanged (:mod:`semimig.straggler.device`), e.g. ``fixed:1:4:scope=device``.
            Measured mode only; composes with every pattern (bursts, round-robin), so a device
            that comes and goes is emulated by ``burst:1:4:every=20:len=5:scope=device``.

Under ``scope=device`` no GEMM is slowed by itself (:meth:`StragglerInjector.delay_for` is 0): the
sleep comes before the next collective and covers the GEMM too; the busy time the controller sees
for a GEMM of wall time ``t`` is ``chi · t`` (:meth:`StragglerInjector.charged_s`), what a real
``chi`` times slower device would show.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from semimig._validate import check_int, is_int, is_number
from semimig.errors import ConfigError

__all__ = [
    "PATTERNS",
    "MODES",
    "SCOPES",
    "MAX_CHI",
    "StragglerConfig",
    "StragglerInjector",
    "calibrate_flops_per_second",
    "calibrate_cuda_sleep_rate",
]

logger = logging.getLogger(__name__)

Pattern = Literal["none", "fixed", "round-robin", "multi", "burst"]
Mode = Literal["measured", "flops", "emulated"]
Scope = Literal["gemm", "device"]
PATTERNS: tuple[str, ...] = ("none", "fixed", "round-robin", "multi", "burst")
MODES: tuple[str, ...] = ("measured", "flops", "emulated")
SCOPES: tuple[str, ...] = ("gemm", "device")
_OPTION_KEYS: tuple[str, ...] = ("every", "len", "mode", "flops", "scope")
MAX_CHI = 100.0
"""Largest slowdown factor: beyond it an injected straggler sleeps for minutes per iteration of any
real model (the paper's experiments go to 8), which is a typo rather than an experiment."""


@dataclass(frozen=True, kw_only=True)
class StragglerConfig:
    """Who straggles, how much, and how the delay is computed."""

    pattern: Pattern = "none"
    """One of ``PATTERNS`` (see the module docstring)."""
    ranks: tuple[int, ...] = ()
    """TP-group ranks that straggle (fixed, multi, burst); empty for none and round-robin."""
    chi: tuple[float, ...] = ()
    """Slowdown factors >= 1: one per rank for multi, exactly one otherwise (empty for none)."""
    mode: Mode = "measured"
    """``measured``: delay = (chi-1) * measured GEMM time; ``flops``: (chi-1) * flops / rate."""
    flops_per_second: Optional[float] = None
    """Calibrated GEMM rate for ``mode="flops"`` (see :func:`calibrate_flops_per_second`)."""
    burst_every: Optional[int] = None
    """Burst period in iterations (burst only)."""
    burst_length: Optional[int] = None
    """Iterations at the start of each period during which the ranks straggle (burst only)."""
    scope: Scope = "gemm"
    """``gemm``: only the linear GEMMs are slow (the paper's method); ``device``: all of the rank's
    work between collectives (:mod:`semimig.straggler.device`).  Measured mode only."""

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS:
            raise ConfigError(f"pattern must be one of {PATTERNS}, got {self.pattern!r}")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.scope not in SCOPES:
            raise ConfigError(f"scope must be one of {SCOPES}, got {self.scope!r}")
        if self.scope == "device" and self.mode != "measured":
            raise ConfigError(f"scope='device' slows all measured work of a rank and needs mode='measured', "
                              f"got mode={self.mode!r}")
        if not isinstance(self.ranks, tuple) or not all(is_int(r) and r >= 0 for r in self.ranks):
            raise ConfigError(f"ranks must be a tuple of ints >= 0, got {self.ranks!r}")
        if len(set(self.ranks)) != len(self.ranks):
            raise ConfigError(f"ranks must not repeat, got {self.ranks!r}")
        if not isinstance(self.chi, tuple):
            raise ConfigError(f"chi must be a tuple of floats in [1, {MAX_CHI:g}], got {self.chi!r}")
        for c in self.chi:
            if not is_number(c) or not 1 <= c <= MAX_CHI:
                raise ConfigError(f"chi must be a tuple of finite floats in [1, {MAX_CHI:g}], got {self.chi!r}")
        self._check_pattern_fields()
        if self.mode in ("flops", "emulated"):
            rate = self.flops_per_second
            if rate is None or not (is_number(rate) and 1.0 <= rate <= 1e18):
                raise ConfigError(f"flops_per_second must be a finite number in [1, 1e18] FLOP/s for "
                                  f"mode={self.mode!r}, got {rate!r}")
        elif self.flops_per_second is not None:  # measured mode times real GEMMs: a rate would go unused
            raise ConfigError(f"straggler spec {self.to_cli()!r}: flops={self.flops_per_second!r} is used only by "
                              f"mode=flops or mode=emulated, not mode={self.mode}; drop flops= or add mode=flops")

    def _check_pattern_fields(self) -> None:
        p = self.pattern
        if p == "none":
            if self.ranks or self.chi:
                raise ConfigError(f"pattern 'none' takes no ranks or chi, got ranks={self.ranks!r} chi={self.chi!r}")
        elif p == "round-robin":
            if self.ranks:
                raise ConfigError(f"pattern 'round-robin' picks rank epoch % group_size itself, got ranks={self.ranks!r}")
            if len(self.chi) != 1:
                raise ConfigError(f"pattern 'round-robin' needs exactly one chi, got chi={self.chi!r}")
        elif p == "multi":
            if not self.ranks or len(self.chi) != len(self.ranks):
                raise ConfigError(
                    f"pattern 'multi' needs one chi per rank, got ranks={self.ranks!r} chi={self.chi!r}"
                )
        else:  # fixed, burst
            if not self.ranks:
                raise ConfigError(f"pattern {p!r} needs at least one rank, got ranks={self.ranks!r}")
            if len(self.chi) != 1:
                raise ConfigError(f"pattern {p!r} needs exactly one chi, got chi={self.chi!r}")
        if p == "burst":
            if not (is_int(self.burst_every) and self.burst_every >= 1):
                raise ConfigError(f"burst_every must be an int >= 1 for pattern 'burst', got {self.burst_every!r}")
            if not (is_int(self.burst_length) and 1 <= self.burst_length <= self.burst_every):
                raise ConfigError(
                    f"burst_length must be an int in [1, burst_every={self.burst_every}], got {self.burst_length!r}"
                )
        elif self.burst_every is not None or self.burst_length is not None:
            raise ConfigError(
                f"burst_every/burst_length only apply to pattern 'burst', got pattern={p!r} "
                f"burst_every={self.burst_every!r} burst_length={self.burst_length!r}"
            )

    # ------------------------------------------------------------------ schedule
    def chi_for(self, *, group_rank: int, group_size: int, epoch: int, iteration: int) -> float:
        """Slowdown factor of ``group_rank`` at (``epoch``, global ``iteration``); 1.0 if not straggling."""
        p = self.pattern
        if p == "none":
            return 1.0
        if p == "round-robin":
            return float(self.chi[0]) if epoch % group_size == group_rank else 1.0
        if p == "burst" and iteration % self.burst_every >= self.burst_length:
            return 1.0
        if group_rank not in self.ranks:
            return 1.0
        if p == "multi":
            return float(self.chi[self.ranks.index(group_rank)])
        return float(self.chi[0])

    # ------------------------------------------------------------------ CLI
    @classmethod
    def from_cli(cls, spec: str) -> "StragglerConfig":
        """Parse the compact grammar of the module docstring; errors name the bad token."""
        if not isinstance(spec, str) or not spec.strip():
            raise ConfigError(f"straggler spec must be a non-empty string, got {spec!r}")
        head, *segments = [s.strip() for s in spec.strip().split(":")]
        if head not in PATTERNS:
            raise ConfigError(f"unknown straggler pattern {head!r} in spec {spec!r}; expected one of {PATTERNS}")
        positional: list[str] = []
        options: dict[str, str] = {}
        for seg in segments:
            key, eq, value = seg.partition("=")
            if eq and key.isalpha():
                if key not in _OPTION_KEYS:
                    raise ConfigError(f"unknown option {key!r} in straggler spec {spec!r}; expected one of {_OPTION_KEYS}")
                if key in options:
                    raise ConfigError(f"option {key!r} given twice in straggler spec {spec!r}")
                options[key] = value
            elif options:
                raise ConfigError(f"positional token {seg!r} after options in straggler spec {spec!r}")
            else:
                positional.append(seg)

        expected = {"none": 0, "fixed": 2, "round-robin": 1, "multi": 1, "burst": 2}[head]
        usage = {
            "none": "none",
            "fixed": "fixed:<ranks>:<chi>",
            "round-robin": "round-robin:<chi>",
            "multi": "multi:<rank>=<chi>,...",
            "burst": "burst:<ranks>:<chi>:every=<n>:len=<m>",
        }[head]
        if len(positional) != expected:
            raise ConfigError(
                f"straggler spec {spec!r} has {len(positional)} positional token(s) {positional!r}; "
                f"expected {usage}"
            )
        kwargs: dict[str, object] = {"pattern": head}
        if head in ("fixed", "burst"):
            kwargs["ranks"] = tuple(_parse_int(t, "rank", spec) for t in positional[0].split(","))
            kwargs["chi"] = (_parse_float(positional[1], "chi", spec),)
        elif head == "round-robin":
            kwargs["chi"] = (_parse_float(positional[0], "chi", spec),)
        elif head == "multi":
            ranks, chis = [], []
            for pair in positional[0].split(","):
                rank_s, eq, chi_s = pair.partition("=")
                if not eq:
                    raise ConfigError(f"bad token {pair!r} in straggler spec {spec!r}; expected <rank>=<chi>")
                ranks.append(_parse_int(rank_s, "rank", spec))
                chis.append(_parse_float(chi_s, "chi", spec))
            kwargs["ranks"], kwargs["chi"] = tuple(ranks), tuple(chis)
        if "every" in options:
            kwargs["burst_every"] = _parse_int(options["every"], "every", spec)
        if "len" in options:
            kwargs["burst_length"] = _parse_int(options["len"], "len", spec)
        if "mode" in options:
            kwargs["mode"] = options["mode"]
        if "flops" in options:
            kwargs["flops_per_second"] = _parse_float(options["flops"], "flops", spec)
        if "scope" in options:
            kwargs["scope"] = options["scope"]
        return cls(**kwargs)  # type: ignore[arg-type]

    def to_cli(self) -> str:
        """The compact spec that :meth:`from_cli` parses back into an equal config."""
        fmt = _format_number
        if self.pattern == "none":
            parts = ["none"]
        elif self.pattern == "round-robin":
            parts = ["round-robin", fmt(self.chi[0])]
        elif self.pattern == "multi":
            parts = ["multi", ",".join(f"{r}={fmt(c)}" for r, c in zip(self.ranks, self.chi))]
        else:
            parts = [self.pattern, ",".join(str(r) for r in self.ranks), fmt(self.chi[0])]
        if self.pattern == "burst":
            parts += [f"every={self.burst_every}", f"len={self.burst_length}"]
        if self.mode != "measured":
            parts.append(f"mode={self.mode}")
        if self.flops_per_second is not None:
            parts.append(f"flops={self.flops_per_second!r}")
        if self.scope != "gemm":
            parts.append(f"scope={self.scope}")
        return ":".join(parts)

    def replace(self, **changes: object) -> "StragglerConfig":
        """A validated copy with ``changes`` applied (e.g. a calibrated ``flops_per_second``)."""
        return dataclasses.replace(self, **changes)


def _parse_int(token: str, what: str, spec: str) -> int:
    try:
        return int(token)
    except ValueError:
        raise ConfigError(f"bad {what} {token!r} in straggler spec {spec!r}; expected an integer") from None


def _parse_float(token: str, what: str, spec: str) -> float:
    try:
        value = float(token)
    except ValueError:
        raise ConfigError(f"bad {what} {token!r} in straggler spec {spec!r}; expected a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"bad {what} {token!r} in straggler spec {spec!r}; expected a finite number")
    return value


def _format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class StragglerInjector:
    """Per-rank view of a :class:`StragglerConfig`: current chi, delay size, delay injection."""

    def __init__(self, config: StragglerConfig, group_rank: int, group_size: int) -> None:
        check_int("group_size", group_size, minimum=1)
        check_int("group_rank", group_rank, minimum=0, maximum=group_size - 1)
        bad = [r for r in config.ranks if r >= group_size]
        if bad:
            raise ConfigError(f"straggler ranks {bad} do not exist in a TP group of size {group_size}")
        self.config = config
        self.group_rank = group_rank
        self.group_size = group_size
        self.epoch = 0
        self.iteration = 0

    def set_position(self, epoch: int, iteration: int) -> None:
        """Tell the injector where training is: ``epoch`` and the global ``iteration`` counter."""
        check_int("epoch", epoch, minimum=0)
        check_int("iteration", iteration, minimum=0)
        self.epoch, self.iteration = epoch, iteration

    def current_chi(self) -> float:
        """This rank's slowdown factor at the current position (1.0: not a straggler now)."""
        return self.config.chi_for(
            group_rank=self.group_rank, group_size=self.group_size, epoch=self.epoch, iteration=self.iteration
        )

    def delay_for(self, elapsed_s: float, flops: float) -> float:
        """Extra seconds for a GEMM that took ``elapsed_s`` and did ``flops`` FLOPs.

        measured: ``(chi - 1) * elapsed_s``; flops: ``(chi - 1) * flops / flops_per_second``;
        emulated: ``chi * flops / flops_per_second`` (also for ranks that do not straggle).
        """
        if not elapsed_s >= 0:
            raise ValueError(f"elapsed_s must be >= 0, got {elapsed_s!r}")
        if not flops >= 0:
            raise ValueError(f"flops must be >= 0, got {flops!r}")
        if self.config.mode == "emulated":
            return self.current_chi() * flops / self.config.flops_per_second
        extra = self.current_chi() - 1.0
        if extra == 0.0 or self.config.scope == "device":
            return 0.0  # device scope: slept before the next collective (semimig.straggler.device)
        if self.config.mode == "flops":
            return extra * flops / self.config.flops_per_second
        return extra * elapsed_s

    def charged_s(self, elapsed_s: float, delay_s: float) -> float:
        """Seconds a GEMM occupied this rank's (emulated) device: what its busy time counts.

        emulated: ``delay_s`` (the nominal device's time); ``scope=device``: ``chi · elapsed_s``
        (its sleep comes at the next collective); otherwise ``elapsed_s + delay_s``.
        """
        if self.config.mode == "emulated":
            return delay_s
        if self.config.scope == "device":
            return self.current_chi() * elapsed_s
        return elapsed_s + delay_s

    def inject(self, delay_s: float, device: torch.device | str) -> None:
        """Occupy ``device`` for ``delay_s`` seconds: CPU sleeps, CUDA spins on the current stream."""
        if not delay_s >= 0 or not math.isfinite(delay_s):
            raise ValueError(f"delay_s must be a finite number >= 0, got {delay_s!r}")
        if delay_s == 0:
            return
        device = torch.device(device)
        if device.type == "cpu":
            _precise_sleep(delay_s)
        elif device.type == "cuda":
            cycles = int(round(delay_s * calibrate_cuda_sleep_rate(device)))
            if cycles > 0:
                with torch.cuda.device(device):
                    torch.cuda._sleep(cycles)
        else:
            raise ValueError(f"cannot inject a delay on device type {device.type!r}; expected 'cpu' or 'cuda'")


_SPIN_S = 2e-4  # time.sleep overshoots by ~0.05-0.1 ms on Linux; the last 0.2 ms are spun


def _precise_sleep(delay_s: float) -> None:
    """Sleep ``delay_s`` seconds: ``time.sleep`` for all but the last ``_SPIN_S``, then spin.

    Plain ``time.sleep`` overshoots by a roughly constant ~0.1 ms, which for sub-millisecond
    GEMMs would inflate chi noticeably; spinning the tail keeps the delay within a few us.
    """
    deadline = time.perf_counter() + delay_s
    if delay_s > _SPIN_S:
        time.sleep(delay_s - _SPIN_S)
    while time.perf_counter() < deadline:
        pass


def calibrate_flops_per_second(device: torch.device | str = "cpu", *, size: int = 256, repeats: int = 5) -> float:
    """Median FLOP/s of a ``[size, size] @ [size, size]`` fp32 matmul on ``device`` (``2 * size**3`` FLOPs)."""
    check_int("size", size, minimum=1)
    check_int("repeats", repeats, minimum=1)
    device = torch.device(device)
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    cuda = device.type == "cuda"
    torch.matmul(a, b)  # warm-up (allocator, library init)
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.matmul(a, b)
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    rate = 2.0 * size**3 / max(statistics.median(times), 1e-9)
    logger.info("calibrated %s matmul rate: %.3g FLOP/s (size %d)", device, rate, size)
    return rate


_CUDA_SLEEP_RATE: dict[int, float] = {}


def calibrate_cuda_sleep_rate(device: torch.device | str, *, cycles: int = 10_000_000) -> float:
    """Cycles per second of ``torch.cuda._sleep`` on ``device``, timed with CUDA events; cached."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"calibrate_cuda_sleep_rate needs a CUDA device, got {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CUDA_SLEEP_RATE:
        with torch.cuda.device(index):
            torch.cuda._sleep(1000)  # warm-up: module load
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        _CUDA_SLEEP_RATE[index] = cycles / max(seconds, 1e-9)
        logger.info("cuda:%d _sleep rate: %.3g cycles/s", index, _CUDA_SLEEP_RATE[index])
    return _CUDA_SLEEP_RATE[index]
