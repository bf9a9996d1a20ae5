"""Probes of the entry points merged for re-sharding and the emulated cluster.

One process, no process group: every case is a bad input that must be refused with a one-line
:class:`~semimig.errors.ConfigError` naming the argument and the value (CLI: exit 2, one
``semimig cluster: error:`` line), never a torch / Colossal-AI / Python traceback.  The cluster
cases are all refused during validation, so no network namespace is ever made.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semimig.errors import ConfigError
from semimig.sharding import ShardPlan
from semimig.shardformer.uneven import UnevenPlan, plan_from_flags


def _refused(call, *names: str) -> str:
    with pytest.raises(ConfigError) as info:
        call()
    text = str(info.value)
    assert "\n" not in text and all(name in text for name in names), text
    return text


# ------------------------------------------------------------------------- ShardPlan
@pytest.mark.parametrize("units", [(), [], (0,), (2, -1), (1.5, 2), ("2", 2), (True, 2), None, "12", 3,
                                   (2, None), (float("nan"),)])
def test_shard_plan_units_that_are_not_positive_ints_are_refused(units) -> None:
    _refused(lambda: ShardPlan(units=units), "units")


@pytest.mark.parametrize("total, tp, name", [(7, 2, "7"), (0, 2, "total_units"), (4, 0, "tp"), (4, -1, "tp"),
                                              ("4", 2, "total_units"), (4, 2.0, "tp"), (4, True, "tp")])
def test_shard_plan_even_refuses_bad_totals_and_sizes(total, tp, name) -> None:
    _refused(lambda: ShardPlan.even(total, tp), name)


@pytest.mark.parametrize("unit_size", [0, -3, 1.5, "8", None, True])
def test_shard_plan_unit_size_must_be_a_positive_int(unit_size) -> None:
    _refused(lambda: ShardPlan(units=(2, 2), unit_size=unit_size), "unit_size")


@settings(max_examples=40, deadline=None)
@given(units=st.lists(st.integers(-3, 5), min_size=1, max_size=5))
def test_shard_plan_is_accepted_exactly_when_no_rank_holds_fewer_than_none_and_some_rank_holds_a_unit(units) -> None:
    if all(u >= 0 for u in units) and sum(units) >= 1:  # a rank may hold no units of a kind
        plan = ShardPlan(units=tuple(units))
        assert plan.tp == len(units) and plan.total_units == sum(units) and plan.offsets()[-1] <= plan.dimension
    else:
        _refused(lambda: ShardPlan(units=tuple(units)), "units")


# ------------------------------------------------------------------------- UnevenPlan
def _llama(intermediate: int = 256, kv: int = 4):
    import transformers as T

    return T.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=intermediate, num_hidden_layers=1,
                         num_attention_heads=8, num_key_value_heads=kv)


@pytest.mark.parametrize("kwargs, name", [({"mlp_units": (-1, 2)}, "mlp_units"), ({"mlp_units": (0, 0)}, "mlp_units"), ({"kv_units": ("a", 1)}, "kv_units"),
                                          ({"mlp_units": 5}, "mlp_units"), ({"kv_units": "3,1"}, "kv_units"),
                                          ({"block_size": 0}, "block_size"), ({"block_size": -1}, "block_size"),
                                          ({"block_size": 1.5}, "block_size"), ({"block_size": True}, "block_size")])
def test_uneven_plan_bad_fields_are_refused(kwargs, name) -> None:
    _refused(lambda: UnevenPlan(**kwargs), name)


@pytest.mark.parametrize("plan, tp, names", [
    (UnevenPlan(mlp_units=(1, 1, 1), block_size=64), 2, ("units=(1, 1, 1)", "tp=2")),   # 3 ranks' units at tp 2
    (UnevenPlan(mlp_units=(3, 2), block_size=64), 2, ("mlp_units",)),            # 5 blocks, the model has 4
    (UnevenPlan(kv_units=(3, 2)), 2, ("kv_units",)),                             # 5 KV groups, the model has 4
    (UnevenPlan(kv_units=(1, 1, 1, 1, 1)), 5, ("5",)),                           # more ranks than KV groups
    (UnevenPlan(), 0, ("tp",)), (UnevenPlan(), "2", ("tp",)), (UnevenPlan(), 3, ("tp=3",)),
])
def test_a_plan_that_does_not_fit_the_model_is_refused_naming_it(plan, tp, names) -> None:
    _refused(lambda: plan.resolve(_llama(), tp), *names)


@pytest.mark.parametrize("text", ["a,b", "1,2:3", "1,2:3,4:5", "0,0", "-1,5", "1.5,2", "2,1", ",", "1,,1", "2;2"])
def test_shard_plan_flag_syntax_and_sums_are_refused_naming_the_flag(text) -> None:
    _refused(lambda: plan_from_flags(text, _llama(), 2, block_size=64), "--shard-plan")


def test_a_valid_shard_plan_flag_resolves() -> None:
    plan = plan_from_flags("3,1:3,1", _llama(), 2, block_size=64)
    assert plan.mlp_units == (3, 1) and plan.kv_units == (3, 1)
    assert plan_from_flags(None, _llama(), 2) is None


# ------------------------------------------------------------------------- apply_plan / current_plan
def test_apply_plan_and_current_plan_refuse_what_they_cannot_re_plan() -> None:
    from semimig.sharding import apply_plan, current_plan

    linear = torch.nn.Linear(4, 4)
    sgd = torch.optim.SGD(linear.parameters(), lr=0.1)
    _refused(lambda: apply_plan(linear, sgd, "3,1"), "new_plan", "str")
    _refused(lambda: apply_plan(linear, sgd, {"mlp_units": (3, 1)}), "new_plan", "dict")
    _refused(lambda: apply_plan(linear, sgd, UnevenPlan(mlp_units=(3, 1))), "Linear")
    _refused(lambda: current_plan(linear), "Linear")
    import transformers as T

    dense = T.LlamaForCausalLM(_llama())  # a Hugging Face model never built with SemiMigPolicy
    _refused(lambda: current_plan(dense), "LlamaForCausalLM")
    _refused(lambda: apply_plan(dense, torch.optim.SGD(dense.parameters(), lr=0.1), UnevenPlan()),
             "LlamaForCausalLM")


# ------------------------------------------------------------------------- semimig cluster
CLUSTER_REFUSALS = [
    ([], "--nodes"), (["--nodes", "2"], "--link-gbit"), (["--link-gbit", "1"], "--nodes"),
    (["--nodes", "0", "--link-gbit", "1"], "--nodes"), (["--nodes", "-1", "--link-gbit", "1"], "--nodes"),
    (["--nodes", "2", "--link-gbit", "0"], "--link-gbit"), (["--nodes", "2", "--link-gbit", "-1"], "--link-gbit"),
    (["--nodes", "2", "--link-gbit", "nan"], "--link-gbit"), (["--nodes", "2", "--link-gbit", "inf"], "--link-gbit"),
    (["--nodes", "2", "--link-gbit", "1", "--nproc-per-node", "0"], "--nproc-per-node"),
    (["--nodes", "2", "--link-gbit", "1", "--link-delay-ms", "-1"], "--link-delay-ms"),
    (["--nodes", "2", "--link-gbit", "1", "--link-delay-ms", "nan"], "--link-delay-ms"),
    (["--nodes", "2", "--link-gbit", "1", "--straggler-link-gbit", "0"], "--straggler-link-gbit"),
    (["--nodes", "2", "--link-gbit", "1", "--straggler-link-gbit", "inf"], "--straggler-link-gbit"),
    (["--nodes", "2", "--link-gbit", "1", "--straggler-link-gbit", "0.5", "--straggler-node", "2"], "--straggler-node"),
    (["--nodes", "2", "--link-gbit", "1", "--straggler-link-gbit", "0.5", "--straggler-node", "-1"],
     "--straggler-node"),
    (["--nodes", "2", "--link-gbit", "1", "--run-id", "ABC"], "--run-id"),
    (["--nodes", "2", "--link-gbit", "1", "--run-id", "toolong1"], "--run-id"),
    (["--nodes", "2", "--link-gbit", "1", "--run-id", ""], "--run-id"),
    (["--nodes", "2", "--link-gbit", "1", "--timeout", "0"], "--timeout"),
    (["--nodes", "2", "--link-gbit", "1", "--timeout", "nan"], "--timeout"),
    (["--nodes", "2", "--link-gbit", "1", "--grace", "-1"], "--grace"),
    (["--nodes", "2", "--link-gbit", "1", "--grace", "1000"], "--grace"),
]


@pytest.mark.parametrize("argv, name", CLUSTER_REFUSALS, ids=[" ".join(a) or "none" for a, _ in CLUSTER_REFUSALS])
def test_semimig_cluster_refuses_bad_flags_in_one_line(argv, name, capsys) -> None:
    from semimig.cluster.cli import main

    with_script = argv + ["--", "train.py"] if argv else argv  # [] also lacks the script: either is named
    assert main(with_script) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("semimig cluster") and name in lines[0], captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_semimig_cluster_without_a_script_and_with_a_non_number_is_refused(capsys) -> None:
    from semimig.cluster.cli import main

    assert main(["--nodes", "2", "--link-gbit", "1"]) == 2
    assert "no script" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["--nodes", "two", "--link-gbit", "1", "--", "train.py"])
    assert stop.value.code == 2 and "--nodes" in capsys.readouterr().err
    assert math.isfinite(1.0)
