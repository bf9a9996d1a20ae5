"""The training run of the LLM training program (:mod:`semimig.bench.llm`): boost, ``semimig.enable``,
train, evaluate, save; the summary and the ``--json`` record."""
from __future__ import annotations

import argparse
import contextlib
import logging
import math
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from semimig.bench.llm.build import build_model, evaluate, init_distributed, make_data
from semimig.bench.llm.checkpoint import load_checkpoint, resume_lr, save_checkpoint
from semimig.bench.llm.record import (balanced_share_by_rank, plan_state, reflex_by_rank, step_split_by_rank,
                                      summary, summary_line, write_record)

logger = logging.getLogger(__name__)


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or inf: the run stops, naming the step (``--allow-nonfinite`` keeps going)."""


def check_loss(loss: float, step: int, args: argparse.Namespace) -> None:
    """Stop at a NaN or inf loss (naming the step) unless ``--allow-nonfinite``: a diverged run
    must not train on, exit 0 and hand the balancer meaningless timings."""
    if not math.isfinite(loss) and not args.allow_nonfinite:
        raise NonFiniteLoss(f"the training loss is {loss} at step {step} (--lr {args.lr:g}); stopping "
                            "(--allow-nonfinite keeps training)")


def setup_logging(rank: int) -> None:
    """INFO on rank 0, WARNING elsewhere, every line prefixed with its rank; Colossal-AI at WARNING."""
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s")
    logging.getLogger("colossalai").setLevel(logging.WARNING)


def run(args: argparse.Namespace, prog: str) -> Optional[str]:
    """One training run of the checked flags ``args`` (:func:`semimig.bench.llm.flags.parse_args`) on
    the process group torchrun describes; rank 0's summary line (``None`` on the other ranks)."""
    rank, world, device = init_distributed(prog, args.timeout_s)
    setup_logging(rank)

    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from semimig._compat import apply_cpu_shim
    from semimig.shardformer import SemiMigPolicy, plan_from_flags

    apply_cpu_shim()  # fills Colossal-AI's CPU gaps; a no-op with CUDA
    pp = getattr(args, "pp", 1)
    tp = args.tp or world // pp
    model = build_model(args, tp)  # the flags were checked against the launch and this config (check_world)
    shard_plan = plan_from_flags(args.shard_plan, model.config, tp, block_size=args.shard_block)
    plugin = HybridParallelPlugin(tp_size=tp, pp_size=pp, num_microbatches=args.microbatches if pp > 1 else None,
                                  precision=args.precision, zero_stage=args.zero_stage,
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
        balancer = _enable(args, model, plugin, optimizer, prog)

    dp_rank = torch.distributed.get_rank(plugin.dp_group)  # TP ranks share a batch; DP ranks do not
    vocab = model.unwrap().config.vocab_size
    batches, val_batches, corpus = make_data(args, vocab, dp_rank, device, prog=prog, eval_batches=args.eval_batches,
                                             dp_size=plugin.dp_size, global_batch=args.batch_split != "none")
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
    losses, times, val_losses, eval_s, shares, sheds, starts, splits, reflexes = [], [], [], 0.0, [], [], [], [], []
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
            if pp > 1:  # 1F1B over --microbatches; the loss reaches every stage from the last
                loss = _pipeline_loss(booster, model, optimizer, batch, plugin)
            elif args.batch_split == "none":
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
                dev = balancer.report.device
                splits.append(None if dev is None else (dev.compute_s, dev.comm_s, balancer.report.busy.busy_s,
                                                          dev.dp_s or 0.0))
            plan = plan_state(balancer, tp)
            if balancer is not None:
                sheds.append(list(plan.shed))  # the group's plan after this step, per TP rank
                reflexes.append(balancer.report.reflex_gamma if balancer.report is not None else 0.0)
            bar.set_postfix(loss=f"{losses[-1]:.3f}", step_ms=f"{times[-1] * 1e3:.0f}")
            bar.update()
            if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
                logger.info("step %d/%d loss %.4f step %.1f ms plan: %s", step + 1, args.steps, losses[-1],
                            times[-1] * 1e3, plan.describe())
            if args.eval_every and ((step + 1) % args.eval_every == 0 or step + 1 == args.steps):
                start = time.perf_counter()
                eval_rows = _evaluation_rows(int(val_batches[0]["input_ids"].shape[0]), balancer, plugin)
                with balancer.dense() if balancer is not None else contextlib.nullcontext():  # no step's work
                    val_losses.append([step + 1, evaluate(model, val_batches, rows=eval_rows, dp_group=plugin.dp_group)
                                       if pp == 1 else _pipeline_eval(booster, model, val_batches, plugin)])
                eval_s += time.perf_counter() - start
                logger.info("step %d/%d validation loss %.4f%s", step + 1, args.steps, val_losses[-1][1], baseline)

    save_s = save_checkpoint(booster, model, optimizer, args, args.steps, rank) if args.save is not None else None
    fields = summary(args, tp, world, losses, times, plan_state(balancer, tp))
    stages = _stage_summaries(balancer, plugin) if pp > 1 else None
    if balancer is not None and balancer.batch_plan is not None:
        fields["batch_split"] = f"{args.batch_split}:" + "/".join(str(s) for s in balancer.batch_plan.samples)
    if first or save_s is not None:
        fields.update(resumed_at=first, load_s=f"{load_s:.3f}" if load_s is not None else "none",
                      save_s=f"{save_s:.3f}" if save_s is not None else "none")
    by_rank = balanced_share_by_rank(shares, plugin.tp_group, tp)
    split_by_rank, splits_by_step = step_split_by_rank(splits)
    reflex_each = reflex_by_rank(reflexes)
    fields.update(final_val_loss=f"{val_losses[-1][1]:.4f}" if val_losses else "none", eval_s=f"{eval_s:.3f}",
                  balanced_share=",".join("-" if b is None else f"{b:.2f}" for b in by_rank),
                  reflex_steps=",".join(str(len(r)) for r in reflex_each))
    reshard = balancer.reshard_summary if balancer is not None else None
    if stages is not None:  # every stage's re-plans (rank 0 holds stage 0's balancer only)
        fields["pp"] = pp
        reshard = _pipeline_reshard(stages)
    if reshard is not None:
        fields.update(replans=reshard["replans"], reshard_plan=reshard["plan"].replace(" ", ""),
                      moved_mb=f"{reshard['bytes_moved'] / 1e6:.2f}", move_s=f"{reshard['move_s']:.3f}")
    line = summary_line(fields) if rank == 0 else None
    if rank == 0 and args.json:
        write_record(args.json, fields, losses=losses, times=times, val_losses=val_losses, eval_s=eval_s,
                     sheds=sheds, starts=starts, corpus=corpus, vocab=vocab, by_rank=by_rank, reshard=reshard,
                     split_by_rank=split_by_rank, splits_by_step=splits_by_step, reflex_each=reflex_each)
    if balancer is not None:
        balancer.close()
    torch.distributed.destroy_process_group()
    return line


def _enable(args: argparse.Namespace, model, plugin, optimizer, prog: str):
    """``semimig.enable`` with the run's balancing flags; a refusal is one line naming the input (exit 2)."""
    import semimig
    from semimig.controller import BalanceConfig, ControllerConfig
    from semimig.controller.reflex import ReflexConfig
    from semimig.controller.reshard import ReshardConfig
    from semimig.resizing.config import ResizingConfig

    reflex = None if args.reflex == "off" else ReflexConfig(forward=args.reflex == "on")
    # a group's micro-steps hold at most --max-micro-batch rows (default --batch-size: the plain run's activation
    # memory); more rows than that become accumulation steps
    split = None if args.batch_split == "none" else \
        semimig.BatchSplit(global_batch_size=args.batch_size * plugin.dp_size, allocation=args.batch_split,
                           max_batch_size=args.max_micro_batch or args.batch_size)
    replica = torch.distributed.get_rank(plugin.dp_group)
    stage = int(plugin.stage_manager.stage) if plugin.pp_size > 1 else 0
    straggler = args.straggler if args.straggler_replica in (None, replica) and \
        getattr(args, "straggler_stage", None) in (None, stage) else None
    try:
        return semimig.enable(model, plugin, optimizer=optimizer, mode=args.balance, straggler=straggler,
                              log_every=args.log_every,
                              config=BalanceConfig(controller=ControllerConfig(reflex=reflex),
                                                   resizing=ResizingConfig(paired=args.paired is not False,
                                                                           block=args.resize_block or 1)),
                              reshard=ReshardConfig(window=args.reshard_window, horizon=args.steps,
                                                    block_size=args.shard_block, probe=args.reshard_probe),
                              batch=split)
    except semimig.ConfigError as err:
        from semimig._validate import refuse_once

        refuse_once(prog, err)


def _pipeline_loss(booster, model, optimizer, batch: dict, plugin) -> torch.Tensor:
    """Forward and backward of one step through the 1F1B pipeline; the step's loss (the mean of the
    micro-batches' losses), sent from the last stage to every stage (one broadcast over the pipeline group)."""
    out = booster.execute_pipeline(iter([batch]), model, lambda outputs, inputs: outputs.loss, optimizer,
                                   return_loss=True)
    return _from_last_stage(out["loss"], plugin, batch["input_ids"].device)


def _pipeline_eval(booster, model, batches: list, plugin) -> float:
    """:func:`~semimig.bench.llm.build.evaluate` through the pipeline: forward only (no gradients, no
    optimizer), the mean loss over ``batches`` from the last stage on every rank."""
    model.eval()
    total = 0.0
    with torch.no_grad():
        for batch in batches:
            out = booster.execute_pipeline(iter([batch]), model, lambda outputs, inputs: outputs.loss, None,
                                           return_loss=True)
            total += float(_from_last_stage(out["loss"], plugin, batch["input_ids"].device))
    model.train()
    return total / len(batches)


def _from_last_stage(loss, plugin, device) -> torch.Tensor:
    """``loss`` (``None`` on every stage but the last) on every stage: a broadcast over the pipeline group."""
    value = torch.zeros(1, dtype=torch.float64, device=device)
    if loss is not None:
        value[0] = float(loss.detach().float())
    last = torch.distributed.get_global_rank(plugin.pp_group, plugin.pp_size - 1)
    torch.distributed.broadcast(value, src=last, group=plugin.pp_group)
    return value[0]


def _stage_summaries(balancer, plugin) -> list:
    """Every stage's re-shard summary, in stage order, from its TP rank 0 (collective over the world)."""
    mine = balancer.reshard_summary if balancer is not None else None
    stage = int(plugin.stage_manager.stage)
    every: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(every, (stage, torch.distributed.get_rank(plugin.tp_group), mine))
    by_stage = {s: summary for s, tp_rank, summary in every if tp_rank == 0}
    return [by_stage.get(s) for s in range(plugin.pp_size)]


def _pipeline_reshard(stages: list) -> Optional[dict]:
    """The stages' re-shard summaries as one (``None`` when no stage re-shards): re-plans, bytes and
    seconds summed, the plans joined by ``|`` in stage order, each event with its ``stage``, and
    every stage's own summary under ``stages``."""
    held = [(s, r) for s, r in enumerate(stages) if r is not None]
    if not held:
        return None
    return {"replans": sum(r["replans"] for _, r in held), "plan": " | ".join(str(r and r["plan"]) for r in stages),
            "bytes_moved": sum(r["bytes_moved"] for _, r in held), "move_s": sum(r["move_s"] for _, r in held),
            "events": [dict(e, stage=s) for s, r in held for e in r["events"]], "stages": stages}


def _evaluation_rows(count: int, balancer, plugin) -> Optional[range]:
    """This DP group's rows of each evaluation batch (``count`` rows): its share of the global batch in
    force (even without a batch split), so a slow replica evaluates less and no replica waits at the next
    step for another's evaluation; ``None`` with one replica (every rank evaluates every row)."""
    if plugin.dp_size == 1:
        return None
    if balancer is not None and balancer.batch_plan is not None:
        return balancer.evaluation_share(count)
    from semimig.allocation import evaluation_share

    return evaluation_share(count, (1,) * plugin.dp_size, torch.distributed.get_rank(plugin.dp_group))


def _split_iteration(booster, model, optimizer, balancer, batch: dict, plugin) -> torch.Tensor:
    """Forward and backward of this DP group's micro-batches of the global ``batch``; returns the
    global-batch mean loss (each rank's scaled losses summed over the DP group, over its size)."""
    from semimig.allocation import run_iteration

    mine = run_iteration(booster, model, optimizer, iter(balancer.micro_batches(batch)),
                         lambda m, b: m(**b).loss, zero_stage=plugin.zero_stage)
    total = torch.tensor([mine], dtype=torch.float64, device=batch["input_ids"].device)  # NCCL: on the GPU
    torch.distributed.all_reduce(total, group=plugin.dp_group)
    return total[0] / plugin.dp_size
