"""The words ``semimig bench`` offers on its command line, importable without torch.

``semimig bench --help`` lists the modes and compute kinds.  The modes come from
:mod:`semimig.modes`, which imports no torch; the compute kinds' owner
(:data:`semimig.bench.config.COMPUTES`) imports torch and Colossal-AI, which would make ``--help``
take seconds, so :data:`COMPUTES` is a copy, kept equal by ``tests/e2e/test_cli_quiet.py``.  :data:`MODES_2D` has no other owner: the 2-D
mode's names are the bench's own words (:class:`semimig.bench.config.BenchConfig` reads them from here).
"""
from __future__ import annotations

from semimig.modes import CONTROLLER_MODES, RESHARD_MODES as _RESHARD_MODES

MODES: tuple[str, ...] = CONTROLLER_MODES
"""The 1-D modes (:data:`semimig.controller.runtime.MODES`)."""
RESHARD_MODES: tuple[str, ...] = _RESHARD_MODES
"""1-D modes of the bench beyond the controller's (owned here): ``reshard`` re-plans uneven
tensor-parallel shards for a slow rank (``semimig.enable(..., mode="reshard")``, DESIGN §8); not
in the paper experiment's sweep (its modes are the paper's); the default experiment runs it."""
EXPERIMENTS: tuple[str, ...] = ("slow-device", "paper")
"""The 1-D experiments of ``semimig bench --experiment`` (:func:`semimig.bench.config.experiment_defaults`):
``slow-device`` (the default), a whole slow device with Colossal-AI alone beside ``reshard`` and ``semi``;
``paper``, the paper's GEMM-only straggler and its seven modes."""
COMPUTES: tuple[str, ...] = ("emulated", "measured")
"""How a straggler's compute is produced (:data:`semimig.bench.config.COMPUTES`)."""
MODES_2D: tuple[str, ...] = ("baseline", "poplar", "semi", "poplar+semi")
"""The 2-D modes (``semimig bench --allocation``): even batches, Poplar's plan across the DP groups,
SEMI in every TP group, both."""
