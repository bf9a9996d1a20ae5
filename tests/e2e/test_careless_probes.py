"""Careless and hostile command lines, round two: every entry point refuses before any work, names the
flag in one line (rank 0 only under a launcher), exit 2; no flag is dropped in silence; a tool that did
nothing says so and fails.  Each named case failed (or silently did the wrong thing) before its fix;
the Hypothesis properties draw invalid combinations per entry point and check the refusal comes
before any process group, rank, cgroup or namespace exists.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scripts import REPO, load_script

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def example():
    return load_script("benchmarks/llm_run.py", "llm_run_careless")


@pytest.fixture
def world(monkeypatch):
    """The environment torchrun gives rank ``rank`` of ``size`` (no process group is made)."""
    def set_world(size: int, rank: int = 0) -> None:
        monkeypatch.setenv("WORLD_SIZE", str(size))
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
    return set_world


def _refusal(call, *argv) -> tuple[int, list[str]]:
    """``call(list(argv))``'s exit status and stderr lines (SystemExit or a returned status)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = call(list(argv))
        except SystemExit as stop:
            code = stop.code
    return code, [line for line in err.getvalue().splitlines() if line.strip()]


# -- the example: flags against the launch and the model, before any group ------------------------
@pytest.mark.parametrize("argv, flag", [
    (["--batch-split", "poplar"], "--batch-split poplar"),          # world 2, tp 2: one DP group
    (["--batch-split", "even", "--tp", "2"], "--batch-split even"),
    (["--straggler", "fixed:3:4"], "--straggler fixed:3:4"),        # TP ranks 0..1
    (["--tp", "1", "--straggler", "fixed:0:2", "--straggler-replica", "2"], "--straggler-replica"),
    (["--tp", "4"], "--tp 4"),                                      # does not divide 2 ranks
    (["--shard-plan", "1,1"], "--shard-plan"),                      # 2 blocks of the model's 8
    (["--save", "/proc/semimig-ckpt"], "--save /proc/semimig-ckpt"),  # a directory nobody can write
])
def test_the_example_refuses_what_does_not_fit_the_launch_before_any_group(example, world, argv, flag):
    """Refused before the process group and the model are built (--tp, --shard-plan,
    --straggler-replica), never accepted as a no-op (--batch-split with one group, a straggler rank
    outside the TP group), nor failing only after every step has trained (--save)."""
    world(2)
    code, err = _refusal(example.parse_args, *argv)
    assert code == 2 and len(err) == 1 and flag in err[0], err
    import torch.distributed as dist

    assert not dist.is_initialized()


def test_a_refusal_under_a_launcher_is_printed_by_rank_0_only(example, world):
    world(2, rank=1)
    assert _refusal(example.parse_args, "--batch-split", "poplar") == (2, [])
    world(2, rank=0)
    code, err = _refusal(example.parse_args, "--batch-split", "poplar")
    assert code == 2 and len(err) == 1 and err[0].startswith(f"{Path(sys.argv[0]).name}: error:"), err


class _Optimizer:
    def __init__(self, lr: float) -> None:
        self.param_groups = [{"lr": lr}, {"lr": lr}]


def test_resume_with_lr_overrides_the_checkpoints_and_says_so(example, caplog):
    """``--resume DIR --lr 0.5`` trains with the lr given, not the checkpoint's (the loaded optimizer
    state), and either way the log says which lr is used."""
    args = example.parse_args(["--lr", "0.5"])
    optimizer = _Optimizer(1e-3)
    with caplog.at_level(logging.INFO, logger="semimig.bench.llm"):
        example.resume_lr(optimizer, args)
    assert [g["lr"] for g in optimizer.param_groups] == [0.5, 0.5]
    assert "overriding the checkpoint's lr 0.001 with --lr 0.5" in caplog.text
    caplog.clear()
    args, optimizer = example.parse_args([]), _Optimizer(0.02)
    with caplog.at_level(logging.INFO, logger="semimig.bench.llm"):
        example.resume_lr(optimizer, args)
    assert args.lr == 0.02 and [g["lr"] for g in optimizer.param_groups] == [0.02, 0.02]
    assert "keeping the checkpoint's lr 0.02 (pass --lr to override it)" in caplog.text


EXAMPLE_BAD = [
    (["--batch-split", "poplar"], "--batch-split"), (["--straggler", "fixed:2:4"], "--straggler"),
    (["--straggler", "fixed:0:4", "--tp", "1", "--straggler-replica", "5"], "--straggler-replica"),
    (["--tp", "3"], "--tp"), (["--tp", "0"], "--tp"), (["--lr", "-1"], "--lr"), (["--lr", "nan"], "--lr"),
    (["--hidden", "100"], "--hidden"), (["--steps", "0"], "--steps"), (["--seq-len", "1"], "--seq-len"),
    (["--json", str(REPO / "setup.py")], "--json"), (["--started-file", str(REPO / "setup.py")], "--started-file"),
    (["--save", "/proc/semimig-x"], "--save"), (["--resume", "/nonexistent-ckpt"], "--resume"),
    (["--timeout-s", "0"], "--timeout-s"), (["--reshard-probe", "1"], "--reshard-probe"),
    (["--straggler-replica", "0"], "--straggler-replica"), (["--zero-stage", "1"], "--zero-stage"),
    (["--policy", "colossalai", "--straggler", "fixed:1:2"], "--policy"),
    (["--reflex", "off", "--balance", "reshard"], "--reflex"),
]
EXAMPLE_OK = [[], ["--steps", "5"], ["--balance", "off"], ["--lr", "0.01"], ["--seed", "3"], ["--data", "synthetic"]]


@FEW
@given(bad=st.lists(st.sampled_from(EXAMPLE_BAD), min_size=1, max_size=3), ok=st.sampled_from(EXAMPLE_OK),
       order=st.randoms(use_true_random=False))
def test_property_the_example_refuses_any_invalid_combination_in_one_line_naming_a_flag(example, world, bad, ok,
                                                                                         order):
    named = {w for a, _ in bad for w in a if w.startswith("--")}
    assume(not named & {w for w in ok if w.startswith("--")})  # a valid value given later would replace the bad one
    world(2)
    parts = [list(a) for a, _ in bad] + [ok]
    order.shuffle(parts)
    code, err = _refusal(example.parse_args, *[w for part in parts for w in part])
    assert code == 2 and len(err) == 1, err
    assert any(flag in err[0] for _, flag in bad), err
    import torch.distributed as dist

    assert not dist.is_initialized()


# -- semimig throttle ---------------------------------------------------------------------------
def _throttle(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "semimig.straggler.throttle_cli", *argv], env=ENV,
                          capture_output=True, text=True, timeout=60)


def test_throttle_refuses_a_rank_the_launched_world_does_not_have_before_launching(tmp_path):
    """``--rank 5 ... -- torchrun --nproc_per_node 2`` is refused: it would run the whole job unthrottled."""
    marker = tmp_path / "ran"
    proc = _throttle("--rank", "5", "--fraction", "0.5", "--", "torchrun", "--nproc_per_node", "2",
                     "--no-python", "touch", str(marker))
    assert proc.returncode == 2 and "--rank 5 does not exist" in proc.stderr and "2 rank(s)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not marker.exists()


def _cgroup_or_skip():
    from semimig.straggler.throttle import ThrottleUnavailable, find_cpu_controller

    try:
        controller = find_cpu_controller()
    except ThrottleUnavailable as err:
        pytest.skip(f"no cgroup cpu controller: {err}")
    if os.geteuid() != 0:
        pytest.skip("cgroup throttling needs root")
    return controller


def test_a_throttle_whose_rank_never_appears_fails_saying_so():
    """Exit 1 and a line that says so, not exit 0 with one line lost among the job's output."""
    _cgroup_or_skip()
    proc = _throttle("--rank", "1", "--fraction", "0.5", "--", "env", "RANK=0", "true")
    assert proc.returncode == 1 and "no process with RANK 1 appeared" in proc.stderr


def test_a_pattern_whose_file_never_appears_fails_saying_so(tmp_path):
    """A typo in --pattern-after fails saying so, not an unthrottled run, exit 0, an empty switch log."""
    _cgroup_or_skip()
    proc = _throttle("--rank", "0", "--fraction", "0.5", "--pattern", "1:1", "--pattern-after",
                     str(tmp_path / "typo"), "--", "env", "RANK=0", "sleep", "0.3")
    assert proc.returncode == 1 and f"--pattern-after {tmp_path / 'typo'} never appeared" in proc.stderr


THROTTLE_BAD = [
    (["--rank", "-1"], "rank"), (["--fraction", "0"], "fraction"), (["--fraction", "1.5"], "fraction"),
    (["--fraction", "nan"], "fraction"), (["--period-us", "10"], "period_us"), (["--pattern", "x"], "pattern"),
    (["--switch-log", "{tmp}/s.json"], "--switch-log"), (["--timeout", "0"], "timeout"),
    (["--pattern", "1:1", "--switch-log", "{tmp}/kept"], "--switch-log"),
    (["--pattern", "1:1", "--pattern-after", "{tmp}/kept"], "--pattern-after"),
    (["--rank", "7", "--world", "2"], "--rank"), (["--pattern", "1:1", "--fraction", "1"], "--pattern"),
    (["--rank", "0,1", "--fraction", "0.5,0.25,0.1"], "--fraction"), (["--fraction", "0.5,0.25"], "--fraction"),
    (["--rank", "0,1", "--fraction", "0.5,0.25", "--pattern", "1:1"], "--fraction"),
]


@FEW
@given(bad=st.sampled_from(THROTTLE_BAD), pin=st.booleans())
def test_property_the_throttle_refuses_any_invalid_flag_before_anything_starts(tmp_path, bad, pin):
    from semimig.cli import main

    (tmp_path / "kept").write_text("kept")
    marker = tmp_path / "ran"
    flags = {"--rank": "0", "--fraction": "0.5"}
    words = [w.format(tmp=tmp_path) for w in bad[0]]
    world = None
    for i in range(0, len(words), 2):
        if words[i] == "--world":
            world = words[i + 1]
        else:
            flags[words[i]] = words[i + 1]
    command = ["touch", str(marker)] if world is None else \
        ["torchrun", "--nproc_per_node", world, "--no-python", "touch", str(marker)]
    argv = ["throttle", *[w for kv in flags.items() for w in kv], *(["--pin"] if pin else []), "--", *command]
    before = set(os.listdir("/sys/fs/cgroup/cpu")) if os.path.isdir("/sys/fs/cgroup/cpu") else set()
    code, err = _refusal(main, *argv)
    assert code == 2 and len(err) == 1 and bad[1] in err[0], (argv, err)
    assert not marker.exists()
    after = set(os.listdir("/sys/fs/cgroup/cpu")) if os.path.isdir("/sys/fs/cgroup/cpu") else set()
    assert not {n for n in after - before if n.startswith(f"semimig-throttle-{os.getpid()}-")}


# -- semimig cluster ----------------------------------------------------------------------------
@pytest.mark.parametrize("script", [["torchrun", "--nproc_per_node", "2", "train.py"],
                                    ["/usr/bin/python3", "train.py"], ["-m", "torch.distributed.run", "train.py"]])
def test_the_cluster_refuses_a_launcher_as_its_script(script, capsys):
    """``semimig cluster ... -- torchrun --nproc_per_node 2 ...`` is refused: it would run one
    independent world per node, the shaped link unused, exit 0."""
    from semimig.cluster import cli

    assert cli.main(["--nodes", "2", "--link-gbit", "1", "--run-id", "zz9", "--", *script]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a launcher" in err[0] and "--nproc-per-node" in err[0]


CLUSTER_BAD = [
    (["--nodes", "0"], "--nodes"), (["--link-gbit", "0"], "--link-gbit"), (["--link-gbit", "nan"], "--link-gbit"),
    (["--nproc-per-node", "0"], "--nproc-per-node"), (["--straggler-node", "5"], "--straggler-node"),
    (["--straggler-link-gbit", "inf"], "--straggler-link-gbit"), (["--run-id", "BAD"], "--run-id"),
    (["--timeout", "-1"], "--timeout"), (["--grace", "1e9"], "--grace"), (["--link-delay-ms", "-1"], "--link-delay-ms"),
]


@FEW
@given(bad=st.lists(st.sampled_from(CLUSTER_BAD), min_size=1, max_size=3, unique_by=lambda b: b[0][0]))
def test_property_the_cluster_refuses_any_invalid_combination_before_any_namespace(bad):
    from semimig.cluster import cli

    flags = {"--nodes": "2", "--link-gbit": "1", "--straggler-link-gbit": "0.5"}
    for words, _ in bad:
        flags[words[0]] = words[1]
    code, err = _refusal(cli.main, *[w for kv in flags.items() for w in kv], "--", "train.py")
    assert code == 2 and len(err) == 1 and any(flag in err[0] for _, flag in bad), err


# -- benchmarks/time_to_loss.py -----------------------------------------------------------------
@pytest.fixture(scope="module")
def ttl():
    return load_script("benchmarks/time_to_loss.py", "time_to_loss_careless")


@pytest.mark.parametrize("argv, said", [
    (["--straggler", "device", "--fraction", "0.5"], "--fraction 0.5 applies to no run"),
    (["--straggler", "gemm", "--period-us", "2000"], "--period-us 2000 applies to no run"),
    (["--straggler", "real", "--chi", "3"], "--chi 3.0 applies to no run"),
    (["--straggler", "device", "--shard-plan", "30,2:3,1"], "--shard-plan 30,2:3,1 applies to no run"),
    (["--straggler", "device", "--modes", "healthy,off", "--resize-block", "4"], "--resize-block 4 applies"),
    (["--straggler", "real", "--pattern", "2:2", "--fraction", "1"], "--pattern 2:2 with --fraction 1"),
    (["--straggler", "device", "--modes", "healthy,uneven", "--shard-plan", "1,1:1,1"], "mode uneven: its run"),
    (["--straggler", "device", "--modes", "healthy,uneven", "--shard-plan", "31,1:3,1", "--hidden", "1000"],
     "mode uneven: its run"),  # a block size that does not divide the MLP
])
def test_time_to_loss_refuses_before_the_healthy_run(ttl, tmp_path, argv, said):
    """A flag that no run uses, and a run the example refuses (a shard plan that does not fit), are
    refused at parse time, before the healthy run trains."""
    code, err = _refusal(ttl.parse_args, *argv, "--json", str(tmp_path / "r.json"))
    assert code == 2 and len(err) == 1 and said in err[0], err


TTL_BAD = [
    (["--fraction", "0.5"], "--fraction"), (["--chi", "0"], "--chi"), (["--steps", "0"], "--steps"),
    (["--repeats", "-1"], "--repeats"), (["--modes", "healthy,bogus"], "--modes"), (["--pattern", "x"], "--pattern"),
    (["--plot", "{tmp}/p.txt"], "--plot"), (["--hidden", "0"], "--hidden"), (["--period-us", "1"], "--period-us"),
    (["--resize-block", "3"], "--resize-block"), (["--shard-plan", "1,1"], "--shard-plan"),
]


@FEW
@given(bad=st.sampled_from(TTL_BAD), straggler=st.sampled_from(["device", "gemm"]))
def test_property_time_to_loss_refuses_any_invalid_flag_in_one_line(ttl, tmp_path, bad, straggler):
    argv = ["--straggler", straggler, "--json", str(tmp_path / "r.json"), *[w.format(tmp=tmp_path) for w in bad[0]]]
    code, err = _refusal(ttl.parse_args, *argv)
    assert code == 2 and len(err) == 1 and bad[1] in err[0], err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow
def test_a_refusal_under_torchrun_is_one_line_from_rank_0_and_no_traceback(tmp_path):
    """One line from rank 0, before the group and model are built: no traceback or usage block per rank."""
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--log-dir",
                           str(tmp_path / "logs"), str(REPO / "benchmarks" / "llm_run.py"), "--batch-split",
                           "poplar"], env=ENV, capture_output=True, text=True, timeout=180)
    ours = [line for line in proc.stderr.splitlines() if "llm_run.py: error:" in line]
    assert proc.returncode != 0 and len(ours) == 1 and "--batch-split poplar" in ours[0], proc.stderr[-2000:]
    assert 'llm_run.py", line' not in proc.stderr  # no rank's traceback (torchrun's own box remains)


def test_resume_with_a_new_lr_trains_with_it_and_says_so(tmp_path):
    """The losses of ``--resume DIR --lr 0.5`` are those of lr 0.5, not the saved run's, and the log says so."""
    import json

    from example_ranks import run_example

    tiny = ["--hidden", "32", "--layers", "1", "--seq-len", "16", "--batch-size", "4", "--lr", "1e-2",
            "--timeout-s", "60", "--data", "synthetic", "--eval-every", "0", "--eval-batches", "1", "--balance", "off"]
    ckpt = tmp_path / "ckpt"
    first = run_example([*tiny, "--steps", "2", "--save", str(ckpt), "--json", str(tmp_path / "a.json")])
    assert first.returncode == 0, first.stderr[-3000:]
    kept = [a for a in tiny if a not in ("--lr", "1e-2")]
    runs = {}
    for name, lr in (("same", []), ("new", ["--lr", "0.5"])):
        run = run_example([*kept, *lr, "--steps", "4", "--resume", str(ckpt), "--json", str(tmp_path / f"{name}.json")])
        assert run.returncode == 0, run.stderr[-3000:]
        runs[name] = (run.stdout + run.stderr, json.loads((tmp_path / f"{name}.json").read_text())["losses"])
    assert "keeping the checkpoint's lr 0.01 (pass --lr to override it)" in runs["same"][0]
    assert "overriding the checkpoint's lr 0.01 with --lr 0.5" in runs["new"][0]
    assert runs["new"][1][0] == runs["same"][1][0] and runs["new"][1][1] != runs["same"][1][1]  # after one step
