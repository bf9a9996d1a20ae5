"""The joint re-plan's pure parts (semimig.resharder.joint) and BatchSplit's memory field."""
from __future__ import annotations

import math

import pytest

from semimig.controller.reshard import ReshardSample
from semimig.errors import ConfigError
from semimig.hybrid.split import BatchSplit
from semimig.resharder.joint import JointSetup, even_samples, own_compute, per_mean_batch


def test_memory_bytes_is_checked_by_name_and_read_back():
    for bad in (0, -1.0, "8G", math.nan):
        with pytest.raises(ConfigError, match="BatchSplit.memory_bytes"):
            BatchSplit(global_batch_size=8, memory_bytes=bad)
    assert BatchSplit(global_batch_size=8, memory_bytes=2e9).capacity() == 2e9
    assert BatchSplit(global_batch_size=8, memory_bytes=math.inf).capacity() == math.inf
    assert BatchSplit(global_batch_size=8).capacity("cpu") == math.inf  # no CUDA device: unlimited


def test_even_samples_and_a_batch_too_small_for_the_replicas():
    assert even_samples(8, 2) == (4, 4) and even_samples(7, 3) == (3, 2, 2)
    with pytest.raises(ConfigError, match="global_batch_size=1"):
        JointSetup(global_batch=1, dp=2, bytes_per_unit=(1.0, 1.0), fixed_bytes=0.0, capacity_bytes=None)


def test_per_mean_batch_scales_the_work_not_the_collectives():
    sample = ReshardSample((2.0, 4.0), (1.0, 3.0), (0.5, 0.5), gemm_s=(0.8, 2.0))
    scaled = per_mean_batch(sample, 2, 4.0)  # 2 samples read at the mean batch of 4: twice the work
    assert scaled.compute_s == (4.0, 8.0) and scaled.shardable_s == (2.0, 6.0) and scaled.gemm_s == (1.6, 4.0)
    assert scaled.comm_s == sample.comm_s
    assert per_mean_batch(sample, 4, 4.0) is sample


def test_own_compute_takes_the_wait_for_the_slower_replica_out():
    # k = R/S = 0.5 (read from the replicas), share 0.5 each: a rank computes 2x its shardable seconds.  Replica 1's rank 1 is 4x
    # slow (8 s); replica 0 (healthy, 2 s of work) waits 6 s for it in the gradient reduction, read as compute
    compute = [[8.0, 8.0], [2.0, 8.0]]
    shardable = [[1.0, 1.0], [1.0, 4.0]]
    shares = [[0.5, 0.5], [0.5, 0.5]]
    own = own_compute(compute, shardable, shares)
    assert own[1] == [2.0, 8.0]  # the slowest replica waits for no one: as measured
    assert own[0] == pytest.approx([2.0, 2.0])  # alpha 4 against 1: its compute scaled by a quarter
    assert own_compute([[2.0, 2.0], [2.0, 2.0]], [[1.0, 1.0]] * 2, shares) == [[2.0, 2.0], [2.0, 2.0]]
