"""A pruned layer's backward checks that its lineage is what its forward pruned: the very tensor
recorded passes without reading indices back to the host (a device sync per layer on a GPU); another
tensor is judged by its values, and a changed lineage is an error naming the layer."""
from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from semimig.launch import free_port


@pytest.fixture
def pruned_model():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    import semimig.nn as snn
    from semimig.controller import BalanceConfig, BalanceController

    torch.manual_seed(0)
    group = dist.group.WORLD
    model = nn.Sequential(snn.Linear1D_Col.from_native_module(nn.Linear(32, 64, bias=False), group),
                          snn.Linear1D_Row.from_native_module(nn.Linear(64, 32, bias=False), group, parallel_input=True))
    controller = BalanceController(model, BalanceConfig(mode="semi"), process_group=group)
    controller.force(prune={0: 0.5})
    x = torch.randn(8, 32)
    for _ in range(2):
        model(x).sum().backward()
        controller.step()
    yield model, controller, x
    controller.close()
    dist.destroy_process_group()


def _counting_host_reads(monkeypatch) -> dict:
    reads, original = {"n": 0}, torch.Tensor.cpu

    def counted(self, *args, **kwargs):
        reads["n"] += 1
        return original(self, *args, **kwargs)
    monkeypatch.setattr(torch.Tensor, "cpu", counted)
    return reads


def test_a_pruned_backward_reads_no_indices_back(pruned_model, monkeypatch) -> None:
    model, controller, x = pruned_model
    y = model(x)
    reads = _counting_host_reads(monkeypatch)
    y.sum().backward()
    assert reads["n"] == 0
    assert controller.binding.lineage.entries()  # the step did prune


def test_a_lineage_changed_between_forward_and_backward_is_refused(pruned_model) -> None:
    model, controller, x = pruned_model
    y = model(x)
    lineage = controller.binding.lineage
    entry = next(e for e in lineage.entries() if e.matrix == "weight")
    same = entry.pruned.clone()  # other tensor, same values: accepted
    lineage.record(entry.layer, entry.matrix, same, entry.iteration, num_columns=entry.num_columns)
    n = entry.pruned.numel()
    other = next(c for c in (torch.arange(n), torch.arange(entry.num_columns - n, entry.num_columns))
                 if not torch.equal(c.to(entry.pruned.dtype), entry.pruned)).to(entry.pruned.dtype)
    y.sum().backward()
    y = model(x)
    entry = next(e for e in lineage.entries() if e.matrix == "weight")
    lineage.record(entry.layer, entry.matrix, other, entry.iteration, num_columns=entry.num_columns)
    with pytest.raises(RuntimeError, match=f"lineage of {entry.layer} changed between forward and backward"):
        y.sum().backward()
