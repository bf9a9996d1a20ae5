"""The LLM training binary of the benchmarks: a causal LM under Colossal-AI's HybridParallelPlugin with
semimig, every knob a benchmark turns exposed as a flag (``examples/finetune_llm.py`` is the user's
script; this one is what ``benchmarks/time_to_loss.py`` and the tests launch).

    torchrun --nproc_per_node 2 benchmarks/llm_run.py --straggler fixed:1:4:scope=device --balance reshard
    torchrun --nproc_per_node 4 benchmarks/llm_run.py --tp 2 --batch-split poplar \\
        --straggler fixed:1:4:scope=device --straggler-replica 0
    torchrun --nproc_per_node 4 benchmarks/llm_run.py --pp 2 --tp 2 --balance reshard \\
        --straggler fixed:1:4:scope=device --straggler-stage 1

Beyond the example's flags: ``--model NAME`` (a Hugging Face causal LM on disk, read with
``local_files_only=True``), ``--heads``/``--kv-heads``, ``--policy colossalai`` (Colossal-AI's own
policy, no balancing), the resizing knobs ``--reflex``, ``--paired``/``--no-paired`` and
``--resize-block``, the re-sharding knobs ``--reshard-window`` (steps a straggler's speed must stay
stable before a re-plan) and ``--reshard-probe`` (before the first step, time the same GEMMs on every
rank and re-plan at once when the predicted gain is at least this fraction of the step), a static
uneven ``--shard-plan`` of ``--shard-block`` columns, ``--batch-split even|poplar`` with
``--straggler-replica D`` (data parallelism beside TP: each iteration's batch a global one, Poplar
giving faster TP groups more of its rows, the gradient still the global-batch mean), ``--pp N`` with
``--microbatches M`` (a 1F1B pipeline of ``N`` stages, ``M`` micro-batches a step, default ``N``; each
stage's TP group balances and re-plans its own layers; the loss comes from the last stage) and
``--straggler-stage S`` (the straggler in stage ``S`` only),
``--eval-every``/``--eval-batches`` (validation loss on fixed batches, its wall time kept apart as
``eval_s``), ``--log-every``, ``--timeout-s`` (the collective timeout of every process group: a dead
or frozen rank fails the run within it), ``--started-file PATH`` (rank 0 creates it as its first
step starts: ``semimig throttle --pattern-after PATH``) and ``--allow-nonfinite`` (train on past a
NaN or inf loss).  Rank 0 prints one summary line at the end; ``--json`` also holds the losses, step
times, step start times, validation losses and the plans.  A launcher that dies (``kill -9`` of
torchrun) ends its ranks within a second, each naming the launcher's pid.  The program itself is
:mod:`semimig.bench.llm`.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from semimig.bench.llm.checkpoint import resume_lr
from semimig.bench.llm.flags import parse_args as _parse_args
from semimig.bench.llm.loop import NonFiniteLoss, check_loss

__all__ = ["NonFiniteLoss", "check_loss", "main", "parse_args", "resume_lr"]  # the tests' handles

PROG = Path(__file__).name


def parse_args(argv: Optional[list[str]] = None):
    """The checked flags (:func:`semimig.bench.llm.flags.parse_args`): a refusal is one line, exit 2."""
    return _parse_args(argv, description=__doc__.split("\n")[0])


def main(argv: Optional[list[str]] = None) -> int:
    from semimig._quiet import quiet_third_party

    words = sys.argv[1:] if argv is None else argv  # quiet before the flag checks import Colossal-AI
    quiet_third_party(verbose=any(w in ("-v", "--verbose") for w in words))
    from semimig.bench.llm.loop import run

    line = run(parse_args(argv), PROG)
    if line is not None:
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except NonFiniteLoss as err:
        sys.exit(f"{PROG}: error: {err}")
