"""Fine-tune a tiny Llama with Colossal-AI's HybridParallelPlugin, stragglers tolerated by semimig.

A plain Colossal-AI training script with semimig's two additions, both in :func:`main`: the plugin
gets ``custom_policy=SemiMigPolicy()``, and after ``booster.boost`` one call,
``semimig.enable(model, plugin, optimizer=optimizer, mode=..., straggler=...)``, hooks the
optimizer's ``step()`` so the balancer re-plans once per iteration; the loop does not change.

One node, two ranks (CPU/gloo, or one GPU per rank/NCCL when CUDA is there)::

    torchrun --nproc_per_node 2 examples/finetune_llm.py --straggler fixed:1:4:scope=device              # semi
    torchrun --nproc_per_node 2 examples/finetune_llm.py --straggler fixed:1:4:scope=device --balance off
    torchrun --nproc_per_node 2 examples/finetune_llm.py --straggler fixed:1:4:scope=device --balance reshard
    colossalai run --nproc_per_node 2 examples/finetune_llm.py --straggler fixed:1:4

Several nodes (the same command on every node, ``--node_rank`` 0..N-1, node 0 the endpoint)::

    torchrun --nnodes 2 --nproc_per_node 4 --node_rank 0 --rdzv_backend c10d \\
        --rdzv_endpoint node0.example:29500 --rdzv_id finetune1 examples/finetune_llm.py --tp 4

``--straggler`` injects a test straggler (``fixed:1:4``: TP rank 1's GEMMs 4x slower;
``fixed:1:4:scope=device``: all of its work).  The data: Shakespeare's plays as bytes (fetched once by
``make setup``), or ``--data synthetic``, seeded sequences any LM learns in a few dozen steps.
Checkpoints: ``--save DIR`` at the end (Colossal-AI's sharded checkpoint, full tensors: any TP degree
loads it), ``--resume DIR`` continues it to ``--steps`` in total on the batches the uninterrupted run
would have seen::

    torchrun --nproc_per_node 2 examples/finetune_llm.py --steps 20 --save ckpt
    torchrun --nproc_per_node 2 examples/finetune_llm.py --steps 40 --resume ckpt

Rank 0 logs the loss every 10 steps and prints one summary line at the end (``--json`` writes it with
the losses and step times).  ``benchmarks/llm_run.py`` is the same training with every knob the
benchmarks turn (re-sharding windows, data-parallel batch splits, other models, ...).
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from semimig.modes import ENABLE_MODES

logger = logging.getLogger("finetune_llm")

PROG = Path(__file__).name
BALANCE_MODES = tuple(m for m in ENABLE_MODES if m != "baseline")  # "off" is the user's word for it
TIMEOUT_S = 180.0  # every collective's: a dead or frozen rank fails the run within it, never a silent hang
LOG_EVERY = 10
VAL_BATCHES = 8


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The flags, checked before any process group exists: a refusal is one line naming the flag,
    printed by rank 0 only, exit 2."""
    from semimig._validate import OneLineParser

    p = OneLineParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=256, help="the tiny Llama's width (a multiple of 8; default 256)")
    p.add_argument("--layers", type=int, default=4, help="its decoder layers (default 4)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: every rank)")
    p.add_argument("--zero-stage", type=int, default=0, choices=(0, 1, 2), help="ZeRO beside TP (bf16/fp16 only)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--balance", default="semi", choices=BALANCE_MODES,
                   help="semimig's mode (default semi); reshard: exact uneven shards for a rank that stays slow; "
                        "off: none, Colossal-AI alone")
    p.add_argument("--straggler", default=None, metavar="SPEC",
                   help="a test straggler, e.g. fixed:1:4 (TP rank 1's GEMMs 4x slower) or fixed:1:4:scope=device")
    p.add_argument("--data", default="shakespeare", choices=("shakespeare", "synthetic"),
                   help="Shakespeare's plays as bytes (default; fetched by make setup) or synthetic sequences")
    p.add_argument("--steps", type=int, default=30, help="training steps in total (default 30)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=None, help="learning rate (default 1e-3; --resume: the checkpoint's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", default=None, metavar="DIR", help="at the end, save model and optimizer in DIR (new/empty)")
    p.add_argument("--resume", default=None, metavar="DIR", help="continue a run saved with --save DIR")
    p.add_argument("--json", default=None, metavar="FILE", help="write the summary, losses and step times here")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --json")
    # what the example fixes: the shape a checkpoint records beside the flags above
    p.set_defaults(model="tiny-llama", heads=8, kv_heads=4)
    args = p.parse_args(argv)
    args.lr_given = args.lr is not None
    args.lr = 1e-3 if args.lr is None else args.lr
    from semimig.bench.llm.flags import check_user_flags

    try:
        check_user_flags(args)  # bounds, the model's shape, --tp against the launch, the outputs, the checkpoint
    except Exception as err:  # ConfigError, naming the flag and the value
        p.error(str(err))
    return args


def main(argv: Optional[list[str]] = None) -> int:
    from semimig._quiet import quiet_third_party

    quiet_third_party()
    args = parse_args(argv)
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    import semimig
    from semimig._compat import apply_cpu_shim
    from semimig.bench.llm.build import build_model, evaluate, init_distributed, make_data
    from semimig.bench.llm.checkpoint import load_checkpoint, resume_lr, save_checkpoint
    from semimig.bench.llm.record import plan_state
    from semimig.shardformer import SemiMigPolicy

    rank, world, device = init_distributed(PROG, TIMEOUT_S)
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s")
    logging.getLogger("colossalai").setLevel(logging.WARNING)
    apply_cpu_shim()  # fills Colossal-AI's CPU gaps; a no-op with CUDA
    tp = args.tp or world

    # Colossal-AI as usual, with semimig's policy: its layers time themselves and can shed or move work
    model = build_model(args, tp)
    plugin = HybridParallelPlugin(tp_size=tp, pp_size=1, precision=args.precision, zero_stage=args.zero_stage,
                                  overlap_communication=torch.cuda.is_available(), custom_policy=SemiMigPolicy())
    booster = Booster(plugin=plugin)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=True)
    model, optimizer, *_ = booster.boost(model, optimizer)

    # the one call: hooks optimizer.step(), after which the balancer re-plans for the slow rank(s)
    try:
        balancer = semimig.enable(model, plugin, optimizer=optimizer, mode=args.balance, straggler=args.straggler)
    except semimig.ConfigError as err:
        from semimig._validate import refuse_once

        refuse_once(PROG, err)

    dp_rank = torch.distributed.get_rank(plugin.dp_group)  # TP ranks share a batch; DP ranks do not
    vocab = model.unwrap().config.vocab_size
    batches, val_batches, _ = make_data(args, vocab, dp_rank, device, prog=PROG, eval_batches=VAL_BATCHES)
    first, load_s = getattr(args, "resume_step", 0), None
    if args.resume is not None:
        load_s = load_checkpoint(booster, model, optimizer, args.resume)
        for _ in range(first):  # the batches the saved run trained on
            next(batches)
        resume_lr(optimizer, args)

    losses, times = [], []
    model.train()
    for step in range(first, args.steps):  # the plain Colossal-AI loop
        batch = next(batches)
        start = time.perf_counter()
        loss = model(**batch).loss
        booster.backward(loss, optimizer)
        optimizer.step()  # the balancer decides right after it
        optimizer.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(float(loss.detach().float()))
        if (step + 1) % LOG_EVERY == 0 or step + 1 == args.steps:
            logger.info("step %d/%d loss %.4f step %.1f ms", step + 1, args.steps, losses[-1], times[-1] * 1e3)
    val_loss = evaluate(model, val_batches)  # dense, without gradients: every rank of the TP group

    save_s = save_checkpoint(booster, model, optimizer, args, args.steps, rank) if args.save is not None else None
    plan = plan_state(balancer, tp)  # the last plan: each TP rank's shed share, the ranks flagged as slow
    steady = times[len(times) // 5:] or times  # after the warm-up and the first plans
    summary = {"steps": len(losses), "median_step_s": f"{statistics.median(steady):.4f}",
               "final_loss": f"{losses[-1]:.4f}", "final_val_loss": f"{val_loss:.4f}",
               "shed": ",".join(f"{s:.3f}" for s in plan.shed), "flagged": ",".join(map(str, plan.flagged)) or "none",
               "balance": args.balance, "straggler": args.straggler or "none", "tp": tp, "world": world,
               "data": args.data}
    if balancer.reshard_summary is not None:
        summary.update(replans=balancer.reshard_summary["replans"],
                       reshard_plan=balancer.reshard_summary["plan"].replace(" ", ""))
    if first or save_s is not None:
        summary.update(resumed_at=first, load_s=f"{load_s:.3f}" if load_s is not None else "none",
                       save_s=f"{save_s:.3f}" if save_s is not None else "none")
    if rank == 0:
        print("summary: " + " ".join(f"{k}={v}" for k, v in summary.items()), flush=True)
        if args.json:
            from semimig._io import write_json

            write_json(args.json, {"summary": summary, "losses": losses, "step_s": times,
                                   "val_loss": val_loss})
    balancer.close()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
