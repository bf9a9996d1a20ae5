"""Keep sets the kernel tests draw from (shared by the torch-path and Triton test modules)."""
import torch


def make_keep(kind, k, rng, group=8, *, min_random=0):
    """A sorted int64 keep set of ``k`` columns of the given kind.

    ``run`` keeps one contiguous range of at least one column; ``random`` keeps between
    ``min_random`` and ``k`` columns; ``grouped`` keeps about half of the aligned blocks of
    ``group`` columns (``k`` must be a multiple of ``group``).
    """
    if kind == "empty":
        return torch.empty(0, dtype=torch.int64)
    if kind == "full":
        return torch.arange(k)
    if kind == "single":
        return torch.randint(k, (1,), generator=rng)
    if kind == "run":  # one contiguous run [a, b), k >= 1: the slice path of the torch twins
        a = int(torch.randint(k, (1,), generator=rng))
        return torch.arange(a, int(torch.randint(a + 1, k + 1, (1,), generator=rng)))
    if kind == "random":
        n = int(torch.randint(min_random, k + 1, (1,), generator=rng))
        return torch.sort(torch.randperm(k, generator=rng)[:n]).values
    blocks = torch.randperm(k // group, generator=rng)[: max(1, k // group // 2)]
    return (torch.sort(blocks).values[:, None] * group + torch.arange(group)).flatten()
