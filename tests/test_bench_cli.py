"""``semimig bench`` end to end on a tiny budget: table, JSON with the documented keys, plots."""
import json

import pytest


def test_bench_writes_json_and_plots(tmp_path, capsys):
    from semimig.cli import main

    out = tmp_path / "r.json"
    code = main(["bench", "--quick", "--modes", "baseline,zero-pri,semi", "--chi", "1,4", "--epochs", "1",
                 "--iters-per-epoch", "6", "--json", str(out), "--plots", str(tmp_path)])
    assert code == 0
    data = json.loads(out.read_text())
    assert {"records", "machine", "config"} <= data.keys()
    records = data["records"]
    assert len(records) == 6
    for r in records:
        assert {"mode", "chi", "seed", "iter_time_s", "epoch_time_s", "accuracy"} <= r.keys()
        assert r["iter_time_s"] > 0 and 0.0 <= r["accuracy"] <= 1.0
    by = {(r["mode"], r["chi"]): r for r in records}
    # the straggler (rank 1) sheds work under ZERO at chi = 4, never at chi = 1 on rank 0
    assert by[("zero-pri", 4.0)]["shed_share_by_rank"][1] > 0
    assert (tmp_path / "rt_vs_chi.png").stat().st_size > 0
    assert (tmp_path / "acc_delta.png").stat().st_size > 0
    assert "semimig bench" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["bench", "--modes", "zero-foo"], "unknown mode 'zero-foo'"),
    (["bench", "--chi", "1,x"], "comma-separated numbers"),
])
def test_bench_rejects_bad_flags(argv, message, capsys):
    from semimig.cli import main

    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err
