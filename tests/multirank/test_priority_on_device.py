"""Priority statistics live where the weights live (DESIGN §3b): no host copy of any weight.

The weights are put on a CUDA device that :class:`~torch._subclasses.fake_tensor.FakeTensorMode`
fakes, so the check runs on a CPU-only machine: every tensor reachable from the statistics'
objects is walked (their attributes, not a list the code under test hands out), and each must sit
on the weight's device; a host tensor of the weight's shape would be a host copy of it.  A real
CUDA device, where present, runs the same check.  The selections (priority lists, keep sets) are
compared with a float64 host computation of the same statistics (the reference), on the same seed.
"""
import math

import pytest
import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode

from semimig.resizing.priority import ColumnVariationTracker, PriorityList

N, K = 6, 16


def _tensors(obj, seen=None) -> list:
    """Every tensor reachable from ``obj`` through attributes, dicts, lists and tuples."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (type, nn.Module)):
        items = list(vars(obj).values())
    else:
        return []
    return [t for item in items for t in _tensors(item, seen)]


def _check_on_device(stats, weight: torch.Tensor) -> list:
    found = _tensors(stats)
    assert found, "the statistics hold no tensor at all"
    host_copies = [tuple(t.shape) for t in found if t.device.type == "cpu" and t.shape == weight.shape]
    assert not host_copies, f"a host tensor of the weight's shape {tuple(weight.shape)}: a host copy of the weight"
    elsewhere = [(t.device, tuple(t.shape)) for t in found if t.device != weight.device]
    assert not elsewhere, f"statistics tensors off the weight's device {weight.device}: {elsewhere}"
    return found


def _devices():
    yield pytest.param("fake-cuda", id="fake-cuda")
    if torch.cuda.is_available():
        yield pytest.param("cuda", id="cuda")


def _context(device: str):
    if device == "fake-cuda":
        return FakeTensorMode()
    return torch.device("cuda")


@pytest.mark.parametrize("device", list(_devices()))
@pytest.mark.parametrize("method", ["snapshot", "per_step"])
def test_tracker_keeps_no_host_copy(device, method):
    with _context(device):
        w = torch.randn(N, K, device="cuda")
        tracker = ColumnVariationTracker(w, method=method)
        _check_on_device(tracker, w)
        for _ in range(2):
            w = w + 0.01
            tracker.observe_step(w)
        delta = tracker.end_period(w, torch.zeros(K, dtype=torch.bool))
        assert delta.device == w.device and delta.dtype == torch.float32
        _check_on_device(tracker, w)


@pytest.mark.parametrize("device", list(_devices()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_priority_list_keeps_no_host_copy_at_enable_or_a_period(device, dtype):
    with _context(device):
        w = torch.randn(N, K, device="cuda", dtype=dtype)
        plist = PriorityList(w)  # what LayerBinding builds per layer at enable
        _check_on_device(plist, w)
        counts = torch.zeros(K, dtype=torch.int64)  # the lineage's counts (host indices)
        counts[:3] = 2
        plist.end_period(w * 1.5, counts)
        found = _check_on_device(plist, w)
        assert sum(tuple(t.shape) == (N, K) for t in found) == 1  # one snapshot, on the device


def _binding_body(rank, world):
    """The binding that enable builds (prioritized, a real two-layer MLP of semimig layers), its
    weights on a (fake) CUDA device: no host copy at construction or after a period."""
    import torch.distributed as dist

    import semimig.nn as snn
    from semimig.controller.binding import LayerBinding, gemm_weight
    from semimig.resizing.config import ResizingConfig

    torch.manual_seed(0)
    model = nn.Sequential(snn.Linear1D_Col.from_native_module(nn.Linear(8, 16), dist.group.WORLD),
                          snn.Linear1D_Row.from_native_module(nn.Linear(16, 8), dist.group.WORLD))
    with FakeTensorMode(allow_non_fake_inputs=True):
        for layer in model:
            layer.weight = nn.Parameter(torch.randn(*layer.weight.shape, device="cuda"))
        binding = LayerBinding(model, ResizingConfig(variant="pri"), (), prioritized=True, rank=rank)
        for b in binding.layers:
            _check_on_device(b.priority, gemm_weight(b.layer))
        binding.end_period(4)
        for b in binding.layers:
            _check_on_device(b.priority, gemm_weight(b.layer))
            assert b.priority.measured
    binding.detach()


def test_binding_statistics_stay_on_the_weights_device():
    from dist_harness import run_pooled

    run_pooled(_binding_body, 2, timeout_s=60)


# ----------------------------------------------------------------------------- same selections
class _HostFloat64List:
    """The float64 host reference of the statistics: a host snapshot, a float64 column
    mean, the lexicographic list ``(pruned last period, delta, earlier counts, index)``."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.ref = weight.detach().to("cpu", copy=True)
        self.delta = torch.full((weight.shape[1],), math.inf, dtype=torch.float64)
        self.counts = torch.zeros(weight.shape[1], dtype=torch.int64)
        self.recent = None

    def end_period(self, weight: torch.Tensor, counts: torch.Tensor) -> None:
        current = weight.detach().to("cpu", copy=True)
        measured = (current.double() - self.ref.double()).abs().mean(dim=0)
        self.delta = torch.where(counts > 0, self.delta, measured)
        self.counts += counts
        self.recent = (counts > 0).to(torch.int8)
        self.ref = current

    def _order(self, delta, ties, recent) -> list:
        k = delta.numel()
        return sorted(range(k), key=lambda i: (int(recent[i]), float(delta[i]), int(ties[i]), i))

    def select(self, own: int, n_prune: int, block: int) -> list:
        if block == 1:
            return sorted(self._order(self.delta[:own], self.counts[:own], self.recent[:own])[:n_prune])
        mean = self.delta[:own].view(-1, block).mean(dim=1)
        ties = self.counts[:own].view(-1, block).sum(dim=1)
        last = self.recent[:own].view(-1, block).amax(dim=1)
        blocks = self._order(mean, ties, last)[:min(mean.numel(), int(n_prune / block + 0.5))]
        return sorted(b * block + j for b in blocks for j in range(block))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_selections_equal_the_float64_host_computation(dtype):
    """A linear layer trained by SGD for four periods from one seed, pruning what the list says:
    every period's selection (columns and blocks, several own/n_prune) equals the old computation's."""
    torch.manual_seed(3)
    layer = nn.Linear(48, 12).to(dtype)
    opt = torch.optim.SGD(layer.parameters(), lr=0.05)
    plist, oracle = PriorityList(layer.weight.detach()), _HostFloat64List(layer.weight)
    for period in range(4):
        pruned = plist.select(48, 12) if period else torch.arange(0)
        counts = torch.zeros(48, dtype=torch.int64)
        for _ in range(3):
            x = torch.randn(20, 48, dtype=dtype)
            loss = (layer(x) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            layer.weight.grad[:, pruned] = 0  # zero imputation: pruned columns do not move
            opt.step()
            counts[pruned] += 1
        plist.end_period(layer.weight.detach(), counts)
        oracle.end_period(layer.weight, counts)
        for own, n_prune, block in [(48, 12, 1), (48, 5, 1), (40, 20, 1), (48, 16, 4), (32, 8, 8), (48, 48, 1)]:
            got = plist.select(own, n_prune, block=block)
            assert got.device.type == "cpu" and got.dtype == torch.int64
            assert got.tolist() == oracle.select(own, n_prune, block), (period, own, n_prune, block)


# ----------------------------------------------------------------------------- the pretest's operands
class _Conversions(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every dtype/device conversion and copy dispatched inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten._to_copy, torch.ops.aten.copy_):
            self.seen.append((str(func), tuple(args[0].shape)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_pretest_draws_its_operands_where_they_are_used(device):
    """The SEMI pretest's GEMM operands are drawn on the device in the dtype they run in: no tensor
    of their size is built elsewhere and converted or copied over."""
    from semimig.controller.pretest import PretestRun

    shapes = [(8, 12, 16), (8, 16, 12)]
    with _Conversions() as conversions:
        run = PretestRun(shapes, None, dtype=torch.bfloat16, device=device)
    assert not conversions.seen, conversions.seen
    for x, w, dy, _, _ in run.tensors:
        assert {t.device.type for t in (x, w, dy)} == {device} and {t.dtype for t in (x, w, dy)} == {torch.bfloat16}
