"""The one writer of semimig's output files, and the check of an output path before any work.

Every file semimig writes (bench and report results, plots, ``plan --json``, the benchmark
scripts' records) goes through :func:`write_atomically`: the bytes go to a temporary file in the
target's directory, are flushed to disk, and the temporary is renamed over the target
(``os.replace``, atomic on POSIX).  A crash, a full disk or an interrupt leaves either the previous
file or the new one, never a torn one, and no temporary behind.

File mode: a new file gets ``0o666 & ~umask`` (what ``open(path, "w")`` would give); a file that
already exists keeps its mode.  A symbolic link is followed: its target is replaced, the link stays.

:func:`check_output_file` is called before any work (training, planning) so that a bad path is
refused at once, not after an hour: the path must not be a directory nor an existing file that is
not regular (a FIFO or a device: opening one could block forever, so only ``os.stat`` is used), its
directory must exist (or, where the caller allows it, be creatable) and be writable, and it must not
be one of the command's own inputs.
"""
from __future__ import annotations

import io
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable, Optional, Tuple, Union

from semimig.errors import ConfigError

__all__ = ["check_apart", "check_figure_path", "check_input_file", "check_new_file", "check_output_file", "check_output_dir",
           "write_atomically", "write_json", "write_figure"]

PathLike = Union[str, "os.PathLike[str]"]


def _umask() -> int:
    """The process's umask: read from ``/proc`` where it can be (setting it, the only portable way
    to read it, would race with other threads creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): compare where they would be
        return os.path.realpath(a) == os.path.realpath(b)


def check_input_file(path: PathLike, what: str) -> Path:
    """Refuse an input that is missing or not a regular file (a FIFO would block the read forever).

    ``what`` names the input in the message (``spec``, ``--json``).
    """
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        raise ConfigError(f"cannot read {what} {path}: {err.strerror}") from None
    if stat.S_ISDIR(mode):
        raise ConfigError(f"{what} {path} is a directory; give a file")
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{what} {path} is {_kind(mode)}, not a regular file")
    return path


def check_output_file(path: PathLike, flag: str, *, inputs: Iterable[PathLike] = (),
                      make_parents: bool = False) -> Path:
    """Refuse an output file path that cannot be written safely.

    ``flag`` names the argument in the message (``--json``); ``inputs`` are the files the command
    reads, never to be written over; ``make_parents``: create a missing directory (for a default
    path such as ``results/bench.json``) instead of refusing it.  Returns ``path`` as a :class:`Path`.
    """
    path = Path(path)
    for given in inputs:
        if _same_file(path, Path(given)):
            raise ConfigError(f"{flag} {path} is the input {given}: writing there would destroy it; give another path")
    try:
        mode = os.stat(path).st_mode  # follows a link; never opens (a FIFO would block)
    except (FileNotFoundError, NotADirectoryError):  # not there yet (or a file where a directory should be)
        mode = None
    except OSError as err:
        raise ConfigError(f"{flag} {path}: cannot inspect it ({err.strerror})") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise ConfigError(f"{flag} {path} is a directory; give a file name")
    if mode is not None and not stat.S_ISREG(mode):
        raise ConfigError(f"{flag} {path} is {_kind(mode)}, not a regular file; give a file name")
    parent = Path(os.path.realpath(path)).parent
    if not parent.exists() and not make_parents:
        raise ConfigError(f"cannot write {flag} {path}: directory {parent} does not exist")
    _writable_directory(parent, flag, path)
    return path


def check_new_file(path: PathLike, flag: str, *, overwrite: bool, overwrite_flag: str = "--overwrite",
                   inputs: Iterable[PathLike] = (), make_parents: bool = False) -> Path:
    """:func:`check_output_file`, and an existing file refused unless ``overwrite``: the one rule of every
    output path of semimig (what a user already has is never replaced without being asked to)."""
    path = check_output_file(path, flag, inputs=inputs, make_parents=make_parents)
    if not overwrite and os.path.lexists(path):
        raise ConfigError(f"{flag} {path} exists: pass {overwrite_flag} to replace it, or choose another path")
    return path


def check_apart(files: Iterable[Tuple[str, Optional[PathLike]]],
                trees: Iterable[Tuple[str, Optional[PathLike]]] = ()) -> None:
    """Refuse outputs that would destroy each other: two ``files`` at one path, or a file at or inside
    one of ``trees`` (a directory another flag reads or writes whole: a checkpoint).  ``(flag, path)``
    pairs, ``None`` paths skipped; paths compared where they would be (links resolved, existing or
    not).  Called before any work, so nothing is lost at the end of a long run."""
    def where(path: PathLike) -> Path:
        return Path(os.path.realpath(path))

    files = [(flag, where(path), path) for flag, path in files if path is not None]
    for i, (flag, real, given) in enumerate(files):
        for other, other_real, other_given in files[:i]:
            if real == other_real:
                raise ConfigError(f"{flag} {given} and {other} {other_given} are one path: the second write would "
                                  "destroy the first; give two paths")
    for tree_flag, tree in trees:
        if tree is None:
            continue
        for flag, real, given in files:
            if real == where(tree) or where(tree) in real.parents:
                raise ConfigError(f"{flag} {given} is inside {tree_flag} {tree}: writing it there would overwrite or "
                                  f"break that checkpoint; give a path outside it")


FIGURE_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg")
"""The figure formats :func:`write_figure` is asked for by a path's suffix (matplotlib's common ones)."""


def check_figure_path(path: PathLike, flag: str) -> Path:
    """:func:`check_output_file`, and a suffix matplotlib renders (``.png``, ``.pdf``, ...; none: PNG):
    refused before the run instead of failing after it."""
    path = check_output_file(path, flag)
    suffix = path.suffix.lstrip(".").lower()
    if suffix and suffix not in FIGURE_FORMATS:  # no suffix: written as PNG
        raise ConfigError(f"{flag} {path}: a figure is written as {', '.join('.' + f for f in FIGURE_FORMATS)}, "
                          f"got {path.suffix!r}")
    return path


def check_output_dir(path: PathLike, flag: str) -> Path:
    """Refuse an output directory that is a file or cannot be created or written."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file; give a directory")
    _writable_directory(path, flag, path)
    return path


def _writable_directory(directory: Path, flag: str, given: Path) -> None:
    """Create ``directory`` if missing; refuse (naming ``flag`` and the ``given`` path) if that fails
    or it is not writable."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"{flag} {given}: cannot create {directory} ({err.strerror})") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {given}: {directory} is not writable")


def write_atomically(path: PathLike, content: Union[str, bytes]) -> Path:
    """Write ``content`` to ``path`` through a temporary file in its directory and a rename.

    Raises :class:`OSError` (nothing written, the previous file intact) if the target exists and
    is not a regular file, or if writing fails.
    """
    target = Path(os.path.realpath(path))  # a link's target is replaced, the link kept
    try:
        existing = os.stat(target).st_mode
    except FileNotFoundError:
        existing = None
    if existing is not None and not stat.S_ISREG(existing):
        raise OSError(f"{path} is {'a directory' if stat.S_ISDIR(existing) else _kind(existing)}; "
                                "not replaced")
    mode = stat.S_IMODE(existing) if existing is not None else 0o666 & ~_umask()
    data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(path)


def write_json(path: PathLike, data: Any, *, indent: int = 2) -> Path:
    """``data`` as JSON (non-JSON values as ``str``), atomically; serialised before the file is touched."""
    return write_atomically(path, json.dumps(data, indent=indent, default=str) + "\n")


def write_figure(fig: Any, path: PathLike, **savefig_kwargs: Any) -> Path:
    """A matplotlib figure rendered in memory, then written atomically (format from the suffix)."""
    path = Path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix.lstrip(".") or "png", **savefig_kwargs)
    return write_atomically(path, buffer.getvalue())
