"""After ``semimig.enable(...)`` in every mode without a test straggler, ``torch.distributed``'s
functions and ``Work.wait`` are the originals, through training steps and after ``close()``; only the
whole-device test straggler (``scope=device``) wraps them, and only while it runs (DESIGN §3b).
Likewise the busy meter waits for the device around a GEMM (``BusyMeter._sync``, a
``torch.cuda.synchronize`` on a GPU) only for a test straggler: a real run's step has no such wait."""
from __future__ import annotations

import pytest
import torch

import plugin_cases as pc
from dist_harness import run_on_ranks

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU/gloo path")

TP2 = dict(tp_size=2, pp_size=1, precision="fp32")


def _functions() -> dict:
    """Every patchable name of torch.distributed (and its c10d module), and Work.wait."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from semimig.straggler.device import COLLECTIVES

    out = {"Work.wait": dist.Work.wait}
    for module, prefix in ((dist, "dist"), (c10d, "c10d")):
        for name in COLLECTIVES:
            if hasattr(module, name):
                out[f"{prefix}.{name}"] = getattr(module, name)
    return out


def _changed(originals: dict) -> list[str]:
    now = _functions()
    return sorted(name for name, fn in originals.items() if now.get(name) is not fn)


def _count_meter_waits() -> dict:
    """Counts the busy meter's device waits (the original still runs: on CPU it does nothing)."""
    from semimig.straggler.busy import BusyMeter

    waits, original = {"n": 0}, BusyMeter._sync

    def counted(self):
        waits["n"] += 1
        return original(self)
    BusyMeter._sync = counted
    return waits


def _modes_body(rank: int, world_size: int) -> dict:
    import semimig
    from semimig.balancer import ENABLE_MODES

    originals = _functions()
    waits = _count_meter_waits()
    out = {}
    for mode in ENABLE_MODES:
        run = pc.boost("llama", TP2, semimig=True)
        balancer = semimig.enable(run.model, run.plugin, optimizer=run.optimizer, mode=mode)
        changed = _changed(originals)
        pc.train_losses(run, "llama", (0, 1))
        changed += _changed(originals)
        balancer.close()
        out[mode] = sorted(set(changed + _changed(originals)))
        out[f"{mode} meter waits"], waits["n"] = waits["n"], 0
    run = pc.boost("llama", TP2, semimig=True)  # the one case that wraps: a whole-device test straggler
    balancer = semimig.enable(run.model, run.plugin, optimizer=run.optimizer, mode="zero-pri",
                              straggler="fixed:1:2:scope=device")
    out["device straggler"] = _changed(originals)
    pc.train_losses(run, "llama", (0,))
    out["device straggler meter waits"] = waits["n"]
    balancer.close()
    out["device straggler closed"] = _changed(originals)
    return out


def test_enable_patches_nothing_in_torch_distributed() -> None:
    out = run_on_ranks(_modes_body, 2, timeout_s=300)
    from semimig.balancer import ENABLE_MODES

    for mode in ENABLE_MODES:
        assert out[mode] == [], (mode, out[mode])
        assert out[f"{mode} meter waits"] == 0, (mode, out[f"{mode} meter waits"])
    assert out["device straggler meter waits"] > 0
    assert "Work.wait" in out["device straggler"] and "dist.all_reduce" in out["device straggler"]
    assert out["device straggler closed"] == []
