"""Which K columns a migrating straggler hands to which peer (pure, no communication).

A straggler ``k`` hands its last ``L_k`` K columns, ``[K - L_k, K)``, to the receivers of the
tensor-parallel group.  The migrated columns are always a contiguous block at the end of K so
that the broadcast payload ``W_k[:, K-L_k:]`` is one slice and receiver ranges are plain
offsets into it.  Which columns migrate does not matter for the result: migration is exact.

Receivers are the ranks that do not migrate themselves.  They are renumbered virtually from the
straggler, ``r' = (r + e - k) % e`` (DESIGN §2), sorted by ``r'``, and receiver ``i`` (0-based
in that order) computes the offsets ``[start_i, stop_i)`` of the block, each receiver taking
``m = L_k // n_recv`` columns and the first ``L_k % n_recv`` receivers one more.

Every rank builds the same layout from the same numbers, so nothing is communicated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True)
class StragglerShare:
    """The columns one straggler migrates and how they are split among receivers.

    ``count`` columns ``[k_total - count, k_total)`` leave rank ``straggler``; receiver
    ``receivers[i]`` computes block offsets ``ranges[i] = (start, stop)``.
    """

    straggler: int
    count: int
    receivers: tuple[int, ...]
    ranges: tuple[tuple[int, int], ...]

    def range_of(self, rank: int) -> tuple[int, int] | None:
        """Block offsets ``(start, stop)`` this rank computes for the straggler, or None."""
        for receiver, span in zip(self.receivers, self.ranges):
            if receiver == rank:
                return span
        return None


@dataclass(frozen=True)
class MigrationLayout:
    """Migration of K columns inside one tensor-parallel group, identical on every rank.

    ``shares`` is sorted by straggler rank; ``k_total`` is the K of every rank's shard.
    """

    group_size: int
    k_total: int
    shares: tuple[StragglerShare, ...]

    @staticmethod
    def build(group_size: int, k_total: int, migrate: Mapping[int, int],
              receivers: Sequence[int] | None = None) -> "MigrationLayout":
        """Lay out ``migrate = {straggler_rank: L_k}`` for a group of ``group_size`` ranks.

        ``receivers``: the ranks that compute migrated columns (the controller's plan, e.g.
        only the non-stragglers); ``None`` means every rank that does not migrate.
        Raises ValueError for ranks outside the group, counts outside ``[0, k_total]``, a
        receiver that migrates itself, or a plan in which nobody is left to receive.
        """
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if k_total < 0:
            raise ValueError(f"k_total must be >= 0, got {k_total}")
        active = {}
        for rank, count in migrate.items():
            if not 0 <= rank < group_size:
                raise ValueError(f"straggler rank {rank} is outside the group of size {group_size}")
            if not 0 <= count <= k_total:
                raise ValueError(f"rank {rank} cannot migrate {count} of its {k_total} columns")
            if count > 0:
                active[rank] = int(count)
        if receivers is None:
            receivers_all = [r for r in range(group_size) if r not in active]
        else:
            receivers_all = sorted(set(receivers))
            for r in receivers_all:
                if not 0 <= r < group_size:
                    raise ValueError(f"receiver rank {r} is outside the group of size {group_size}")
                if r in active:
                    raise ValueError(f"rank {r} cannot both migrate {active[r]} columns and receive")
        if active and not receivers_all:
            raise ValueError(f"ranks {sorted(active)} migrate but no receiver is left in the group of size {group_size}")
        shares = []
        for k in sorted(active):
            receivers = tuple(sorted(receivers_all, key=lambda r: (r + group_size - k) % group_size))
            count = active[k]
            base, extra = divmod(count, len(receivers))
            ranges, start = [], 0
            for i in range(len(receivers)):
                width = base + (1 if i < extra else 0)
                ranges.append((start, start + width))
                start += width
            shares.append(StragglerShare(straggler=k, count=count, receivers=receivers, ranges=tuple(ranges)))
        return MigrationLayout(group_size=group_size, k_total=k_total, shares=tuple(shares))

    def migrated_count(self, rank: int) -> int:
        """``L_k`` for ``rank`` (0 when it does not migrate)."""
        for share in self.shares:
            if share.straggler == rank:
                return share.count
        return 0

    def own_columns(self, rank: int) -> int:
        """How many leading K columns ``rank`` still owns: ``K - L_rank``."""
        return self.k_total - self.migrated_count(rank)

    @property
    def active(self) -> bool:
        return bool(self.shares)
