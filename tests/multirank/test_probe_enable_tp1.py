"""``semimig.enable`` on a ``tp_size=1`` plugin, and its argument refusals (probes).

One rank (gloo) boosts a tiny Llama with ``HybridParallelPlugin(tp_size=1,
custom_policy=SemiMigPolicy())``: the policy swaps no layer, which is not an error (refusing the
model as having "no semimig layers" would crash ``finetune_llm.py --tp 1``): ``enable`` warns
once (nothing to balance) and returns an inactive handle, the optimizer's step is untouched and
training goes on.  Every bad argument is refused first, naming it, and leaves no state: the
corrected call then works.
"""
from __future__ import annotations

import logging

from dist_harness import run_on_ranks


def _body(rank, world):
    import torch
    import transformers as T
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    import semimig
    from semimig._compat import apply_cpu_shim
    from semimig.controller.reshard import ReshardConfig
    from semimig.shardformer import SemiMigPolicy

    apply_cpu_shim()
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1))
    model.config.use_cache = False
    plugin = HybridParallelPlugin(tp_size=1, pp_size=1, precision="fp32", custom_policy=SemiMigPolicy())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(model, optimizer)
    out = {}
    bad = {"mode": dict(mode="bogus"), "log_every": dict(log_every=-1), "straggler": dict(straggler="fixed:x:4"),
           "config": dict(config="semi"), "optimizer": dict(optimizer=object()), "reshard": dict(reshard=object()),
           "reshard_mode": dict(mode="reshard", reshard="window=3")}
    for name, kwargs in bad.items():
        try:
            semimig.enable(model, plugin, **{"optimizer": optimizer, **kwargs})
            out[name] = "accepted"
        except semimig.ConfigError as err:
            out[name] = str(err)
        except Exception as err:  # a traceback from elsewhere: the probe fails
            out[name] = f"NOT ConfigError {type(err).__name__}: {err}"
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("semimig").addHandler(handler)
    step = optimizer.step
    balancer = semimig.enable(model, plugin, optimizer=optimizer, mode="reshard",
                              reshard=ReshardConfig(window=3), straggler="fixed:0:2")
    out["warnings"] = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    out["active"], out["hooked"] = balancer.active, optimizer.step != step
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(3):
        ids = torch.randint(0, 32, (2, 8), generator=gen)
        loss = model(input_ids=ids, labels=ids).loss
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    out["losses"], out["report"] = losses, balancer.report
    balancer.close()
    return out


def test_enable_on_a_tp_1_plugin_warns_once_and_trains_and_refuses_bad_arguments_first() -> None:
    out = run_on_ranks(_body, 1, timeout_s=240)
    expect = {"mode": "bogus", "log_every": "-1", "straggler": "fixed:x:4", "config": "semi", "optimizer": "object",
              "reshard": "reshard", "reshard_mode": "window=3"}
    for name, text in expect.items():
        assert not out[name].startswith(("accepted", "NOT")) and text in out[name] and "\n" not in out[name], \
            (name, out[name])
    assert len(out["warnings"]) == 1 and "tp_size=1" in out["warnings"][0], out["warnings"]
    assert out["active"] is False and out["hooked"] is False and out["report"] is None
    assert len(out["losses"]) == 3 and all(loss == loss and abs(loss) < 1e3 for loss in out["losses"])
    assert out["losses"][-1] < out["losses"][0]  # SGD on the same generator's batches: it learns
