"""Checkpoints of the LLM training program: ``--save DIR`` and ``--resume DIR`` (:mod:`semimig.bench.llm`)."""
from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

logger = logging.getLogger(__name__)


def staging_dir(save: str) -> Path:
    """``--save DIR``'s staging directory ``DIR.partial`` (absolute: ``--save .`` has no name of its own):
    the checkpoint is written there and renamed to ``DIR`` once complete."""
    final = Path(save).absolute()
    return final.with_name(final.name + ".partial")


CHECKPOINT_STATE = "finetune_state.json"
# What a checkpoint must share with the run that resumes it: the model's shape and the data stream.
RESUME_MUST_MATCH = ("model", "hidden", "layers", "heads", "kv_heads", "data", "batch_size", "seq_len", "seed",
                      "precision", "zero_stage")


def check_checkpoint_flags(args: argparse.Namespace) -> None:
    """``--save`` never writes over anything (a missing or empty directory, and no leftover
    ``DIR.partial``); ``--resume`` reads a complete checkpoint of the same model and data, with
    steps left to train.  Refused here, naming the flag, before any rank starts."""
    import json

    from semimig.errors import ConfigError

    if args.save is not None:
        path = Path(args.save)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise ConfigError(f"--save {path} exists and is not an empty directory: a checkpoint is never written "
                              "over anything; choose a new directory")
        partial = staging_dir(args.save)
        if partial.exists():
            raise ConfigError(f"--save {path}: {partial} exists (an interrupted save?); remove it or choose another "
                              "directory")
        if not path.parent.is_dir():
            raise ConfigError(f"--save {path}: its directory {path.parent} does not exist")
        import tempfile

        try:  # a real write, not os.access (root passes that on a read-only file system)
            os.rmdir(tempfile.mkdtemp(prefix=".finetune-save-probe-", dir=partial.parent))
        except OSError as err:
            raise ConfigError(f"--save {path}: cannot write in {partial.parent} ({err.strerror})") from None
    if args.resume is not None:
        state_file = Path(args.resume) / CHECKPOINT_STATE
        if not state_file.is_file():
            raise ConfigError(f"--resume {args.resume} is not a checkpoint of the LLM training (no {CHECKPOINT_STATE}: "
                              "written last, so a save that did not finish has none)")
        try:
            state = json.loads(state_file.read_text())
            saved_step, flags = int(state["step"]), dict(state["flags"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"--resume {args.resume}: unreadable {CHECKPOINT_STATE} ({err!r})") from None
        wrong = [f"--{k.replace('_', '-')} {flags.get(k)!r} (this run: {getattr(args, k)!r})"
                 for k in RESUME_MUST_MATCH if flags.get(k) != getattr(args, k)]
        if wrong:
            raise ConfigError(f"--resume {args.resume} was saved with " + ", ".join(wrong))
        if saved_step >= args.steps:
            raise ConfigError(f"--resume {args.resume} has trained {saved_step} steps: --steps (the total) must be "
                              f"larger, got {args.steps}")
        args.resume_step = saved_step


def save_checkpoint(booster, model, optimizer, args: argparse.Namespace, step: int, rank: int) -> float:
    """Model and optimizer into ``--save DIR.partial``, the state file last, then renamed to ``DIR``:
    a save that does not finish leaves no checkpoint under ``DIR``.  ``DIR`` must be on a file system
    every rank sees (as Colossal-AI's checkpoint IO assumes).  Collective; its seconds."""
    import torch.distributed as dist

    from semimig._io import write_json

    start = time.perf_counter()
    final, partial = Path(args.save).absolute(), staging_dir(args.save)
    booster.save_model(model, str(partial / "model"), shard=True)
    booster.save_optimizer(optimizer, str(partial / "optimizer"), shard=True)
    dist.barrier()
    if rank == 0:
        flags = {k: getattr(args, k) for k in RESUME_MUST_MATCH}
        write_json(partial / CHECKPOINT_STATE, {"step": step, "flags": flags})
        if final.exists():
            final.rmdir()  # checked empty before the run
        partial.rename(final)
    dist.barrier()
    return time.perf_counter() - start


def resume_lr(optimizer, args: argparse.Namespace) -> None:
    """The learning rate after ``--resume``: the checkpoint's (loaded with the optimizer state), said so,
    unless ``--lr`` was given: then ``--lr``, said so too.  Never one replaced by the other in silence."""
    saved = optimizer.param_groups[0]["lr"]
    if args.lr_given and args.lr != saved:
        for group in optimizer.param_groups:
            group["lr"] = args.lr
        logger.info("overriding the checkpoint's lr %g with --lr %g", saved, args.lr)
    elif not args.lr_given:
        args.lr = saved
        logger.info("keeping the checkpoint's lr %g (pass --lr to override it)", saved)


def load_checkpoint(booster, model, optimizer, path: str) -> float:
    """Weights and optimizer state of ``--resume DIR`` into the boosted model; its seconds."""
    start = time.perf_counter()
    booster.load_model(model, str(Path(path) / "model"))
    booster.load_optimizer(optimizer, str(Path(path) / "optimizer"))
    return time.perf_counter() - start

