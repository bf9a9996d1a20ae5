"""Load a repository script (``examples/…``, ``benchmarks/…``) as a module, to test its functions
in-process without running its ``main``."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(relative: str, name: str) -> ModuleType:
    """The script at ``REPO/relative``, executed once as module ``name`` (not put in ``sys.modules``).

    Its folder goes on ``sys.path`` first, as Python puts a script's folder when it runs one (the
    benchmark scripts import their shared ``bench_output``)."""
    folder = str((REPO / relative).parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, REPO / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
