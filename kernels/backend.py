"""Which implementation the launchers run: the Triton kernels or their pure-torch twins.

- ``"auto"`` (default): for CUDA tensors of dtype fp16/bf16/fp32 when Triton is installed, the
  faster of the two per launch shape, measured at its first launch (:mod:`semimig.kernels.choice`;
  the resolved name is ``"measured"``); torch otherwise (CPU tensors, float64).
- ``"torch"``: always the pure-torch twins (:mod:`semimig.kernels.reference`).
- ``"triton"``: always Triton; CPU tensors are accepted only under Triton's interpreter
  (``TRITON_INTERPRET=1``), which is how the test suite runs the kernels without a GPU.

The choice is process-wide (not thread-local).  :func:`use_backend` changes it for a block.
The autograd function resolves the backend in forward and reuses that choice in backward, so
backward does not depend on the setting at the time (or on the thread) it runs.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from typing import Literal

import torch

from semimig.errors import ConfigError

__all__ = ["Backend", "get_backend", "resolve_backend", "set_backend", "triton_available", "use_backend"]

Backend = Literal["auto", "torch", "triton"]
_BACKENDS: tuple[str, ...] = ("auto", "torch", "triton")
TRITON_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)

_backend: str = "auto"


def triton_available() -> bool:
    """True when the ``triton`` package can be imported."""
    return importlib.util.find_spec("triton") is not None


def triton_interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def set_backend(name: Backend) -> None:
    """Choose the backend for all later launches: ``"auto"``, ``"torch"`` or ``"triton"``."""
    global _backend
    if name not in _BACKENDS:
        raise ConfigError(f"backend must be one of {_BACKENDS}, got {name!r}")
    _backend = name


def get_backend() -> str:
    """The configured backend name (``"auto"``, ``"torch"`` or ``"triton"``)."""
    return _backend


@contextlib.contextmanager
def use_backend(name: Backend) -> Iterator[None]:
    """Context manager: run the block with backend ``name``, then restore the previous one."""
    previous = get_backend()
    set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


def resolve_backend(device: torch.device, dtype: torch.dtype) -> Literal["torch", "triton", "measured"]:
    """The concrete backend for operands on ``device`` with ``dtype`` under the current setting."""
    if _backend == "torch":
        return "torch"
    if _backend == "auto":
        usable = device.type == "cuda" and dtype in TRITON_DTYPES and triton_available()
        return "measured" if usable else "torch"
    if not triton_available():
        raise RuntimeError("backend 'triton' was requested but the triton package is not installed")
    if dtype not in TRITON_DTYPES:
        raise ConfigError(f"the Triton kernels support {TRITON_DTYPES}, got {dtype}; use backend 'torch' or 'auto'")
    if device.type != "cuda" and not triton_interpreting():
        raise RuntimeError(
            f"backend 'triton' needs CUDA tensors (got {device}) unless TRITON_INTERPRET=1 is set "
            "before triton is imported"
        )
    return "triton"
