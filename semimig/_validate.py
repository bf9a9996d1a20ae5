"""Small validators shared by every config of semimig (one place, one wording).

Each ``check_*`` returns the value (normalised where stated) or raises
:class:`semimig.errors.ConfigError` naming ``name`` and the bad value, e.g.
``check_int("interval", 0, minimum=1)`` -> ``ConfigError("interval must be an int >= 1, got 0")``.
``bool`` is never accepted as a number.
"""
from __future__ import annotations

import argparse
import math
import numbers
import os
import sys
from typing import Any, Iterable, NoReturn, Optional

from semimig.errors import ConfigError

__all__ = ["OneLineParser", "first_local_rank", "refuse_once", "is_int", "is_number", "check_bool", "check_int", "check_number", "check_choice", "check_str_tuple"]


def is_int(value: object) -> bool:
    """An ``int`` (numpy integers included), not a ``bool``."""
    if type(value) is int:  # the common case, without the abstract-class check
        return True
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A finite real number, not a ``bool``."""
    if type(value) is float or type(value) is int:  # the common cases, without the abstract-class check
        return math.isfinite(value)
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def _bounds(minimum, maximum, *, low_open: bool = False, high_open: bool = False) -> str:
    parts = []
    if minimum is not None:
        parts.append(f"{'>' if low_open else '>='} {minimum:g}" if isinstance(minimum, float) else
                     f"{'>' if low_open else '>='} {minimum}")
    if maximum is not None:
        parts.append(f"{'<' if high_open else '<='} {maximum:g}" if isinstance(maximum, float) else
                     f"{'<' if high_open else '<='} {maximum}")
    return " and ".join(parts)


def check_bool(name: str, value: Any) -> bool:
    """A ``bool`` (not ``0``/``1`` nor a string)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be a bool, got {value!r}")
    return value


def check_int(name: str, value: Any, *, minimum: Optional[int] = None, maximum: Optional[int] = None,
              allow_none: bool = False) -> Optional[int]:
    """An int in ``[minimum, maximum]`` (either bound optional); ``None`` only if ``allow_none``."""
    if value is None and allow_none:
        return None
    ok = is_int(value) and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
    if not ok:
        bounds = _bounds(minimum, maximum)
        raise ConfigError(f"{name} must be an int{' ' + bounds if bounds else ''}"
                          f"{' or None' if allow_none else ''}, got {value!r}")
    return int(value)


def check_number(name: str, value: Any, *, minimum: Optional[float] = None, maximum: Optional[float] = None,
                 low_open: bool = False, high_open: bool = False, allow_none: bool = False) -> Optional[float]:
    """A finite number in the given range (``low_open``/``high_open`` exclude the bound); as ``float``."""
    if value is None and allow_none:
        return None
    ok = is_number(value)
    if ok and minimum is not None:
        ok = value > minimum if low_open else value >= minimum
    if ok and maximum is not None:
        ok = value < maximum if high_open else value <= maximum
    if not ok:
        bounds = _bounds(minimum, maximum, low_open=low_open, high_open=high_open)
        raise ConfigError(f"{name} must be a finite number{' ' + bounds if bounds else ''}"
                          f"{' or None' if allow_none else ''}, got {value!r}")
    return float(value)


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """One of ``choices`` (compared with ``==``, type included for strings)."""
    choices = tuple(choices)
    if not any(type(value) is type(c) and value == c for c in choices):
        raise ConfigError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_str_tuple(name: str, value: Any, *, allow_empty: bool = True) -> tuple[str, ...]:
    """A tuple (or list) of non-empty strings, returned as a tuple; a bare string is refused."""
    if isinstance(value, str) or not isinstance(value, (tuple, list)) or \
            not all(isinstance(v, str) and v for v in value) or (not allow_empty and not value):
        raise ConfigError(f"{name} must be a tuple of non-empty strings{'' if allow_empty else ' (at least one)'}, "
                          f"got {value!r}")
    return tuple(value)


def first_local_rank() -> bool:
    """Whether this process speaks for its launch: not under a launcher, or its rank 0 (``RANK`` where a
    launcher sets it, else ``LOCAL_RANK``).  A refusal is printed by that process only, not once per rank."""
    rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))
    return rank.strip() in ("", "0") or not rank.strip().lstrip("-").isdigit()


def refuse_once(prog: str, message: object, code: int = 2) -> NoReturn:
    """``prog: error: message`` on stderr (one line, rank 0 only: :func:`first_local_rank`), then exit ``code``."""
    if first_local_rank():
        text = " ".join(str(message).split("\n"))
        print(f"{prog}: error: {text}", file=sys.stderr, flush=True)
    raise SystemExit(code)


class OneLineParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose refusal is one line (no usage block), printed once per
    launch (:func:`refuse_once`), exit status 2: under torchrun every rank parses the same flags, and one
    line from rank 0 says what N copies of a usage block would."""

    def error(self, message: str) -> NoReturn:  # noqa: D102 (argparse's)
        refuse_once(self.prog, message)
