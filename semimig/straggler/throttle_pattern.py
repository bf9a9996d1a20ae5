"""A time-varying throttle: throttled ``on_s`` seconds, free ``off_s``, repeating (``"20:40"``).

    fraction_at(t) = fraction   if (t mod (on_s + off_s)) < on_s   else free     (t >= 0 from the start)

(``free`` 1, a whole core, unless the rank is held to a share of one: ``semimig throttle --share``.)

A straggler that moves visits ``n`` ranks in turn (:meth:`ThrottlePattern.in_turn`): each rank's pattern
has the cycle ``n·c`` (``c = on_s + off_s``) and rank ``j`` of them is throttled during
``[j·c, j·c + on_s)`` of it, so exactly one rank is throttled in every ``on_s`` phase, the next one after
each ``off_s`` (with ``off_s = 0`` the straggler moves straight on)::

    fraction_at_j(t) = fraction   if 0 <= (t mod n·c) − j·c < on_s   else free

:class:`ThrottlePattern` is the pure schedule; :class:`PatternDriver` is a daemon thread that applies
it to a :class:`~semimig.straggler.throttle.CpuThrottle`, waking only at the switching times and
logging each switch at INFO.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Optional, Tuple

from semimig._validate import check_int, check_number
from semimig.errors import ConfigError

if TYPE_CHECKING:
    from semimig.straggler.throttle import CpuThrottle

__all__ = ["PatternDriver", "ThrottlePattern"]

logger = logging.getLogger("semimig.straggler.throttle")  # one logger for the throttle and its pattern


@dataclass(frozen=True, kw_only=True)
class ThrottlePattern:
    """Throttled for ``on_s`` seconds at ``fraction``, then free for ``off_s``, repeating from ``t = 0``:

        fraction_at(t) = fraction   if (t mod (on_s + off_s)) < on_s   else free

    ``turn`` of ``turns``: this rank's share of a straggler that visits ``turns`` ranks in turn (module
    docstring; ``turns = 1``: the plain pattern).  ``free``: the fraction outside the throttled phases (1: a
    whole core; a rank held to a share of a core, as every other rank is, returns to that share).
    """

    on_s: float
    off_s: float
    fraction: float
    turn: int = 0
    turns: int = 1
    free: float = 1.0

    def __post_init__(self) -> None:
        check_number("pattern on_s", self.on_s, minimum=0.0, low_open=True)
        check_number("pattern off_s", self.off_s, minimum=0.0)
        check_number("pattern fraction", self.fraction, minimum=0.0, maximum=1.0, low_open=True)
        check_int("pattern turns", self.turns, minimum=1)
        check_int("pattern turn", self.turn, minimum=0, maximum=self.turns - 1)
        check_number("pattern free fraction", self.free, minimum=0.0, maximum=1.0, low_open=True)
        if self.free < self.fraction:
            raise ConfigError(f"pattern: the free fraction {self.free:g} is below the throttled one "
                              f"{self.fraction:g}: the free phases would be the slow ones")

    def in_turn(self, n: int) -> Tuple["ThrottlePattern", ...]:
        """The patterns of ``n`` ranks that take this pattern's throttled phases in turn (module docstring)."""
        check_int("ranks in turn", n, minimum=1)
        return tuple(replace(self, turn=j, turns=n) for j in range(n))

    @property
    def always(self) -> bool:
        """Throttled at every ``t`` (one rank, no free phase)."""
        return self.turns == 1 and self.off_s == 0

    @classmethod
    def parse(cls, text: str, *, fraction: float) -> "ThrottlePattern":
        """``"ON:OFF"`` in seconds, e.g. ``"20:40"``."""
        parts = str(text).split(":")
        try:
            on_s, off_s = (float(p) for p in parts)
        except ValueError:
            raise ConfigError(f"pattern must be ON:OFF in seconds (e.g. 20:40), got {text!r}") from None
        return cls(on_s=on_s, off_s=off_s, fraction=fraction)

    def held_at(self, t: float) -> bool:
        """Whether ``t`` seconds after the pattern started fall in this rank's throttled phase (``t < 0``: as
        ``t = 0``)."""
        if self.always:
            return True
        phase = self.on_s + self.off_s
        at = math.fmod(max(0.0, t), self.turns * phase) - self.turn * phase
        return 0.0 <= at < self.on_s

    def fraction_at(self, t: float) -> float:
        """The fraction in force ``t`` seconds after the pattern started (``t < 0``: as ``t = 0``)."""
        return self.fraction if self.held_at(t) else self.free

    def next_change(self, t: float) -> float:
        """The first time after ``t`` at which :meth:`fraction_at` changes (``inf`` if it never does)."""
        if self.always:
            return math.inf
        t = max(0.0, t)
        cycle = self.turns * (self.on_s + self.off_s)
        begin = self.turn * (self.on_s + self.off_s)  # this rank's throttled phase within a cycle
        start = math.floor(t / cycle) * cycle
        for edge in (start + begin, start + begin + self.on_s, start + cycle + begin, start + cycle + begin + self.on_s):
            if edge > t:
                return edge
        return start + 2 * cycle + begin  # unreachable: kept for floating-point safety


class PatternDriver:
    """A daemon thread that sets ``throttle``'s fraction to ``pattern.fraction_at(now - start)``.

    ``on_switch(unix_s, fraction)``: told the wall-clock time (``time.time()``) and the fraction at
    the start and at every switch applied, so a run's steps can be matched with the phases."""

    def __init__(self, throttle: CpuThrottle, pattern: ThrottlePattern, *,
                 clock: Callable[[], float] = time.monotonic,
                 on_switch: Optional[Callable[[float, float], None]] = None) -> None:
        self._throttle, self._pattern, self._clock, self._on_switch = throttle, pattern, clock, on_switch
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="semimig-throttle-pattern", daemon=True)
        self._start = 0.0

    def start(self, origin: Optional[float] = None) -> "PatternDriver":
        """Apply the pattern from ``origin`` on (a reading of the driver's clock; default now): drivers of
        ranks that take a pattern in turn start from one origin."""
        self._start = self._clock() if origin is None else origin
        self._throttle.set_fraction(self._pattern.fraction_at(0.0))
        if self._on_switch is not None:
            self._on_switch(time.time(), self._pattern.fraction_at(0.0))
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        current = self._pattern.fraction_at(0.0)
        while not self._stop.is_set():
            t = self._clock() - self._start
            edge = self._pattern.next_change(t)
            if self._stop.wait(min(edge - t, 3600.0) if math.isfinite(edge) else None):
                return
            t = self._clock() - self._start
            wanted = self._pattern.fraction_at(t)
            if wanted != current:
                try:
                    self._throttle.set_fraction(wanted)
                except (OSError, RuntimeError) as err:   # closed under us: the run is ending
                    logger.info("throttle pattern stopped: %s", err)
                    return
                logger.info("throttle pattern at t=%.1f s: fraction %g -> %g", t, current, wanted)
                if self._on_switch is not None:
                    self._on_switch(time.time(), wanted)
                current = wanted
