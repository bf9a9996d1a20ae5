"""``semimig bench --modes ...,reshard``: the bench ViT re-sharded for a slow rank through ``semimig.enable``."""
import json
import re

import pytest

from semimig.errors import ConfigError


@pytest.mark.slow
def test_bench_reshard_moves_shards_off_a_slow_device_and_keeps_the_baselines_accuracy(tmp_path):
    """Measured compute, rank 1's whole device 4x slow (``--scope device``): the reshard case re-plans
    at the device probe toward rank 0 (bytes moved, reasons logged in the record) and its dense test
    accuracy is the baseline's (an uneven plan only reorders sums: at most one test image in 450 may
    round the other way); at chi = 1 nothing is re-planned."""
    from semimig.bench.runner import usable_cores
    from semimig.cli import main

    if usable_cores() < 2:
        pytest.skip("measured compute needs a core per rank")
    out = tmp_path / "r.json"
    assert main(["bench", "--compute", "measured", "--scope", "device", "--model", "128x512x1", "--modes",
                 "baseline,reshard", "--chi", "1,4", "--seeds", "0", "--epochs", "1", "--iters-per-epoch", "12",
                 "--no-plots", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    by = {(r["mode"], r["chi"]): r for r in data["records"]}
    assert by[("baseline", 4.0)]["reshard"] is None
    moved = by[("reshard", 4.0)]["reshard"]
    assert moved["replans"] >= 1 and moved["bytes_moved"] > 0
    probe = moved["events"][0]
    assert probe["step"] == -1 and "device probe" in probe["reason"]
    assert probe["mlp_units"][0] > probe["mlp_units"][1] and sum(probe["mlp_units"]) == 16  # 8 blocks per rank
    assert probe["kv_units"][0] >= probe["kv_units"][1]
    assert by[("reshard", 1.0)]["reshard"]["replans"] == 0
    for chi in (1.0, 4.0):
        assert abs(by[("reshard", chi)]["accuracy"] - by[("baseline", chi)]["accuracy"]) <= 1 / 450 + 1e-9


@pytest.mark.parametrize("kwargs,message", [
    (dict(tp=1, straggler_rank=0), "tp must be >= 2, got tp=1"),
    (dict(size="64x200x1"), "intermediate=200 is not divisible by 16 (tp=2)"),
    (dict(tp=4, size="64x256x1"), None),  # 256 = 32 blocks of 8: accepted
])
def test_bench_reshard_refuses_a_model_it_cannot_re_plan_by_name(kwargs, message):
    from semimig.bench.config import BenchConfig
    from semimig.models import VitSize

    if "size" in kwargs:
        kwargs = dict(kwargs, size=VitSize.parse(kwargs["size"]))
    config = dict(modes=("baseline", "reshard"), compute="emulated", **kwargs)
    if message is None:
        plan = BenchConfig(**config).reshard_plan()
        assert plan.mlp_units == (8,) * 4 and plan.kv_units == (1,) * 4 and plan.block_size == 8
        return
    with pytest.raises(ConfigError, match=re.escape(message)):
        BenchConfig(**config)
    BenchConfig(**dict(config, modes=("baseline", "semi")))  # the other modes do not need it


def test_bench_offers_reshard_but_keeps_it_out_of_the_default_sweep(capsys):
    from semimig.bench.cli import _modes
    from semimig.bench.config import BenchConfig

    assert _modes("baseline,reshard") == ("baseline", "reshard")
    assert "reshard" not in BenchConfig(compute="emulated").modes
    with pytest.raises(ConfigError, match="'reshard'"):
        BenchConfig(compute="emulated", allocation="poplar", modes=("baseline", "reshard"))
