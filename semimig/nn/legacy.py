"""Legacy flavour: drop-ins for ``colossalai.legacy.nn.Linear1D_Col`` / ``Linear1D_Row`` / ``Linear1D``.

These subclass the legacy layers (constructor, initialisation under the tensor seed, global
state-dict gathering) and run their GEMMs through :mod:`semimig.nn.functional` on the legacy
``PARALLEL_1D`` group.  ``semimig.nn.Linear1D_Col(...)`` builds one of these automatically when
no ``process_group`` is given inside a program started by ``colossalai.legacy.launch`` with
``parallel=dict(tensor=dict(mode="1d", ...))``.
"""
from __future__ import annotations

import sys

import torch

from semimig.errors import ConfigError
from semimig.nn.balanced import BalancedLinearMixin, Output
from semimig.nn.conversion import check_constructor, check_options


def legacy_1d_active() -> bool:
    """True inside a program whose legacy global context runs the 1D tensor mode.

    Looks only at modules the program already imported, so plain ShardFormer programs never
    import ``colossalai.legacy``.
    """
    core = sys.modules.get("colossalai.legacy.core")
    if core is None:
        return False
    from colossalai.legacy.context import ParallelMode

    gpc = core.global_context
    try:
        return gpc.is_initialized(ParallelMode.PARALLEL_1D)
    except Exception:  # noqa: BLE001 - an uninitialised context raises various errors
        return False


def wants_legacy(kwargs: dict) -> bool:
    """Whether a constructor call without ``process_group`` belongs to a legacy 1D program."""
    return kwargs.get("process_group") is None and legacy_1d_active()


def _legacy():
    from colossalai.legacy.context import ParallelMode
    from colossalai.legacy.core import global_context as gpc
    from colossalai.legacy.nn.layer.parallel_1d import layers

    return ParallelMode, gpc, layers


def _check_arguments(cls_name: str, base: type, args: tuple, kwargs: dict) -> None:
    """The legacy constructor's arguments bound as Colossal-AI's would bind them, then checked like
    the ShardFormer flavour's (:func:`~semimig.nn.conversion.check_constructor`; no group argument)."""
    import inspect

    try:
        bound = inspect.signature(base.__init__).bind(None, *args, **kwargs).arguments
    except TypeError as err:
        raise ConfigError(f"semimig {cls_name}: {err}") from None
    check_constructor(cls_name, in_features=bound.get("in_features"), out_features=bound.get("out_features"),
                      bias=bound.get("bias", True), dtype=bound.get("dtype"), device=None, process_group=None)


def _group():
    ParallelMode, gpc, _ = _legacy()
    return gpc.get_group(ParallelMode.PARALLEL_1D)


def _build_classes():
    ParallelMode, _, layers = _legacy()
    from colossalai.legacy.nn.layer.parallel_1d._utils import (
        gather_forward_split_backward,
        split_forward_gather_backward,
    )

    class Linear1D_Col(BalancedLinearMixin, layers.Linear1D_Col):
        """Legacy column-parallel linear on the ``PARALLEL_1D`` group, balanced by semimig."""

        matrix_kind = "column"

        def __init__(self, *args, **kwargs) -> None:
            _check_arguments(type(self).__name__, layers.Linear1D_Col, args, kwargs)
            super().__init__(*args, **kwargs)
            self.process_group = _group()
            self._init_balancing()

        def forward(self, input_: torch.Tensor) -> Output:
            return self._column_forward(
                input_, lambda y: gather_forward_split_backward(y, ParallelMode.PARALLEL_1D, dim=-1))

    class Linear1D_Row(BalancedLinearMixin, layers.Linear1D_Row):
        """Legacy row-parallel linear on the ``PARALLEL_1D`` group, balanced by semimig."""

        matrix_kind = "row"

        def __init__(self, *args, **kwargs) -> None:
            check_options(type(self).__name__, kwargs)
            _check_arguments(type(self).__name__, layers.Linear1D_Row, args, kwargs)
            super().__init__(*args, **kwargs)
            self.process_group = _group()
            self._init_balancing()

        def forward(self, input_: torch.Tensor) -> Output:
            return self._row_forward(
                input_, lambda x: split_forward_gather_backward(x, ParallelMode.PARALLEL_1D, dim=-1))

    return Linear1D_Col, Linear1D_Row


_CLASSES: dict = {}


def __getattr__(name: str):
    """Build the legacy classes on first use, so importing semimig never imports colossalai.legacy."""
    if name in ("Linear1D_Col", "Linear1D_Row"):
        if not _CLASSES:
            _CLASSES["Linear1D_Col"], _CLASSES["Linear1D_Row"] = _build_classes()
        return _CLASSES[name]
    if name == "Linear1D":
        return Linear1D
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def Linear1D(in_features: int, out_features: int, bias: bool = True, dtype: torch.dtype = None,
             gather_output: bool = False, skip_bias_add: bool = False, **init) -> torch.nn.Module:
    """Legacy ``Linear1D``: a column layer if the previous layer's output is replicated, else a row layer.

    Mirrors ``colossalai.legacy.nn.Linear1D`` (which wraps the chosen layer); here the chosen
    semimig layer is returned directly so the balancing runtime finds it.
    """
    if not legacy_1d_active():
        raise ConfigError(
            "semimig.nn.Linear1D is the legacy 1D layer: call it inside a program started by "
            "colossalai.legacy.launch with parallel.tensor.mode='1d' (for ShardFormer use Linear1D_Col/Linear1D_Row)"
        )
    from colossalai.legacy.nn.layer.parallel_1d._utils import get_parallel_input

    parallel_input = get_parallel_input()
    if not parallel_input and not gather_output:
        return __getattr__("Linear1D_Col")(in_features, out_features, bias=bias, dtype=dtype,
                                           skip_bias_add=skip_bias_add, **init)
    return __getattr__("Linear1D_Row")(in_features, out_features, bias=bias, dtype=dtype,
                                       parallel_input=parallel_input, skip_bias_add=skip_bias_add, **init)
