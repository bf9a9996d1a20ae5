"""The JSON that ``semimig plan`` reads: device specs or measured profiles, checked key by key.

SPEC is either a list of devices or ``{"devices": [...], "comm_time_s": <seconds >= 0>}``.  A device is

    {"name": "a100", "max_batch_size": 64, "peak_speed": 900.0}           constant speed, samples/s
    {"name": "v100", "max_batch_size": 32, "points": [[1, 0.004], ...]}   (batch, seconds) per micro-step

``name`` is optional (``device<i>``); exactly one of ``peak_speed`` and ``points``; with
``points``, ``"interpolation": "linear"`` (default) or ``"spline"`` (:mod:`.speed`).  A measured
profile (:func:`profiles_to_spec`, from :meth:`~.profiler.DeviceProfile.to_dict`) is the same
with the extra keys ``probes``, ``failed_batch_sizes``, ``first_estimate`` and ``memory_fit``,
which are ignored here.  Any other key is refused (a misspelt ``comm_time`` would otherwise be
silently dropped).  Every refusal is a :class:`~semimig.errors.ConfigError` whose one-line message
names the key by its path (``devices[1].max_batch_size``) and the bad value.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from semimig._validate import check_choice, check_int, check_number
from semimig.allocation.profiler import DeviceProfile
from semimig.allocation.speed import INTERPOLATIONS, MAX_BATCH_SIZE, MAX_TIME_S, MIN_TIME_S, SpeedCurve
from semimig.errors import ConfigError

__all__ = ["curves_from_spec", "profiles_to_spec"]

_TOP_KEYS = frozenset({"devices", "comm_time_s"})
_DEVICE_KEYS = frozenset({"name", "max_batch_size", "peak_speed", "points", "interpolation"})
_PROFILE_KEYS = frozenset({"probes", "failed_batch_sizes", "first_estimate", "memory_fit"})
_MAX_REPR = 80


def _short(value: Any) -> str:
    """``repr(value)``, cut to one short line for error messages."""
    text = repr(value).replace("\n", " ")
    return text if len(text) <= _MAX_REPR else text[:_MAX_REPR - 3] + "..."


def _unknown_keys(where: str, mapping: dict, allowed: frozenset) -> None:
    unknown = sorted(str(k) for k in mapping if k not in allowed)
    if unknown:
        raise ConfigError(f"{where} has unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _points(where: str, points: Any) -> list[tuple[int, float]]:
    if not isinstance(points, list) or not points:
        raise ConfigError(f"{where} must be a non-empty list of [batch_size, seconds], got {_short(points)}")
    pairs = []
    for j, point in enumerate(points):
        if not isinstance(point, list) or len(point) != 2:
            raise ConfigError(f"{where}[{j}] must be [batch_size, seconds], got {_short(point)}")
        batch = check_int(f"{where}[{j}][0] (batch size)", point[0], minimum=1, maximum=MAX_BATCH_SIZE)
        seconds = check_number(f"{where}[{j}][1] (seconds)", point[1], minimum=MIN_TIME_S, maximum=MAX_TIME_S)
        pairs.append((batch, seconds))
    return pairs


def _device_curve(i: int, device: Any) -> SpeedCurve:
    where = f"devices[{i}]"
    if not isinstance(device, dict):
        raise ConfigError(f"{where} must be an object, got {_short(device)}")
    _unknown_keys(where, device, _DEVICE_KEYS | _PROFILE_KEYS)
    name = device.get("name", f"device{i}")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.name must be a non-empty string, got {_short(name)}")
    if "max_batch_size" not in device:
        raise ConfigError(f"{where} ({name!r}) has no 'max_batch_size'")
    max_batch = check_int(f"{where}.max_batch_size", device["max_batch_size"], minimum=1, maximum=MAX_BATCH_SIZE)
    if ("points" in device) == ("peak_speed" in device):
        raise ConfigError(f"{where} ({name!r}) needs exactly one of 'points' and 'peak_speed'")
    if "peak_speed" in device:
        speed = check_number(f"{where}.peak_speed (samples/s)", device["peak_speed"],
                             minimum=1.0 / MAX_TIME_S, maximum=1.0 / MIN_TIME_S)
        return SpeedCurve.constant(peak_speed=speed, max_batch_size=max_batch, name=name)
    points = _points(f"{where}.points", device["points"])
    batches = [b for b, _ in points]
    if len(set(batches)) != len(batches):
        raise ConfigError(f"{where}.points repeats a batch size: {batches}")
    if max(batches) > max_batch:
        raise ConfigError(f"{where}.points has batch size {max(batches)} above max_batch_size={max_batch}")
    interpolation = check_choice(f"{where}.interpolation", device.get("interpolation", "linear"), INTERPOLATIONS)
    return SpeedCurve.from_points(points, max_batch_size=max_batch, name=name, interpolation=interpolation)


def curves_from_spec(spec: Any) -> tuple[list[SpeedCurve], Optional[float]]:
    """Speed curves (and the spec's ``comm_time_s``, if any) from a parsed SPEC (module docs)."""
    comm: Optional[float] = None
    if isinstance(spec, dict):
        _unknown_keys("spec", spec, _TOP_KEYS)
        if "devices" not in spec:
            raise ConfigError(f"spec must have a 'devices' list, got keys {sorted(str(k) for k in spec)}")
        if "comm_time_s" in spec:
            comm = check_number("comm_time_s", spec["comm_time_s"], minimum=0.0)
        devices = spec["devices"]
    elif isinstance(spec, list):
        devices = spec
    else:
        raise ConfigError(f"spec must be a list of devices or an object with 'devices', got {_short(spec)}")
    if not isinstance(devices, list):
        raise ConfigError(f"devices must be a list, got {_short(devices)}")
    if not devices:
        raise ConfigError("devices is empty: cannot allocate a batch over an empty cluster")
    return [_device_curve(i, device) for i, device in enumerate(devices)], comm


def profiles_to_spec(profiles: Sequence[DeviceProfile], *, comm_time_s: float = 0.0) -> dict[str, Any]:
    """A SPEC (module docs) holding measured profiles, readable by ``semimig plan``."""
    if not all(isinstance(p, DeviceProfile) for p in profiles):
        raise ConfigError(f"profiles must be DeviceProfile objects, got {_short(profiles)}")
    return {"comm_time_s": check_number("comm_time_s", comm_time_s, minimum=0.0),
            "devices": [p.to_dict() for p in profiles]}
