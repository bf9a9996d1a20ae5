"""γ = 0 overhead of semimig's layers against Colossal-AI's, on real compute.

    python benchmarks/overhead_bench.py [--quick] [--parts layers,mlp,model,llm] [--json out.json]

Nothing is emulated and nobody straggles: two gloo ranks on this machine, one torch thread
each, run the same work through Colossal-AI's layers (``cai``) and through semimig's, side by
side in one process per rank.  Variants of one case are *interleaved*: a repetition runs
``iters`` iterations of every variant in turn (the order rotates each repetition), so load from
elsewhere on the machine hits all of them alike.  A repetition's figure is the median of its
iterations on the slower rank; a case reports the median over repetitions and the spread
(min-max and interquartile range) of the per-repetition figures, and the ratio to ``cai``
computed per repetition (paired) and summarised the same way.  Two clocks: ``wall`` (the
figure that counts) and ``cpu``, the main thread's CPU time, which is blind to waiting and to
overlap with communication but also to other processes' load, so it shows per-call host work
(bookkeeping, copies) clearly on a busy machine.

Parts and variants:

``layers``  one ``Linear1D_Col`` or ``Linear1D_Row`` forward + backward (input gradient
            included) for several ``tokens x in x out`` shapes.  ``cai``; ``semimig`` (no
            directive: must equal Colossal-AI bit for bit); ``directive`` (a γ = 0 directive
            with no timer: the balanced code path's own bookkeeping); ``timed`` (the same with a
            :class:`~semimig.straggler.BusyMeter`, as the controller runs it).
``mlp``     a whole training iteration (forward, backward, SGD step) of a column -> GELU -> row
            MLP, 512 -> 2048 -> 512, batch 256.  ``cai``,
            ``semimig`` and ``semi`` (semimig with a ``BalanceController`` in mode ``semi``, no
            straggler, ``step()`` after every optimizer step).
``llm``     a whole training step (forward, backward, fused AdamW) of the time-to-loss tiny Llama
            (``--hidden`` 1024 x 2 layers, 16 heads, 8 KV heads, batch 4 x 128 tokens: the shape of
            ``benchmarks/time_to_loss.py``) boosted by ``HybridParallelPlugin(tp_size=2)`` as the
            example builds it: Colossal-AI's policy (``cai``), ``SemiMigPolicy`` alone (``semimig``),
            and through ``semimig.enable`` with ``mode="off"`` (``off``) and ``mode="semi"`` with the
            example's paired pruning, step reflex and re-sharder (``semi``) -- the free-phase step of
            every mode of the come-and-go runs, side by side.  Only with ``--parts`` naming it.
``model``   the measured bench ViT (``BenchConfig(compute="measured")``'s size and batch) boosted by
            ``HybridParallelPlugin(tp_size=2)``: Colossal-AI's policy (``cai``), ``SemiMigPolicy``
            (``semimig``) and ``SemiMigPolicy`` with a ``semi`` controller (``semi``).

Figures on a shared machine are smoke figures; the interleaving makes the ratios fair, not the
absolute times quiet.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable

from bench_output import add_json_flag, refuse, write_result

PARTS = ("layers", "mlp", "model", "llm")
DEFAULT_PARTS = ("layers", "mlp", "model")
"""What runs without ``--parts``: ``llm`` (~1.3 s a step here, four variants) only when asked for."""
LAYER_SHAPES = ((256, 512, 2048), (256, 2048, 512), (1088, 256, 1024), (1088, 1024, 256), (1088, 64, 256))
"""``tokens x in x out`` of the single-layer cases: the MLP's two layers, the measured bench ViT's MLP
(hidden 256, intermediate 1024, 64 images x 17 tokens) and a small layer where per-call costs show."""
CLOCKS = ("wall", "cpu")


@dataclass(frozen=True, kw_only=True)
class OverheadConfig:
    """Repetitions and sizes of one run."""

    parts: tuple[str, ...] = DEFAULT_PARTS
    reps: int = 15
    """Interleaved repetitions; each gives one figure per variant."""
    iters: int = 10
    """Timed iterations of each variant per repetition (their median is the repetition's figure)."""
    warmup: int = 3
    """Untimed iterations of each variant before the first repetition."""
    layer_shapes: tuple[tuple[int, int, int], ...] = LAYER_SHAPES
    mlp: tuple[int, int, int] = (256, 512, 2048)
    """``batch, hidden, intermediate`` of the MLP part."""
    llm_hidden: int = 1024
    """The llm part's hidden size (layers 2, heads 16, KV heads 8, batch 4 x 128 tokens)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.parts or any(p not in PARTS for p in self.parts):
            raise ValueError(f"parts must be a non-empty subset of {PARTS}, got {self.parts!r}")
        for name in ("reps", "iters"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an int >= 1, got {getattr(self, name)!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, got {self.warmup!r}")
        if not isinstance(self.llm_hidden, int) or self.llm_hidden < 16 or self.llm_hidden % 16:
            raise ValueError(f"llm_hidden must be an int multiple of 16 (16 heads), got {self.llm_hidden!r}")
        for shape in self.layer_shapes + (self.mlp,):
            if len(shape) != 3 or any(not isinstance(v, int) or v < 2 or v % 2 for v in shape):
                raise ValueError(f"sizes must be three even ints >= 2 (two ranks split them), got {shape!r}")


QUICK = dict(reps=7, iters=5, warmup=2, layer_shapes=LAYER_SHAPES[:1] + LAYER_SHAPES[-1:])


# ----------------------------------------------------------------------------- statistics (pure)
def summarise(values: list[float]) -> dict:
    """Median, min, max and interquartile range of per-repetition figures."""
    ordered = sorted(values)
    q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else ordered * 3
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1], "q1": q1, "q3": q3}


def case_record(part: str, case: str, per_rep: dict[str, dict[str, list[float]]]) -> dict:
    """One case: per clock, each variant's per-repetition seconds summarised and paired ratios to ``cai``."""
    record = {"part": part, "case": case}
    for clock, variants in per_rep.items():
        base = variants["cai"]
        record[clock] = {
            "seconds": {v: summarise(t) for v, t in variants.items()},
            "ratio_to_cai": {v: summarise([a / b for a, b in zip(t, base)]) for v, t in variants.items() if v != "cai"},
            "per_rep_s": variants,
        }
    return record


def _ratio_text(ratio: dict | None) -> str:
    if ratio is None:
        return ""
    return f"{ratio['median']:.3f} [{ratio['min']:.3f}-{ratio['max']:.3f}] ({ratio['q1']:.3f}-{ratio['q3']:.3f})"


def format_records(records: list[dict]) -> str:
    """A table: per variant the median wall ms and, per clock, the ratio to cai: median [min-max] (q1-q3);
    then, for controlled variants, how often each rank was given a target gamma > 0 (no straggler: never)."""
    lines = [f"{'part':<7} {'case':<24} {'variant':<10} {'wall ms':>9}  "
             f"{'wall / cai: median [min-max] (q1-q3)':<42} cpu / cai"]
    for rec in records:
        for variant, s in rec["wall"]["seconds"].items():
            wall, cpu = (_ratio_text(rec[c]["ratio_to_cai"].get(variant)) for c in CLOCKS)
            lines.append(f"{rec['part']:<7} {rec['case']:<24} {variant:<10} {s['median'] * 1e3:>9.3f}  {wall:<42} {cpu}")
    for rec in records:
        for variant, c in rec.get("controller", {}).items():
            lines.append(f"{rec['part']} {variant}: target gamma > 0 in {c['pruned_iterations_by_rank']} of "
                         f"{c['iterations']} iterations per rank, largest {c['max_gamma_by_rank']}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- on the ranks
def _interleave(steps: dict, cfg: OverheadConfig) -> dict[str, dict[str, list[float]]]:
    """Per clock and variant, one figure per repetition: the median iteration seconds of the slower rank.

    Clocks: ``wall`` (what a user waits for) and ``cpu`` (this rank's main-thread CPU time: blind
    to waiting in collectives and to overlap, but also to the host's other load).
    """
    import torch
    import torch.distributed as dist

    names = list(steps)
    for name in names:
        for _ in range(cfg.warmup):
            steps[name]()
    per_rep = {clock: {name: [] for name in names} for clock in CLOCKS}
    for rep in range(cfg.reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            dist.barrier()
            wall, cpu = [], []
            for _ in range(cfg.iters):
                start, start_cpu = time.perf_counter(), time.thread_time()
                steps[name]()
                wall.append(time.perf_counter() - start)
                cpu.append(time.thread_time() - start_cpu)
            per_rep["wall"][name].append(statistics.median(wall))
            per_rep["cpu"][name].append(statistics.median(cpu))
    table = torch.tensor([per_rep[c][n] for c in CLOCKS for n in names], dtype=torch.float64)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)  # the slower rank sets the pace
    rows = iter(table.tolist())
    return {c: {n: next(rows) for n in names} for c in CLOCKS}


def _layer_steps(kind: str, shape: tuple[int, int, int], seed: int) -> dict:
    """Forward + backward of one layer: cai, semimig, semimig with a γ = 0 directive (untimed, timed)."""
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from colossalai.shardformer.layer import Linear1D_Col as CaiCol
    from colossalai.shardformer.layer import Linear1D_Row as CaiRow

    import semimig.nn as snn
    from semimig.straggler import BusyMeter

    tokens, d_in, d_out = shape
    group, world = dist.group.WORLD, dist.get_world_size()
    torch.manual_seed(seed)
    dense = nn.Linear(d_in, d_out)
    if kind == "col":
        make = lambda cls: cls.from_native_module(copy.deepcopy(dense), group)  # noqa: E731
        ours_cls, cai_cls, x, dy = snn.Linear1D_Col, CaiCol, torch.randn(tokens, d_in), torch.randn(tokens, d_out // world)
    else:
        make = lambda cls: cls.from_native_module(copy.deepcopy(dense), group, parallel_input=True)  # noqa: E731
        ours_cls, cai_cls, x, dy = snn.Linear1D_Row, CaiRow, torch.randn(tokens, d_in // world), torch.randn(tokens, d_out)
    x.requires_grad_(True)
    layers = {"cai": make(cai_cls), "semimig": make(ours_cls), "directive": make(ours_cls), "timed": make(ours_cls)}
    layers["directive"].directive = snn.LayerDirective(iteration=0)
    meter = BusyMeter()
    layers["timed"].directive = snn.LayerDirective(iteration=0, timer=meter)

    def step(layer):
        timed = layer is layers["timed"]

        def run():
            x.grad = None
            for p in layer.parameters():
                p.grad = None
            layer(x).backward(dy)
            if timed:
                meter.end_step()  # one step of the meter's clock, as the controller closes it
        return run

    return {name: step(layer) for name, layer in layers.items()}


def _controlled(train: Callable[[], None], controller=None) -> Callable[[], None]:
    """One variant's iteration: ``train`` alone, or, with a controller, ``train`` with semimig's
    collectives timed on the controller's step clock only while this variant runs, then
    ``controller.step()``, whose target gamma is kept in ``run.gammas`` (what
    :func:`_controller_gammas` reads)."""
    if controller is None:
        return train
    from semimig.comm import primitives as P

    controller._untime()  # not while the other variants are timed

    def run():
        stop = P.time_collectives(controller.meter.comm)
        train()
        run.gammas.append(controller.step().gamma_target)
        stop()
    run.gammas = []
    return run


def _mlp_steps(cfg: OverheadConfig) -> dict:
    """A whole iteration of column -> GELU -> row: cai, semimig, semimig + semi controller."""
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from colossalai.shardformer.layer import Linear1D_Col as CaiCol
    from colossalai.shardformer.layer import Linear1D_Row as CaiRow

    import semimig.nn as snn
    from semimig.controller import BalanceConfig, BalanceController

    batch, hidden, inter = cfg.mlp
    group = dist.group.WORLD
    torch.manual_seed(cfg.seed)
    fc1, fc2 = nn.Linear(hidden, inter), nn.Linear(inter, hidden)
    x = torch.randn(batch, hidden)

    def build(col_cls, row_cls):
        return nn.Sequential(col_cls.from_native_module(copy.deepcopy(fc1), group), nn.GELU(),
                             row_cls.from_native_module(copy.deepcopy(fc2), group, parallel_input=True))

    def step(model, controller=None):
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

        def train():
            loss = model(x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return _controlled(train, controller)

    semi_model = build(snn.Linear1D_Col, snn.Linear1D_Row)
    controller = BalanceController(semi_model, BalanceConfig(mode="semi"), process_group=group)
    return {"cai": step(build(CaiCol, CaiRow)), "semimig": step(build(snn.Linear1D_Col, snn.Linear1D_Row)),
            "semi": step(semi_model, controller)}


def _model_steps(cfg: OverheadConfig) -> tuple[dict, str]:
    """A whole iteration of the bench ViT through HybridParallelPlugin: cai, semimig, semimig + semi."""
    import torch
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    from semimig.bench.config import BenchConfig
    from semimig.bench.models import digits_split, tiny_vit
    from semimig.controller import BalanceConfig, BalanceController
    from semimig.shardformer import SemiMigPolicy

    bench = BenchConfig(tp=2, compute="measured")
    x_train, y_train, _, _ = digits_split(seed=0)
    xb, yb = x_train[:bench.batch], y_train[:bench.batch]

    def step(policy, mode=None):
        plugin = HybridParallelPlugin(tp_size=2, pp_size=1, precision="fp32", custom_policy=policy)
        model = tiny_vit(bench.size, seed=cfg.seed, num_labels=10)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        booster = Booster(plugin=plugin)
        model, optimizer, _, _, _ = booster.boost(model, optimizer)
        controller = None
        if mode is not None:
            controller = BalanceController(model, BalanceConfig(mode=mode), process_group=plugin.tp_group)

        def train():
            loss = model(pixel_values=xb, labels=yb).loss
            booster.backward(loss, optimizer)
            optimizer.step()
            optimizer.zero_grad()
        return _controlled(train, controller)

    size = bench.size
    case = f"vit h{size.hidden} i{size.intermediate} L{size.layers} b{bench.batch}"
    return {"cai": step(None), "semimig": step(SemiMigPolicy()), "semi": step(SemiMigPolicy(), "semi")}, case


def _llm_steps(cfg: OverheadConfig) -> tuple[dict, str]:
    """A whole step of the example's tiny Llama: cai, semimig, ``enable(mode="off")``, ``enable(mode="semi")``."""
    import torch
    import transformers as T
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    import semimig
    from semimig.comm import primitives as P
    from semimig.controller import BalanceConfig, ControllerConfig
    from semimig.controller.reflex import ReflexConfig
    from semimig.resizing.config import ResizingConfig
    from semimig.shardformer import SemiMigPolicy

    batch, seq, vocab = 4, 128, 256
    gen = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)  # the same batch on both ranks (one TP group)

    def step(policy, mode=None):
        torch.manual_seed(cfg.seed)
        config = T.LlamaConfig(vocab_size=vocab, hidden_size=cfg.llm_hidden, intermediate_size=4 * cfg.llm_hidden,
                               num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=8,
                               max_position_embeddings=256, use_cache=False)
        model = T.LlamaForCausalLM(config)
        plugin = HybridParallelPlugin(tp_size=2, pp_size=1, precision="fp32", custom_policy=policy)
        booster = Booster(plugin=plugin)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        model, optimizer, *_ = booster.boost(model, optimizer)
        balancer = None
        if mode is not None:  # the example's settings; the hooked optimizer.step() steps the balancer
            balancer = semimig.enable(model, plugin, optimizer=optimizer, mode=mode,
                                      config=BalanceConfig(controller=ControllerConfig(reflex=ReflexConfig()),
                                                           resizing=ResizingConfig(paired=True)))
            balancer.controller._untime()  # semimig's collectives timed only while this variant runs

        def train():
            stop = None
            if balancer is not None:
                stop = P.time_collectives(balancer.controller.meter.comm)
            loss = model(input_ids=ids, labels=ids).loss
            booster.backward(loss, optimizer)
            optimizer.step()
            optimizer.zero_grad()
            if balancer is not None:
                stop()
                train.gammas.append(balancer.report.gamma_target)
        if balancer is not None:
            train.gammas = []  # what _controller_gammas reads
        return train

    steps = {"cai": step(None), "semimig": step(SemiMigPolicy()), "off": step(SemiMigPolicy(), "off"),
             "semi": step(SemiMigPolicy(), "semi")}
    return steps, f"llama h{cfg.llm_hidden} L2 kv8 b{batch}x{seq}"


def _controller_gammas(steps: dict) -> dict:
    """Per controlled variant: every rank's count of iterations with a target gamma > 0, and the largest."""
    import torch.distributed as dist

    mine = {name: (sum(g > 0 for g in fn.gammas), max(fn.gammas, default=0.0), len(fn.gammas))
            for name, fn in steps.items() if hasattr(fn, "gammas")}
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    return {name: {"iterations": ranks[0][name][2], "pruned_iterations_by_rank": [r[name][0] for r in ranks],
                   "max_gamma_by_rank": [r[name][1] for r in ranks]} for name in mine}


def _bench_body(rank: int, world: int, cfg: OverheadConfig) -> list[dict]:
    import torch

    torch.set_num_threads(1)
    records = []
    if "layers" in cfg.parts:
        for shape in cfg.layer_shapes:
            for kind in ("col", "row"):
                per_rep = _interleave(_layer_steps(kind, shape, cfg.seed), cfg)
                records.append(case_record("layers", f"{kind} {shape[0]}x{shape[1]}x{shape[2]}", per_rep))
    whole = []
    if "mlp" in cfg.parts:
        batch, hidden, inter = cfg.mlp
        whole.append(("mlp", f"{hidden}-{inter}-{hidden} b{batch}", _mlp_steps(cfg)))
    if "model" in cfg.parts:
        steps, case = _model_steps(cfg)
        whole.append(("model", case, steps))
    if "llm" in cfg.parts:
        steps, case = _llm_steps(cfg)
        whole.append(("llm", case, steps))
    for part, case, steps in whole:
        record = case_record(part, case, _interleave(steps, cfg))
        record["controller"] = _controller_gammas(steps)
        records.append(record)
    return records


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_json_flag(parser, required=False, help="write the records here")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and shapes (smoke run)")
    parser.add_argument("--parts", help=f"comma-separated subset of {','.join(PARTS)} (default {','.join(DEFAULT_PARTS)})")
    parser.add_argument("--reps", type=int, help="interleaved repetitions (default 15, --quick 7)")
    parser.add_argument("--iters", type=int, help="timed iterations per variant and repetition (default 10)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before the ranks are killed")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    fields = dict(QUICK) if args.quick else {}
    if args.parts is not None:
        fields["parts"] = tuple(p.strip() for p in args.parts.split(","))
    fields.update({k: v for k, v in (("reps", args.reps), ("iters", args.iters)) if v is not None})
    try:
        cfg = OverheadConfig(**fields)
    except ValueError as err:
        return refuse("overhead_bench.py", err)
    from semimig.launch import run_on_ranks

    print(f"overhead bench: parts {','.join(cfg.parts)}, {cfg.reps} interleaved repetitions x {cfg.iters} "
          f"iterations, 2 gloo ranks x 1 thread, CPU ({platform.machine()})", flush=True)
    start = time.perf_counter()
    records = run_on_ranks(_bench_body, 2, cfg, timeout_s=args.timeout)
    print(format_records(records))
    print(f"wall time {time.perf_counter() - start:.0f} s")
    if args.json is not None:
        write_result(args.json, "overhead_bench", argv, asdict(cfg), records=records)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
