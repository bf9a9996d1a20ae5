"""Time to the same model: the headline benchmark's analysis (pure functions) and its run plan.

Every mode trains the same model on the same data for the same number of steps (the LLM example,
``examples/finetune_llm.py``, real text); the healthy run (no straggler) sets the target::

    target          = (1 + tolerance) · final_val_loss(healthy)          tolerance 2 %
    time_to_target  = Σ_{s ≤ s*} step_s[s]      s* = first evaluated step with val_loss ≤ target
                                                (evaluation time excluded; None if never reached)
    steady_step_s   = median(step_s of the last half of the steps)

Under a time-varying throttle (``--pattern``) each step is *throttled* or *free* by the fraction
in force at its midpoint (the throttle's switch log against the example's step start times), and
each mode's mean step per phase (after the warm-up) is set beside off's: a balancing mode should
be slower than off in no phase.

A mode that drops work (resizing) may be faster per step and still slower to the target, or never
reach it: that is what this benchmark is for.  ``balanced_share`` per rank is the share of the
rank's own work spent in the GEMMs semimig can shed (DESIGN §5's ``B``), the ceiling of what
resizing and migration can save; it is reported beside every figure.
"""
from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from semimig._validate import check_number
from semimig.errors import ConfigError

__all__ = ["TARGET_TOLERANCE", "RunResult", "steady_step_s", "time_to_target_s", "summarize_mode",
           "exact_limit", "pattern_limit", "throttled_steps", "phase_mean_step_s", "run_order"]

TARGET_TOLERANCE = 0.02
"""A mode reaches the healthy model when its validation loss is within 2 % of healthy's final one."""
WARMUP_STEPS = 5
"""Steps left out of :func:`worst_step_s` (start-up, the references of the step reflex)."""


@dataclass(frozen=True)
class RunResult:
    """One run of the example, as its ``--json`` file gives it."""

    step_s: tuple[float, ...]
    """Wall time of every training step (evaluation excluded)."""
    val_losses: tuple[tuple[int, float], ...]
    """``(steps done, validation loss)`` at every evaluation."""
    balanced_share: tuple[Optional[float], ...] = ()
    """Per TP rank, the share of its own work in the balanced GEMMs (``None`` where not measured)."""
    reshard: Optional[dict] = None
    """Modes that re-shard: the example's re-plan summary (``replans``, ``plan``, ``bytes_moved``,
    ``move_s``: the moves' own cost, already inside ``step_s``); ``None`` otherwise."""
    throttled: Optional[tuple[Optional[bool], ...]] = None
    """Under a throttle pattern: per step, whether it ran throttled (:func:`throttled_steps`)."""
    step_split: tuple[Optional[dict], ...] = ()
    """Per rank of the job (global order), its steady step's own work, collectives and balanced GEMMs in seconds
    (:data:`semimig.bench.llm.record.SPLIT_FIELDS`; ``None`` where not measured; empty in older files)."""
    reflex_steps: Optional[tuple[int, ...]] = None
    """Per rank of the job, how many steps its step reflex pruned (lossy steps no plan shows); ``None``
    where the file does not record it."""

    @classmethod
    def from_json(cls, data: dict, where: str = "run") -> "RunResult":
        """The example's ``--json`` output; a missing or malformed key is named with ``where``."""
        try:
            step_s = tuple(float(t) for t in data["step_s"])
            val = tuple((int(s), float(v)) for s, v in data["val_losses"])
            shares = tuple(None if b is None else float(b) for b in data["summary"].get("balanced_share_by_rank", ()))
            reshard = data["summary"].get("reshard")
            throttled = data.get("throttled")
            split = tuple(None if r is None else {k: float(v) for k, v in r.items()}
                          for r in data["summary"].get("step_split_by_rank", ()))
            throttled = None if throttled is None else tuple(None if t is None else bool(t) for t in throttled)
            reflex = data.get("reflex_each")
            reflex = None if reflex is None else tuple(len(r) for r in reflex)
            if reshard is not None:
                reshard = {"replans": int(reshard["replans"]), "plan": str(reshard["plan"]),
                           "bytes_moved": int(reshard["bytes_moved"]), "move_s": float(reshard["move_s"])}
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"{where}: not an examples/finetune_llm.py --json result ({err!r})") from None
        if not step_s:
            raise ConfigError(f"{where}: no training steps recorded")
        if throttled is not None and len(throttled) != len(step_s):
            raise ConfigError(f"{where}: {len(throttled)} step phases for {len(step_s)} steps")
        return cls(step_s=step_s, val_losses=val, balanced_share=shares, reshard=reshard, throttled=throttled,
                   step_split=split, reflex_steps=reflex)

    @property
    def final_val_loss(self) -> Optional[float]:
        return self.val_losses[-1][1] if self.val_losses else None


def run_order(modes: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """``(repeat, mode)`` in the order the runs are made: every mode once per repeat, in the given order on
    even repeats and reversed on odd ones, so a machine whose speed drifts over the benchmark (its load,
    its clock) weighs each mode's runs alike: a drift linear in time cancels over each pair of repeats,
    where a fixed order would leave the modes run later in every repeat on the slower machine."""
    if not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be an int >= 1, got {repeats!r}")
    return [(k, mode) for k in range(repeats) for mode in (modes if k % 2 == 0 else list(reversed(modes)))]


def steady_step_s(step_s: Sequence[float]) -> float:
    """Median step time of the last half of the run (warm-up, first plans and re-plans left out)."""
    if not step_s:
        raise ConfigError("steady_step_s needs at least one step time, got none")
    return float(statistics.median(step_s[len(step_s) // 2:]))


def worst_step_s(step_s: Sequence[float]) -> float:
    """The slowest step after the first ``WARMUP_STEPS`` (the bar a mode should meet: none over 3x a healthy step)."""
    if len(step_s) <= WARMUP_STEPS:
        raise ConfigError(f"worst_step_s needs more than {WARMUP_STEPS} step times, got {len(step_s)}")
    return float(max(step_s[WARMUP_STEPS:]))


def time_to_target_s(step_s: Sequence[float], val_losses: Sequence[tuple[int, float]], target: float) -> Optional[float]:
    """Training wall time until the first evaluation at or below ``target`` (``None``: never).

    ``val_losses[k] = (n, loss)`` is the loss after ``n`` steps, so the time is ``sum(step_s[:n])``.
    """
    check_number("target", target, minimum=0.0)
    for steps, loss in val_losses:
        if not 0 <= steps <= len(step_s):
            raise ConfigError(f"validation after {steps} steps, but the run has {len(step_s)} step times")
        if math.isfinite(loss) and loss <= target:
            return float(sum(step_s[:steps]))
    return None


def held_ranks(step_start_unix: Sequence[float], step_s: Sequence[float],
               switches: Sequence[dict]) -> tuple[Optional[tuple], ...]:
    """Per step, the ranks the throttle held at its midpoint ``start + step_s / 2``: those whose last
    switch at or before it held them (``()``: none, a free step; ``None`` before the first switch: not yet
    attached).

    ``switches``: ``[{"unix_s": t, "fraction": f, "rank": r, "held": h}, ...]`` in time order (``semimig
    throttle --switch-log``; several ranks for a straggler that moves; a log without ``held`` or ``rank``, one
    rank's throttle whose free phases ran at a whole core: held while the fraction is below 1)."""
    if len(step_start_unix) != len(step_s):
        raise ConfigError(f"{len(step_start_unix)} step start times for {len(step_s)} steps")
    times = [float(s["unix_s"]) for s in switches]
    if any(b < a for a, b in zip(times, times[1:])):
        raise ConfigError("the throttle's switches are not in time order")
    state: dict = {}
    held = []
    for s in switches:  # after each switch: the ranks held
        state[s.get("rank")] = bool(s["held"]) if "held" in s else float(s["fraction"]) < 1.0
        held.append(tuple(sorted((r for r, on in state.items() if on), key=lambda r: -1 if r is None else r)))
    # the last switch at or before each step's midpoint
    at = [bisect.bisect_right(times, float(start) + float(dt) / 2.0) for start, dt in zip(step_start_unix, step_s)]
    return tuple(None if i == 0 else held[i - 1] for i in at)


def throttled_steps(step_start_unix: Sequence[float], step_s: Sequence[float],
                    switches: Sequence[dict]) -> tuple[Optional[bool], ...]:
    """Per step, whether the throttle held some rank at its midpoint (:func:`held_ranks`; ``None``
    before the first switch: not yet attached)."""
    return tuple(None if h is None else bool(h) for h in held_ranks(step_start_unix, step_s, switches))


def phase_mean_step_s(run: RunResult) -> Optional[dict]:
    """``{"throttled": mean step, "free": mean step}`` over the steps after ``WARMUP_STEPS`` (a phase
    without such steps: ``None``); ``None`` for a run without step phases."""
    if run.throttled is None:
        return None
    out = {}
    for name, flag in (("throttled", True), ("free", False)):
        steps = [t for t, th in zip(run.step_s[WARMUP_STEPS:], run.throttled[WARMUP_STEPS:]) if th is flag]
        out[name] = statistics.fmean(steps) if steps else None
    return out


def summarize_mode(runs: Sequence[RunResult], target: Optional[float]) -> dict:
    """Median and range over repeats of one mode: steady step, final validation loss, time to target."""
    if not runs:
        raise ConfigError("summarize_mode needs at least one run")
    steady = [steady_step_s(r.step_s) for r in runs]
    finals = [r.final_val_loss for r in runs if r.final_val_loss is not None]
    reach = [None if target is None else time_to_target_s(r.step_s, r.val_losses, target) for r in runs]
    reached = [t for t in reach if t is not None]
    shares = [r.balanced_share for r in runs if r.balanced_share]
    return {
        "repeats": len(runs),
        "steady_step_s": statistics.median(steady), "steady_step_s_range": [min(steady), max(steady)],
        "final_val_loss": statistics.median(finals) if finals else None,
        "final_val_loss_range": [min(finals), max(finals)] if finals else None,
        "time_to_target_s": statistics.median(reached) if len(reached) * 2 > len(runs) else None,
        "time_to_target_s_each": reach,
        "train_s": statistics.median(sum(r.step_s) for r in runs),
        "mean_step_s": statistics.median(statistics.fmean(r.step_s) for r in runs),
        "worst_step_s": statistics.median(worst_step_s(r.step_s) for r in runs) if all(
            len(r.step_s) > WARMUP_STEPS for r in runs) else None,
        "balanced_share": [_median_or_none(col) for col in zip(*shares)] if shares else None,
        "step_split": _split_summary(runs),
        "val_losses": [list(v) for v in runs[0].val_losses],
        "reshard": _reshard_summary(runs),
        "phase_mean_step_s": _phase_summary(runs),
        "reflex_steps_each": [None if r.reflex_steps is None else sum(r.reflex_steps) for r in runs],
    }


def _split_summary(runs: Sequence[RunResult]) -> Optional[list]:
    """Per rank, the median over the repeats of each field of its step split (``None`` where no run
    recorded one)."""
    splits = [r.step_split for r in runs if r.step_split]
    if not splits:
        return None
    out = []
    for col in zip(*splits):
        got = [c for c in col if c is not None]
        out.append({k: statistics.median(c[k] for c in got) for k in got[0]} if got else None)
    return out


def _phase_summary(runs: Sequence[RunResult]) -> Optional[dict]:
    """Median over the repeats of each phase's mean step (``None`` unless every run has phases)."""
    phases = [phase_mean_step_s(r) for r in runs]
    if not phases or any(p is None for p in phases):
        return None
    return {name: _median_or_none([p[name] for p in phases]) for name in ("throttled", "free")}


def _reshard_summary(runs: Sequence[RunResult]) -> Optional[dict]:
    """Re-plans over the repeats (count, bytes moved, seconds moving: median and each), or ``None``."""
    known = [r.reshard for r in runs if r.reshard is not None]
    if not known:
        return None
    return {"replans": statistics.median(k["replans"] for k in known),
            "bytes_moved": statistics.median(k["bytes_moved"] for k in known),
            "move_s": statistics.median(k["move_s"] for k in known),
            "each": known}


def _median_or_none(values: Sequence[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def exact_limit(chi: Union[float, Sequence[float]], ranks: int = 2) -> float:
    """The exact limit with one of ``ranks`` ranks ``chi`` times slower and work re-split in proportion
    to speed (DESIGN §8, replicated work R = 0 or small enough that every share stays >= 0): a TP
    group's, and a whole tp x dp job's with ``ranks`` = tp·dp (its speed is the sum of its ranks')::

        t / t_healthy = e / (e − 1 + 1/chi) = e·chi / ((e − 1)·chi + 1)      2chi/(chi+1) for e = 2

    (1.23x for one of four ranks at chi 4, 1.10x for one of eight.)  Several slow ranks, ``chi`` one
    slowdown each: ``e / (e − k + Σ_i 1/chi_i)`` (1.45x for two of four at chi 2 and 4).
    """
    chis = list(chi) if isinstance(chi, (list, tuple)) else [chi]
    for i, c in enumerate(chis):
        check_number(f"chi[{i}]" if len(chis) > 1 else "chi", c, minimum=1.0)
    if not 1 <= len(chis) <= ranks:
        raise ConfigError(f"exact_limit needs 1..{ranks} slow ranks of {ranks}, got {len(chis)}")
    return ranks / (ranks - len(chis) + sum(1.0 / c for c in chis))


def pattern_limit(chi: float, on_s: float, off_s: float, healthy_s: float, ranks: int = 2) -> float:
    """The exact limit of a run under a throttle that comes and goes, as a multiple of healthy's time:
    ``healthy_s`` seconds of healthy work, the throttle on for ``on_s`` seconds, then off for ``off_s``,
    repeating, starting on (``semimig throttle --pattern``); each throttled second does
    ``1 / exact_limit(chi)`` of a healthy second's work (the group re-split at once, nothing paid for
    switching), each free second a whole one.  Over whole cycles this is the time-weighted
    ``(on + off) / (on / L + off)`` (1.14x for 20:40 at χ = 4); a run that ends within a cycle counts
    the part it ran, so a run shorter than one cycle, spent mostly throttled, has a higher limit."""
    check_number("on_s", on_s, minimum=0.0)
    check_number("off_s", off_s, minimum=0.0)
    check_number("healthy_s", healthy_s, minimum=0.0, low_open=True)
    if on_s + off_s <= 0.0:
        raise ConfigError(f"pattern_limit needs a pattern of positive length, got on_s={on_s}, off_s={off_s}")
    slow = exact_limit(chi, ranks)
    per_cycle = on_s / slow + off_s  # healthy seconds of work one cycle does
    cycles = math.floor(healthy_s / per_cycle)
    left = healthy_s - cycles * per_cycle
    wall = cycles * (on_s + off_s) + (left * slow if left <= on_s / slow else on_s + (left - on_s / slow))
    return wall / healthy_s
