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
