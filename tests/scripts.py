"""Load a repository script (``examples/…``, ``benchmarks/…``) as a module, to test its functions
in-process without running its ``main``."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(relative: str, name: str) -> ModuleType:
    """The script at ``REPO/relative``, executed once as module ``name`` (not put in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(name, REPO / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
