"""The schema of a saved ``semimig bench`` JSON, checked where it enters (``semimig report``, ``--resume``).

Only what the table, the plots and a resume read is required; extra keys (trajectories, plans,
per-rank lists) pass through untouched.  Every refusal is a :class:`semimig.errors.ConfigError`
whose one-line message names the file, the JSON path and the bad value, e.g.
``r.json: records[3].accuracy must be a finite number >= 0 and <= 1 or None, got 'high'``.

A run's ``config`` is the settings of its mode (:meth:`semimig.bench.config.BenchConfig.settings`): a 2-D
run's has ``allocation`` (:func:`is_grid`).  Files written before the one run config named the 2-D
run's compute mode ``timing``; :func:`validate_saved` reads that key as ``compute``
(:data:`RENAMED_KEYS`), so old and new files resume and merge alike.
"""
from __future__ import annotations

from typing import Any

from semimig._validate import check_int, check_number
from semimig.errors import ConfigError

_SWEEP_ITEMS = {"modes": "str", "chis": "number", "seeds": "int", "lambdas": "int"}
RENAMED_KEYS = {"timing": "compute"}
"""Config keys of older files and today's name for each (read as today's, the old key dropped)."""


def is_grid(config: dict) -> bool:
    """Whether a run's settings are the 2-D mode's (an ``allocation`` that is not None)."""
    return config.get("allocation") is not None


def current_config(config: dict) -> dict:
    """``config`` with the keys of :data:`RENAMED_KEYS` under today's names (a new dict; unchanged when
    it has none).  A file holding both names is refused: which one it means cannot be told."""
    renamed = {old: new for old, new in RENAMED_KEYS.items() if old in config}
    if not renamed:
        return config
    for old, new in renamed.items():
        if new in config:
            raise ConfigError(f"config has both {old!r} (the old name) and {new!r}: one run has one {new}")
    return {renamed.get(key, key): value for key, value in config.items()}


def _check_str(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _check_list(name: str, value: Any) -> list:
    if not isinstance(value, list):
        raise ConfigError(f"{name} must be a list, got {type(value).__name__} {_short(value)}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validate_record(record: Any, where: str, *, grid: bool = False) -> dict:
    """One case's record; ``where`` names it (``file: records[3]``); ``grid``: a 2-D run's record,
    which has no chi (its slowdowns are a per-group pattern in the config)."""
    if not isinstance(record, dict):
        raise ConfigError(f"{where} must be an object, got {type(record).__name__} {_short(record)}")
    for key in ("mode", "seed", "iter_time_s", "epoch_time_s") + (() if grid else ("chi",)):
        if key not in record:
            raise ConfigError(f"{where} has no {key!r}")
    _check_str(f"{where}.mode", record["mode"])
    check_number(f"{where}.chi", record.get("chi"), minimum=1.0, allow_none=grid)
    check_int(f"{where}.seed", record["seed"], minimum=0)
    check_int(f"{where}.lambda", record.get("lambda"), minimum=0, allow_none=True)
    for key in ("iter_time_s", "epoch_time_s"):
        check_number(f"{where}.{key}", record[key], minimum=0.0, low_open=True)
    check_number(f"{where}.accuracy", record.get("accuracy"), minimum=0.0, maximum=1.0, allow_none=True)
    check_number(f"{where}.migrating_stragglers", record.get("migrating_stragglers", 0), minimum=0.0)
    for key, maximum in (("shed_share_by_rank", 1.0), ("savings_by_rank", 1.0), ("busy_share_by_rank", None)):
        if key in record:
            for i, value in enumerate(_check_list(f"{where}.{key}", record[key])):
                check_number(f"{where}.{key}[{i}]", value, minimum=0.0, maximum=maximum)
    return record


def validate_config(config: Any, where: str) -> dict:
    """The run's settings: an object whose sweep axes, where present, are lists of the right items."""
    if not isinstance(config, dict):
        raise ConfigError(f"{where} must be an object, got {type(config).__name__} {_short(config)}")
    for key, kind in _SWEEP_ITEMS.items():
        if key not in config:
            continue
        for i, value in enumerate(_check_list(f"{where}.{key}", config[key])):
            name = f"{where}.{key}[{i}]"
            if kind == "str":
                _check_str(name, value)
            elif kind == "int":
                check_int(name, value, minimum=0)
            else:
                check_number(name, value, minimum=1.0)
    return config


def validate_saved(data: Any, source: str) -> dict:
    """A whole saved run (``records`` and ``config``); returns ``data`` when valid, its config under
    today's key names (:func:`current_config`; a copy of ``data`` when a key was renamed)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must hold a JSON object, got {type(data).__name__}: not a JSON written by "
                          "semimig bench")
    for key in ("records", "config"):
        if key not in data:
            raise ConfigError(f"{source} has no {key!r}: not a JSON written by semimig bench")
    validate_config(data["config"], f"{source}: config")
    try:
        config = current_config(data["config"])
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    if config is not data["config"]:
        data = {**data, "config": config}
    records = _check_list(f"{source}: records", data["records"])
    grid = is_grid(config)
    seen = {}
    for i, record in enumerate(records):
        validate_record(record, f"{source}: records[{i}]", grid=grid)
        case = (record["mode"], record.get("chi"), record["seed"], record.get("lambda"))
        if case in seen:
            raise ConfigError(f"{source}: records[{i}] measures the case of records[{seen[case]}] again "
                              f"(mode {case[0]!r}, chi {case[1]}, seed {case[2]}, lambda {case[3]})")
        seen[case] = i
    return data
