"""The process-group backend a multi-rank case runs on: ``gloo`` and ``nccl``.

- ``gloo`` is the CPU path every multi-rank case has always run on; it runs where CUDA is absent
  (where CUDA is present, Colossal-AI places models on the GPU and the gloo cases do not apply).
- ``nccl`` runs one rank per GPU where at least as many GPUs as ranks are present, and is skipped,
  with the reason, everywhere else.

A case takes the :func:`backend` fixture (both values; each skipped where it cannot run) and
passes it to :func:`run_on_ranks` / :func:`run_pooled` here.  Under nccl every tensor a rank's
body makes without naming a device is made on the rank's GPU (``torch.set_default_device``), so
the CPU bodies run unchanged.  Cases that start the example under torchrun pass nothing: the
example takes nccl itself where CUDA is present.  A module whose other cases are CPU-only keeps
them so with ``pytestmark = pytest.mark.usefixtures("cpu_path")`` (:func:`cpu_path`).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import pytest
import torch

BACKENDS = ("gloo", "nccl")


def gpu_count() -> int:
    """GPUs this process can use (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def backend_problem(backend: str, world_size: int = 2) -> str | None:
    """Why ``world_size`` ranks cannot run on ``backend`` here (``None``: they can)."""
    if backend == "gloo" and torch.cuda.is_available():
        return "gloo: the CPU path; CUDA is present here (the nccl variant runs instead)"
    if backend == "nccl" and gpu_count() < world_size:
        return f"nccl: {world_size} ranks need {world_size} GPUs, {gpu_count()} here"
    return None


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request) -> str:
    """``"gloo"`` or ``"nccl"``; the case is skipped where two ranks cannot run on it."""
    problem = backend_problem(request.param)
    if problem:
        pytest.skip(problem)
    return request.param


@pytest.fixture
def cpu_path(request) -> None:
    """A case of a CPU/gloo module that takes no :func:`backend`: skipped where CUDA is present."""
    if "backend" not in request.fixturenames and torch.cuda.is_available():
        pytest.skip("CPU/gloo path")


def _on_gpu(body: Callable[..., Any], rank: int, world_size: int, *args: Any) -> Any:
    """``body`` on an nccl rank: tensors made without a device go to the rank's GPU (set by the launcher)."""
    torch.set_default_device(torch.device("cuda", torch.cuda.current_device()))
    return body(rank, world_size, *args)


def _placed(body: Callable[..., Any], backend: str, world_size: int) -> Callable[..., Any]:
    problem = backend_problem(backend, world_size)
    if problem:
        pytest.skip(problem)
    return functools.partial(_on_gpu, body) if backend == "nccl" else body


def run_on_ranks(body: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo", **kwargs: Any) -> Any:
    """:func:`semimig.launch.run_on_ranks` on ``backend`` (the case is skipped where it cannot run)."""
    from semimig.launch import run_on_ranks as launch

    return launch(_placed(body, backend, world_size), world_size, *args, backend=backend, **kwargs)


def run_pooled(body: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo", **kwargs: Any) -> Any:
    """gloo: the test run's pool of ranks (:mod:`rank_pool`); nccl: fresh ranks (the pool is gloo's)."""
    if backend == "gloo":
        from rank_pool import run_pooled as pooled

        return pooled(body, world_size, *args, **kwargs)
    return run_on_ranks(body, world_size, *args, backend=backend, **kwargs)
