"""Fine-tune a causal LM with Colossal-AI's HybridParallelPlugin, with semimig's straggler tolerance.

One node, two ranks (CPU/gloo, or one GPU per rank/NCCL when CUDA is there)::

    torchrun --nproc_per_node 2 examples/finetune_llm.py --straggler fixed:1:4            # balanced
    torchrun --nproc_per_node 2 examples/finetune_llm.py --straggler fixed:1:4 --balance off
    colossalai run --nproc_per_node 2 examples/finetune_llm.py --straggler fixed:1:4

Several nodes (run on every node, ``--node_rank`` 0..N-1; the endpoint is node 0)::

    torchrun --nnodes 2 --nproc_per_node 4 --node_rank 0 --rdzv_backend c10d \\
        --rdzv_endpoint node0.example:29500 --rdzv_id finetune1 examples/finetune_llm.py --tp 4

A rank that *stays* slow is served exactly by re-sharding: ``--balance reshard`` gives it fewer MLP
blocks and KV groups once its speed has been stable for ``--reshard-window`` steps and the
predicted gain pays for moving the weights and optimizer state (``semi`` does the same and resizes
what varies from step to step; a rank clearly slow before the first step, by a short probe of the
same GEMMs on every rank, is re-planned for at once: ``--reshard-probe``); the summary reports
``replans``, the plan, ``moved_mb`` and ``move_s`` (the move's time is inside its step's time)::

    torchrun --nproc_per_node 2 examples/finetune_llm.py --straggler fixed:1:4:scope=device --balance reshard

With data parallelism beside TP (more ranks than ``--tp``), ``--batch-split poplar`` makes each
iteration's batch a global one — every DP rank's ``--batch-size`` rows, the same on every rank —
and lets Poplar give the faster TP groups more of its rows, calibrated from the first iterations
(``semimig.enable(..., batch=semimig.BatchSplit(...))``; each micro-step's loss is scaled so the
DP-averaged gradient stays the global-batch mean, and the logged loss is that mean).  ``even`` keeps
every group on its own rows, the plain run's; a group's micro-steps hold at most ``--batch-size``
rows (more become accumulation steps).  ``--straggler-replica D`` injects ``--straggler`` in replica
``D`` only, so the groups differ; the summary reports the split in force::

    torchrun --nproc_per_node 4 examples/finetune_llm.py --tp 2 --batch-split poplar \
        --straggler fixed:1:4:scope=device --straggler-replica 0

The model is a tiny Llama built in code (no download) unless ``--model NAME`` names a Hugging Face
causal LM, which is read with ``from_pretrained(NAME, local_files_only=True)``: the weights must
already be on disk (a local directory, or the Hugging Face cache).

The data (``--data``): ``shakespeare`` (default) is real English text, Shakespeare's plays as bytes
(vocabulary 256: the tiny Llama gets 256 embeddings; a ``--model`` must have at least 256 and its
token ``i`` is fed byte ``i``, so it re-learns its embeddings rather than fine-tunes), fetched once
by ``make setup`` (:mod:`semimig.bench.corpus`: the held-out 5 % tail of every play is the
validation set).  ``synthetic`` are token sequences from a seeded generator,
``x_t = (a + b·t) mod V`` with random ``a`` and a stride ``b`` in 1..7 (``V = 512``), which any LM
learns within a few dozen steps: a smoke test that needs no data.  Every ``--eval-every`` steps
(and after the last) every rank computes the mean loss over ``--eval-batches`` fixed validation
batches, in eval mode (dense: no balancing, no injected delay) and without gradients; its wall
time is kept apart (``eval_s``) from the step times.  With Shakespeare, compare the validation
loss (nats a byte) with the corpus's unigram entropy, 3.26 nats: the loss of a model that knows
only byte frequencies.

The whole pipeline: ``HybridParallelPlugin(tp_size=--tp, zero_stage=--zero-stage,
precision=--precision, custom_policy=SemiMigPolicy())``, ``booster.boost``, then one line,
``semimig.enable(model, plugin, optimizer=optimizer, mode=--balance, straggler=--straggler)``,
which hooks the optimizer's step.  ``--policy colossalai`` boosts with Colossal-AI's own policy
instead (no balancing), for comparison.  Rank 0 shows a progress bar, logs loss, step time and
the balancing plan every ``--log-every`` steps and prints one summary line at the end::

    summary: steps=30 median_step_s=0.0412 final_loss=2.4101 shed=0.000,0.512 flagged=1 balance=semi ...
             data=shakespeare final_val_loss=2.4630 eval_s=0.812

Checkpoints: ``--save DIR`` writes model and optimizer at the end (Colossal-AI's sharded
checkpoint, full tensors, loadable under any TP degree or shard plan; into ``DIR.partial``, the state
file last, then renamed: an interrupted save leaves nothing under ``DIR``), never over an existing
non-empty directory; ``--resume DIR`` continues it to ``--steps`` in total, on the same batches the
uninterrupted run would have seen (the model and data flags must match, refused naming the
difference).  The summary reports ``resumed_at``, ``load_s`` and ``save_s``::

    torchrun --nproc_per_node 2 examples/finetune_llm.py --steps 20 --save ckpt
    torchrun --nproc_per_node 2 examples/finetune_llm.py --steps 40 --resume ckpt

A rank that dies or hangs makes the others fail within ``--timeout-s`` (the collective timeout
of every process group), never a silent hang; a launcher that dies (``kill -9`` of torchrun) ends
its ranks within a second, each naming the launcher's pid.
"""
from __future__ import annotations

import argparse
import datetime
import logging
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional, Tuple

import torch

if TYPE_CHECKING:
    from semimig.bench.corpus import ByteCorpus

logger = logging.getLogger("finetune_llm")

BALANCE_MODES = ("semi", "mig", "zero-rd", "zero-pri", "zero-pridiff-e", "zero-pridiff-r", "reshard", "off")
SYNTHETIC_VOCAB = 512
DEFAULT_LR = 1e-3


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    from semimig._validate import OneLineParser  # a refusal: one line, from rank 0 only, exit 2

    p = OneLineParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-llama",
                   help="'tiny-llama' (built in code) or a Hugging Face causal LM name/path, weights on disk")
    p.add_argument("--hidden", type=int, default=256, help="tiny-llama hidden size (default 256)")
    p.add_argument("--layers", type=int, default=4, help="tiny-llama decoder layers (default 4)")
    p.add_argument("--heads", type=int, default=8, help="tiny-llama attention heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=4,
                   help="tiny-llama key/value heads (default 4; GQA groups, the attention's re-sharding unit)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: every rank)")
    p.add_argument("--zero-stage", type=int, default=0, choices=(0, 1, 2), help="ZeRO stage beside TP")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--policy", default="semimig", choices=("semimig", "colossalai"),
                   help="semimig's layers (default) or Colossal-AI's own policy (no balancing)")
    p.add_argument("--balance", default="semi", choices=BALANCE_MODES,
                   help="balancing mode; 'off': none; 'reshard': exact uneven shards re-planned for a straggler that "
                        "stays (semi also re-shards, and resizes what varies)")
    p.add_argument("--reflex", default=None, choices=("on", "backward", "off"),
                   help="the step reflex of the resizing modes (a rank turning slow prunes the rest of its step): "
                        "'on' (default), 'backward' (backward calls only: every forward exact), 'off'")
    p.add_argument("--paired", action=argparse.BooleanOptionalAction, default=None,
                   help="resizing modes: prune each MLP as a pair (the down projection's kept units also prune the "
                        "gate/up projections' rows; ResizingConfig.paired; the default); --no-paired: every layer "
                        "prunes its own K (the paper)")
    p.add_argument("--resize-block", type=int, default=None, metavar="G",
                   help="resizing modes: prune whole aligned blocks of G columns (1, 8, 16 or 32; ResizingConfig.block; "
                        "default 1, single columns as in the paper), chosen by the blocks' mean weight change")
    p.add_argument("--reshard-window", type=int, default=10,
                   help="reshard/semi: steps a straggler's speed must stay stable before a re-plan (default 10; "
                        "the run's first re-plan may come after half of them when its gain is large)")
    p.add_argument("--reshard-probe", type=float, default=0.25,
                   help="reshard/semi: before the first step, time the same GEMMs on every rank and re-plan at once "
                        "when the predicted gain is at least this fraction of the step (default 0.25: a rank ~1.7x "
                        "slower at tp 2); 0: no probe, the first steps decide")
    p.add_argument("--shard-plan", default=None, metavar="MLP_UNITS[:KV_UNITS]",
                   help="uneven tensor-parallel shards: MLP blocks of --shard-block columns and KV groups per TP "
                        "rank, e.g. 28,4:3,1 (needs --policy semimig and a --balance other than mig)")
    p.add_argument("--shard-block", type=int, default=128,
                   help="MLP intermediate columns per --shard-plan unit (and per re-sharding unit)")
    p.add_argument("--straggler", default=None, help="test straggler, e.g. fixed:1:4 (TP rank 1 4x slower)")
    p.add_argument("--straggler-replica", type=int, default=None, metavar="D",
                   help="inject --straggler only in data-parallel replica D (default: in every TP group), e.g. to "
                        "give --batch-split poplar a slow group to plan around")
    p.add_argument("--batch-split", default="none", choices=("none", "even", "poplar"),
                   help="with DP groups beside TP: split each global batch (--batch-size rows per DP rank) between "
                        "them; 'poplar' gives faster TP groups more rows (the gradient stays the global-batch mean)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=None,
                   help=f"learning rate (default {DEFAULT_LR:g}; with --resume: the checkpoint's, unless given)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default="shakespeare", choices=("shakespeare", "synthetic"),
                   help="Shakespeare's plays as bytes (default; fetched by make setup) or synthetic sequences")
    p.add_argument("--eval-every", type=int, default=10,
                   help="validation loss every N steps and after the last (default 10); 0: never")
    p.add_argument("--eval-batches", type=int, default=8, help="fixed validation batches per evaluation (default 8)")
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--timeout-s", type=float, default=180.0, help="collective timeout of every process group")
    p.add_argument("--json", default=None, help="write losses, step times and the summary here (rank 0)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --json / --started-file")
    p.add_argument("--started-file", default=None, metavar="PATH",
                   help="rank 0 creates PATH as its first training step starts (for a launcher that "
                        "throttles the training, not the start-up: semimig throttle --pattern-after PATH)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also show third-party warnings (Colossal-AI's optional-package notices, deprecations)")
    p.add_argument("--save", default=None, metavar="DIR",
                   help="at the end, save model and optimizer (Colossal-AI's sharded checkpoint: full tensors, "
                        "any TP degree or shard plan loads it) into DIR, which must not exist or be empty")
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="continue a run saved with --save DIR: its weights, optimizer state and step; --steps is "
                        "the total (the saved steps count), and the model and data flags must match")
    p.add_argument("--allow-nonfinite", action="store_true",
                   help="keep training when the loss becomes NaN or inf (default: stop, naming the step)")
    args = p.parse_args(argv)
    args.lr_given = args.lr is not None
    args.lr = DEFAULT_LR if args.lr is None else args.lr
    try:
        check_flags(args)
    except Exception as err:  # ConfigError: one line naming the flag and the value
        p.error(str(err))
    return args


# Flag bounds: wide enough for any CPU or GPU run of the example, narrow enough that a typo
# (a stray zero, a minus sign, inf) is refused before any process group or model is built.
_INT_FLAGS = {"hidden": (8, 65536), "layers": (1, 1024), "steps": (1, 10**7), "batch_size": (1, 65536),
              "seq_len": (2, 1 << 20), "seed": (0, 2**32 - 1), "eval_every": (0, 10**7), "eval_batches": (1, 10**5),
              "log_every": (1, 10**7), "shard_block": (1, 1 << 20), "reshard_window": (2, 10**6),
              "heads": (1, 4096), "kv_heads": (1, 4096)}


def check_flags(args: argparse.Namespace) -> None:
    """Every numeric flag bounded and finite, consistent with the tiny Llama and the output path
    writable: refused here (:class:`~semimig.errors.ConfigError`, naming the flag) rather than by
    torch or Colossal-AI after the ranks started, or by ``open`` after the run finished."""
    from semimig._validate import check_choice, check_int, check_number
    from semimig.errors import ConfigError

    for name, (low, high) in _INT_FLAGS.items():
        check_int(f"--{name.replace('_', '-')}", getattr(args, name), minimum=low, maximum=high)
    check_int("--tp", args.tp, minimum=1, maximum=4096, allow_none=True)
    check_number("--lr", args.lr, minimum=0.0, maximum=100.0, low_open=True)
    check_number("--timeout-s", args.timeout_s, minimum=1.0, maximum=7 * 86400.0)
    check_number("--reshard-probe", args.reshard_probe, minimum=0.0, maximum=1.0, high_open=True)
    if args.model == "tiny-llama":
        if args.hidden % args.heads:
            raise ConfigError(f"--hidden must be a multiple of --heads {args.heads}, got {args.hidden}")
        if args.heads % args.kv_heads:
            raise ConfigError(f"--kv-heads must divide --heads {args.heads}, got {args.kv_heads}")
        if args.tp is not None and args.kv_heads % args.tp:
            raise ConfigError(f"--tp must divide the tiny Llama's --kv-heads {args.kv_heads}, got {args.tp}")
    else:  # its config now, not from_pretrained failing on every rank after start-up
        try:
            model_config(args)
        except (OSError, ValueError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(f"--model {args.model!r} is neither 'tiny-llama' nor a Hugging Face model on this "
                              f"disk (a directory or a name in the local cache; nothing is downloaded): {first}") from None
    if args.zero_stage and args.precision == "fp32":  # Colossal-AI asserts this after the ranks start
        raise ConfigError(f"--zero-stage {args.zero_stage} needs --precision bf16 or fp16 (Colossal-AI's ZeRO "
                          f"keeps fp32 master weights of half-precision ones), got --precision fp32")
    if args.policy == "colossalai" and (args.balance != "off" or args.straggler):
        raise ConfigError("--policy colossalai has no semimig layers: use it with --balance off and no --straggler")
    if args.shard_plan and (args.policy != "semimig" or args.balance == "mig"):
        raise ConfigError(f"--shard-plan {args.shard_plan} needs --policy semimig and a --balance other than mig "
                          f"(migration needs equal shards), got --policy {args.policy} --balance {args.balance}")
    resizes = args.policy == "semimig" and args.balance not in ("mig", "reshard", "off")
    if args.reflex is not None and not resizes:
        raise ConfigError(f"--reflex {args.reflex} is the resizing modes' step reflex: it needs --policy semimig and a "
                          f"resizing --balance (semi or zero-*), got --policy {args.policy} --balance {args.balance}")
    args.reflex = args.reflex or "on"
    if args.paired is not None and not resizes:
        flag = "--paired" if args.paired else "--no-paired"
        raise ConfigError(f"{flag} says how MLPs prune: it needs --policy semimig and a resizing --balance (semi or "
                          f"zero-*), got --policy {args.policy} --balance {args.balance}")
    if args.resize_block is not None:
        from semimig.resizing.config import BLOCKS

        check_choice("--resize-block", args.resize_block, BLOCKS)
        if not resizes:
            raise ConfigError(f"--resize-block {args.resize_block} says how resizing prunes: it needs --policy semimig "
                              f"and a resizing --balance (semi or zero-*), got --policy {args.policy} "
                              f"--balance {args.balance}")
    if args.straggler_replica is not None and args.straggler is None:
        raise ConfigError(f"--straggler-replica {args.straggler_replica} names where --straggler acts: give --straggler")
    check_int("--straggler-replica", args.straggler_replica, minimum=0, maximum=65535, allow_none=True)
    if args.batch_split != "none" and args.policy != "semimig":
        raise ConfigError(f"--batch-split {args.batch_split} times each data-parallel group by semimig's layers: it "
                          f"needs --policy semimig, got --policy {args.policy}")
    check_world(args)

    from semimig._io import check_apart, check_new_file

    outputs = (("--json", args.json), ("--started-file", args.started_file))
    partial = None if args.save is None else staging_dir(args.save)
    check_apart(outputs, (("--save", args.save), ("--save's staging directory", partial), ("--resume", args.resume)))
    for flag, path in outputs:
        if path is not None:
            check_new_file(path, flag, overwrite=args.overwrite)
    check_checkpoint_flags(args)


def check_world(args: argparse.Namespace) -> None:
    """The flags against the launch (``WORLD_SIZE``, set by torchrun; unknown outside a launch) and the
    model: a TP size that divides the ranks, a straggler rank inside the TP group, a replica that exists,
    a batch split with more than one group to split between, a shard plan that fits."""
    from semimig.errors import ConfigError

    world = os.environ.get("WORLD_SIZE")
    world = int(world) if world and world.isdigit() and int(world) > 0 else None
    tp = args.tp or world
    if world is not None and world % tp:
        raise ConfigError(f"--tp {tp} must divide the number of ranks {world}")
    if args.straggler is not None:
        from semimig.straggler import StragglerConfig

        ranks = StragglerConfig.from_cli(args.straggler).ranks  # names the bad token
        if tp is not None and any(r >= tp for r in ranks):
            raise ConfigError(f"--straggler {args.straggler} names TP rank {max(ranks)}, but the TP group has "
                              f"ranks 0..{tp - 1} (--tp {tp})")
    dp = None if world is None else world // tp
    if dp is not None and args.straggler_replica is not None and args.straggler_replica >= dp:
        raise ConfigError(f"--straggler-replica must be below the {dp} data-parallel replica(s), got "
                          f"{args.straggler_replica}")
    if dp == 1 and args.batch_split != "none":
        raise ConfigError(f"--batch-split {args.batch_split} splits a batch between data-parallel groups, but there "
                          f"is one ({world} ranks, --tp {tp}): drop it, or launch more ranks than --tp")
    if args.shard_plan and tp is not None:
        from semimig.shardformer import plan_from_flags

        plan_from_flags(args.shard_plan, model_config(args), tp, block_size=args.shard_block)


def staging_dir(save: str) -> Path:
    """``--save DIR``'s staging directory ``DIR.partial`` (absolute: ``--save .`` has no name of its own):
    the checkpoint is written there and renamed to ``DIR`` once complete."""
    final = Path(save).absolute()
    return final.with_name(final.name + ".partial")


CHECKPOINT_STATE = "finetune_state.json"
# What a checkpoint must share with the run that resumes it: the model's shape and the data stream.
_RESUME_MUST_MATCH = ("model", "hidden", "layers", "heads", "kv_heads", "data", "batch_size", "seq_len", "seed",
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
            raise ConfigError(f"--resume {args.resume} is not a checkpoint of this example (no {CHECKPOINT_STATE}: "
                              "written last, so a save that did not finish has none)")
        try:
            state = json.loads(state_file.read_text())
            saved_step, flags = int(state["step"]), dict(state["flags"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"--resume {args.resume}: unreadable {CHECKPOINT_STATE} ({err!r})") from None
        wrong = [f"--{k.replace('_', '-')} {flags.get(k)!r} (this run: {getattr(args, k)!r})"
                 for k in _RESUME_MUST_MATCH if flags.get(k) != getattr(args, k)]
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
        flags = {k: getattr(args, k) for k in _RESUME_MUST_MATCH}
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


def init_distributed(timeout_s: float) -> tuple[int, int, torch.device]:
    """The process group torchrun (or colossalai run) describes in the environment, with a bounded timeout."""
    import torch.distributed as dist

    from semimig.launch import set_collective_timeout

    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        sys.exit("finetune_llm.py: start it with torchrun or colossalai run (RANK/WORLD_SIZE are not set), e.g.\n"
                 "  torchrun --nproc_per_node 2 examples/finetune_llm.py")
    watch_launcher(int(os.environ["RANK"]))
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    set_collective_timeout(timeout_s)  # also the groups HybridParallelPlugin creates later
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def watch_launcher(rank: int, poll_s: float = 0.5) -> None:
    """End this rank within ``poll_s`` once its launcher (the parent: torchrun's agent) has died.

    torchrun ends the other ranks when one dies, but nothing ends the ranks of a launcher that was
    killed (``kill -9``, a lost terminal): they would train on unseen.  A daemon thread watches the
    parent pid and exits the process (status 1) naming the launcher that died."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        try:
            print(f"finetune_llm.py: error: rank {rank}: its launcher (pid {parent}) died; stopping", file=sys.stderr,
                  flush=True)
        finally:
            os._exit(1)

    threading.Thread(target=watch, name="watch-launcher", daemon=True).start()


def model_config(args: argparse.Namespace):
    """The model's config alone (no weights): the tiny Llama's from the flags, or ``--model``'s from disk."""
    import transformers as T

    if args.model != "tiny-llama":
        return T.AutoConfig.from_pretrained(args.model, local_files_only=True)
    vocab = 256 if args.data == "shakespeare" else SYNTHETIC_VOCAB  # bytes, or the synthetic range
    return T.LlamaConfig(vocab_size=vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=max(256, args.seq_len))


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    """The tiny Llama (seeded), or ``--model`` read from disk."""
    import transformers as T

    torch.manual_seed(args.seed)
    if args.model == "tiny-llama":
        model = T.LlamaForCausalLM(model_config(args))
    else:
        model = T.AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True)
        if args.data == "shakespeare" and model.config.vocab_size < 256:
            from semimig.errors import ConfigError

            raise ConfigError(f"--data shakespeare feeds bytes as token ids 0..255: --model {args.model} has "
                              f"only {model.config.vocab_size} tokens")
    model.config.use_cache = False  # training: no KV cache (Colossal-AI warns about it otherwise)
    return model


def synthetic_batches(vocab: int, batch: int, seq: int, seed: int, device: torch.device) -> Iterator[dict]:
    """Endless batches of ``x_t = (a + b·t) mod vocab`` (labels = inputs; the model shifts them)."""
    gen = torch.Generator().manual_seed(seed)
    steps = torch.arange(seq)
    while True:
        start = torch.randint(0, vocab, (batch, 1), generator=gen)
        stride = torch.randint(1, 8, (batch, 1), generator=gen)
        ids = (start + stride * steps) % vocab
        yield {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device),
               "labels": ids.to(device)}


def make_data(args: argparse.Namespace, vocab: int, dp_rank: int, device: torch.device,
              dp_size: int = 1) -> Tuple[Iterator[dict], list, Optional["ByteCorpus"]]:
    """Training batches, the fixed validation batches (the same on every rank) and the corpus
    (``None`` for synthetic data).  DP rank ``d`` trains on stream ``d``; with ``--batch-split``
    every rank gets the global batch instead, streams ``0..dp_size-1`` concatenated row-wise (so the
    even split gives each group the rows it trains on without a split)."""
    def as_batch(ids: torch.Tensor) -> dict:
        ids = ids.to(device)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

    def stream(d: int) -> Iterator[dict]:
        if args.data == "synthetic":
            return synthetic_batches(vocab, args.batch_size, args.seq_len, args.seed * 1000 + d, device)
        return (as_batch(ids) for ids in corpus.train_batches(args.batch_size, args.seq_len, args.seed * 1000 + d))

    def global_batches() -> Iterator[dict]:
        for parts in zip(*(stream(d) for d in range(dp_size))):
            yield {key: torch.cat([p[key] for p in parts]) for key in parts[0]}

    corpus = None
    if args.data == "synthetic":
        val_stream = synthetic_batches(vocab, args.batch_size, args.seq_len, 2**31 - 1 - args.seed, device)
        val = [next(val_stream) for _ in range(args.eval_batches)]
    else:
        from semimig.bench.corpus import load_corpus
        from semimig.errors import ConfigError

        try:
            corpus = load_corpus()
        except ConfigError as err:
            sys.exit(f"finetune_llm.py: {err}")
        val = [as_batch(ids) for ids in corpus.val_batches(args.batch_size, args.seq_len, args.eval_batches)]
    return (global_batches() if args.batch_split != "none" else stream(dp_rank)), val, corpus


def evaluate(model: torch.nn.Module, batches: list) -> float:
    """Mean loss (nats a token) over ``batches``: eval mode (semimig's layers then run densely and
    untimed), no gradients.  Collective: every rank of the TP group must call it with the same batches."""
    model.eval()
    with torch.no_grad():
        total = sum(float(model(**batch).loss.float()) for batch in batches)
    model.train()
    return total / len(batches)


def main(argv: Optional[list[str]] = None) -> int:
    from semimig._quiet import quiet_third_party

    words = sys.argv[1:] if argv is None else argv  # quiet before the flag checks import Colossal-AI
    quiet_third_party(verbose=any(w in ("-v", "--verbose") for w in words))
    args = parse_args(argv)
    rank, world, device = init_distributed(args.timeout_s)
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s")
    logging.getLogger("colossalai").setLevel(logging.WARNING)

    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    import semimig
    from semimig._compat import apply_cpu_shim
    from semimig.balancer import PlanView
    from semimig.shardformer import SemiMigPolicy, plan_from_flags

    apply_cpu_shim()  # fills Colossal-AI's CPU gaps; a no-op with CUDA
    tp = args.tp or world
    model = build_model(args)  # the flags were checked against the launch and this config (check_world)
    shard_plan = plan_from_flags(args.shard_plan, model.config, tp, block_size=args.shard_block)
    plugin = HybridParallelPlugin(tp_size=tp, pp_size=1, precision=args.precision, zero_stage=args.zero_stage,
                                  overlap_communication=torch.cuda.is_available(),  # CPU: no CUDA streams
                                  custom_policy=SemiMigPolicy(shard_plan=shard_plan) if args.policy == "semimig"
                                  else None)
    booster = Booster(plugin=plugin)
    # fused: one kernel over every tensor, 5x the CPU default's speed on this model (AdamW was ~10 % of a
    # step unfused; benchmarks/optimizer_bench.py); the same update up to rounding
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=True)
    model, optimizer, *_ = booster.boost(model, optimizer)
    balancer = None
    if args.policy == "semimig":
        from semimig.controller.reshard import ReshardConfig

        from semimig.controller import BalanceConfig, ControllerConfig
        from semimig.controller.reflex import ReflexConfig
        from semimig.resizing.config import ResizingConfig

        reflex = None if args.reflex == "off" else ReflexConfig(forward=args.reflex == "on")
        # a group's micro-steps hold at most --batch-size rows (the plain run's activation memory); more rows
        # than that become accumulation steps
        split = None if args.batch_split == "none" else \
            semimig.BatchSplit(global_batch_size=args.batch_size * plugin.dp_size, allocation=args.batch_split,
                               max_batch_size=args.batch_size)
        replica = torch.distributed.get_rank(plugin.dp_group)
        straggler = args.straggler if args.straggler_replica in (None, replica) else None
        try:
            balancer = semimig.enable(model, plugin, optimizer=optimizer, mode=args.balance,
                                      straggler=straggler, log_every=args.log_every,
                                      config=BalanceConfig(controller=ControllerConfig(reflex=reflex),
                                                           resizing=ResizingConfig(paired=args.paired is not False,
                                                                                   block=args.resize_block or 1)),
                                      reshard=ReshardConfig(window=args.reshard_window, horizon=args.steps,
                                                            block_size=args.shard_block, probe=args.reshard_probe),
                                      batch=split)
        except semimig.ConfigError as err:
            from semimig._validate import refuse_once

            refuse_once("finetune_llm.py", err)

    dp_rank = torch.distributed.get_rank(plugin.dp_group)  # TP ranks share a batch; DP ranks do not
    vocab = model.unwrap().config.vocab_size
    batches, val_batches, corpus = make_data(args, vocab, dp_rank, device, plugin.dp_size)
    baseline = f" (unigram entropy {corpus.unigram_entropy():.4f})" if corpus is not None else ""
    if corpus is not None and rank == 0:
        logger.info("data: %s", corpus.describe())
    first, load_s = getattr(args, "resume_step", 0), None
    if args.resume is not None:
        load_s = load_checkpoint(booster, model, optimizer, args.resume)
        for _ in range(first):  # the batches the saved run trained on
            next(batches)
        logger.info("resumed %s at step %d (loaded in %.3f s)", args.resume, first, load_s)
        resume_lr(optimizer, args)
    losses, times, val_losses, eval_s, shares, sheds, starts = [], [], [], 0.0, [], [], []
    model.train()
    # a progress bar only on a terminal: redirected output gets the periodic log lines instead of redraws
    bar_off = rank != 0 or not sys.stderr.isatty()
    with logging_redirect_tqdm(), tqdm(total=args.steps, initial=first, disable=bar_off, desc="finetune",
                                       unit="step") as bar:
        for step in range(first, args.steps):
            batch = next(batches)
            if step == first and rank == 0 and args.started_file is not None:
                Path(args.started_file).touch()
            starts.append(time.time())  # wall clock: matched with a time-varying throttle's switches
            start = time.perf_counter()
            if args.batch_split == "none":
                loss = model(**batch).loss
                booster.backward(loss, optimizer)
            else:  # this group's rows of the global batch, its micro-steps' losses scaled (global mean)
                loss = _split_iteration(booster, model, optimizer, balancer, batch, plugin)
            optimizer.step()  # semimig.enable hooked it: the balancer re-plans right after
            optimizer.zero_grad()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            losses.append(float(loss.detach().float()))
            check_loss(losses[-1], step + 1, args)
            if balancer is not None and balancer.report is not None:
                shares.append(balancer.report.balanced_share)
            plan = _plan(balancer, tp, PlanView)
            if balancer is not None:
                sheds.append(list(plan.shed))  # the group's plan after this step, per TP rank
            bar.set_postfix(loss=f"{losses[-1]:.3f}", step_ms=f"{times[-1] * 1e3:.0f}")
            bar.update()
            if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
                logger.info("step %d/%d loss %.4f step %.1f ms plan: %s", step + 1, args.steps, losses[-1],
                            times[-1] * 1e3, plan.describe())
            if args.eval_every and ((step + 1) % args.eval_every == 0 or step + 1 == args.steps):
                start = time.perf_counter()
                val_losses.append([step + 1, evaluate(model, val_batches)])
                eval_s += time.perf_counter() - start
                logger.info("step %d/%d validation loss %.4f%s", step + 1, args.steps, val_losses[-1][1], baseline)

    save_s = save_checkpoint(booster, model, optimizer, args, args.steps, rank) if args.save is not None else None
    summary = _summary(args, tp, world, losses, times, _plan(balancer, tp, PlanView))
    if balancer is not None and balancer.batch_plan is not None:
        summary["batch_split"] = f"{args.batch_split}:" + "/".join(str(s) for s in balancer.batch_plan.samples)
    if first or save_s is not None:
        summary.update(resumed_at=first, load_s=f"{load_s:.3f}" if load_s is not None else "none",
                       save_s=f"{save_s:.3f}" if save_s is not None else "none")
    by_rank = _balanced_share_by_rank(shares, plugin.tp_group, tp)
    summary.update(final_val_loss=f"{val_losses[-1][1]:.4f}" if val_losses else "none", eval_s=f"{eval_s:.3f}",
                   balanced_share=",".join("-" if b is None else f"{b:.2f}" for b in by_rank))
    reshard = balancer.reshard_summary if balancer is not None else None
    if reshard is not None:
        summary.update(replans=reshard["replans"], reshard_plan=reshard["plan"].replace(" ", ""),
                       moved_mb=f"{reshard['bytes_moved'] / 1e6:.2f}", move_s=f"{reshard['move_s']:.3f}")
    if rank == 0:
        print("summary: " + " ".join(f"{k}={v}" for k, v in summary.items()), flush=True)
        if args.json:
            from semimig._io import write_json

            summary["balanced_share_by_rank"] = by_rank
            if reshard is not None:
                summary["reshard"] = reshard
            if corpus is not None:
                summary["unigram_entropy_nats"] = corpus.unigram_entropy()
            write_json(args.json, {"summary": summary, "losses": losses, "step_s": times,
                                         "val_losses": val_losses, "eval_s": eval_s, "shed": sheds,
                                         "step_start_unix": starts,
                                         "data": corpus.describe() if corpus is not None else
                                         {"synthetic": True, "vocab": vocab}})
    if balancer is not None:
        balancer.close()
    torch.distributed.destroy_process_group()
    return 0


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or inf: the run stops, naming the step (``--allow-nonfinite`` keeps going)."""


def check_loss(loss: float, step: int, args: argparse.Namespace) -> None:
    """Stop at a NaN or inf loss (naming the step) unless ``--allow-nonfinite``: a diverged run
    must not train on, exit 0 and hand the balancer meaningless timings."""
    if not math.isfinite(loss) and not args.allow_nonfinite:
        raise NonFiniteLoss(f"the training loss is {loss} at step {step} (--lr {args.lr:g}); stopping "
                            "(--allow-nonfinite keeps training)")


def _balanced_share_by_rank(shares: list, tp_group, tp: int) -> list:
    """Per TP rank, the median over the second half of the steps of the share of its own work
    (wall minus time in collectives) spent in the GEMMs semimig sheds (DESIGN §5's ``B``);
    ``None`` where not measured (Colossal-AI's policy).  Collective over the TP group."""
    steady = [s for s in shares[len(shares) // 2:] if s is not None]
    mine = statistics.median(steady) if steady else None
    gathered = [None] * tp
    torch.distributed.all_gather_object(gathered, mine, group=tp_group)
    return [None if g is None else round(float(g), 4) for g in gathered]


def _split_iteration(booster, model, optimizer, balancer, batch: dict, plugin) -> torch.Tensor:
    """Forward and backward of this DP group's micro-batches of the global ``batch``; returns the
    global-batch mean loss (each rank's scaled losses summed over the DP group, over its size)."""
    from semimig.allocation import run_iteration

    mine = run_iteration(booster, model, optimizer, iter(balancer.micro_batches(batch)),
                         lambda m, b: m(**b).loss, zero_stage=plugin.zero_stage)
    total = torch.tensor([mine], dtype=torch.float64, device=batch["input_ids"].device)  # NCCL: on the GPU
    torch.distributed.all_reduce(total, group=plugin.dp_group)
    return total[0] / plugin.dp_size


def _plan(balancer, tp: int, plan_view):
    """The balancing state to show: the latest report's plan, or 'every rank dense'."""
    if balancer is None or balancer.report is None:
        return plan_view(flagged=(), shed=(0.0,) * tp)
    return plan_view.from_report(balancer.report, tp)


def _summary(args: argparse.Namespace, tp: int, world: int, losses: list, times: list, plan) -> dict:
    """One line's worth: the median step time skips the first fifth (warm-up, first plans)."""
    steady = times[len(times) // 5:] or times
    return {"steps": len(losses), "median_step_s": f"{statistics.median(steady):.4f}",
            "final_loss": f"{losses[-1]:.4f}", "shed": ",".join(f"{s:.3f}" for s in plan.shed),
            "flagged": ",".join(str(r) for r in plan.flagged) or "none",
            "balance": args.balance if args.policy == "semimig" else "none",
            "policy": args.policy, "straggler": args.straggler or "none", "tp": tp, "world": world,
            "precision": args.precision, "zero_stage": args.zero_stage, "data": args.data,
            "shard_plan": args.shard_plan or "even"}


if __name__ == "__main__":
    try:
        sys.exit(main())
    except NonFiniteLoss as err:
        sys.exit(f"finetune_llm.py: error: {err}")
