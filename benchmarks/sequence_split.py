"""Would an uneven sequence split pay?  The work ``split_gather`` sequence parallelism splits evenly, measured,
and a step with that work split evenly against split by the ranks' speeds (DESIGN §8).

    python benchmarks/sequence_split.py [--repeats 8] [--json F]

Under ``split_gather`` each rank of a TP group runs the norms and the residual adds on ``1/tp`` of the
sequence, whatever its shard plan; the GEMMs follow the plan.  That work sits between the row layer's
reduce-scatter and the next column layer's all-gather, so it is a region of its own that every rank
leaves together: it runs at the slow rank's pace, ``ρ·χ`` of a healthy step for a share ``ρ`` of the step
and a rank ``χ`` times slower, and no plan of the GEMMs (a region of their own too) shortens it.  Split by
the ranks' speeds it would take ``ρ·tp/Σ v_r``.  (Without sequence parallelism the same work runs whole on
every rank inside the GEMMs' region, as replicated work the plan balances.)

Part 1 measures ``ρ``: on the example's tiny Llama (hidden 1024, 2 layers, 16 / 8 heads, intermediate 4096,
batch 4, sequence 128, fp32, one process, one thread) a training step (forward, backward, AdamW) against the
same norms and residual adds alone, forward and backward, on the step's activations; the two are timed
interleaved (``bench_output.interleaved_ms``) and the medians taken.  Part 2 scores one rank ``χ`` times
slower at tp 2, 4 and 8, in healthy even steps: the GEMMs' region at the planner's best whole-unit plan
(:func:`~semimig.sharding.solver.solve_plan`, 32 units) plus the sequence region split evenly, against the
same plus the sequence region split by speed, for the measured ``ρ`` and larger shares a GPU's faster GEMMs
would leave (the norms are memory-bound there: unmeasured here).
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch
from bench_output import add_json_flag, interleaved_ms, write_result

from semimig.sharding.solver import StepModel, predicted_step, solve_plan

LAYOUTS = (2, 4, 8)
"""Tensor-parallel sizes scored."""
CHIS = (2.0, 4.0, 8.0)
"""The slow rank's slowdowns scored."""
UNITS = 32
"""Units of the paired dimension per TP group (the example's MLP blocks of 128 columns)."""
WHAT_IF = (0.05, 0.10)
"""Shares of the step scored beside the measured one."""


def measure(repeats: int) -> dict:
    """Seconds of a training step and of the sequence-split work alone (module docstring), medians."""
    import transformers

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=1024, intermediate_size=4096, num_hidden_layers=2,
                                      num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(config)
    tokens = torch.randint(0, config.vocab_size, (4, 128))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    hidden = torch.randn(4, 128, config.hidden_size, requires_grad=True)
    norm = model.model.layers[0].input_layernorm

    def step() -> None:
        model(input_ids=tokens, labels=tokens).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sequence_work() -> None:  # per layer two norms and two residual adds, then the final norm
        y = hidden
        for _ in range(config.num_hidden_layers):
            y = y + norm(y)
            y = y + norm(y)
        norm(y).sum().backward()

    times = interleaved_ms({"step": step, "sequence": sequence_work}, repeats, warmup=2)
    step_s, seq_s = (statistics.median(times[name]) / 1e3 for name in ("step", "sequence"))
    return {"step_s": step_s, "sequence_work_s": seq_s, "share": seq_s / step_s}


def score(tp: int, chi: float, share: float) -> dict:
    """The step (a healthy even step is 1) with the sequence region split evenly and split by speed (module
    docstring); the GEMMs' region at its best whole-unit plan either way."""
    speeds = (1.0,) * (tp - 1) + (1.0 / chi,)
    gemms = StepModel(speeds=speeds, replicated=0.0, shardable=tp * (1.0 - share))
    plan = solve_plan(gemms, total_units=UNITS)
    gemm_s = predicted_step(gemms, plan)
    limit = tp / sum(speeds)  # the job's step with every piece of work split by speed
    even_s, by_speed_s = gemm_s + max(share / v for v in speeds), gemm_s + share * limit
    return {"tp": tp, "chi": chi, "share": share, "plan": list(plan.units), "gemm_region": gemm_s,
            "even_split_step": even_s, "split_by_speed_step": by_speed_s, "gain": even_s / by_speed_s - 1.0,
            "limit": limit}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8, help="timed repeats of each part (default 8)")
    add_json_flag(parser, required=False, help="write the measurement and the rows here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    measured = measure(args.repeats)
    print(f"step {measured['step_s'] * 1e3:.1f} ms, norms and residual adds {measured['sequence_work_s'] * 1e3:.2f} ms: "
          f"{measured['share']:.2%} of the step")
    rows = [score(tp, chi, share) for share in (measured["share"], *WHAT_IF) for tp in LAYOUTS for chi in CHIS]
    print(f"{'share':>7} {'tp':>3} {'chi':>4} {'GEMM plan':>26}  {'even split':>10}  {'by speed':>8}  {'gain':>6}  limit")
    for row in rows:
        print(f"{row['share']:7.2%} {row['tp']:3d} {row['chi']:4.0f} {str(row['plan']):>26}  {row['even_split_step']:10.4f}  "
              f"{row['split_by_speed_step']:8.4f}  {row['gain']:+6.1%}  {row['limit']:.3f}")
    if args.json:
        write_result(args.json, "sequence_split", None, vars(args) | {"json": str(args.json)}, measured=measured,
                     rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
