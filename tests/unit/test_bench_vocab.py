"""The tiny Llama's vocabulary covers the data and gives every tensor-parallel rank a shard of real ids:
Colossal-AI pads the vocabulary to a multiple of 64·tp, and a rank whose shard is padding only fails
in its cross entropy."""
from __future__ import annotations

import argparse

import pytest

from semimig.bench.llm.build import VOCAB_MULTIPLE, model_config


def _args(data: str) -> argparse.Namespace:
    return argparse.Namespace(model="tiny-llama", data=data, hidden=64, layers=1, heads=8, kv_heads=8, seq_len=32)


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("data", ["shakespeare", "synthetic"])
def test_every_rank_holds_real_ids(tp, data):
    vocab = model_config(_args(data), tp).vocab_size
    data_ids = 256 if data == "shakespeare" else 512
    assert vocab >= data_ids                                  # every id the data feeds is in the table
    padded = -(-vocab // (VOCAB_MULTIPLE * tp)) * VOCAB_MULTIPLE * tp
    shard = padded // tp
    assert vocab > (tp - 1) * shard                           # the last rank's shard starts below the vocabulary


def test_small_tp_keeps_the_data_vocabulary():
    assert model_config(_args("shakespeare"), 4).vocab_size == 256
