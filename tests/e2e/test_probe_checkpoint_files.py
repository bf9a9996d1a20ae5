"""Checkpoint files that are not regular files (probes).

With :func:`semimig.shardformer.uneven_ckpt.install` in place, every reader Colossal-AI's
``HybridParallelCheckpointIO`` uses for a shard (``load_shard_state_dict``, ``load_state_dict``,
``load_flat``) and for an index (``CheckpointIndexFile.from_file``) refuses a directory, a FIFO or a
character device with one :class:`ConfigError` naming the path, without opening it (a FIFO would
block ``torch.load`` forever).  Each case runs in a child process with a deadline, so a
regression fails the test instead of hanging the suite.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
READERS = ["load_shard_state_dict", "load_state_dict", "load_flat", "CheckpointIndexFile.from_file"]
PROGRAM = """
import sys
from pathlib import Path
from semimig.errors import ConfigError
from semimig.shardformer import uneven_ckpt
uneven_ckpt.install()
from colossalai.checkpoint_io import hybrid_parallel_checkpoint_io as hpcio
for line in sys.stdin:
    reader, path = line.split()
    target = hpcio.CheckpointIndexFile.from_file if reader.startswith("Checkpoint") else getattr(hpcio, reader)
    try:
        target(Path(path))
        print("accepted", reader, path, flush=True)
    except ConfigError as err:
        print("refused", reader, str(err).replace(chr(10), " | "), flush=True)
    except BaseException as err:
        print("other", reader, type(err).__name__, flush=True)
"""


def test_checkpoint_paths_that_are_not_regular_files_are_refused_without_hanging(tmp_path: Path) -> None:
    fifo, folder = tmp_path / "shard.fifo", tmp_path / "shard.dir"
    os.mkfifo(fifo)
    folder.mkdir()
    paths = [folder, fifo] + ([Path("/dev/null")] if Path("/dev/null").exists() else [])
    cases = [(reader, path) for reader in READERS for path in paths]
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")]))
    try:
        done = subprocess.run([sys.executable, "-c", PROGRAM], input="".join(f"{r} {p}\n" for r, p in cases),
                              env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"a reader blocked on a path that is not a regular file: {err.stdout}")
    lines = [line for line in done.stdout.splitlines() if line.split(" ", 1)[0] in ("refused", "accepted", "other")]
    assert len(lines) == len(cases), done.stdout + done.stderr[-3000:]
    for line, (reader, path) in zip(lines, cases):
        assert line.startswith(f"refused {reader} ") and repr(str(path)) in line and "not a regular file" in line, line
