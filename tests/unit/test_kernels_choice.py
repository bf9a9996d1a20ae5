"""``semimig.kernels.choice``: at a new key every path runs and the faster is kept; later launches
with the key run that path alone; results are the chosen path's own."""
import torch

from semimig.kernels import choice


def _paths(calls: dict, x: torch.Tensor, w: torch.Tensor) -> dict:
    def fast():
        calls["fast"] += 1
        return x @ w

    def slow():  # the same product, after work a fast path does not do
        calls["slow"] += 1
        for _ in range(40):
            (x @ w).sum()
        return x @ w
    return {"slow": slow, "fast": fast}


def test_the_faster_path_is_chosen_once_and_then_runs_alone() -> None:
    choice.forget()
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(256, 256, generator=gen), torch.randn(256, 256, generator=gen)
    calls = {"fast": 0, "slow": 0}
    key = ("fwd", "test", 1)
    first = choice.fastest(key, torch.device("cpu"), _paths(calls, x, w))
    assert choice.choices() == {key: "fast"}
    assert calls == {"fast": 1 + choice.TRIALS, "slow": 1 + choice.TRIALS}
    again = choice.fastest(key, torch.device("cpu"), _paths(calls, x, w))
    assert calls == {"fast": 2 + choice.TRIALS, "slow": 1 + choice.TRIALS}
    assert torch.equal(first, x @ w) and torch.equal(again, x @ w)
    choice.forget()
    assert choice.choices() == {}


def test_keys_are_decided_apart() -> None:
    choice.forget()
    x = torch.randn(64, 64)
    one, two = ("dgrad", 1), ("dgrad", 2)
    choice.fastest(one, torch.device("cpu"), {"only": lambda: x})
    choice.fastest(two, torch.device("cpu"), {"other": lambda: x})
    assert choice.choices() == {one: "only", two: "other"}
    choice.forget()
