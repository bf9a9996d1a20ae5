"""A time-varying throttle: throttled ``on_s`` seconds, free ``off_s``, repeating (``"20:40"``).

    fraction_at(t) = fraction   if (t mod (on_s + off_s)) < on_s   else 1.0      (t >= 0 from the start)

:class:`ThrottlePattern` is the pure schedule; :class:`PatternDriver` is a daemon thread that applies
it to a :class:`~semimig.straggler.throttle.CpuThrottle`, waking only at the switching times and
logging each switch at INFO.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from semimig._validate import check_number
from semimig.errors import ConfigError

if TYPE_CHECKING:
    from semimig.straggler.throttle import CpuThrottle

__all__ = ["PatternDriver", "ThrottlePattern"]

logger = logging.getLogger("semimig.straggler.throttle")  # one logger for the throttle and its pattern


@dataclass(frozen=True, kw_only=True)
class ThrottlePattern:
    """Throttled for ``on_s`` seconds at ``fraction``, then free for ``off_s``, repeating from ``t = 0``:

        fraction_at(t) = fraction   if (t mod (on_s + off_s)) < on_s   else 1.0
    """

    on_s: float
    off_s: float
    fraction: float

    def __post_init__(self) -> None:
        check_number("pattern on_s", self.on_s, minimum=0.0, low_open=True)
        check_number("pattern off_s", self.off_s, minimum=0.0)
        check_number("pattern fraction", self.fraction, minimum=0.0, maximum=1.0, low_open=True)

    @classmethod
    def parse(cls, text: str, *, fraction: float) -> "ThrottlePattern":
        """``"ON:OFF"`` in seconds, e.g. ``"20:40"``."""
        parts = str(text).split(":")
        try:
            on_s, off_s = (float(p) for p in parts)
        except ValueError:
            raise ConfigError(f"pattern must be ON:OFF in seconds (e.g. 20:40), got {text!r}") from None
        return cls(on_s=on_s, off_s=off_s, fraction=fraction)

    def fraction_at(self, t: float) -> float:
        """The fraction in force ``t`` seconds after the pattern started (``t < 0``: as ``t = 0``)."""
        if self.off_s == 0:
            return self.fraction
        phase = math.fmod(max(0.0, t), self.on_s + self.off_s)
        return self.fraction if phase < self.on_s else 1.0

    def next_change(self, t: float) -> float:
        """The first time after ``t`` at which :meth:`fraction_at` changes (``inf`` if it never does)."""
        if self.off_s == 0:
            return math.inf
        t = max(0.0, t)
        cycle = self.on_s + self.off_s
        start = math.floor(t / cycle) * cycle
        for edge in (start + self.on_s, start + cycle, start + cycle + self.on_s):
            if edge > t:
                return edge
        return start + 2 * cycle  # unreachable: kept for floating-point safety


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

    def start(self) -> "PatternDriver":
        self._start = self._clock()
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
