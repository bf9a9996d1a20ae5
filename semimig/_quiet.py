"""Third-party warnings that semimig's command line and example hide unless asked (``-v``).

Each entry below names the package, the message and why it is harmless here; each is matched
by its own mechanism (``warnings`` filters with category, message and module; a
:class:`logging.Filter` on the one logger that emits a message), so every other warning of the
same packages still shows.  :func:`quiet_third_party` installs them (``verbose=False``) or
removes them again (``verbose=True``).

warnings.warn
-------------
1. colossalai (``colossalai.utils.safetensors``, at import): ``UserWarning: Please install the
   latest tensornvme to use async save``.  tensornvme is Colossal-AI's optional NVMe writer for
   *asynchronous* checkpoint saving; semimig saves synchronously (``Booster.save_model``
   without ``use_async``), so nothing here can use it.
2. colossalai (``colossalai.shardformer.layer.normalization``, at import, twice):
   ``UserWarning: Please install apex from source ... to use the fused RMSNorm kernel``.  apex
   backs ``enable_fused_normalization``, which semimig's runs never turn on (the CPU/gloo runs
   cannot use a CUDA kernel; on CUDA the plain ``LayerNorm``/``RMSNorm`` are used).
3. torch DDP called by colossalai (``colossalai.booster.plugin.hybrid_parallel_plugin``, once
   per rank whenever a plugin with data parallelism wraps a model): ``FutureWarning:
   `broadcast_buffers` is deprecated``.  Colossal-AI passes torch's own default
   (``broadcast_buffers=True``), whose meaning the new ``forward_sync_buffers`` keeps (the
   warning's caveat is about ``False``); nothing a user can change from semimig.
4. torch, called by Colossal-AI's ZeRO (``LowLevelZeroOptimizer`` and its tensor bucket; the
   warning names the module ``torch.distributed.c10d_logger``, torch's wrapper of every
   collective, once per rank): ``FutureWarning: `torch.distributed.all_gather_into_tensor` is
   deprecated`` and the same for ``reduce_scatter_tensor`` (torch 2.13 renamed them
   ``all_gather_single`` / ``reduce_scatter_single``; the old names still call the new ones).
   semimig itself calls neither (:mod:`semimig.allocation.collectives` only times them), so
   the only callers are Colossal-AI's, which a user cannot change.

logging
-------
5. bitsandbytes (logger ``bitsandbytes.backends.cpu.ops``, at import of ``bitsandbytes``,
   which ``colossalai.quantization`` imports): ``Failed to load CPU gemm_4bit_forward from
   kernels-community: ...``.  On a CPU with AVX512-BF16 bitsandbytes tries the optional
   Hugging Face ``kernels`` package (absent here; from a source checkout the repository's
   ``kernels`` folder answers with an ImportError on purpose) for its 4-bit CPU GEMM, which
   semimig never calls: it does not quantize to 4 bit.  bitsandbytes offers no switch for the
   probe (``BITSANDBYTES_NOWELCOME`` only silenced the welcome banner of old releases), so the
   record is dropped by message on that logger.

Ranks started by :func:`semimig.launch.run_on_ranks` come from a forkserver that imports this
module before torch and Colossal-AI: :func:`quiet_third_party` records its choice in
``SEMIMIG_THIRD_PARTY_WARNINGS`` (``hide``/``show``), and importing this module applies
``hide`` (and nothing else: without the variable an import changes nothing).  A forked rank
inherits the filters, so Colossal-AI's warnings no longer repeat once per rank and case.  With
``show`` (``-v``) each listed warning is printed at most once per run, not once per rank and
case: the first process to show it creates a marker file in a directory the command made
(``SEMIMIG_WARNED_DIR``, removed when the command exits), and the others skip it.

Importing this module is cheap (no torch, no Colossal-AI).
"""
from __future__ import annotations

import logging
import os
import re
import warnings

__all__ = ["ENV_VAR", "SEEN_DIR_VAR", "quiet_third_party"]

ENV_VAR = "SEMIMIG_THIRD_PARTY_WARNINGS"
"""``hide`` or ``show``: the choice of :func:`quiet_third_party`, for the ranks it starts."""
SEEN_DIR_VAR = "SEMIMIG_WARNED_DIR"
"""With ``show``: the directory of marker files of the listed warnings already shown in this run."""

# (category, start of the message, module that warns), items 1-4 of the module docstring
_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    (UserWarning, "Please install the latest tensornvme", "colossalai.utils.safetensors"),
    (UserWarning, "Please install apex from source", "colossalai.shardformer.layer.normalization"),
    (FutureWarning, "`broadcast_buffers` is deprecated", "colossalai.booster.plugin.hybrid_parallel_plugin"),
    (FutureWarning, "`torch.distributed.all_gather_into_tensor` is deprecated", "torch.distributed.c10d_logger"),
    (FutureWarning, "`torch.distributed.reduce_scatter_tensor` is deprecated", "torch.distributed.c10d_logger"),
)
# logger -> start of the message, item 5
_LOG_RECORDS: tuple[tuple[str, str], ...] = (
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward from kernels-community"),
)
# the (category, message, module) patterns of the filters warnings.filterwarnings makes of _WARNINGS
_PATTERNS = {(category, re.escape(message), re.escape(module) + r"\Z") for category, message, module in _WARNINGS}


def _ours(entry: tuple) -> bool:
    """Whether a ``warnings.filters`` entry is one :func:`quiet_third_party` installed."""
    action, message, category, module, _lineno = entry
    return action == "ignore" and (category, getattr(message, "pattern", None),
                                   getattr(module, "pattern", None)) in _PATTERNS


def _listed(category: type, message: str, filename: str) -> bool:
    """Whether a warning about to be shown is one of ``_WARNINGS`` (by category, message, file)."""
    where = str(filename).replace(os.sep, "/")
    return any(issubclass(category, c) and message.startswith(m) and where.endswith(mod.replace(".", "/") + ".py")
               for c, m, mod in _WARNINGS)


def _first_in_run(what: str) -> bool:
    """True for the first process of this run to show ``what`` (it creates the marker file)."""
    import hashlib

    directory = os.environ.get(SEEN_DIR_VAR)
    if directory is None:
        return True
    try:
        fd = os.open(os.path.join(directory, hashlib.sha1(what.encode()).hexdigest()),
                     os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    except OSError:  # the directory is gone (the command is ending): show it rather than lose it
        return True
    os.close(fd)
    return True


class _DropMessage(logging.Filter):
    """Drops a logger's records whose (unformatted) message starts with ``prefix``; with
    ``once_per_run``, only those another process of this run has already shown."""

    def __init__(self, prefix: str, *, once_per_run: bool = False) -> None:
        super().__init__()
        self.prefix = prefix
        self.once_per_run = once_per_run

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.prefix):
            return True
        return self.once_per_run and _first_in_run(f"{record.name}|{self.prefix}")


_HIDE = {name: _DropMessage(prefix) for name, prefix in _LOG_RECORDS}
_ONCE = {name: _DropMessage(prefix, once_per_run=True) for name, prefix in _LOG_RECORDS}


def _show_once_per_run() -> None:
    """``-v``: each listed warning at most once per run, across this process and its ranks."""
    import atexit
    import shutil
    import tempfile

    directory = os.environ.get(SEEN_DIR_VAR)
    if directory is None or not os.path.isdir(directory):  # the command's own process: make it
        os.environ[SEEN_DIR_VAR] = tempfile.mkdtemp(prefix="semimig-warned-")
        atexit.register(shutil.rmtree, os.environ[SEEN_DIR_VAR], ignore_errors=True)
    for name, once in _ONCE.items():
        logging.getLogger(name).addFilter(once)
    if getattr(warnings.showwarning, "semimig_once_per_run", False):
        return
    show = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if _listed(category, text, filename) and not _first_in_run(f"{category.__name__}|{text}|{filename}|{lineno}"):
            return
        show(message, category, filename, lineno, file, line)

    showwarning.semimig_once_per_run = True
    warnings.showwarning = showwarning


def quiet_third_party(verbose: bool = False) -> None:
    """Hide (``verbose=False``) the warnings listed above, or show each once per run (``verbose=True``).

    Idempotent; affects this process, and (through ``SEMIMIG_THIRD_PARTY_WARNINGS``) the ranks
    it starts afterwards.  Call it first thing in a command line or script, before torch or
    Colossal-AI is imported: the import-time warnings fire only once.
    """
    os.environ[ENV_VAR] = "show" if verbose else "hide"
    if any(_ours(entry) for entry in warnings.filters):
        warnings.filters[:] = [entry for entry in warnings.filters if not _ours(entry)]
        getattr(warnings, "_filters_mutated", lambda: None)()  # what filterwarnings does after an edit
    for name in dict(_LOG_RECORDS):
        logging.getLogger(name).removeFilter(_HIDE[name])
        logging.getLogger(name).removeFilter(_ONCE[name])
    if verbose:
        _show_once_per_run()
        return
    for category, message, module in _WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), category=category,
                                module=re.escape(module) + r"\Z")
    for name, hide in _HIDE.items():
        logging.getLogger(name).addFilter(hide)


if os.environ.get(ENV_VAR) in ("hide", "show"):  # a rank's forkserver: see the module docstring
    quiet_third_party(verbose=os.environ[ENV_VAR] == "show")
