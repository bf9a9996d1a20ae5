"""Bad arguments to the layers' constructors and forward end in semimig's one-line refusal.

Unchecked, wrong sizes, types, dtypes, devices and process groups would reach Colossal-AI's or
torch's internals (``ZeroDivisionError: float division by zero`` for ``in_features=0``,
``AttributeError: 'object' object has no attribute 'size'`` for a bad group, ``mat1 and mat2 must
have the same dtype`` for a float64 input).  Each is a :class:`~semimig.errors.ConfigError` naming the layer,
the argument and the value, raised before any tensor is allocated or any collective runs.

Hypothesis draws the bad values inside one 2-rank gloo run (both ranks draw the same examples: a
fixed seed and no example database), so the refusals are checked where the layers live: in a real
process group.  Every example must raise ``ConfigError`` (never another exception type) with the
argument's name in its message; a good value next to the bad ones must still build or run.
"""
from __future__ import annotations

import pytest
import torch

from _backends import run_on_ranks

pytestmark = pytest.mark.usefixtures("cpu_path")

EXAMPLES = 40  # per strategy and layer class: 2 classes x 5 strategies x 40 = 400 draws in one spawn


def _probe_body(rank: int, world_size: int) -> dict:
    import torch.distributed as dist
    from hypothesis import given, seed, settings
    from hypothesis import strategies as st

    from semimig.errors import ConfigError
    from semimig.nn import Linear1D_Col, Linear1D_Row

    group = dist.group.WORLD
    checked: dict = {}
    quick = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True)

    def refused(label: str, call, *names: str) -> None:
        try:
            call()
        except ConfigError as err:
            message = str(err)
            assert "\n" not in message and any(n in message for n in names), (label, message)
            checked[label] = checked.get(label, 0) + 1
            return
        raise AssertionError(f"{label}: accepted")

    bad_size = st.one_of(st.integers(max_value=0), st.booleans(), st.none(), st.text(max_size=3),
                         st.floats(allow_nan=True, allow_infinity=True), st.just([4]))
    bad_group = st.one_of(st.integers(), st.text(max_size=3), st.just(object()), st.just([group, group]))
    bad_dtype = st.one_of(st.sampled_from([torch.int64, torch.int32, torch.bool, torch.uint8, torch.complex64]),
                          st.text(max_size=8), st.integers())
    bad_device = st.text(alphabet="xyzq:!", min_size=1, max_size=6)
    bad_bias = st.one_of(st.integers(), st.text(max_size=3), st.none())

    for cls in (Linear1D_Col, Linear1D_Row):
        name = cls.__name__

        @seed(0)
        @quick
        @given(value=bad_size, which=st.sampled_from(["in_features", "out_features"]))
        def sizes(value, which):
            kwargs = {"in_features": 4, "out_features": 4, which: value}
            refused(f"{name}.{which}", lambda: cls(**kwargs, process_group=group), which)

        @seed(0)
        @quick
        @given(value=bad_group)
        def groups(value):
            refused(f"{name}.process_group", lambda: cls(4, 4, process_group=value), "process_group")

        @seed(0)
        @quick
        @given(dtype=bad_dtype, device=bad_device, bias=bad_bias)
        def options(dtype, device, bias):
            refused(f"{name}.dtype", lambda: cls(4, 4, dtype=dtype, process_group=group), "dtype")
            refused(f"{name}.device", lambda: cls(4, 4, device=device, process_group=group), "device")
            refused(f"{name}.bias", lambda: cls(4, 4, bias=bias, process_group=group), "bias")

        layer = cls(4, 4, process_group=group)
        width = 4 if cls is Linear1D_Col else 4 // world_size
        good = torch.randn(3, width)

        @seed(0)
        @quick
        @given(rows=st.integers(1, 3), extra=st.integers(-width, 6).filter(lambda e: e != 0))
        def widths(rows, extra):
            refused(f"{name}.forward width", lambda: layer(torch.randn(rows, width + extra)), "width")

        @seed(0)
        @quick
        @given(dtype=st.sampled_from([torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int8,
                                      torch.bool]),
               other=st.one_of(st.just(None), st.lists(st.floats(), max_size=3), st.integers(), st.text(max_size=2)))
        def inputs(dtype, other):
            refused(f"{name}.forward dtype", lambda: layer(good.to(dtype)), "dtype")
            refused(f"{name}.forward type", lambda: layer(other), "torch.Tensor")

        for probe in (sizes, groups, options, widths, inputs):
            probe()
        refused(f"{name}.forward 0-d", lambda: layer(torch.tensor(1.0)), "dimension")
        refused(f"{name}.forward device", lambda: layer(torch.empty(3, width, device="meta")), "meta")
        checked[f"{name}.good"] = tuple(layer(good).shape)  # the good value next to the bad ones still runs
    return checked


def test_bad_constructor_and_forward_arguments_are_refused_by_name(backend: str) -> None:
    checked = run_on_ranks(_probe_body, 2, backend=backend, timeout_s=240)
    for cls in ("Linear1D_Col", "Linear1D_Row"):
        for arg in ("in_features", "out_features", "process_group", "dtype", "device", "bias", "forward width",
                    "forward dtype", "forward type", "forward 0-d", "forward device"):
            assert checked.get(f"{cls}.{arg}", 0) >= 1, (cls, arg, checked)
    assert checked["Linear1D_Col.good"] == (3, 2) and checked["Linear1D_Row.good"] == (3, 4)  # [M, N/e], [M, N]
    draws = sum(v for k, v in checked.items() if not k.endswith(".good"))
    assert draws >= 300, checked  # the probe count reported in docs/reliability.md
    print(f"{draws} bad layer arguments refused by name")


def _legacy_body(rank: int, world_size: int, port: int) -> dict:
    from legacy_helpers import launch_legacy_1d

    launch_legacy_1d(rank, world_size, port)
    from semimig import nn as ours
    from semimig.errors import ConfigError

    out = {}
    for cls in (ours.Linear1D_Col, ours.Linear1D_Row):
        for label, args, kwargs in (("in_features", (0, 4), {}), ("out_features", (4, "4"), {}),
                                    ("dtype", (4, 4), {"dtype": torch.int64}), ("bias", (4, 4), {"bias": None}),
                                    ("unexpected", (4, 4), {"colour": "red"})):
            try:
                cls(*args, **kwargs)
                out[f"{cls.__name__}.{label}"] = "accepted"
            except ConfigError as err:
                out[f"{cls.__name__}.{label}"] = str(err)
        out[f"{cls.__name__}.good"] = type(cls(4, 4)).__name__
    return out


def test_the_legacy_flavour_refuses_the_same_arguments() -> None:
    from legacy_helpers import free_ipv6_port

    out = run_on_ranks(_legacy_body, 1, free_ipv6_port(), timeout_s=120)
    for cls in ("Linear1D_Col", "Linear1D_Row"):
        for label, expected in (("in_features", "in_features must be an int >= 1, got 0"),
                                ("out_features", "out_features must be an int >= 1, got '4'"),
                                ("dtype", "dtype must be a floating-point torch.dtype"),
                                ("bias", "bias must be a bool, got None"),
                                ("unexpected", "unexpected keyword argument 'colour'")):
            assert out[f"{cls}.{label}"].startswith(f"semimig {cls}: ") and expected in out[f"{cls}.{label}"], out
        assert out[f"{cls}.good"] == cls
