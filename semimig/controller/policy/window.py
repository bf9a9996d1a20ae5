"""The window of the plan in force, and the change-point test that decides how much of it each rank's
reading rests on (DESIGN §9).

The window holds the latest steps of one plan (at most ``size``; a move empties it).  Each rank ``r``
reads only its *fresh* steps, the ones since its speed last changed: its time is their lower tercile
(:func:`~semimig.controller.policy.stepmodel.tercile`).  A change is a step in a rank's log compute:
the last ``m`` steps all away from the median of the rank's earlier fresh steps (at least ``N_MIN``
of them), on the same side, by more than ``z·σ̂/√m``, the smallest such ``m`` (the latest change: a
step before it that clears the wider band of a longer run would otherwise set the new reading) (``z``: :data:`CHANGE_Z`; ``σ̂`` the one noise
estimator, :class:`~semimig.controller.policy.gain.Noise`).  A large change clears that band in one step, a small
one only as ``m`` grows: the detection delay scales as ``(σ̂ / size of the change)²``, and the false
alarms per rank and step stay near ``Φ(−z/√m)^m``.

Outlier steps are slow steps (an interrupt, a collection, a page fault never makes a step faster), so
one step faster than the band is a change while one step slower may be an outlier: a rank is
believed faster after one step and slower after :data:`SLOW_STEPS`.  A rank whose last step alone is
slower than the band is *pending*; the next step tells which it was.  :class:`Rates` counts, over every
step seen, the one-step excursions that did not last (outliers, and the noise's own false alarms) and
the slowdowns that did (a rank that stayed in the slow set for :data:`LASTED` steps,
:class:`~semimig.controller.policy.states.Slowdown`; one that left it sooner counts as an outlier), and the
outliers' sizes: an outlier stretches a step by a small factor, so a step many times a rank's reading is
rarely one (:data:`OUTLIER_SIZE`).  The slowdowns' sizes are counted too: a run whose slowdowns made its
ranks 1.6x slower explains a step 2.6x slower better by its outliers than by another such slowdown.  Their
ratio, each at the step's size, is what a single slow step is worth as evidence of a change (:meth:`Rates.change_odds`), which lets the
gain test bet on a pending step when acting a step sooner is worth the risk.  A change resets only that rank's
fresh steps; the other ranks keep their readings and their precision.  The steps that made a change
were chosen for being far from the earlier ones: the noise of a reading is counted over the fresh
steps after them (:attr:`Window.independent`), so a run of outliers that passes for a change does not
also pass for a slow rank.  Nor does a run whose latest step falls below every earlier one (its first left
out) by more than the two-step noise band (``z·√2·σ̂``): a new speed's steps scatter as the old ones did,
and a slowdown that deepens (a ramp) only rises, while outliers are each their own size and only add, so
its steps are not read as a speed (:meth:`Window.after_change`) and the next step tells.
"""
from __future__ import annotations

import bisect
import collections
import math
import statistics
from typing import Any, List, Optional, Sequence, Tuple

from semimig.controller.policy.states import LASTED, N_MIN
from semimig.controller.policy.stepmodel import ordered_median, tercile

__all__ = ["Window", "Rates", "drifted", "outlier_tail", "OUTLIER_SIZE", "OUTLIER_TAIL", "OUTLIER_PRIOR", "SLOWDOWN_PRIOR",
           "LASTED", "CHANGE_Z", "SLOW_STEPS", "RATE_PRIOR_STEPS", "PRIOR_OUTLIER_RATE", "PRIOR_SLOWDOWN_RATE"]

CHANGE_Z = 3.0
"""Standard errors a change of speed must clear: its own false-alarm rate (``Φ(−z)`` per rank and step),
apart from the gain test's ``noise_z``, so a gain test opened wide does not also read every step's noise
as a change and keep each rank's reading a step or two long."""

SLOW_STEPS = 2
"""Fewest steps a slowdown is believed on: one slower step may be an outlier, two in a row on one rank
rarely are (``q²`` for an outlier rate ``q``)."""


RATE_PRIOR_STEPS = 200
"""Rank-steps of prior evidence in :class:`Rates`: the run's own counts outweigh it after a few hundred."""
PRIOR_OUTLIER_RATE = 0.01
"""Outliers per rank-step assumed before any is counted."""
PRIOR_SLOWDOWN_RATE = 0.003
"""Slowdowns per rank-step assumed before any is counted: a third as likely as an outlier, so a first slow step
is bet on only for a gain over three times what being wrong costs, and readily once slowdowns were seen to
come.  Chosen on the simulator's family: as likely as an outlier, noise alone moves an even plan."""


OUTLIER_SIZE = 3.0
"""Times a rank's reading up to which an outlier is as likely as any slow step: an interrupt, a collection or a
page fault stretches a step by a small factor."""
OUTLIER_TAIL = 3.0
"""How fast outliers thin beyond :data:`OUTLIER_SIZE` (:func:`outlier_tail`), so that one step several times
slower is read as a change sooner.  With :data:`OUTLIER_SIZE`, chosen on the simulator's family (whose outliers
run 1.5-3x, stretched further by the noise): a sharper tail bets on the outliers of its noisiest groups."""


OUTLIER_PRIOR = 20
"""Outliers of :func:`outlier_tail`'s shape assumed beside the counted ones' sizes: the run's own sizes outweigh
it after a few dozen, so a run whose outliers are large stops betting on large steps."""


SLOWDOWN_PRIOR = 1
"""Slowdowns of any size assumed beside the counted ones' sizes (:meth:`Rates.slowdown_share_at_least`): one, so a
run's first counted slowdown already tells a step of another size apart, and a slowdown larger than every one
counted is still believed on the steps after it."""


def outlier_tail(size: float) -> float:
    """Share of outliers at least ``size`` times the rank's reading: 1 up to :data:`OUTLIER_SIZE`, then
    ``(OUTLIER_SIZE/size)^OUTLIER_TAIL``."""
    return min(1.0, (OUTLIER_SIZE / size) ** OUTLIER_TAIL) if size > 0.0 else 1.0


def drifted(windows: Sequence[Sequence[Any]], ranks, sigma: float, z: float = CHANGE_Z) -> bool:
    """Whether a rank of ``ranks`` ran its last step of one of ``windows`` more than ``z`` two-step noise bands
    (``z·√2·σ`` in log time, ``σ`` the one-step noise) away from its first: its speed moved within the window,
    so a step predicted at one end and measured at the other differs by the drift, not only by the model's
    error.  A slowdown that deepens step by step (a ramp) is such a rank; the change test, which reads a change
    against ``N_MIN`` earlier steps, cannot cut the few steps around a move."""
    band = z * math.sqrt(2.0) * sigma
    return any(abs(math.log(max(w[-1].compute_s[r], 1e-12) / max(w[0].compute_s[r], 1e-12))) > band
               for w in windows if len(w) > 1 for r in ranks)


class Rates:
    """How often a rank's single slow step was an outlier, and how often a slowdown that lasted (module
    docstring); both per rank-step, over every step the window has seen."""

    def __init__(self) -> None:
        self.rank_steps = 0
        self.outliers = 0
        self.sizes: List[float] = []
        """The sizes of the outliers counted with one (a step over the rank's reading)."""
        self.slowdowns = 0
        self.slowdown_sizes: List[float] = []
        """The sizes of the slowdowns counted (each its slow steps' smallest time over the rank's reading before)."""
        self.change_size: dict = {}
        """Per rank, the size of its latest change to slower steps, counted with its slowdown if it lasts."""
        self.sigma = 0.0
        """The one-step noise (a log time's standard deviation) the window's latest change test read with."""
        self.since: dict = {}
        """Step each rank joined the slow set, until its stay is counted."""
        self.from_start: dict = {}
        """Step each rank slow since the run's first reading was first read slow, until it leaves the set."""

    def joined(self, step: int, ranks) -> None:
        """``ranks`` joined the slow set, their slowdown's first slow step ``step``.  Ranks slow since the run's
        first reading are not joined (:meth:`began`): nothing was seen to begin, so while they stay slow they
        are neither slowdowns nor outliers."""
        self.since.update({r: step for r in ranks})

    def began(self, step: int, ranks) -> None:
        """``ranks`` are slow from the run's first reading, at ``step``: a stay that ends after :data:`LASTED`
        steps or more is counted a slowdown when it ends (one was there, lasted and ended, its size unknown); one
        that never ends is never counted (a device slow for the whole run tells nothing of how often a rank
        slows), and a shorter one (a misread probe) is neither."""
        self.from_start.update({r: step for r in ranks})

    def left(self, step: int, ranks) -> None:
        """``ranks`` left the slow set at ``step``: a stay shorter than :data:`LASTED` was an outlier, and the size
        of the change that began it is no slowdown's (a later stay is counted at its own change's size)."""
        for r in ranks:
            if r in self.from_start:
                self.slowdowns += step - self.from_start.pop(r) >= LASTED
                continue
            self.outliers += step - self.since.pop(r, step - LASTED) < LASTED
            self.change_size.pop(r, None)

    def held(self, step: int, ranks) -> None:
        """``ranks`` are in the slow set at ``step``: a stay of :data:`LASTED` steps is a slowdown."""
        for r in ranks:
            if r in self.since and step - self.since[r] >= LASTED:
                del self.since[r]
                self.slowdowns += 1
                if r in self.change_size:
                    self.slowdown_sizes.append(self.change_size.pop(r))

    def share_at_least(self, size: float) -> float:
        """Share of outliers at least ``size`` times the rank's reading: the counted ones' sizes (one of unknown
        size counts as any) beside :data:`OUTLIER_PRIOR` outliers shaped as :func:`outlier_tail`."""
        known = sum(x >= size for x in self.sizes)
        unknown = self.outliers - len(self.sizes)
        return (unknown + known + OUTLIER_PRIOR * outlier_tail(size)) / (self.outliers + OUTLIER_PRIOR)

    def slowdown_share_at_least(self, size: float, steps: int = 1) -> float:
        """Probability that a slowdown's ``steps`` steps are each at least ``size`` times the rank's reading: over
        the counted slowdowns' sizes ``χ``, each step's log time normal about ``ln χ`` with the one-step noise
        :attr:`sigma`, ``Φ(−(ln size − ln χ)/σ)^steps``, beside :data:`SLOWDOWN_PRIOR` slowdowns of any size."""
        sigma = self.sigma

        def tail(chi: float) -> float:
            if sigma <= 0.0:
                return float(chi >= size)
            return (0.5 * math.erfc((math.log(size) - math.log(chi)) / (sigma * math.sqrt(2.0)))) ** steps
        counted = self.slowdown_sizes
        return (sum(tail(chi) for chi in counted) + SLOWDOWN_PRIOR) / (len(counted) + SLOWDOWN_PRIOR)

    def change_odds(self, steps: int = 1, onset: Optional[float] = None, size: float = 1.0) -> float:
        """Probability that ``steps`` slow steps in a row on one rank, each at least ``size`` times its reading,
        are a slowdown rather than as many outliers (each independent): ``h·s / (h·s + q^steps)`` with the two
        rates read with their prior.  Each of the steps must be slower than the one-step band, as a pending step
        is: ``q`` counts every such step that did not last, the noise's own false alarms among them, times the
        share of outliers at least ``size`` (:meth:`share_at_least`); ``s`` is the share of slowdowns whose steps
        run at least that slow (:meth:`slowdown_share_at_least`).  ``onset``: the
        probability that a slowdown starts on this rank at these steps where something else is known of them (a
        straggler handing over, :meth:`~semimig.controller.policy.states.Slowdown.handover`), in place of ``h``."""
        n = self.rank_steps + RATE_PRIOR_STEPS
        h = (self.slowdowns + PRIOR_SLOWDOWN_RATE * RATE_PRIOR_STEPS) / n if onset is None else onset
        h *= self.slowdown_share_at_least(size, steps) if size > 1.0 else 1.0
        q = (self.outliers + PRIOR_OUTLIER_RATE * RATE_PRIOR_STEPS) / n * self.share_at_least(size)
        return h / (h + q ** steps)


class Window:
    """The steps of the plan in force, and each rank's fresh steps among them (module docstring)."""

    def __init__(self, size: int, tp: int) -> None:
        self.samples: collections.deque = collections.deque(maxlen=size)
        self.compute: List[List[float]] = [[] for _ in range(tp)]
        """Per rank, its compute over the window's steps (oldest first): the column every reading slices."""
        self.shardable: List[List[float]] = [[] for _ in range(tp)]
        """Per rank, its timed shardable seconds over the window's steps (oldest first)."""
        self._ordered: List[Optional[list]] = [None] * tp
        """Per rank, its fresh steps' compute in order where the change test sorted them (:func:`tercile` reads it)."""
        self.fresh: List[int] = [0] * tp
        self.trigger: List[int] = [0] * tp
        """Per rank, the steps among its fresh ones that made its last change: chosen for being far from
        the earlier ones, they tell that the speed changed, not by how much."""
        self.pending: Tuple[int, ...] = ()
        """The ranks whose last step is slower than the band, not yet told apart from an outlier."""
        self.slower: List[bool] = [False] * tp
        """Per rank, whether its last change is a slowdown whose every step is slower than the one-step band
        (each as a pending step is: what :meth:`Rates.change_odds` prices)."""
        self.size: List[float] = [1.0] * tp
        """Per rank, its pending step's, or its last slowdown's smallest step's, time over its earlier reading."""
        self.faster: List[bool] = [False] * tp
        """Per rank, whether its last change is a speed-up (a slowdown whose steps clear the band only
        together is neither this nor :attr:`slower`)."""
        self.rates = Rates()
        """Outliers and slowdowns counted over every step seen (kept across plans)."""

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self):
        return iter(self.samples)

    def __getitem__(self, i: int) -> Any:
        return self.samples[i]

    def clear(self) -> None:
        self.samples.clear()
        self.compute = [[] for _ in self.fresh]
        self.shardable = [[] for _ in self.fresh]
        self._ordered = [None] * len(self.fresh)
        self.fresh = [0] * len(self.fresh)
        self.trigger = [0] * len(self.fresh)
        self.slower = [False] * len(self.fresh)
        self.size = [1.0] * len(self.fresh)
        self.faster = [False] * len(self.fresh)
        self.pending = ()

    @property
    def steps(self) -> int:
        """Steps every rank's reading rests on (the fewest fresh steps of any rank)."""
        return min(self.fresh)

    def steady(self) -> list:
        """The window's last :attr:`steps` steps: those at one set of speeds, every rank's reading among them."""
        return list(self.samples)[len(self.samples) - self.steps:]

    @property
    def independent(self) -> int:
        """Steps the noise of every rank's reading is counted over: its fresh steps after the ones that
        made its last change (at least 1; the fewest of any rank)."""
        return min(max(f - t, 1) for f, t in zip(self.fresh, self.trigger))

    def add(self, sample: Any, *, sigma: float, z: float = CHANGE_Z) -> bool:
        """Append one step; ``True`` when some rank's speed changed (module docstring)."""
        self.samples.append(sample)
        n = len(self.samples)
        for columns, values in ((self.compute, sample.compute_s), (self.shardable, sample.shardable_s)):
            for column, value in zip(columns, values):
                column.append(value)
                if len(column) > n:
                    del column[0]
        self.trigger = [t - 1 if f + 1 > n and t > 0 else t for f, t in zip(self.fresh, self.trigger)]
        self.fresh = [min(f + 1, n) for f in self.fresh]
        changed, pending = False, []
        self.rates.rank_steps, self.rates.sigma = self.rates.rank_steps + len(self.fresh), sigma
        for r, fresh in enumerate(self.fresh):
            m, slower, faster, ordered, size = self._change(self.compute[r][-fresh:], fresh, sigma, z)
            self._ordered[r] = ordered if not m else None  # the fresh steps in order, while they stay the fresh ones
            if m:
                self.fresh[r], self.trigger[r], self.slower[r], self.faster[r], changed = m, m, slower, faster, True
                self.size[r] = size
                if slower:  # the slowdown's size, read at its latest step (the first may straddle its start)
                    self.rates.change_size[r] = size * self.compute[r][-1] / min(self.compute[r][-m:])
                continue
            if r in self.pending:  # the slow step before did not last
                self.rates.outliers += 1
                self.rates.sizes.append(self.size[r])
            if slower:
                pending.append(r)
                self.size[r] = size
        self.pending = tuple(pending)
        return changed

    @staticmethod
    def _change(times: Sequence[float], fresh: int, sigma: float,
                z: float) -> Tuple[int, bool, bool, Optional[list], float]:
        """The most recent of a rank's ``fresh`` steps ``times`` that differ from its earlier ones (0: none)
        and whether they are slower, each beyond the one-step band; with none, whether its last step alone
        is slower than the band; whether they are faster; ``times`` in order where the test sorted them
        (``None`` where it did not); and the slow steps' size, the smallest over the earlier median (1.0 where
        none is slow)."""
        slower, size, last = False, 1.0, min(N_MIN, fresh - N_MIN)
        earlier = sorted(times[:-last]) if last > 0 else []  # times[:-m] sorted, from the longest m down
        bases = []
        for m in range(last, 0, -1):
            bases.append(ordered_median(earlier))
            bisect.insort(earlier, times[-m])
        for m in range(1, last + 1):  # the latest change first: its steps read the new speed
            base = bases[last - m]
            band = z * sigma / math.sqrt(m)
            if abs(math.log(times[-1] / base)) <= band:  # the last step inside the band: no run of m clears it
                continue
            devs = [math.log(t / base) for t in times[-m:]]
            if all(d < -band for d in devs):
                return m, False, True, earlier, 1.0
            if m >= SLOW_STEPS and all(d > band for d in devs):
                return m, all(d > z * sigma for d in devs), False, earlier, math.exp(min(devs))
            if m == 1 and devs[0] > band:
                slower, size = True, math.exp(devs[0])
        return 0, slower, False, (earlier if last > 0 else None), size

    def bet_size(self) -> float:
        """The smallest :attr:`size` of the ranks a bet is on (pending, or slowed with no step after): what
        :meth:`Rates.change_odds` prices their steps as outliers by."""
        ranks = set(self.pending) | set(self.unconfirmed())
        return min((self.size[r] for r in ranks), default=1.0)

    def unconfirmed(self) -> dict:
        """``{rank: m}`` for every rank whose last change is a slowdown of ``m`` steps, each slower than the
        one-step band, with no step after them yet: a change or as many outliers (:meth:`Rates.change_odds`),
        the next step tells which."""
        return {r: t for r, (f, t, s) in enumerate(zip(self.fresh, self.trigger, self.slower)) if s and f == t}

    def sped_up(self) -> Tuple[int, ...]:
        """The ranks whose last change is a speed-up with no step after it: a change this step (one step
        faster than the band is a change: :data:`SLOW_STEPS` is for slowdowns)."""
        return tuple(r for r, (f, t, up) in enumerate(zip(self.fresh, self.trigger, self.faster)) if up and f == t)

    def times(self) -> Tuple[Tuple[float, ...], float]:
        """Every rank's compute (the lower tercile of its fresh steps) and the median of the step's
        smallest collective time over the window."""
        compute = tuple(tercile(column[-max(f, 1):]) if ordered is None else ordered[(len(ordered) - 1) // 3]
                        for column, f, ordered in zip(self.compute, self.fresh, self._ordered))
        return compute, statistics.median([min(s.comm_s) for s in self.samples])

    def betting(self) -> Tuple[float, ...]:
        """:meth:`times` with every rank a bet is on read from its last step alone: the speeds if its slow steps
        are a change.  A pending rank has one slow step; a rank with slow steps and none after them is read at
        the latest (a change on the wall clock begins within a step, so its first step runs partly at the old
        pace and only the later ones read the new)."""
        compute, _ = self.times()
        last = self.samples[-1].compute_s
        ranks = set(self.pending) | set(self.unconfirmed())
        return tuple(last[r] if r in ranks else c for r, c in enumerate(compute))

    def after_change(self) -> Tuple[Optional[float], ...]:
        """Every rank's compute over its fresh steps after the ones that made its last change (the lower
        tercile; ``None`` while there is none): the steps that made a change were chosen for being far from
        the earlier ones, so only the steps after them tell a slowdown from a run of outliers.  ``None`` too
        where a slowdown's latest step falls below every earlier one beyond the two-step band (module
        docstring; the first of its steps is left out, as a change on the wall clock may begin within it)."""
        out = []
        for r, (column, f, t) in enumerate(zip(self.compute, self.fresh, self.trigger)):
            if f <= t:
                out.append(None)
                continue
            level = column[-f:][1:]  # a slowdown's steps after its first, which may straddle it
            if self.slower[r] and len(level) > 1 and \
                    math.log(min(level[:-1]) / level[-1]) > CHANGE_Z * math.sqrt(2.0) * self.rates.sigma:
                out.append(None)
                continue
            out.append(tercile(column[-(f - t):]))
        return tuple(out)

