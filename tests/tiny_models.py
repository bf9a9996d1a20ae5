"""Tiny models shared by the tests."""
import torch
import torch.nn as nn


class TinyMLP(nn.Module):
    """4 -> 8 -> 2 with tanh: parameters (4*8 + 8 + 8*2 + 2) floats."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


class TwoLayerMLP(nn.Module):
    """``fc2(relu(fc1(x)))`` around two given layers (a column→row pair in the TP tests)."""

    def __init__(self, fc1: nn.Module, fc2: nn.Module) -> None:
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def semimig_pair(d_in: int, d_mid: int, d_out: int, group=None) -> TwoLayerMLP:
    """A :class:`TwoLayerMLP` of a semimig column -> row pair sharded over ``group`` (default: the world),
    converted from fresh ``nn.Linear(d_in, d_mid)`` and ``nn.Linear(d_mid, d_out)``, created in that
    order (the caller's seed decides their weights)."""
    import torch.distributed as dist

    import semimig.nn as snn

    group = dist.group.WORLD if group is None else group
    fc1, fc2 = nn.Linear(d_in, d_mid), nn.Linear(d_mid, d_out)
    return TwoLayerMLP(snn.Linear1D_Col.from_native_module(fc1, group),
                       snn.Linear1D_Row.from_native_module(fc2, group))


def zero_pri_pair(width: int, world: int, spec):
    """``(model, controller)``: with seed 0 and one torch thread, a :func:`semimig_pair` of ``width ->
    width·world -> width`` over the world under a zero-pri controller slowed by ``spec``, without the
    back-off: on a loaded 2-core machine the fitted fixed fraction of so small a layer wanders past 0.5
    (busy times move 10x with other processes), and the rank bodies that use it are about flagging
    and shedding, not about whether shedding pays.  The caller closes the controller."""
    from semimig.controller import BalanceConfig, BalanceController, ControllerConfig

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = semimig_pair(width, width * world, width)
    ctl = BalanceController(model, BalanceConfig(mode="zero-pri", straggler=spec,
                                                 controller=ControllerConfig(max_fixed_fraction=1.0)))
    return model, ctl


def digits_batch(n: int, start: int = 0) -> tuple:
    """Rows ``start`` to ``start + n`` of the digits training split (seed 0): ``(pixels, labels)``."""
    from semimig.bench.models import digits_split

    x, y, _, _ = digits_split(seed=0)
    return x[start:start + n], y[start:start + n]


def vit_loss(model: nn.Module, data: tuple) -> torch.Tensor:
    """A ViT classifier's loss on ``(pixels, labels)``."""
    x, y = data
    return model(pixel_values=x, labels=y).loss
