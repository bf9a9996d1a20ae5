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

logging
-------
4. bitsandbytes (logger ``bitsandbytes.backends.cpu.ops``, at import of ``bitsandbytes``,
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
inherits the filters, so Colossal-AI's warnings no longer repeat once per rank and case.

Importing this module is cheap (no torch, no Colossal-AI).
"""
from __future__ import annotations

import logging
import os
import re
import warnings

__all__ = ["ENV_VAR", "quiet_third_party"]

ENV_VAR = "SEMIMIG_THIRD_PARTY_WARNINGS"
"""``hide`` or ``show``: the choice of :func:`quiet_third_party`, for the ranks it starts."""

# (category, start of the message, module that warns), items 1-3 of the module docstring
_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    (UserWarning, "Please install the latest tensornvme", "colossalai.utils.safetensors"),
    (UserWarning, "Please install apex from source", "colossalai.shardformer.layer.normalization"),
    (FutureWarning, "`broadcast_buffers` is deprecated", "colossalai.booster.plugin.hybrid_parallel_plugin"),
)
# logger -> start of the message, item 4
_LOG_RECORDS: tuple[tuple[str, str], ...] = (
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward from kernels-community"),
)


class _DropMessage(logging.Filter):
    """Drops a logger's records whose (unformatted) message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


_FILTERS = {name: _DropMessage(prefix) for name, prefix in _LOG_RECORDS}


def _ours(entry: tuple) -> bool:
    """Whether a ``warnings.filters`` entry is one :func:`quiet_third_party` installed."""
    action, message, category, module, _lineno = entry
    return action == "ignore" and (category, getattr(message, "pattern", None),
                                   getattr(module, "pattern", None)) in _PATTERNS


_PATTERNS = {(category, re.escape(message), re.escape(module) + r"\Z") for category, message, module in _WARNINGS}


def quiet_third_party(verbose: bool = False) -> None:
    """Hide (``verbose=False``) or show again (``verbose=True``) the warnings listed above.

    Idempotent; affects this process, and (through ``SEMIMIG_THIRD_PARTY_WARNINGS``) the ranks
    it starts afterwards.  Call it first thing in a command line or script, before torch or
    Colossal-AI is imported: the import-time warnings fire only once.
    """
    os.environ[ENV_VAR] = "show" if verbose else "hide"
    if any(_ours(entry) for entry in warnings.filters):
        warnings.filters[:] = [entry for entry in warnings.filters if not _ours(entry)]
        getattr(warnings, "_filters_mutated", lambda: None)()  # what filterwarnings does after an edit
    for name, drop in _FILTERS.items():
        logging.getLogger(name).removeFilter(drop)
    if verbose:
        return
    for category, message, module in _WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), category=category,
                                module=re.escape(module) + r"\Z")
    for name, drop in _FILTERS.items():
        logging.getLogger(name).addFilter(drop)


if os.environ.get(ENV_VAR) == "hide":  # a rank's forkserver: see the module docstring
    quiet_third_party(verbose=False)
