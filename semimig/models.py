"""Small real models and data for CPU-sized experiments: HF ViT on scikit-learn's digits.

Digits (1797 8x8 grey images of 10 classes) ships inside scikit-learn, so nothing is downloaded.

This module sits below every trainer that uses it (``semimig.bench``'s loop, the 2-D hybrid in
``semimig.hybrid``; DESIGN §7: models live at or below the code that trains them) and imports only the
ground (``_validate``, ``errors``).  ``semimig.bench.models`` re-exports these names for older callers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from semimig._validate import check_int
from semimig.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class VitSize:
    """A ViT for 8x8 single-channel images; ``hidden`` and ``intermediate`` divisible by the TP size."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    intermediate: int = 128
    patch: int = 2

    def __post_init__(self) -> None:
        for name, maximum in (("hidden", 8192), ("layers", 64), ("heads", 256), ("intermediate", 32768), ("patch", 8)):
            check_int(f"VitSize.{name}", getattr(self, name), minimum=1, maximum=maximum)
        if self.hidden % self.heads:
            raise ConfigError(f"VitSize.hidden={self.hidden} is not divisible by heads={self.heads}")
        if 8 % self.patch:
            raise ConfigError(f"VitSize.patch must divide the image size 8, got {self.patch}")

    @classmethod
    def parse(cls, text: str) -> "VitSize":
        """``HIDDENxINTERMEDIATExLAYERS`` (e.g. ``256x1536x1``); 4 heads."""
        parts = text.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ConfigError(f"model size must be HIDDENxINTERMEDIATExLAYERS, e.g. 256x1536x1, got {text!r}")
        hidden, intermediate, layers = (int(p) for p in parts)
        return cls(hidden=hidden, intermediate=intermediate, layers=layers)

    def __str__(self) -> str:
        return f"{self.hidden}x{self.intermediate}x{self.layers}"


def tiny_vit(size: VitSize = VitSize(), *, seed: int = 0, num_labels: int = 10) -> torch.nn.Module:
    """``ViTForImageClassification`` for digits, initialised from ``seed`` (dropout off).

    ``num_labels`` may exceed the 10 digit classes: Colossal-AI's ViT policy shards the
    classifier too, so its output size must be divisible by the TP size (the extra logits are
    never a target and are trained down).
    """
    if num_labels < 10:
        raise ConfigError(f"num_labels must be >= 10 (digits has 10 classes), got {num_labels}")
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        hidden_size=size.hidden,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        intermediate_size=size.intermediate,
        image_size=8,
        patch_size=size.patch,
        num_channels=1,
        num_labels=num_labels,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(seed)
    return ViTForImageClassification(config)


def digits_split(*, test_fraction: float = 0.25, seed: int = 0):
    """Fixed train/test split of digits as ``(x_train, y_train, x_test, y_test)`` tensors.

    Images are scaled to [0, 1] and shaped ``[n, 1, 8, 8]``; the split is stratified and
    depends only on ``seed``.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"test_fraction must be in (0, 1), got {test_fraction}")
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    idx_train, idx_test = train_test_split(
        torch.arange(len(y)).numpy(), test_size=test_fraction, random_state=seed, stratify=y.numpy()
    )
    return x[idx_train], y[idx_train], x[idx_test], y[idx_test]
