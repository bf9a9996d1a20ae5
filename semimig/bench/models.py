"""Compatibility name: the experiment models and data moved to :mod:`semimig.models`.

They sit below both trainers (``semimig.bench`` and ``semimig.hybrid``) so the hybrid does not import
upward into the bench harness (DESIGN §7, the import-linter contract in ``.importlinter``).
"""
from semimig.models import VitSize, digits_split, tiny_vit

__all__ = ["VitSize", "tiny_vit", "digits_split"]
