"""The bench harness's one training loop (``semimig.bench.loop``), shared by the TP and 2-D cases.

- ``timed_epochs`` calls the case's step once per batch with the run-wide iteration count, calls
  ``on_epoch`` before each epoch and ``sync`` before each clock reading, and times each iteration
  from the end of the one before: slept steps of known length come back as those lengths (to a
  scheduler's slack, generous: a loaded CI machine), the warm-up is left out of the median, the first epoch out of the mean;
- a warm-up that leaves nothing to time is refused, naming it;
- ``one_cycle`` runs every run length from 1 to 300 steps (torch's own raised at 10) and keeps
  torch's 10 % warm-up wherever that works;
- ``dense_accuracy`` counts correct classifications of a real model, inside the controller's dense
  context, and leaves the model in training mode.
"""
from __future__ import annotations

import contextlib
import time

import pytest
import torch

from semimig.bench.loop import dense_accuracy, one_cycle, timed_epochs


def test_the_loop_calls_every_step_in_order_and_times_each_from_the_last():
    calls, epochs, syncs = [], [], []
    sleeps = [0.02, 0.06, 0.04, 0.08, 0.02, 0.10]  # two epochs of three iterations

    def step(epoch, iteration, batch):
        calls.append((epoch, iteration, batch))
        time.sleep(sleeps[iteration])

    timed = timed_epochs(2, 2, lambda e: [f"b{e}{i}" for i in range(3)], step, on_epoch=epochs.append,
                         sync=lambda: syncs.append(len(calls)))
    assert calls == [(0, 0, "b00"), (0, 1, "b01"), (0, 2, "b02"), (1, 3, "b10"), (1, 4, "b11"), (1, 5, "b12")]
    assert epochs == [0, 1] and syncs == [1, 2, 3, 4, 5, 6]  # one sync per step, after it
    assert len(timed.all_iter_times) == 6 and timed.iter_times == timed.all_iter_times[2:]
    for measured, slept in zip(timed.all_iter_times, sleeps):  # a time shifted by one iteration would
        assert slept <= measured < slept + 0.5, (measured, slept)  # read a shorter sleep somewhere: lower bound
    assert timed.iter_time_s == pytest.approx(sorted(timed.iter_times)[1] / 2 + sorted(timed.iter_times)[2] / 2)
    assert timed.epoch_time_s == timed.epoch_times[1]  # the first epoch left out
    assert sum(sleeps[3:]) <= timed.epoch_times[1] < sum(sleeps[3:]) + 1.0  # slack: a loaded machine


def test_one_epoch_is_its_own_mean_and_a_warmup_that_leaves_nothing_is_refused():
    timed = timed_epochs(1, 0, lambda e: range(2), lambda e, i, b: None)
    assert timed.epoch_time_s == timed.epoch_times[0] and len(timed.iter_times) == 2
    with pytest.raises(ValueError, match="warmup_iters=2"):
        timed_epochs(1, 2, lambda e: range(2), lambda e, i, b: None)


class _Logits(torch.nn.Module):
    """Classifies by the argmax of its input (pixel_values are logits already), counts dense entries."""

    def __init__(self):
        super().__init__()
        self.dense_calls = 0
        self.in_dense = False

    def forward(self, pixel_values):
        assert not self.training and self.in_dense and not torch.is_grad_enabled()
        self.dense_calls += 1
        return type("Out", (), {"logits": pixel_values})()


class _Controller:
    def __init__(self, model):
        self.model = model

    @contextlib.contextmanager
    def dense(self):
        self.model.in_dense = True
        try:
            yield
        finally:
            self.model.in_dense = False


def test_dense_accuracy_counts_in_batches_inside_the_dense_context_and_restores_training():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 10, generator=gen)
    y = x.argmax(-1)
    y[:75] = (y[:75] + 1) % 10  # a quarter wrong
    model = _Logits().train()
    assert dense_accuracy(model, _Controller(model), x, y) == pytest.approx(0.75)
    assert model.training and model.dense_calls == 3  # 128 + 128 + 44
    with pytest.raises(AssertionError):  # no controller: no dense context (the fake asserts one)
        dense_accuracy(model, None, x, y)
    assert model.training  # restored on the way out of a failure too


def test_one_cycle_runs_every_length_and_keeps_the_ten_percent_warmup_elsewhere():
    for total in range(1, 301):
        param = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([param], lr=1.0)
        schedule = one_cycle(opt, 1e-3, total)
        lrs = [opt.param_groups[0]["lr"]]
        for _ in range(total - 1):
            opt.step()
            schedule.step()
            lrs.append(opt.param_groups[0]["lr"])
        assert all(0 < lr <= 1e-3 * (1 + 1e-9) for lr in lrs), (total, lrs)
        expected = 0.15 if total == 10 else 0.1
        assert schedule._schedule_phases[0]["end_step"] == pytest.approx(expected * total - 1), total
    reference = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ZeroDivisionError):  # why: torch's own at 10 steps
        torch.optim.lr_scheduler.OneCycleLR(reference, max_lr=1e-3, pct_start=0.1, total_steps=10)
