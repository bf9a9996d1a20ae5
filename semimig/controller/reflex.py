"""Resizing inside the step: a rank that turns slow prunes the rest of the step at once.

The controller sees a step only after it ends, decides at the next ``step()`` and needs a few
observations of a new regime before it flags a straggler (DESIGN §3a), so a throttle that starts
runs a few whole steps at the slow device's pace (each as many times a healthy step as the device
is slower) before anything is pruned.  Resizing needs no agreement — a rank that prunes computes the same
collectives on the same shapes — so a rank may react to its *own* evidence within the step; the
reflex is that reaction, and only that: a rule every rank holds (the config), whose firing is
local and reported (the work fraction of the step, the step report, the lineage table).

Marks.  Each timed layer call of a step (a forward, then a backward, in the order the step runs
them) opens at a *mark* ``m_i``: the rank's busy seconds so far in the step (its own GEMM time,
:mod:`semimig.straggler.busy`; never a collective wait).  The increment ``Δ_i = m_(i+1) − m_i``
is the own work of call ``i``.  A clean step (dense, not fired) joins a short history; the
reference ``R_i`` of increment ``i`` is the median of its past values, ``R`` that of the step's
whole busy time.

Firing, at mark ``i`` (the opening of call ``i``):

    the last increments each ran  Δ_j ≥ ratio · R_j                         (one descheduled GEMM never fires)
      — at least ``evidence`` of them, and at least ``evidence_share`` of a clean step's work: Σ R_j ≥ share · R
    r = Σ Δ_j / Σ R_j  over those increments                                (the rank's present slowdown)
    (r − 1) · (R − Σ_(j<i) R_j) ≥ min_excess_s                              (what is left of the step is worth it)

and then every later call of the step prunes the share that brings the rank's remaining work
back to its reference pace under the fitted cost model ``T(γ) = T(0)·(f + (1 − f)(1 − γ))``
(:mod:`semimig.controller.timing`):

    f + (1 − f)(1 − γ) = 1 / r   ⇒   γ = (1 − 1/r) / (1 − f),  clamped to [0, γ_max], rounded up to ``grain``

Calls already run stay as they ran; a layer whose forward ran dense prunes its backward only
(its gradient then drops the same columns a pruned forward would have).  While the controller's
plan already prunes the rank at ``γ_p`` (a plan still being released after a throttle, when the
throttle returns) the marks are compared with the same dense references, so a slow device reads
``r ≈ χ·(f + (1 − f)(1 − γ_p))``, and a layer whose forward is still to run prunes the larger of
the two shares, forward and backward alike (a keep set never changes between a layer's forward
and its backward).  Once fired, ``γ`` holds to the end of the step.  The next step starts clean:
by then the controller has the evidence, or the reflex fires again.

Where it runs.  The marks are read while the step runs, so the reflex needs a clock whose regions
are known at once: the host clock (:mod:`semimig.straggler.clock`).  On CUDA the step's events are
read only after the step (never waited for inside it), so the runtime builds no reflex there: the
reflex is off on CUDA, and the controller meets a slow device from its step observations.

What the controller sees.  A fired step is observed as the dense step it would have been,
``r · R`` seconds at full work (:attr:`StepReflex.dense_s`): its fitted cost model must not read a
step whose speed changed within it, half slow and dense, half pruned, as pruning that does not pay.
"""
from __future__ import annotations

import collections
import math
import statistics
from dataclasses import dataclass
from typing import Optional

from semimig._validate import check_bool, check_int, check_number

__all__ = ["ReflexConfig", "StepReflex", "reflex_gamma"]


@dataclass(frozen=True, kw_only=True)
class ReflexConfig:
    """When a rank prunes inside a step on its own evidence (module docstring)."""

    ratio: float = 2.5
    """A call is slow when its own work took at least this many times its reference.  2.5 lies
    above the spread of a loaded host (single steps within about 1.5x their median, the noise
    ``change_ratio`` allows for) and below the slowdown worth reacting to (a quarter of a core is
    up to 4x)."""

    evidence: int = 2
    """Consecutive slow calls needed to fire (a preemption hits one call; a slow device every one)."""

    evidence_share: float = 0.1
    """... and together at least this share of a clean step's own work.  A rank slowed by a time
    slice (a CPU quota, a shared GPU's time slicing) stalls short calls several-fold while its step
    keeps its pace: a quota period that lands on a millisecond call stalls it whole, while over a
    step the quota averages out, so a few slow short calls are no evidence of a slow rank.  A
    throttle that really starts slows every call, so a tenth of a step is soon there."""

    min_excess_s: float = 0.05
    """... and the rest of the step must be expected to run at least this many seconds over its
    reference: below that the reflex's pruning buys too little to be worth its accuracy."""

    history: int = 5
    """Clean steps the references are the median of."""

    min_history: int = 3
    """Clean steps needed before the reflex can fire (warm-up)."""

    grain: float = 0.05
    """``γ`` is rounded up to a multiple of this, so consecutive slow steps reuse keep sets."""

    forward: bool = True
    """Prune the step's remaining forward calls too (ZERO-resizing of the rest of the step).
    False: only backward calls — every forward stays exact (the loss and activations are the dense
    ones) and the gradients drop the pruned columns; it sheds about two thirds as much (backward is
    two of a layer's three GEMMs).  ``True`` is the default: backward-only pruning leaves a slow
    rank's steps further above its reference, and it does not spare the model the pruning (the
    gradients drop the same columns, and the loss moves after pruned phases either way)."""

    def __post_init__(self) -> None:
        check_number("ReflexConfig.ratio", self.ratio, minimum=1.0, low_open=True, maximum=100.0)
        check_int("ReflexConfig.evidence", self.evidence, minimum=1, maximum=1000)
        check_number("ReflexConfig.evidence_share", self.evidence_share, minimum=0.0, maximum=1.0)
        check_number("ReflexConfig.min_excess_s", self.min_excess_s, minimum=0.0, maximum=3600.0)
        check_int("ReflexConfig.history", self.history, minimum=1, maximum=1000)
        check_int("ReflexConfig.min_history", self.min_history, minimum=1, maximum=self.history)
        check_number("ReflexConfig.grain", self.grain, minimum=0.0, low_open=True, maximum=1.0)
        check_bool("ReflexConfig.forward", self.forward)  # "no" or 1 would read as True: forward calls pruned


def reflex_gamma(slowdown: float, fixed_fraction: float, gamma_max: float, grain: float) -> float:
    """The share that brings a rank running ``slowdown`` times its reference back to it.

    ``γ = (1 − 1/r) / (1 − f)`` clamped to ``[0, γ_max]`` and rounded *up* to a multiple of
    ``grain`` (then clamped again); 0 for ``r ≤ 1`` and when ``f ≥ 1`` (pruning saves nothing).
    """
    if not slowdown > 1.0 or not fixed_fraction < 1.0:
        return 0.0
    gamma = (1.0 - 1.0 / slowdown) / (1.0 - max(fixed_fraction, 0.0))
    gamma = math.ceil(gamma / grain - 1e-9) * grain
    return min(max(gamma, 0.0), gamma_max)


class StepReflex:
    """The marks of one rank's steps, their references, and the decision to fire (module docstring).

    Protocol, per step: :meth:`begin_step` (armed or not), :meth:`mark` at the opening of every
    timed layer call with the busy seconds so far (returns the ``γ`` that call prunes: 0 until the
    reflex fires), :meth:`end_step` with the step's busy seconds (returns the ``γ`` fired, 0 for
    none).  Pure: no clock, no tensors.
    """

    def __init__(self, config: ReflexConfig = ReflexConfig(), *, gamma_max: float) -> None:
        if not isinstance(config, ReflexConfig):
            raise TypeError(f"config must be a ReflexConfig, got {config!r}")
        check_number("gamma_max", gamma_max, minimum=0.0, maximum=1.0, high_open=True)
        self.config, self.gamma_max = config, gamma_max
        self._history: collections.deque = collections.deque(maxlen=config.history)
        self._signature: object = None
        self._marks: list[float] = []
        self._refs: Optional[list[float]] = None
        """Reference marks (median over the clean steps that reached each call), rebuilt when the
        history changes; ``_total`` the median busy seconds of a clean step."""
        self._total = 0.0
        self._armed = self._dense = False
        self._fixed = 0.0
        self.gamma = 0.0
        """The share this step prunes from the firing on (0: not fired)."""
        self.fired_at: Optional[int] = None
        """The call at whose opening the reflex fired this step."""
        self.slowdown = 1.0
        """``r`` when it fired."""
        self.dense_s = math.nan
        """When fired: the step's dense-equivalent busy seconds, ``r · R`` — the slowdown measured on
        the step's own dense calls times a clean step's busy time.  The controller observes a fired
        step as this dense step: its fitted cost model must not see a pruned step of a rank whose
        speed changed within it (the slow dense calls and the pruned rest would read as pruning that
        does not pay)."""

    @property
    def clean_steps(self) -> int:
        return len(self._history)

    def begin_step(self, *, armed: bool, dense: bool = True, fixed_fraction: float = 0.0,
                   signature: object = None) -> None:
        """Open a step.  ``armed``: the reflex may fire (this rank migrates and receives nothing);
        ``dense``: its plan prunes nothing either — only such a step can join the references;
        ``fixed_fraction``: its fitted ``f``; ``signature``: what the references are valid for
        (the layers' shapes) — a new one drops the history."""
        if signature != self._signature:
            self._history.clear()
            self._signature, self._refs = signature, None
        self._armed, self._dense = bool(armed), bool(dense)
        self._fixed = fixed_fraction if math.isfinite(fixed_fraction) else 0.0
        self._marks = []
        self.gamma, self.fired_at, self.slowdown, self.dense_s = 0.0, None, 1.0, math.nan

    def mark(self, busy_s: float) -> float:
        """A timed layer call opens with ``busy_s`` seconds of own work done in the step; the
        ``γ`` it prunes (0 while the reflex has not fired or is not armed)."""
        if not self._armed:
            return 0.0
        self._marks.append(busy_s)
        if self.gamma == 0.0 and self.fired_at is None:
            self._check()
        return self.gamma

    def end_step(self, busy_s: float) -> float:
        """Close the step; a clean armed step (nothing fired) joins the references.  Returns ``γ``."""
        fired = self.gamma
        if self._armed and self._dense and self.fired_at is None and self._marks and math.isfinite(busy_s):
            self._history.append((tuple(self._marks), busy_s))
            self._refs = None
        self._armed = False
        return fired

    # ------------------------------------------------------------------ decision
    def _check(self) -> None:
        cfg, i = self.config, len(self._marks) - 1
        if len(self._history) < cfg.min_history or i < cfg.evidence:
            return
        refs = self._reference_marks()
        if i >= len(refs):
            return
        done, ref_done, j = 0.0, 0.0, i - 1
        while i - 1 - j < cfg.evidence or ref_done < cfg.evidence_share * self._total:  # newest call first
            if j < 0:
                return
            delta, ref = self._marks[j + 1] - self._marks[j], refs[j + 1] - refs[j]
            if not ref > 0.0 or delta < cfg.ratio * ref:
                return
            done, ref_done, j = done + delta, ref_done + ref, j - 1
        slowdown = done / ref_done
        if (slowdown - 1.0) * max(self._total - refs[i], 0.0) < cfg.min_excess_s:
            return
        gamma = reflex_gamma(slowdown, self._fixed, self.gamma_max, cfg.grain)
        if gamma > 0.0:
            self.gamma, self.fired_at, self.slowdown, self.dense_s = gamma, i, slowdown, slowdown * self._total

    def _reference_marks(self) -> list[float]:
        """Median marks over the clean steps, for every call at least ``min_history`` of them
        reached (built once per history change: a step costs O(calls), not O(calls²))."""
        if self._refs is None:
            need, refs, j = self.config.min_history, [], 0
            while True:
                runs = [marks[j] for marks, _ in self._history if len(marks) > j]
                if len(runs) < need:
                    break
                refs.append(statistics.median(runs))
                j += 1
            self._refs = refs
            self._total = statistics.median(busy for _, busy in self._history)
        return self._refs
