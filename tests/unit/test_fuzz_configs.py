"""Fuzz the config dataclasses, the straggler grammar, speed curves and keep plans.

Every input either works or raises :class:`semimig.errors.ConfigError` with a one-line message
naming what it refused — never another exception type, a hang (hypothesis' deadline) or a silent
acceptance.  "Silent acceptance" is checked by an oracle independent of the code under test: an
accepted config must hold, in every field, a value of the field's declared type (ints are ints, not
bools or floats; floats are finite numbers; tuples hold what they declare), plus the few ranges the
docs promise.  Runs are derandomised (the same examples every run) and bounded, so the suite is
fast and an ``xfail(strict=True)`` marks a known failure until it is fixed.  A longer hunt:
``SEMIMIG_FUZZ_EXAMPLES=5000 SEMIMIG_FUZZ_RANDOM=1 pytest tests/unit/test_fuzz_*.py``.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semimig.errors import ConfigError

FUZZ = settings(max_examples=int(os.environ.get("SEMIMIG_FUZZ_EXAMPLES", "150")), deadline=None,
                derandomize=not os.environ.get("SEMIMIG_FUZZ_RANDOM"), database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# ------------------------------------------------------------------------------------ values
EDGE_NUMBERS = [0, 1, -1, 2, 3, 0.5, 1.0, 4.0, 100, 101, 1e6, 1e300, -1e300, 5e-324, 2**63, 10**11,
                float("nan"), float("inf"), float("-inf"), -0.0]
ANY = st.one_of(
    st.none(), st.booleans(), st.sampled_from(EDGE_NUMBERS),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6), st.sampled_from(["1", "fast", "semi", "pri", "fixed:1:4", "", "x"]),
    st.lists(st.sampled_from(EDGE_NUMBERS[:12]), max_size=4).map(tuple),
    st.lists(st.integers(-2, 5), max_size=4),
    st.dictionaries(st.sampled_from(["a", "0", "mode"]), st.integers(-1, 2), max_size=2),
)
"""Any value a user might pass by mistake: wrong types, edge numbers, non-finite floats, containers."""


def kwargs_for(cls, plausible: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """Keyword arguments for ``cls``: each field absent (its default), plausible, or anything."""
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    return st.fixed_dictionaries({}, optional={
        name: st.one_of(plausible[name], ANY) if name in plausible else ANY for name in names})


# ------------------------------------------------------------------------------------ oracle
def conforms(value, hint) -> bool:
    """Does ``value`` hold the declared type ``hint`` (finite for floats, no bool for numbers)?"""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any or isinstance(hint, (str, typing.TypeVar)):
        return True
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        return any(conforms(value, a) for a in args)
    if origin is typing.Literal:
        return any(type(value) is type(a) and value == a for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(conforms(v, args[0]) for v in value)
        return len(args) == len(value) and all(conforms(v, a) for v, a in zip(value, args))
    if origin in (dict, typing.Mapping) or str(origin) == "<class 'collections.abc.Mapping'>":
        return isinstance(value, typing.Mapping)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def assert_conforms(obj) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if f.name.startswith("_") or f.name not in hints:
            continue
        value = getattr(obj, f.name)
        assert conforms(value, hints[f.name]), f"{type(obj).__name__} accepted {f.name}={value!r} ({hints[f.name]})"


def build(factory, **kwargs):
    """``factory(**kwargs)``, or ``None`` when refused with a one-line ConfigError."""
    try:
        return factory(**kwargs)
    except ConfigError as err:
        message = str(err)
        assert message and "\n" not in message, f"refusal is not one line: {message!r}"
        return None


# ------------------------------------------------------------------------------------ configs
PROB = st.floats(min_value=-0.5, max_value=1.5)


@FUZZ
@given(kwargs_for(__import__("semimig.resizing.config", fromlist=["x"]).ResizingConfig,
                  {"gamma_max": PROB, "alpha": PROB, "theta_rel": st.floats(-1, 20), "period": st.integers(-2, 9),
                   "variant": st.sampled_from(["rd", "pri", "pridiff-e", "pridiff-r", "x"])}))
def test_resizing_config(kwargs):
    from semimig.resizing.config import ResizingConfig

    cfg = build(ResizingConfig, **kwargs)
    if cfg is not None:
        assert_conforms(cfg)
        assert 0.0 <= cfg.gamma_max < 1.0 and 0.0 < cfg.alpha <= 1.0


@FUZZ
@given(kwargs_for(__import__("semimig.controller.config", fromlist=["x"]).ControllerConfig,
                  {"tol": PROB, "gamma_max": PROB, "window": st.integers(-1, 20), "patience": st.integers(-1, 20),
                   "migrators": st.integers(-1, 4), "mode": st.sampled_from(["semi", "zero", "mig", "baseline"])}))
def test_controller_config(kwargs):
    from semimig.controller.config import ControllerConfig

    cfg = build(ControllerConfig, **kwargs)
    if cfg is not None:
        assert_conforms(cfg)


@FUZZ
@given(kwargs_for(__import__("semimig.controller.runtime", fromlist=["x"]).BalanceConfig,
                  {"mode": st.sampled_from(["semi", "zero-pri", "mig", "baseline", "zero-foo"]),
                   "straggler": st.sampled_from(["fixed:1:4", "none", "round-robin:8", "fixed:1:x", "multi:0=2"]),
                   "interval": st.integers(-1, 5), "dense_layers": st.just(("classifier",))}))
def test_balance_config(kwargs):
    from semimig.controller.runtime import BalanceConfig

    cfg = build(BalanceConfig, **kwargs)
    if cfg is not None:
        assert_conforms(cfg)


STRAGGLER_PLAUSIBLE = {
    "pattern": st.sampled_from(["none", "fixed", "round-robin", "multi", "burst"]),
    "ranks": st.lists(st.integers(-1, 3), max_size=3).map(tuple),
    "chi": st.lists(st.sampled_from([1.0, 2.0, 4.0, 0.5, float("inf")]), max_size=3).map(tuple),
    "mode": st.sampled_from(["measured", "flops", "emulated"]),
    "flops_per_second": st.sampled_from([1e9, 0.0, -1.0, float("nan"), None]),
    "burst_every": st.integers(-1, 5), "burst_length": st.integers(-1, 5),
}


@FUZZ
@given(kwargs_for(__import__("semimig.straggler.injection", fromlist=["x"]).StragglerConfig, STRAGGLER_PLAUSIBLE))
def test_straggler_config(kwargs):
    from semimig.straggler.injection import StragglerConfig

    cfg = build(StragglerConfig, **kwargs)
    if cfg is not None:
        assert_conforms(cfg)
        assert all(math.isfinite(c) and c >= 1 for c in cfg.chi)


SPEC_TOKENS = st.sampled_from(["none", "fixed", "round-robin", "multi", "burst", "1", "0", "-1", "4", "1,3", "1,1",
                               "0=8,1=6", "0=x", "inf", "nan", "1e300", "every=2", "len=1", "mode=flops",
                               "mode=emulated", "flops=1e9", "flops=0", "mode=x", "", "x=1", "=", "every=0"])


@FUZZ
@given(st.one_of(st.lists(SPEC_TOKENS, min_size=1, max_size=6).map(":".join), st.text(max_size=20)))
def test_straggler_cli_grammar(spec):
    """Either a config that prints back to an equal config, or a one-line ConfigError."""
    from semimig.straggler.injection import StragglerConfig

    cfg = build(StragglerConfig.from_cli, spec=spec)
    if cfg is not None:
        assert StragglerConfig.from_cli(cfg.to_cli()) == cfg


@FUZZ
@given(kwargs_for(__import__("semimig.bench.config", fromlist=["x"]).BenchConfig,
                  {"allocation": st.sampled_from([None, "even", "poplar", "uneven"]),
                   "modes": st.lists(st.sampled_from(["baseline", "semi", "zero-pri", "poplar", "x"]),
                                     max_size=3).map(tuple),
                   "group_chis": st.sampled_from([(), ((1.0, 4.0), (2.0, 2.0)), ((1.0,),), ((1.0, 0.5), (1.0, 1.0)),
                                                  [[1, 4], [2, 2]], ((True, 4.0), (2.0, 2.0))]),
                   "zero_stage": st.integers(-1, 3), "straggler_until": st.sampled_from([None, 0, 4, True]),
                   "chis": st.lists(st.sampled_from([1.0, 4.0, 8.0, 0.5, 101.0, 1e6]), max_size=3).map(tuple),
                   "seeds": st.lists(st.integers(-1, 3), max_size=3).map(tuple),
                   "tp": st.integers(-1, 5), "dp": st.integers(-1, 3), "epochs": st.integers(-1, 3),
                   "compute": st.sampled_from(["emulated", "measured", "x"]),
                   "device_ms": st.sampled_from([40.0, 0.0, 1e5, float("inf")]),
                   "timeout_s": st.sampled_from([None, 0.5, 60.0, 1e6])}))
def test_bench_config(kwargs):
    from semimig.bench.config import MAX_CHI, BenchConfig

    cfg = build(BenchConfig, **kwargs)
    if cfg is not None:
        assert_conforms(cfg)
        assert all(1.0 <= c <= MAX_CHI for c in cfg.chis)
        assert len(set(cfg.chis)) == len(cfg.chis) and len(set(cfg.seeds)) == len(cfg.seeds)
        assert len(set(cfg.modes)) == len(cfg.modes)
        assert cfg.compute == "measured" or cfg.longest_wait_s() < cfg.timeout_s
        if cfg.allocation is not None:  # the 2-D mode: dp rows of tp slowdowns, each in [1, 100]
            assert len(cfg.grid_chis()) == cfg.dp and all(len(row) == cfg.tp for row in cfg.grid_chis())
            assert all(1.0 <= c <= MAX_CHI for row in cfg.grid_chis() for c in row)


# ------------------------------------------------------------------------------------ allocation
@FUZZ
@given(peak=ANY, max_batch=st.one_of(st.integers(-1, 2**21), ANY), name=st.one_of(st.just("d"), ANY))
def test_speed_curve_constant(peak, max_batch, name):
    from semimig.allocation.speed import SpeedCurve

    curve = build(SpeedCurve.constant, peak_speed=peak, max_batch_size=max_batch, name=name)
    if curve is not None:
        for b in {1, curve.max_batch_size}:
            assert math.isfinite(curve.time(b)) and curve.time(b) > 0


POINT = st.tuples(st.one_of(st.integers(-1, 70), ANY), st.one_of(st.floats(-1, 1), ANY))


@FUZZ
@given(points=st.one_of(st.lists(POINT, max_size=4), st.lists(ANY, max_size=3), ANY),
       max_batch=st.one_of(st.integers(-1, 80), ANY),
       interpolation=st.sampled_from(["linear", "spline", "cubic", 3]))
def test_speed_curve_from_points(points, max_batch, interpolation):
    from semimig.allocation.speed import SpeedCurve

    curve = build(SpeedCurve.from_points, points=points, max_batch_size=max_batch, interpolation=interpolation)
    if curve is not None:
        assert all(math.isfinite(curve.time(b)) and curve.time(b) > 0 for b in (1, curve.max_batch_size))


@pytest.mark.parametrize("points", [None, 5])
def test_speed_curve_from_points_refuses_a_non_sequence(points):
    """``points`` that is not a sequence is refused as a bad input, not a TypeError from iterating it."""
    from semimig.allocation.speed import SpeedCurve

    assert build(SpeedCurve.from_points, points=points, max_batch_size=8) is None


@FUZZ
@given(gbs=st.one_of(st.integers(-1, 600), ANY), zero=st.one_of(st.integers(-1, 4), ANY),
       comm=st.one_of(st.floats(-1, 1), ANY), steps=st.one_of(st.none(), st.integers(-1, 9), ANY))
def test_allocation_request_and_plans(gbs, zero, comm, steps):
    from semimig.allocation.allocate import even_plan, poplar_plan
    from semimig.allocation.request import AllocationRequest
    from semimig.allocation.speed import SpeedCurve

    curves = (SpeedCurve.constant(peak_speed=900.0, max_batch_size=64, name="a"),
              SpeedCurve.from_points([(1, 0.01), (16, 0.05), (32, 0.09)], max_batch_size=32, name="b"))
    request = build(AllocationRequest, curves=curves, global_batch_size=gbs, zero_stage=zero, comm_time_s=comm,
                    max_accumulation_steps=steps)
    if request is None:
        return
    for planner in (poplar_plan, even_plan):
        plan = build(planner, request=request)
        if plan is not None:
            assert sum(d.samples for d in plan.devices) == request.global_batch_size


# ------------------------------------------------------------------------------------ keep plans
@FUZZ
@given(values=st.lists(st.integers(-3, 70), max_size=12), k=st.one_of(st.integers(-2, 68), ANY),
       kind=st.sampled_from(["int32", "int64", "float32", "bool", "list", "2d"]),
       group=st.one_of(st.none(), st.sampled_from([1, 8, 16, 32, 3, 0, -8]), ANY))
def test_plan_keep(values, k, kind, group):
    """A plan's kept columns are sorted, distinct and inside [0, k), its pruned ones their complement."""
    import torch

    from semimig.kernels.keep import plan_keep

    if kind == "list":
        keep = values
    elif kind == "2d":
        keep = torch.tensor(values, dtype=torch.int64).reshape(1, -1)
    else:
        keep = torch.tensor(values, dtype=getattr(torch, kind if kind != "bool" else "bool")) if kind != "bool" \
            else torch.tensor([v > 0 for v in values])
    plan = build(plan_keep, keep=keep, k=k, device="cpu", group=group)
    if plan is not None:
        kept, pruned = plan.keep.tolist(), plan.pruned.tolist()
        assert kept == sorted(set(kept)) and all(0 <= c < k for c in kept)
        assert sorted(kept + pruned) == list(range(k))


# ------------------------------------------------------------- the issue's own list, by name
@pytest.mark.parametrize(("module", "cls", "kwargs", "named"), [
    ("semimig.controller.runtime", "BalanceConfig", {"resizing": "pri"}, "'pri'"),
    ("semimig.controller.runtime", "BalanceConfig", {"controller": {"mode": "semi"}}, "{'mode': 'semi'}"),
    ("semimig.controller.runtime", "BalanceConfig", {"curves": "x"}, "'x'"),
    ("semimig.straggler.injection", "StragglerConfig", {"flops_per_second": "fast"}, "'fast'"),
])
def test_config_inputs_of_the_wrong_type_are_refused_naming_the_value(module, cls, kwargs, named) -> None:
    """Inputs of the wrong type, which would end in an AttributeError at once or later: one ConfigError, value named."""
    import importlib

    with pytest.raises(ConfigError) as info:
        getattr(importlib.import_module(module), cls)(**kwargs)
    assert named in str(info.value) and "\n" not in str(info.value)


def test_a_straggler_spec_string_is_parsed_not_kept_as_a_string() -> None:
    """``BalanceConfig(straggler="fixed:1:4")`` holds the parsed config (a string kept would fail later)."""
    from semimig.controller.runtime import BalanceConfig
    from semimig.straggler.injection import StragglerConfig

    assert BalanceConfig(straggler="fixed:1:4").straggler == StragglerConfig.from_cli("fixed:1:4")
