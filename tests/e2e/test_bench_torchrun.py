"""``semimig bench`` under torchrun: the launcher's ranks train (no ranks of its own), rank 0 alone
prints and writes; what it cannot serve is refused at once on every rank; a launcher's leftover
environment does not make the single-command default wait for an agent."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
TINY = ["bench", "--quick", "--compute", "emulated", "--modes", "baseline,semi", "--chi", "1", "--epochs", "1",
        "--iters-per-epoch", "5", "--no-plots"]
pytestmark = pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed")


def _torchrun(args, timeout):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    from semimig.launch import free_port

    return subprocess.run([TORCHRUN, "--nproc_per_node", "2", "--master_port", str(free_port()), "-m", "semimig",
                           *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**env, "PYTHONWARNINGS": "ignore"})


@pytest.mark.slow
def test_torchrun_ranks_train_and_rank_zero_alone_reports(tmp_path):
    out = tmp_path / "r.json"
    done = _torchrun([*TINY, "--json", str(out), "--full-trace"], timeout=300)  # per-rank traces: --full-trace
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("semimig bench: ViT") == 1  # one banner, not one per rank
    assert "the launcher's 2 ranks" in done.stdout
    assert done.stdout.count(f"JSON: {out}") == 1
    records = json.loads(out.read_text())["records"]
    assert [r["mode"] for r in records] == ["baseline", "semi"]
    assert all(len(r["trajectory"]["by_rank"]) == 2 for r in records)


@pytest.mark.slow
def test_torchrun_refuses_what_it_cannot_serve_at_once_on_every_rank(tmp_path):
    done = _torchrun([*TINY, "--tp", "4", "--json", str(tmp_path / "r.json")], timeout=120)
    assert done.returncode != 0
    message = "semimig bench: error: the launcher started 2 ranks but tp=4 x dp=1 needs 4"
    assert done.stderr.count(message) == 1, done.stderr[-3000:]
    assert not (tmp_path / "r.json").exists()


def test_a_partial_launcher_environment_is_refused_by_name(capsys, monkeypatch, tmp_path):
    from semimig.cli import main

    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main([*TINY, "--json", str(tmp_path / "r.json"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "RANK or WORLD_SIZE is set) but WORLD_SIZE, MASTER_ADDR, MASTER_PORT is not set" in err


@pytest.mark.parametrize("env,message", [
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "x", "MASTER_PORT": "1"}, "RANK=2 WORLD_SIZE=2"),
    ({"RANK": "a", "WORLD_SIZE": "2", "MASTER_ADDR": "x", "MASTER_PORT": "1"}, "RANK must be an integer, got 'a'"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "x", "MASTER_PORT": "70000"}, "must be a TCP port, got 70000"),
])
def test_launcher_environment_values_are_checked(env, message):
    from semimig.errors import ConfigError
    from semimig.launch import TorchrunEnv

    with pytest.raises(ConfigError, match=message):
        TorchrunEnv.from_environ(env)


def test_no_launcher_environment_means_spawn():
    from semimig.launch import TorchrunEnv

    assert TorchrunEnv.from_environ({"MASTER_ADDR": "x", "TORCHELASTIC_USE_AGENT_STORE": "True"}) is None
    env = TorchrunEnv.from_environ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                                    "MASTER_ADDR": "node0", "MASTER_PORT": "29500"})
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (1, 4, 1, 2)


@pytest.mark.slow
def test_an_agent_store_variable_without_torchrun_does_not_hang_the_default(tmp_path):
    """TORCHELASTIC_USE_AGENT_STORE=True alone (no torchrun) must not make the spawned ranks wait for an agent."""
    out = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, "-m", "semimig", *TINY, "--modes", "baseline", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**env, "TORCHELASTIC_USE_AGENT_STORE": "True", "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(json.loads(out.read_text())["records"]) == 1
