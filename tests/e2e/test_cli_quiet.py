"""A quiet, quick CLI: ``--help`` imports neither torch nor Colossal-AI, third-party warnings are
hidden narrowly (by package, message and mechanism) and shown again with ``-v``."""
import importlib.util
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import semimig

ROOT = Path(semimig.__file__).resolve().parent.parent
HEAVY = ("torch", "torch.distributed", "colossalai", "bitsandbytes")

# Runs the CLI in a fresh interpreter, then reports which heavy modules it imported.
_RUN_CLI = """
import sys
from semimig.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
sys.stdout.flush()
print("IMPORTED=" + ",".join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)
sys.exit(code)
"""


def _python(code: str, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "SEMIMIG_THIRD_PARTY_WARNINGS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


@pytest.mark.parametrize("command", [[], ["bench"], ["report"], ["plan"], ["demo"]], ids=lambda c: c[0] if c else "top")
def test_help_imports_no_torch_and_prints_no_warning(command):
    proc = _python(_RUN_CLI.format(heavy=HEAVY), *command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: semimig {' '.join(command)}".rstrip())
    *other, imported = proc.stderr.rstrip("\n").split("\n")
    assert imported == "IMPORTED=", f"--help imported {imported[len('IMPORTED='):]}"
    assert other == [], other  # nothing else on stderr
    assert not re.search(r"\w+Warning\b|warnings\.warn|Failed to load", proc.stdout)  # -v's help names "warnings"


def test_a_command_still_imports_its_implementation(tmp_path):
    """The lazy parser must not hide a command's code: ``plan`` runs and imports what it needs."""
    spec = tmp_path / "spec.json"
    spec.write_text('{"devices": [{"name": "a", "max_batch_size": 64, "peak_speed": 100.0},'
                    ' {"name": "b", "max_batch_size": 64, "peak_speed": 50.0}]}')
    proc = _python(_RUN_CLI.format(heavy=("semimig.allocation.allocate",)), "plan", str(spec),
                   "--global-batch-size", "60", "--zero-stage", "0")
    assert proc.returncode == 0, proc.stderr
    assert "IMPORTED=semimig.allocation.allocate" in proc.stderr
    assert "even split" in proc.stdout


def test_cli_choices_equal_their_owners():
    from semimig.bench import choices
    from semimig.bench.config import COMPUTES
    from semimig.controller.runtime import MODES

    assert choices.MODES == MODES and choices.COMPUTES == COMPUTES


def test_allocation_names_resolve_lazily_to_the_same_objects():
    import semimig.allocation as allocation
    from semimig.allocation.allocate import allocate
    from semimig.allocation.speed import SpeedCurve

    assert allocation.allocate is allocate and allocation.SpeedCurve is SpeedCurve
    assert set(allocation.__all__) <= set(dir(allocation))
    for name in allocation.__all__:
        value = getattr(allocation, name)
        assert getattr(value, "__name__", name) == name  # the object itself, not its module
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        allocation.nope  # noqa: B018


# --------------------------------------------------------------------------------------------
# the filters, against Python's own warnings and logging machinery
# --------------------------------------------------------------------------------------------
@pytest.fixture
def ours(monkeypatch, tmp_path):
    """The ``warnings.filters`` entries ``quiet_third_party(False)`` installs (all undone afterwards)."""
    from semimig._quiet import ENV_VAR, SEEN_DIR_VAR, quiet_third_party

    monkeypatch.setenv(ENV_VAR, "unset")  # restored by monkeypatch, like the marker directory
    monkeypatch.setenv(SEEN_DIR_VAR, str(tmp_path))
    with warnings.catch_warnings():  # restores warnings.filters and warnings.showwarning
        warnings.resetwarnings()
        quiet_third_party(verbose=False)
        yield list(warnings.filters)
        quiet_third_party(verbose=True)


def _shown(filters: list, category, message: str, module: str) -> bool:
    """Whether ``module`` warning ``message`` shows under ``filters`` on top of "always"."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filters[:0] = filters
        warnings.warn_explicit(message, category, f"/site-packages/{module.replace('.', '/')}.py", 13,
                               module=module, registry={})
    return bool(caught)


@pytest.mark.parametrize("category,message,module", [
    (UserWarning, "Please install the latest tensornvme to use async save. pip install ...",
     "colossalai.utils.safetensors"),
    (UserWarning, "Please install apex from source (https://github.com/NVIDIA/apex) to use the fused RMSNorm kernel",
     "colossalai.shardformer.layer.normalization"),
    (FutureWarning, "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead. ...",
     "colossalai.booster.plugin.hybrid_parallel_plugin"),
    (FutureWarning, "`torch.distributed.all_gather_into_tensor` is deprecated. Please use ...",
     "torch.distributed.c10d_logger"),
    (FutureWarning, "`torch.distributed.reduce_scatter_tensor` is deprecated. Please use ...",
     "torch.distributed.c10d_logger"),
])
def test_each_listed_warning_is_hidden_and_only_it(ours, category, message, module):
    from semimig._quiet import _WARNINGS

    assert len(ours) == len(_WARNINGS)
    assert _shown([], category, message, module)  # the reference: shown without the filters
    assert not _shown(ours, category, message, module)
    assert _shown(ours, category, message, module + "_other")  # another module's same words
    assert _shown(ours, category, "something else", module)  # the same module's other warnings
    other = DeprecationWarning if category is FutureWarning else RuntimeWarning
    assert _shown(ours, other, message, module)  # another category


def test_verbose_removes_the_filters(ours):
    from semimig._quiet import ENV_VAR, quiet_third_party

    assert os.environ[ENV_VAR] == "hide"
    quiet_third_party(verbose=True)
    assert os.environ[ENV_VAR] == "show"
    assert not [f for f in warnings.filters if f in ours]
    quiet_third_party(verbose=False)
    quiet_third_party(verbose=False)  # idempotent: installed once
    assert sorted(map(repr, warnings.filters)) == sorted(map(repr, ours))


def test_verbose_shows_each_listed_warning_once_per_run(ours, tmp_path):
    """-v: a listed warning shows once per run (a marker file the ranks share), any other as usual."""
    from semimig._quiet import quiet_third_party

    shown = []
    warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))  # what -v wraps
    quiet_third_party(verbose=True)
    ddp = "/site-packages/colossalai/booster/plugin/hybrid_parallel_plugin.py"
    for _ in range(3):  # e.g. three ranks, or three cases
        warnings.showwarning(FutureWarning("`broadcast_buffers` is deprecated. Use ..."), FutureWarning, ddp, 117)
        warnings.showwarning(UserWarning("our own warning"), UserWarning, "/semimig/x.py", 1)
    assert shown == ["`broadcast_buffers` is deprecated. Use ...", "our own warning", "our own warning",
                     "our own warning"]
    assert len(list(tmp_path.iterdir())) == 1  # the marker another process would find


def test_bitsandbytes_probe_record_dropped_by_message(ours):
    from semimig._quiet import quiet_third_party

    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    probe = "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure ..."
    try:
        logger.warning(probe, "No module named 'kernels'")
        logger.warning("an unrelated bitsandbytes warning")
        quiet_third_party(verbose=True)
        logger.warning(probe, "No module named 'kernels'")
        logger.warning(probe, "No module named 'kernels'")  # -v: once per run
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage()[:22] for r in records] == ["an unrelated bitsandby", "Failed to load CPU gem"]


_IMPORT_COLOSSALAI = """
import importlib, sys
from semimig._quiet import quiet_third_party
quiet_third_party(verbose=False)
import colossalai.booster, colossalai.shardformer  # the imports that warned before every usage line
print("VERBOSE", file=sys.stderr, flush=True)
quiet_third_party(verbose=True)
for name in ("colossalai.utils.safetensors", "colossalai.shardformer.layer.normalization"):
    importlib.reload(sys.modules[name])  # their import-time warnings again, now shown
"""


@pytest.mark.slow
def test_colossalai_import_is_quiet_unless_verbose():
    """The real import-time warnings: none by default; with verbose those this machine has."""
    proc = _python(_IMPORT_COLOSSALAI, timeout=240)
    assert proc.returncode == 0, proc.stderr
    quiet, verbose = proc.stderr.split("VERBOSE\n")
    assert quiet == ""
    if importlib.util.find_spec("tensornvme") is None:
        assert "Please install the latest tensornvme" in verbose
    if importlib.util.find_spec("apex") is None:
        assert "Please install apex from source" in verbose
