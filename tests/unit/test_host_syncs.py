"""Every host synchronisation point in semimig/ and kernels/, listed and allowed by name (DESIGN §3b).

A static scan of the source (no run): each call of ``.synchronize`` (``torch.cuda.synchronize``,
``Event.synchronize``, ``Stream.synchronize``, also taken by reference), ``.cpu()``, ``.item()``,
``.tolist()``, ``.wait()`` and ``torch.equal`` is keyed by file, enclosing function and call, and must
appear in :data:`ALLOWED` with the reason it may wait.  A new one fails here until it is justified;
an entry whose call is gone fails too (the list stays true).  Implicit conversions of a device
tensor to a Python number (``float(t)``, ``if t:``) are beyond a static scan.

What runs in a training step, per step: the step clock's resolver (at most one event wait), the
controller's observation exchange collected at the balancer's hook, the re-shard policy's gather
there (modes reshard and semi), the batch plan's fingerprint under dp > 1; ``Work.wait()`` on an
NCCL collective orders the stream and returns (on gloo the host work is the collective).  Nothing
else: everything below is per re-plan, per period, setup, profiling, checkpoint, a test straggler,
a benchmark harness or process control.
"""
from __future__ import annotations

import ast
import collections
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
CALLS = {"synchronize", "cpu", "item", "tolist", "wait"}

PER_STEP = "per step, at the balancer's hook after the optimizer step"
STREAM = "Work.wait(): orders the current stream on NCCL (no host wait); on gloo the host is the device"
RE_PLAN = "once per re-plan (a new plan or keep set)"
SETUP = "setup: enable/build time, before the first step"
PROFILE = "profiling before training (Poplar's probes), synchronised on purpose"
TEST_STRAGGLER = "injected test straggler only (benchmarks, tests): its delay needs the GEMM's own time"
HARNESS = "benchmark harness (semimig.bench), not the library a user runs"
PROCESS = "a subprocess or thread, not a device"
SIMULATOR = "the policy simulator's numpy arrays, read once per scenario (no device)"
LINEAGE = ("only when a layer's lineage is another tensor than the one its forward recorded (compared by "
           "identity first): the values then decide")

IDLE = "a rank that skips the step (it holds no unit: nothing else runs on its device)"

ALLOWED: dict[tuple[str, str, str], str] = {
    # a rank that skips the step waits for the holders; the holders never wait for it
    ("semimig/shardformer/skip.py", "_received_loss", ".wait()"): IDLE + ": the step's loss from the first holder",
    ("semimig/shardformer/skip.py", "after_step", ".wait()"): IDLE + ": the replicated parameters' new values",
    # the step clock's resolver: at most one event wait per step (DESIGN §3b)
    ("semimig/straggler/clock.py", "StepClock._wait_one", ".wait()"): PER_STEP + ": the step clock's one event wait",
    ("semimig/straggler/clock.py", "_CudaMarks.wait", ".synchronize()"): PER_STEP + ": the step clock's one event wait",
    ("semimig/straggler/clock.py", "Span.seconds", ".wait()"): RE_PLAN + ": a move's or the device probe's span, one "
    "event wait at its end",
    ("semimig/controller/agreement.py", "ObservationExchange.collect", ".wait()"): PER_STEP + ": the observation exchange",
    ("semimig/controller/agreement.py", "ObservationExchange.collect", ".cpu()"): PER_STEP + ": the observation exchange",
    ("semimig/comm/primitives.py", "all_gather_rows", ".cpu()"): PER_STEP + ": the re-shard policy's gather; " + RE_PLAN,
    ("semimig/comm/primitives.py", "all_gather_rows", ".tolist()"): PER_STEP + ": the re-shard policy's gather; " + RE_PLAN,
    ("semimig/hybrid/balancer.py", "batch_fingerprint", ".cpu()"): PER_STEP + " with dp > 1: the batch plan's check",
    # collectives' handles
    ("semimig/comm/primitives.py", "wait", ".wait()"): STREAM,
    ("semimig/shardformer/vocab_clock.py", "_HeadLinear.backward", ".wait()"): STREAM + " (the head's input gradient, "
    "as Colossal-AI's LinearWithAsyncCommunication)",
    ("semimig/comm/primitives.py", "_p2p", ".wait()"): STREAM + " (migration's direct movements)",
    ("semimig/comm/primitives.py", "PackedSwap.wait", ".wait()"): STREAM + " (a packed exchange's messages: per-replica "
                                                                        "plans' cross-layout gradient exchange; "
                                                                        + RE_PLAN + ": moving units' weights)",
    ("semimig/comm/primitives.py", "swap_packed", ".wait()"): STREAM + " (PackedSwap.wait: a packed exchange posted and "
                                                                       "waited at once; " + RE_PLAN + ": moving units' "
                                                                       "weights)",
    ("semimig/shardformer/crosslayout.py", "finish_across_layouts", ".wait()"): STREAM + " (PackedSwap.wait: per-replica "
                                                                                        "plans' gradient buckets, posted "
                                                                                        "during the backward, waited "
                                                                                        "once at its end)",
    ("semimig/comm/holders.py", "_Pending.wait", ".wait()"): STREAM + " (the holders' sum, as the group's all-reduce)",
    ("semimig/comm/holders.py", "drain_sends", ".wait()"): STREAM + " (a send to an idle rank: beyond the sends in flight, "
                                                                 "and every one once, when they stop skipping)",
    ("semimig/comm/holders.py", "HolderSum.all_reduce_", ".wait()"): STREAM + " (an idle rank's receive of the holders' slices)",
    ("semimig/nn/functional.py", "_ColumnParallelLinear.backward", ".wait()"): STREAM,
    ("semimig/nn/functional.py", "_paired_column_backward", ".wait()"): STREAM,
    ("semimig/nn/collectives.py", "reduce_output", ".wait()"): STREAM,
    ("semimig/comm/lagged.py", "LaggedRows.collect", ".wait()"): PER_STEP + " with dp > 1: the lagged DP exchange, posted a step earlier",
    ("semimig/comm/lagged.py", "LaggedRows.collect", ".cpu()"): PER_STEP + " with dp > 1: the lagged DP exchange's rows",
    ("semimig/comm/lagged.py", "LaggedRows.collect", ".tolist()"): PER_STEP + " with dp > 1: the lagged DP exchange's rows",
    ("semimig/resizing/priority.py", "PriorityList._list", ".cpu()"): "once per period: the [K] priority order read back for selection",
    # per re-plan / per period
    ("semimig/nn/directive.py", "LayerState._same_keep", "torch.equal()"): RE_PLAN + ": a new keep tensor compared once",
    ("kernels/keep.py", "_check_values", ".tolist()"): RE_PLAN + ": a keep plan is validated when built",
    ("kernels/keep.py", "_detect_group", ".tolist()"): RE_PLAN + ": a keep plan is built once per keep set",
    ("semimig/controller/binding.py", "LayerBinding._reader.read", ".cpu()"): LINEAGE,
    ("semimig/controller/binding.py", "LayerBinding._reader.read", "torch.equal()"): LINEAGE,
    ("kernels/choice.py", "_clock", ".synchronize()"): "once per tuning key: a new shape's first pruned launch "
                                                               "times both paths",
    ("semimig/controller/reshard.py", "ReshardPolicy.profile", ".tolist()"): SETUP + ": the device probe's times, "
                                                                            "once, if handed as an array or tensor",
    ("semimig/controller/policy/records.py", "ReshardSample.__post_init__", ".tolist()"): "a caller's sample handed "
        "as arrays; semimig builds its samples from host floats (the gathered rows)",
    ("semimig/controller/pretest.py", "PretestRun._samples", ".cpu()"): RE_PLAN + ": the SEMI pretest",
    ("semimig/controller/pretest.py", "PretestRun._samples", ".tolist()"): RE_PLAN + ": the SEMI pretest",
    ("semimig/controller/pretest.py", "_best_of", ".synchronize()"): RE_PLAN + ": the SEMI pretest times its tasks",
    ("semimig/controller/agreement.py", "exchange_observations", ".cpu()"): "force(): an experiment's pinned plan",
    ("semimig/hybrid/agreement.py", "verify_batch_plan", ".item()"): RE_PLAN + ": the batch plan's digest",
    # setup
    ("semimig/resharder/observe.py", "ProbeWork.__init__", ".synchronize()"):
        SETUP + ": the device probe's synchronised repeats; and " + IDLE + ": the probe of its speed",
    ("semimig/hybrid/layout.py", "GridLayout.from_plugin", ".item()"): SETUP,
    ("semimig/_compat/cpu_shim.py", "<module>", ".synchronize()"): "the CPU shim (no CUDA device)",
    ("semimig/_compat/cpu_shim.py", "_synchronize", ".synchronize()"): "the CPU shim (no CUDA device)",
    ("semimig/shardformer/uneven_ckpt.py", "packed_parts", ".tolist()"): "checkpoint save/load",
    # profiling
    ("semimig/allocation/collectives.py", "_sync", ".synchronize()"): PROFILE,
    ("semimig/allocation/collectives.py", "_TimedWork.wait", ".wait()"): PROFILE,
    ("semimig/allocation/device.py", "ModelStepDevice.__call__", ".synchronize()"): PROFILE,
    ("semimig/allocation/device.py", "ModelStepDevice.__call__", ".tolist()"): PROFILE,
    ("semimig/allocation/device.py", "ModelStepDevice.__init__", ".item()"): PROFILE,
    ("semimig/allocation/data.py", "HeteroBatchSampler.__iter__", ".tolist()"): "the sampler's index list, a host tensor",
    ("semimig/straggler/injection.py", "calibrate_cuda_sleep_rate", ".synchronize()"): PROFILE + " (injection's calibration)",
    ("semimig/straggler/injection.py", "calibrate_flops_per_second", ".synchronize()"): PROFILE + " (injection's calibration)",
    # test stragglers
    ("semimig/straggler/busy.py", "BusyMeter._sync", ".synchronize()"): TEST_STRAGGLER,
    ("semimig/straggler/hooks.py", "BaselineInjection._sync", ".synchronize()"): TEST_STRAGGLER,
    ("semimig/straggler/device.py", "DeviceClock._before", ".synchronize()"): TEST_STRAGGLER + " (scope=device)",
    # harness and processes
    ("semimig/bench/train.py", "train_case", ".synchronize()"): HARNESS,
    ("semimig/bench/train2d.py", "train_2d_case", ".tolist()"): HARNESS,
    ("semimig/bench/llm/loop.py", "run", ".synchronize()"): HARNESS + ": the training binary times each step on the device",
    ("semimig/controller/sim/simulate.py", "_Noise.__init__", ".tolist()"): SIMULATOR,
    ("semimig/controller/sim/simulate.py", "_Step.__init__", ".tolist()"): SIMULATOR,
    ("semimig/cluster/launcher.py", "_stop", ".wait()"): PROCESS,
    ("semimig/straggler/throttle_cli.py", "run_throttled", ".wait()"): PROCESS,
    ("semimig/straggler/throttle_pattern.py", "PatternDriver._run", ".wait()"): PROCESS,
}


def _scan() -> collections.Counter:
    found: collections.Counter = collections.Counter()
    for base in ("semimig", "kernels"):
        for path in sorted((ROOT / base).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("semimig/kernels/"):
                continue  # the link to kernels/, scanned there
            stack: list[str] = []

            def visit(node: ast.AST) -> None:
                named = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                if named:
                    stack.append(node.name)
                where = ".".join(stack) or "<module>"
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    func = node.func
                    if func.attr in CALLS:
                        found[(rel, where, f".{func.attr}()")] += 1
                    elif func.attr == "equal" and isinstance(func.value, ast.Name) and func.value.id == "torch":
                        found[(rel, where, "torch.equal()")] += 1
                elif isinstance(node, ast.Attribute) and node.attr == "synchronize":
                    found[(rel, where, ".synchronize()")] += 1  # taken by reference: sync = torch.cuda.synchronize
                for child in ast.iter_child_nodes(node):
                    if isinstance(node, ast.Call) and child is node.func and isinstance(child, ast.Attribute):
                        visit(child.value)  # the call's own attribute is counted above; what it is called on is not
                        continue
                    visit(child)
                if named:
                    stack.pop()

            visit(ast.parse(path.read_text(), filename=rel))
    return found


def test_every_host_synchronisation_is_allowed_by_name():
    found = _scan()
    unknown = sorted(key for key in found if key not in ALLOWED)
    assert not unknown, "host synchronisation points without a reason in ALLOWED:\n" + "\n".join(map(str, unknown))


def test_the_allow_list_names_only_calls_that_exist():
    found = _scan()
    stale = sorted(key for key in ALLOWED if key not in found)
    assert not stale, "ALLOWED names calls that are gone:\n" + "\n".join(map(str, stale))


def test_nothing_in_a_layers_step_waits_but_a_collectives_handle():
    """The layers, the meter and the clock's region code: no host synchronisation in the step's path
    (the meter's only one serves an injected straggler; the clock's span is read once per re-plan, between steps)."""
    found = _scan()
    in_step = {key for key in found if key[0] in ("semimig/nn/functional.py", "semimig/nn/collectives.py",
                                                    "semimig/nn/spans.py", "semimig/nn/balanced.py",
                                                    "semimig/nn/layers.py", "semimig/straggler/busy.py",
                                                    "semimig/straggler/clock.py")}
    assert {key for key in in_step if ALLOWED[key] not in (STREAM, TEST_STRAGGLER)
            and not ALLOWED[key].startswith(PER_STEP + ": the step clock")
            and not (key[1] == "Span.seconds" and ALLOWED[key].startswith(RE_PLAN))} == set()
