"""The summary line and the ``--json`` record of the LLM training program (:mod:`semimig.bench.llm`)."""
from __future__ import annotations

import argparse
import statistics
from typing import Optional

import torch


def balanced_share_by_rank(shares: list, tp_group, tp: int) -> list:
    """Per TP rank, the median over the second half of the steps of the share of its own work
    (wall minus time in collectives) spent in the GEMMs semimig sheds (DESIGN §5's ``B``);
    ``None`` where not measured (Colossal-AI's policy).  Collective over the TP group."""
    steady = [s for s in shares[len(shares) // 2:] if s is not None]
    mine = statistics.median(steady) if steady else None
    gathered = [None] * tp
    torch.distributed.all_gather_object(gathered, mine, group=tp_group)
    return [None if g is None else round(float(g), 4) for g in gathered]


SPLIT_FIELDS = ("compute_s", "comm_s", "gemm_s", "dp_s")
"""A rank's step as :func:`step_split_by_rank` records it: its own work (the step less the time inside
collectives: semimig's, the vocabulary's and the data-parallel gradient reduction), the time inside those
collectives, the part of its own work spent in the GEMMs semimig balances (the rest of ``compute_s`` is the
replicated work and the attention core), and the part of its collectives spent in the data-parallel
gradient reduction (0 without replicas)."""


def step_split_by_rank(splits: list) -> tuple[list, list]:
    """Per rank of the job (global rank order), the medians over the second half of the steps of
    :data:`SPLIT_FIELDS`, and every step's split (``None`` where not measured).  Every rank, not one TP
    group: under data parallelism the replica that sets the pace is often not rank 0's.  Collective
    over the default group."""
    steady = [s for s in splits[len(splits) // 2:] if s is not None]
    mine = [statistics.median(col) for col in zip(*steady)] if steady else None
    steps = [None if s is None else [round(float(v), 6) for v in s] for s in splits]
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, (mine, steps))
    medians = [None if g[0] is None else dict(zip(SPLIT_FIELDS, (round(float(v), 6) for v in g[0])))
               for g in gathered]
    return medians, [g[1] for g in gathered]


def reflex_by_rank(gammas: list) -> list:
    """Per rank of the job (global rank order), every step whose step reflex fired, as ``[step, γ]``
    (:mod:`semimig.controller.reflex`: the rank pruned the rest of that step on its own evidence, so the
    step was lossy although no plan shed anything).  ``gammas``: this rank's ``γ`` per step, 0 where it did
    not fire.  Collective over the default group."""
    mine = [[i, round(float(g), 4)] for i, g in enumerate(gammas) if g > 0.0]
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, mine)
    return gathered


def plan_state(balancer, tp: int):
    """The balancing state to show (a :class:`semimig.balancer.PlanView`): the latest report's plan, or
    'every rank dense'."""
    from semimig.balancer import PlanView

    if balancer is None or balancer.report is None:
        return PlanView(flagged=(), shed=(0.0,) * tp)
    return PlanView.from_report(balancer.report, tp)


def summary(args: argparse.Namespace, tp: int, world: int, losses: list, times: list, plan) -> dict:
    """One line's worth: the median step time skips the first fifth (warm-up, first plans)."""
    steady = times[len(times) // 5:] or times
    return {"steps": len(losses), "median_step_s": f"{statistics.median(steady):.4f}",
            "final_loss": f"{losses[-1]:.4f}", "shed": ",".join(f"{s:.3f}" for s in plan.shed),
            "flagged": ",".join(str(r) for r in plan.flagged) or "none",
            "balance": args.balance if args.policy == "semimig" else "none",
            "policy": args.policy, "straggler": args.straggler or "none", "tp": tp, "world": world,
            "precision": args.precision, "zero_stage": args.zero_stage, "data": args.data,
            "shard_plan": args.shard_plan or "even"}


def summary_line(fields: dict) -> str:
    """``summary: key=value ...``: the one line rank 0 prints at the end of a run."""
    return "summary: " + " ".join(f"{k}={v}" for k, v in fields.items())


def write_record(path: str, fields: dict, *, losses: list, times: list, val_losses: list, eval_s: float,
                 sheds: list, starts: list, corpus, vocab: int, by_rank: list,
                 reshard: Optional[dict], split_by_rank: Optional[list] = None,
                 splits_by_step: Optional[list] = None, reflex_each: Optional[list] = None) -> None:
    """The ``--json`` record: the summary (with the per-rank balanced shares and step splits, the re-plans and the
    corpus's unigram entropy beside the line's fields), the losses, step times and step start times,
    the validation losses, the plans' shed shares per step, every rank's step split per step, every rank's
    steps pruned by its step reflex (:func:`reflex_by_rank`) and the data."""
    from semimig._io import write_json

    fields = dict(fields, balanced_share_by_rank=by_rank)
    if split_by_rank is not None:
        fields["step_split_by_rank"] = split_by_rank
    if reshard is not None:
        fields["reshard"] = reshard
    if corpus is not None:
        fields["unigram_entropy_nats"] = corpus.unigram_entropy()
    write_json(path, {"summary": fields, "losses": losses, "step_s": times, "val_losses": val_losses,
                      "eval_s": eval_s, "shed": sheds, "step_start_unix": starts,
                      "step_split_each": splits_by_step, "reflex_each": reflex_each,
                      "data": corpus.describe() if corpus is not None else {"synthetic": True, "vocab": vocab}})
