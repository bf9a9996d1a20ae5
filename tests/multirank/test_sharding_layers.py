"""Uneven Col→GELU→Row MLPs (DESIGN §8) equal the dense MLP: semimig.nn layers with ``shard_sizes``.

Each spawn runs several plans on a fresh gloo group (a spawn costs seconds, a plan milliseconds);
hypothesis draws the plans.  The reference is the dense ``nn.Linear`` pair built on every rank from
the same seed.  Checked per plan: the output ``y``, the input gradient ``dx``, each rank's shard of
the weight and bias gradients, ``state_dict`` (the full tensors, gathered) and ``load_state_dict``
(a full tensor cut at the plan's offsets).

Tolerances.  fp32: the sharded pair sums over the intermediate dimension in a different order
(per-rank partial sums, then the all-reduce), ~1e-6 relative at these sizes; rtol = atol = 1e-5.
bf16: weights and activations bf16 in both; each rank's partial ``y`` and ``dx`` is rounded to
bf16 (eps 2^-8 ≈ 3.9e-3) before the all-reduce, so a few eps of the output's magnitude
(measured: at most 7.4e-3 · max|reference| for y and dx over five plans): rtol = 2e-2,
atol = 2e-2 · max|reference|.
"""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dist_harness import run_on_ranks

FP32_TOL = dict(rtol=1e-5, atol=1e-5)
SPAWN_PHASES = (Phase.explicit, Phase.generate)  # no shrinking: every example is a multi-second spawn


def _shard(t, plan, rank, dim):
    from semimig.sharding.split import shard

    return shard(t, plan, rank, dim=dim)


def _tol(dtype, ref):
    if dtype == torch.float32:
        return FP32_TOL
    return dict(rtol=2e-2, atol=2e-2 * float(ref.abs().max()))


def _one_plan(rank, world, units, unit_size, hidden, dtype, seed, bias, seq_split):
    import semimig.nn as snn
    from semimig.sharding import ShardPlan

    plan = ShardPlan(units=tuple(units), unit_size=unit_size)
    inter = plan.dimension
    torch.manual_seed(seed)
    col, row = nn.Linear(hidden, inter, bias=bias).to(dtype), nn.Linear(inter, hidden, bias=bias).to(dtype)
    x = torch.randn(2, 2 * world, hidden, dtype=dtype)  # [B, T, H]; T divides by world for sequence splits
    dy = torch.randn(2, 2 * world, hidden, dtype=dtype)
    group = dist.group.WORLD
    extra = {"seq_parallel_mode": "split_gather"} if seq_split else {}

    # dense reference, same weights
    xr = x.clone().requires_grad_(True)
    yr = row(nn.functional.gelu(col(xr)))
    yr.backward(dy)

    c = snn.Linear1D_Col.from_native_module(copy.deepcopy(col), group, shard_sizes=plan.sizes, **extra)
    r = snn.Linear1D_Row.from_native_module(copy.deepcopy(row), group, shard_sizes=plan.sizes, **extra)
    assert c.weight.shape == (plan.sizes[rank], hidden) and r.weight.shape == (hidden, plan.sizes[rank])
    assert (c.shard_plans is None) == plan.is_even

    def local(t):  # this rank's sequence chunk under split_gather, else the whole tensor
        return t.chunk(world, dim=1)[rank] if seq_split else t

    xs = local(x).clone().requires_grad_(True)
    y = r(nn.functional.gelu(c(xs)))
    y.backward(local(dy))

    torch.testing.assert_close(y, local(yr).detach(), **_tol(dtype, yr))
    torch.testing.assert_close(xs.grad, local(xr.grad), **_tol(dtype, xr.grad))
    torch.testing.assert_close(c.weight.grad, _shard(col.weight.grad, plan, rank, 0), **_tol(dtype, col.weight.grad))
    torch.testing.assert_close(r.weight.grad, _shard(row.weight.grad, plan, rank, 1), **_tol(dtype, row.weight.grad))
    if bias:
        torch.testing.assert_close(c.bias.grad, _shard(col.bias.grad, plan, rank, 0), **_tol(dtype, col.bias.grad))
        db = r.bias.grad.clone()
        if seq_split:  # the replicated bias sees only this rank's sequence chunk (Colossal-AI all-reduces it later)
            dist.all_reduce(db, group=group)
        torch.testing.assert_close(db, row.bias.grad, **_tol(dtype, row.bias.grad))

    # state_dict holds the full tensors; load_state_dict cuts full tensors at the plan's offsets
    for layer, dense in ((c, col), (r, row)):
        state = layer.state_dict()
        assert torch.equal(state["weight"], dense.weight.detach())
        if bias:
            assert torch.equal(state["bias"], dense.bias.detach())
        fresh = {k: torch.randn_like(v) for k, v in state.items()}
        layer.load_state_dict(fresh)
        dim = 0 if layer is c else 1
        assert torch.equal(layer.weight.detach(), _shard(fresh["weight"], plan, rank, dim))
        assert torch.equal(layer.state_dict()["weight"], fresh["weight"])


def _even_is_colossalai(rank, world):
    """Even shard_sizes take Colossal-AI's own path: the same shards (dist_layout and all) as no shard_sizes."""
    import semimig.nn as snn
    from colossalai.tensor.d_tensor import is_distributed_tensor

    torch.manual_seed(1)
    col, row = nn.Linear(8, 4 * world), nn.Linear(4 * world, 8)
    group = dist.group.WORLD
    for cls, dense in ((snn.Linear1D_Col, col), (snn.Linear1D_Row, row)):
        a = cls.from_native_module(copy.deepcopy(dense), group, shard_sizes=(4,) * world)
        b = cls.from_native_module(copy.deepcopy(dense), group)
        assert a.shard_plans is None and is_distributed_tensor(a.weight)
        assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)


def _refusals(rank, world):
    import semimig.nn as snn
    from semimig.errors import ConfigError

    group = dist.group.WORLD
    uneven = (5,) + (1,) * (world - 1)
    cases = [
        (snn.Linear1D_Col, {"gather_output": True}, "gather_output=True"),
        (snn.Linear1D_Row, {"parallel_input": False}, "parallel_input=False"),
    ]
    for cls, extra, needle in cases:
        with pytest.raises(ConfigError, match=needle):
            cls.from_native_module(nn.Linear(4 + world, 4 + world), group, shard_sizes=uneven, **extra)
    with pytest.raises(ConfigError, match="no weight given"):
        snn.Linear1D_Col(8, 4 + world, process_group=group, shard_sizes=uneven)
    with pytest.raises(ConfigError, match=rf"sum to {5 + world}, not out_features=8"):
        snn.Linear1D_Col.from_native_module(nn.Linear(4, 8), group, shard_sizes=(6,) + (1,) * (world - 1))
    with pytest.raises(ConfigError, match="has 1 entries"):
        snn.Linear1D_Row.from_native_module(nn.Linear(8, 4), group, shard_sizes=(8,))
    with pytest.raises(ConfigError, match=r"units\[1\] must be an int >= 0"):
        snn.Linear1D_Row.from_native_module(nn.Linear(8, 4), group, shard_sizes=(9, -1) + (0,) * (world - 2))


def _resizing_on_uneven(rank, world):
    """ZERO-resizing on top of an uneven row layer: each rank keeps every other column of its own shard;
    y, dx and dw equal the dense layer's with the dropped columns of x zeroed (pruned dw = 0, impute zero)."""
    import semimig.nn as snn
    from semimig.sharding import ShardPlan

    plan = ShardPlan(units=(1,) + (3,) * (world - 1), unit_size=4)
    torch.manual_seed(5)
    row = nn.Linear(plan.dimension, 8)
    x, dy = torch.randn(3, plan.dimension), torch.randn(3, 8)
    layer = snn.Linear1D_Row.from_native_module(copy.deepcopy(row), dist.group.WORLD, shard_sizes=plan.sizes)
    layer.directive = snn.LayerDirective(iteration=0, keep=torch.arange(0, plan.sizes[rank], 2))
    mask = torch.zeros(plan.dimension)
    for q in range(world):
        first, last = plan.column_range(q)
        mask[first:last:2] = 1.0
    start, stop = plan.column_range(rank)
    xs = x[:, start:stop].clone().requires_grad_(True)
    y = layer(xs)
    y.backward(dy)
    xr = x.clone().requires_grad_(True)
    yr = nn.functional.linear(xr * mask, row.weight, row.bias)
    yr.backward(dy)
    torch.testing.assert_close(y, yr.detach(), **FP32_TOL)
    torch.testing.assert_close(xs.grad, xr.grad[:, start:stop], **FP32_TOL)
    dw = torch.outer(torch.ones(8), mask) * (dy.T @ x)  # dense dw on kept columns, zero on pruned ones
    torch.testing.assert_close(layer.weight.grad, dw[:, start:stop], **FP32_TOL)


def _body(rank, world, cases, checks):
    for case in cases:
        _one_plan(rank, world, **case)
    if "even" in checks:
        _even_is_colossalai(rank, world)
    if "refusals" in checks:
        _refusals(rank, world)
    if "resizing" in checks:
        _resizing_on_uneven(rank, world)
    return len(cases)


def _plans(world, max_units=9):
    """Random uneven plans of ``world`` ranks: units ≥ 1 each, unit sizes 1-8."""
    return st.fixed_dictionaries({
        "units": st.lists(st.integers(1, max_units), min_size=world, max_size=world),
        "unit_size": st.integers(1, 8),
        "hidden": st.sampled_from([8, 16, 24]),
        "seed": st.integers(0, 2**16),
        "bias": st.booleans(),
        "seq_split": st.booleans(),
    })


def _run(world, cases, dtype, checks=()):
    cases = [dict(c, dtype=dtype) for c in cases]
    assert run_on_ranks(_body, world, cases, tuple(checks), timeout_s=120) == len(cases)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=SPAWN_PHASES)
@given(cases=st.lists(_plans(2), min_size=6, max_size=6))
def test_uneven_mlp_tp2_fp32(cases):
    _run(2, cases, torch.float32)


def test_extreme_plans_even_path_and_refusals_tp2():
    cases = [dict(units=u, unit_size=s, hidden=16, seed=i, bias=True, seq_split=False)
             for i, (u, s) in enumerate([((1, 31), 4), ((31, 1), 4), ((8, 8), 4), ((1, 1), 1)])]
    _run(2, cases, torch.float32, checks=("even", "refusals", "resizing"))


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=SPAWN_PHASES)
@given(cases=st.lists(_plans(4, max_units=5), min_size=4, max_size=4))
def test_uneven_mlp_tp4_fp32(cases):
    _run(4, cases, torch.float32, checks=("even", "refusals", "resizing"))


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=SPAWN_PHASES)
@given(cases=st.lists(_plans(2), min_size=4, max_size=4))
def test_uneven_mlp_tp2_bf16(cases):
    _run(2, cases, torch.bfloat16)


# ----------------------------------------------------------------------------- Llama attention, uneven KV groups
def _llama_attention(n_q, n_kv, head_dim, seed, dtype):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=n_q * head_dim, num_attention_heads=n_q, num_key_value_heads=n_kv,
                         intermediate_size=8, num_hidden_layers=1, vocab_size=16, attention_bias=False)
    config._attn_implementation = "sdpa"  # causal for q_len > 1 without a mask
    torch.manual_seed(seed)
    attention = LlamaAttention(config, layer_idx=0).to(dtype)
    x = torch.randn(2, 6, config.hidden_size, dtype=dtype)
    dy = torch.randn(2, 6, config.hidden_size, dtype=dtype)
    cos, sin = LlamaRotaryEmbedding(config)(x, torch.arange(6).unsqueeze(0))
    return attention, x, dy, (cos.to(dtype), sin.to(dtype))


def _attention_plan(units, n_q, n_kv, head_dim):
    from semimig.sharding import ShardPlan, kv_group_unit

    q_cols, _ = kv_group_unit(num_heads=n_q, num_kv_heads=n_kv, head_dim=head_dim)
    return ShardPlan.for_dimension(tuple(units), dimension=n_q * head_dim, unit_size=q_cols)


def _attention_body(rank, world, cases):
    """Hugging Face's LlamaAttention with q/k/v as uneven Linear1D_Col and o as Linear1D_Row (shard_sizes from a
    KV-group plan) equals the dense module: output, dx, and each projection's weight-gradient shard.
    transformers >= 4.48 reshapes heads with -1, so no per-rank head count is needed in its own forward."""
    import semimig.nn as snn
    from semimig.sharding.split import shard

    group = dist.group.WORLD
    for units, n_q, n_kv, head_dim, seed in cases:
        dense, x, dy, pos = _llama_attention(n_q, n_kv, head_dim, seed, torch.float32)
        plan = _attention_plan(units, n_q, n_kv, head_dim)
        kv_plan = plan.with_unit_size(head_dim)
        sharded = copy.deepcopy(dense)
        for name in ("q_proj", "k_proj", "v_proj"):
            sizes = (plan if name == "q_proj" else kv_plan).sizes
            setattr(sharded, name, snn.Linear1D_Col.from_native_module(getattr(sharded, name), group,
                                                                        shard_sizes=sizes))
        sharded.o_proj = snn.Linear1D_Row.from_native_module(sharded.o_proj, group, shard_sizes=plan.sizes)

        xr = x.clone().requires_grad_(True)
        yr = dense(xr, pos, None)[0]
        yr.backward(dy)
        xs = x.clone().requires_grad_(True)
        y = sharded(xs, pos, None)[0]
        y.backward(dy)
        torch.testing.assert_close(y, yr.detach(), **FP32_TOL)
        torch.testing.assert_close(xs.grad, xr.grad, **FP32_TOL)
        for name, p, dim in (("q_proj", plan, 0), ("k_proj", kv_plan, 0), ("v_proj", kv_plan, 0), ("o_proj", plan, 1)):
            got, full = getattr(sharded, name).weight.grad, getattr(dense, name).weight.grad
            torch.testing.assert_close(got, shard(full, p, rank, dim=dim), **FP32_TOL)
    return len(cases)


def _kv_units(world, n_kv):
    """Random compositions of ``n_kv`` KV groups into ``world`` parts ≥ 1."""
    return st.sets(st.integers(1, n_kv - 1), min_size=world - 1, max_size=world - 1).map(
        lambda cut: tuple(b - a for a, b in zip([0] + sorted(cut), sorted(cut) + [n_kv])))


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=SPAWN_PHASES)
@given(data=st.data())
def test_uneven_llama_attention_tp2_fp32(data):
    cases = []
    for n_q, n_kv, seed in ((8, 4, 0), (6, 3, 1), (8, 8, 2), (4, 2, 3)):  # GQA 2:1, 2:1, MHA, GQA
        cases.append((data.draw(_kv_units(2, n_kv)), n_q, n_kv, 4, seed))
    assert run_on_ranks(_attention_body, 2, cases, timeout_s=120) == len(cases)


def test_uneven_kv_groups_through_hf_llama_attention_single_process():
    """The split alone, one process, fp64: Σ_r LlamaAttention_r(x) with rank r's q/k/v rows and o columns
    equals the full LlamaAttention (sums over heads reordered only: 1e-12)."""
    from semimig.sharding.split import split_attention

    for units, n_q, n_kv in (((1, 3), 8, 4), ((2, 1, 3), 12, 6), ((1, 1, 1, 2), 10, 5)):
        dense, x, _, pos = _llama_attention(n_q, n_kv, 4, sum(units), torch.float64)
        plan = _attention_plan(units, n_q, n_kv, 4)
        full = dense(x, pos, None)[0]
        total = torch.zeros_like(full)
        for r in range(plan.tp):
            part = split_attention(dense.q_proj.weight, dense.k_proj.weight, dense.v_proj.weight,
                                   dense.o_proj.weight, plan, r, head_dim=4)
            assert (part.num_heads, part.num_kv_heads) == (units[r] * n_q // n_kv, units[r])
            rank_module = copy.deepcopy(dense)
            for name, weight in (("q_proj", part.q), ("k_proj", part.k), ("v_proj", part.v), ("o_proj", part.o)):
                layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=torch.float64)
                layer.weight.data.copy_(weight)
                setattr(rank_module, name, layer)
            total += rank_module(x, pos, None)[0]
        torch.testing.assert_close(total, full, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- training under an uneven plan
def _train_body(rank, world, plans, steps):
    """A residual stack of two Col→GELU→Row blocks trained with AdamW: the losses of every plan (uneven
    and even) equal dense single-process training's, and the gathered weights at the end too.
    AdamW is elementwise, so AdamW on the shards is AdamW on the full tensors; the row bias is
    replicated and gets the same full gradient on every rank."""
    import semimig.nn as snn
    from semimig.sharding import ShardPlan

    def build(seed):
        torch.manual_seed(seed)
        return nn.ModuleList([nn.ModuleList([nn.Linear(16, 48), nn.Linear(48, 16)]) for _ in range(2)])

    def forward(blocks, x):
        for col, row in blocks:
            x = x + row(nn.functional.gelu(col(x)))
        return x

    def train(blocks):
        torch.manual_seed(123)
        data = [(torch.randn(4, 3, 16), torch.randn(4, 3, 16)) for _ in range(steps)]
        opt = torch.optim.AdamW(blocks.parameters(), lr=1e-2, weight_decay=0.01)
        losses = []
        for x, target in data:
            opt.zero_grad()
            loss = nn.functional.mse_loss(forward(blocks, x), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    dense = build(7)
    reference = train(copy.deepcopy(dense))
    trained = copy.deepcopy(dense)
    train(trained)
    results = {}
    for units in plans:
        plan = ShardPlan(units=tuple(units), unit_size=48 // sum(units))
        blocks = copy.deepcopy(dense)
        for pair in blocks:
            pair[0] = snn.Linear1D_Col.from_native_module(pair[0], dist.group.WORLD, shard_sizes=plan.sizes)
            pair[1] = snn.Linear1D_Row.from_native_module(pair[1], dist.group.WORLD, shard_sizes=plan.sizes)
        losses = train(blocks)
        # fp32 reassociation in every step's sums over the intermediate dimension, carried through 20
        # AdamW steps: measured 2.1e-7 relative at worst (two fp32 ulps); rtol 1e-5
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference), rtol=1e-5, atol=0)
        for got, want in zip(blocks.state_dict().values(), trained.state_dict().values()):  # gathered full tensors
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        results[tuple(units)] = max(abs(a - b) / b for a, b in zip(losses, reference))
    return results


def test_twenty_adamw_steps_under_uneven_plans_match_dense_tp2():
    plans = [(1, 5), (5, 1), (2, 4), (3, 3)]  # units of 8 columns of 48; (3, 3) is the even layout
    worst = run_on_ranks(_train_body, 2, plans, 20, timeout_s=120)
    assert set(worst) == {tuple(p) for p in plans}


# ----------------------------------------------------------------------------- GPT-2 (fused QKV, Conv1D)
def _gpt2_block_body(rank, world, cases):
    """Hugging Face's GPT2Attention and GPT2MLP with semimig's GPT-2 layers under uneven head / block plans
    (as Colossal-AI's GPT-2 policy builds them: c_attn packed [Q, K, V], c_fc one part, Conv1D
    weights stored [in, out]; attn.split_size set to this rank's width) equal the dense modules."""
    import semimig.nn as snn
    from semimig.sharding import ShardPlan
    from semimig.sharding.split import shard, shard_packed
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, GPT2MLP

    group = dist.group.WORLD
    for heads, blocks, seed in cases:
        n_head, head_dim, block = sum(heads), 4, 8
        hidden = n_head * head_dim
        config = GPT2Config(n_embd=hidden, n_head=n_head, n_inner=block * sum(blocks), attn_pdrop=0.0,
                            resid_pdrop=0.0, n_layer=1, vocab_size=16)
        config._attn_implementation = "eager"
        head_plan, mlp_plan = ShardPlan(units=heads, unit_size=head_dim), ShardPlan(units=blocks, unit_size=block)
        torch.manual_seed(seed)
        dense = nn.ModuleList([GPT2Attention(config, layer_idx=0), GPT2MLP(config.n_inner, config)]).eval()
        sharded = copy.deepcopy(dense)
        attn, mlp = sharded
        attn.c_attn = snn.GPT2FusedLinearConv1D_Col.from_native_module(
            attn.c_attn, group, split_sizes=[hidden] * 3, shard_sizes=head_plan.sizes)
        attn.c_proj = snn.GPT2FusedLinearConv1D_Row.from_native_module(attn.c_proj, group, shard_sizes=head_plan.sizes)
        attn.split_size = attn.embed_dim = head_plan.sizes[rank]
        attn.num_heads = heads[rank]
        mlp.c_fc = snn.GPT2FusedLinearConv1D_Col.from_native_module(
            mlp.c_fc, group, split_sizes=[config.n_inner], shard_sizes=mlp_plan.sizes)
        mlp.c_proj = snn.GPT2FusedLinearConv1D_Row.from_native_module(mlp.c_proj, group, shard_sizes=mlp_plan.sizes)

        x, dy = torch.randn(2, 5, hidden), torch.randn(2, 5, hidden)
        outs = []
        for model in (dense, sharded):
            xi = x.clone().requires_grad_(True)
            y = model[1](model[0](xi)[0])
            y.backward(dy)
            outs.append((y.detach(), xi.grad))
        torch.testing.assert_close(outs[1][0], outs[0][0], **FP32_TOL)
        torch.testing.assert_close(outs[1][1], outs[0][1], **FP32_TOL)
        (d_attn, d_mlp), (s_attn, s_mlp) = dense, sharded
        torch.testing.assert_close(s_attn.c_attn.weight.grad, shard_packed(
            d_attn.c_attn.weight.grad, [hidden] * 3, [head_plan] * 3, rank, dim=1), **FP32_TOL)
        torch.testing.assert_close(s_attn.c_attn.bias.grad, shard_packed(
            d_attn.c_attn.bias.grad, [hidden] * 3, [head_plan] * 3, rank, dim=0), **FP32_TOL)
        torch.testing.assert_close(s_attn.c_proj.weight.grad, shard(d_attn.c_proj.weight.grad, head_plan, rank, dim=0),
                                   **FP32_TOL)
        torch.testing.assert_close(s_mlp.c_fc.weight.grad, shard(d_mlp.c_fc.weight.grad, mlp_plan, rank, dim=1),
                                   **FP32_TOL)
        torch.testing.assert_close(s_mlp.c_proj.weight.grad, shard(d_mlp.c_proj.weight.grad, mlp_plan, rank, dim=0),
                                   **FP32_TOL)
        # state_dict gathers the packed and transposed shards back to Hugging Face's full tensors
        for got, want in zip(sharded.state_dict().items(), dense.state_dict().items()):
            assert got[0] == want[0] and torch.equal(got[1], want[1]), got[0]
    return len(cases)


def _packed_gqa_body(rank, world, kv_units):
    """FusedLinear1D_Col over a packed GQA projection [Q, K, V] (Q twice as wide as K, V) with one plan per part
    (KV groups: 2 query heads per KV head): y is the packed shard [Q_r, K_r, V_r] of the dense y, dx the dense
    dx, dw the packed shard of the dense dw; state_dict gathers the full packed weight."""
    import semimig.nn as snn
    from semimig.sharding import ShardPlan
    from semimig.sharding.split import shard_packed

    head_dim, hidden = 4, 12
    q_plan, kv_plan = ShardPlan(units=kv_units, unit_size=2 * head_dim), ShardPlan(units=kv_units, unit_size=head_dim)
    parts, plans = [q_plan.dimension, kv_plan.dimension, kv_plan.dimension], [q_plan, kv_plan, kv_plan]
    torch.manual_seed(11)
    dense = nn.Linear(hidden, sum(parts))
    layer = snn.FusedLinear1D_Col.from_native_module(copy.deepcopy(dense), dist.group.WORLD, split_sizes=parts,
                                                     shard_sizes=tuple(p.sizes for p in plans))
    x, dy = torch.randn(3, hidden), torch.randn(3, sum(parts))
    xr, xs = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    yr = dense(xr)
    yr.backward(dy)
    y = layer(xs)
    y.backward(shard_packed(dy, parts, plans, rank, dim=-1))
    torch.testing.assert_close(y, shard_packed(yr.detach(), parts, plans, rank, dim=-1), **FP32_TOL)
    torch.testing.assert_close(xs.grad, xr.grad, **FP32_TOL)
    dw = shard_packed(dense.weight.grad, parts, plans, rank, dim=0)
    torch.testing.assert_close(layer.weight.grad, dw, **FP32_TOL)
    assert torch.equal(layer.state_dict()["weight"], dense.weight.detach())
    assert torch.equal(layer.state_dict()["bias"], dense.bias.detach())


def _gpt2_and_packed_body(rank, world, cases, kv_units):
    _packed_gqa_body(rank, world, kv_units)
    return _gpt2_block_body(rank, world, cases)


def test_uneven_gpt2_attention_and_mlp_tp2_fp32():
    cases = [((1, 3), (1, 5), 0), ((3, 1), (4, 2), 1), ((2, 2), (3, 3), 2), ((2, 5), (6, 1), 3)]
    assert run_on_ranks(_gpt2_and_packed_body, 2, cases, (1, 2), timeout_s=120) == len(cases)
