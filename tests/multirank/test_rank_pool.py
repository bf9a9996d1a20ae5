"""The test run's rank pool (tests/rank_pool.py): results, bounded failures, a fresh pool after one,
nothing of one case left for the next."""
import os
import time

import pytest
import torch
import torch.distributed as dist

import rank_pool
from rank_pool import RankFailure, run_pooled
from semimig.launch import RanksTimedOut


def _sum_ranks(rank, world):
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    return float(t), os.getpid()


def _raise_on_one(rank, world):
    if rank == 1:
        raise ValueError("rank one refuses")
    dist.barrier()  # rank 0 waits on its peer: the pool must not wait for the collective timeout


def _hang_on_one(rank, world):
    if rank == 1:
        time.sleep(3600)
    dist.barrier()


def _die_on_one(rank, world):
    if rank == 1:
        os._exit(3)
    dist.barrier()


def _dirty(rank, world):
    os.environ["SEMIMIG_POOL_LEFTOVER"] = "1"
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.Tensor.semimig_leftover = 1
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(99)
    return torch.rand(1).item()


def _clean(rank, world):
    return ("SEMIMIG_POOL_LEFTOVER" in os.environ, hasattr(torch.Tensor, "semimig_leftover"),
            torch.get_default_dtype(), torch.initial_seed(), torch.rand(1).item())


def _fresh_state(rank, world):
    return torch.initial_seed(), torch.rand(1).item()


def _many_groups(rank, world, n):
    for _ in range(n):
        dist.new_group(list(range(world)))
    return os.getpid()


def _pid(rank, world):
    return os.getpid()


def test_a_case_returns_rank_zeros_result_and_the_pool_is_reused():
    first, pid1 = run_pooled(_sum_ranks, 2)
    second, pid2 = run_pooled(_sum_ranks, 2)
    assert first == second == 3.0
    assert pid1 == pid2  # one spawn served both cases


def test_a_raising_rank_fails_the_case_with_its_traceback_fast_and_the_next_case_runs():
    start = time.monotonic()
    with pytest.raises(RankFailure, match=r"(?s)rank 1 of 2 failed.*ValueError: rank one refuses"):
        run_pooled(_raise_on_one, 2, timeout_s=30)
    assert time.monotonic() - start < 15  # the grace, not the 60 s collective timeout
    assert run_pooled(_sum_ranks, 2)[0] == 3.0


def test_a_hanging_rank_times_out_the_case_and_the_next_case_runs():
    with pytest.raises(RanksTimedOut, match=r"ranks \[.*1.*\] of 2 did not finish within 3 s"):
        run_pooled(_hang_on_one, 2, timeout_s=3)
    assert run_pooled(_sum_ranks, 2)[0] == 3.0


def test_a_dead_rank_is_named_and_the_next_case_runs():
    with pytest.raises(RankFailure, match="rank 1 of 2 exited with code 3"):
        run_pooled(_die_on_one, 2, timeout_s=30)
    assert run_pooled(_sum_ranks, 2)[0] == 3.0


def test_nothing_of_a_case_is_left_for_the_next():
    run_pooled(_dirty, 2)
    leftover_env, leftover_attr, dtype, seed, draw = run_pooled(_clean, 2)
    fresh_seed, fresh_draw = rank_pool.run_on_ranks(_fresh_state, 2)  # what a fresh rank sees
    assert not leftover_env and not leftover_attr and dtype == torch.float32
    assert (seed, draw) == (fresh_seed, fresh_draw)


def test_too_many_groups_retire_the_pool():
    pid = run_pooled(_many_groups, 2, rank_pool.MAX_GROUPS + 1)
    assert run_pooled(_pid, 2) != pid


def test_a_body_not_pickled_by_reference_is_refused_in_the_test():
    with pytest.raises(Exception, match="(?i)pickle|attribute"):
        run_pooled(lambda rank, world: None, 2)
