"""``semimig.launch``'s forkserver preload on a machine with CUDA asks nothing of CUDA.

A rank forked from a process that has initialised CUDA (or asked the driver for its devices) fails
at its first CUDA call.  Each module the forkserver preloads is imported here in a fresh
interpreter with ``torch.cuda``'s device queries wrapped to record their callers: the CUDA-host
list must record none.  The full list (the one for machines without CUDA) does query the device,
which is why the two lists differ.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from semimig import launch

_PROBE = textwrap.dedent("""
    import importlib, json, sys, traceback
    import torch
    import torch.cuda as tc
    calls = []
    for name in ("is_available", "device_count", "current_device", "get_device_capability",
                 "get_device_properties", "get_device_name", "set_device", "init", "_lazy_init",
                 "synchronize", "mem_get_info"):
        original = getattr(tc, name)
        def wrapper(*args, _original=original, _name=name, **kwargs):
            where = traceback.extract_stack(limit=2)[0]
            calls.append(f"{_name} from {where.filename}:{where.lineno}")
            return _original(*args, **kwargs)
        setattr(tc, name, wrapper)
    for module in json.loads(sys.argv[1]):
        importlib.import_module(module)
    print(json.dumps(calls))
""")


def _device_queries(modules: list[str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(modules)], capture_output=True, text=True,
                          timeout=240, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_cuda_host_preload_asks_nothing_of_cuda():
    modules = launch._preload_modules(cuda=True)
    assert "torch" in modules and "torch.distributed" in modules
    assert _device_queries(modules) == []


def test_the_full_preload_queries_the_device():
    """Colossal-AI and semimig.nn ask for the device at import: they stay out of a CUDA host's forkserver."""
    full = launch._preload_modules(cuda=False)
    assert set(launch._preload_modules(cuda=True)) < set(full)
    assert _device_queries(full)
