"""Colossal-AI's own layer tests, run against semimig's layers on CPU gloo ranks.

    SEMIMIG_COLOSSALAI_SRC=/path/to/ColossalAI .venv/bin/pytest -q tests/multirank/test_upstream_layers.py

(a checkout, or a bare git mirror: the files are read with ``git show HEAD:...``).  Without the
variable the tests skip; CI runs the faithful equivalent in ``tests/multirank/test_layers_conformance.py``.

Colossal-AI's ``tests/`` are not in its wheel or sdist; :func:`upstream_source` reads them from
a checkout or a bare git mirror named by ``SEMIMIG_COLOSSALAI_SRC``.  :func:`run_upstream_file`,
on every rank of an initialised group:

1. makes ``Tensor.cuda`` / ``Module.cuda`` the identity (the tests put every tensor on CUDA);
2. executes the upstream module with ``colossalai.testing.parameterize`` replaced by a version
   that loops identically but records each innermost call's outcome instead of stopping at the
   first failure, and wraps every module-level ``check_*`` function the same way;
3. substitutes semimig's classes for every Colossal-AI layer name semimig exports
   (``Linear1D_Col``, ``GPT2FusedLinearConv1D_Col``, ...), so the checks build semimig's layers;
4. calls what the upstream ``run_dist``/``check_dist_*`` calls after ``colossalai.launch``
   (found with ``ast``), i.e. every parametrization the file declares, both lazy settings.

Checks listed in :data:`LEFT_OUT` are recorded as skipped, with the reason, instead of run.
"""
from __future__ import annotations

import ast
import os
import subprocess
import traceback
import types
from pathlib import Path
from typing import Callable, Dict, List, Optional

UPSTREAM_DIR = "tests/test_shardformer/test_layer"
UPSTREAM_FILES = ("test_linear_1d.py", "test_qkv_fused_linear_1d.py", "test_gpt2_qkv_fused_linear_1d.py")
ENV = "SEMIMIG_COLOSSALAI_SRC"

LEFT_OUT: Dict[str, str] = {
    "check_linear_without_weight_grad_store":
        "tests Colossal-AI's LinearWithGradAccum (used only with TP off); semimig does not replace it",
    "check_linear_with_weight_grad_store":
        "tests Colossal-AI's LinearWithGradAccum with the zero-bubble WeightGradStore; semimig refuses use_zbv",
    "check_linear_conv_1d_without_weight_grad_store":
        "tests Colossal-AI's GPT2FusedLinearConv (used only with TP off); semimig does not replace it",
    "check_linear_conv_1d_with_weight_grad_store":
        "tests Colossal-AI's GPT2FusedLinearConv with the zero-bubble WeightGradStore; semimig refuses use_zbv",
    "check_linear_1d_base":
        "tests Colossal-AI's FusedLinear (no tensor parallelism); semimig does not replace it",
}
"""Upstream checks not run against semimig, and why: each exercises a Colossal-AI class semimig
leaves in place (no tensor-parallel GEMM to balance)."""


def upstream_source(root: str, name: str) -> str:
    """The text of ``tests/test_shardformer/test_layer/<name>`` in a checkout or a (bare) git repository."""
    path = Path(root) / UPSTREAM_DIR / name
    if path.is_file():
        return path.read_text()
    done = subprocess.run(["git", "-C", root, "show", f"HEAD:{UPSTREAM_DIR}/{name}"],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise FileNotFoundError(f"{ENV}={root}: neither {path} nor HEAD:{UPSTREAM_DIR}/{name} in git "
                                f"({done.stderr.strip()})")
    return done.stdout


def _drivers(source: str) -> List[str]:
    """Names of the functions the upstream spawned entry point calls after ``colossalai.launch``."""
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        calls = [stmt.value for stmt in node.body if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)]
        if calls and ast.unparse(calls[0].func) == "colossalai.launch":
            return [ast.unparse(call.func) for call in calls[1:]]
    raise ValueError("no function calling colossalai.launch found in the upstream test")


class _Recorder:
    """Collects one line per upstream check call: ``(check, kwargs, "ok" | "skipped: ..." | traceback)``."""

    def __init__(self) -> None:
        self.results: List[tuple] = []

    def wrap(self, name: str, func: Callable) -> Callable:
        def recorded(*args, **kwargs):
            call = f"{name}({', '.join([repr(a) for a in args] + [f'{k}={v!r}' for k, v in kwargs.items()])})"
            if name in LEFT_OUT:
                self.results.append((call, f"skipped: {LEFT_OUT[name]}"))
                return
            try:
                func(*args, **kwargs)
            except Exception:  # noqa: BLE001 - recorded; the test reports every failure
                self.results.append((call, traceback.format_exc()))
            else:
                self.results.append((call, "ok"))

        recorded._upstream_recorded = True
        return recorded

    def parameterize(self, argument: str, values: list) -> Callable:
        """``colossalai.testing.parameterize``'s loop, with the undecorated function recorded."""
        def decorate(func):
            inner = func if getattr(func, "_upstream_loop", False) else self.wrap(func.__name__, func)

            def loop(**kwargs):
                for value in values:
                    inner(**{argument: value}, **kwargs)

            loop._upstream_loop = True
            loop.__name__ = func.__name__
            return loop

        return decorate


def _cuda_is_identity() -> None:
    import torch

    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self


def run_upstream_file(name: str, source: str, substitute: Optional[Dict[str, type]] = None) -> dict:
    """Run one upstream layer test file on this rank; ``{"results": [...], "substituted": [...]}``.

    ``substitute`` maps upstream names to classes (``None``: semimig's class of the same name).
    """
    import colossalai.testing

    import semimig.nn as snn

    _cuda_is_identity()
    recorder = _Recorder()
    module = types.ModuleType(f"upstream_{Path(name).stem}")
    original = colossalai.testing.parameterize
    colossalai.testing.parameterize = recorder.parameterize
    try:
        exec(compile(source, f"<upstream {UPSTREAM_DIR}/{name}>", "exec"), module.__dict__)
    finally:
        colossalai.testing.parameterize = original
    if substitute is None:
        substitute = {n: getattr(snn, n) for n in snn.__all__ if isinstance(module.__dict__.get(n), type)}
    for attr, cls in substitute.items():
        setattr(module, attr, cls)
    for attr, value in list(module.__dict__.items()):
        if attr.startswith("check_") and isinstance(value, types.FunctionType) \
                and not getattr(value, "_upstream_loop", False) and not getattr(value, "_upstream_recorded", False):
            setattr(module, attr, recorder.wrap(attr, value))
    for driver in _drivers(source):
        getattr(module, driver)()
    return {"results": recorder.results, "substituted": sorted(substitute)}


def failures(results: List[tuple]) -> List[str]:
    return [f"{call}:\n{outcome}" for call, outcome in results if outcome != "ok" and not outcome.startswith("skipped")]


def source_root() -> Optional[str]:
    return os.environ.get(ENV) or None


# ----------------------------------------------------------------------------- the tests
import pytest  # noqa: E402

from dist_harness import run_on_ranks  # noqa: E402

CHECKS_RUN = {
    # upstream check -> parametrizations it must have run (lazy_init x seq_parallel_mode)
    "test_linear_1d.py": {"check_linear_1d_col": 4, "check_linear_1d_row": 4, "check_linear_col_plus_row": 4},
    "test_qkv_fused_linear_1d.py": {"check_linear_1d_col": 2, "check_linear_1d_row": 2, "check_linear_1d_col_row": 2},
    "test_gpt2_qkv_fused_linear_1d.py": {"check_linear_conv_1d_col": 4, "check_linear_conv_1d_row": 4},
}


def _upstream_body(rank, world, name, source, layers):
    """Every rank's outcomes (a check can fail on one rank only), each call tagged with its rank."""
    import torch.distributed as dist

    out = run_upstream_file(name, source, substitute={} if layers == "colossalai" else None)
    every = [None] * world
    dist.all_gather_object(every, out["results"])
    out["results"] = [(f"rank {r}: {call}", outcome) for r, results in enumerate(every) for call, outcome in results]
    return out


@pytest.mark.skipif(source_root() is None, reason=f"set {ENV} to a Colossal-AI checkout or git mirror")
@pytest.mark.parametrize("layers", ["semimig", "colossalai"])
@pytest.mark.parametrize("name", UPSTREAM_FILES)
def test_upstream_layer_test(name, layers):
    """Every upstream parametrization passes; ``colossalai`` runs the same harness on Colossal-AI's
    own classes, which shows the CPU harness itself changes nothing that the checks look at."""
    out = run_on_ranks(_upstream_body, 2, name, upstream_source(source_root(), name), layers, timeout_s=240)
    results = out["results"]
    bad = failures(results)
    assert not bad, f"{len(bad)} of {len(results)} upstream checks failed:\n" + "\n".join(bad)
    ran = {}
    for call, outcome in results:
        check = call.split(": ", 1)[1].split("(")[0]
        if outcome == "ok" and call.startswith("rank 0"):
            ran[check] = ran.get(check, 0) + 1
    for check, count in CHECKS_RUN[name].items():
        assert ran.get(check, 0) >= count, (check, ran)
    if layers == "semimig":
        assert out["substituted"], "no Colossal-AI layer name was replaced by semimig's"
