"""``benchmarks/optimizer_bench.py``: its lazy AdamW step is the dense step on the kept columns and
leaves the skipped ones untouched; the script runs and writes what it prints."""
import json

import pytest
import torch
from scripts import load_script


def _bench():
    return load_script("benchmarks/optimizer_bench.py", "optimizer_bench")


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_lazy_adamw_equals_dense_adamw_on_the_kept_columns(weight_decay):
    bench = _bench()
    gen = torch.Generator().manual_seed(3)
    shapes = [(6, 32), (4, 48)]
    dense = [torch.nn.Parameter(torch.randn(*s, generator=gen)) for s in shapes]
    lazy = [torch.nn.Parameter(p.detach().clone()) for p in dense]
    opt_dense = torch.optim.AdamW(dense, lr=0.1, weight_decay=weight_decay, foreach=False)
    opt_lazy = torch.optim.AdamW(lazy, lr=0.1, weight_decay=weight_decay, foreach=False)
    for step in range(4):
        grads = [torch.randn(*s, generator=gen) for s in shapes]
        for d, z, g in zip(dense, lazy, grads):
            d.grad, z.grad = g.clone(), g.clone()
        if step == 0:  # both states exist before the first lazy step, as in the benchmark
            opt_dense.step()
            opt_lazy.step()
            continue
        before = [(z.detach().clone(), opt_lazy.state[z]["exp_avg"].clone(), opt_lazy.state[z]["exp_avg_sq"].clone())
                  for z in lazy]
        keeps = [bench.block_keep(s[1], 0.75, 8, gen) for s in shapes]
        opt_dense.step()
        bench.lazy_adamw_(opt_lazy, lazy, keeps)
        for d, z, keep, (p0, m0, v0) in zip(dense, lazy, keeps, before):
            skipped = torch.ones(z.shape[1], dtype=torch.bool)
            skipped[keep] = False
            state_d, state_z = opt_dense.state[d], opt_lazy.state[z]
            torch.testing.assert_close(z.detach()[:, keep], d.detach()[:, keep], rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(state_z["exp_avg"][:, keep], state_d["exp_avg"][:, keep], rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(state_z["exp_avg_sq"][:, keep], state_d["exp_avg_sq"][:, keep],
                                       rtol=1e-6, atol=1e-8)
            assert torch.equal(z.detach()[:, skipped], p0[:, skipped])
            assert torch.equal(state_z["exp_avg"][:, skipped], m0[:, skipped])
            assert torch.equal(state_z["exp_avg_sq"][:, skipped], v0[:, skipped])
            assert float(state_z["step"]) == float(state_d["step"])
        # the two diverge on the skipped columns from here on; re-align them for the next step
        with torch.no_grad():
            for d, z in zip(dense, lazy):
                z.copy_(d)
                for key in ("exp_avg", "exp_avg_sq"):
                    opt_lazy.state[z][key].copy_(opt_dense.state[d][key])


def test_block_keep_keeps_whole_aligned_blocks():
    bench = _bench()
    keep = bench.block_keep(64, 0.75, 8, torch.Generator().manual_seed(0))
    assert keep.numel() == 16 and torch.equal(keep, keep.sort().values)
    assert torch.equal(keep.view(-1, 8) % 8, torch.arange(8).expand(2, 8))


def test_optimizer_bench_runs_and_writes_rows(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "opt.json"
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--hidden", "64", "--layers", "1", "--heads", "4", "--kv-heads", "2", "--reps", "1",
                           "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    result = json.loads(out.read_text())
    names = {row["impl"] for row in result["rows"]}
    assert {"single", "foreach", "fused"} <= names and sum(n.startswith("lazy") for n in names) == len(bench.LAZY)
    assert result["meta"]["params"] == sum(n * k for n, k in bench.rank_shapes(64, 1, 4, 2))
    assert all(row["median_ms"] > 0 for row in result["rows"])
    assert "x fused" in capsys.readouterr().out


def test_optimizer_bench_refuses_a_bad_size():
    with pytest.raises(SystemExit):
        _bench().main(["--hidden", "65"])
