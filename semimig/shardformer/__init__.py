"""ShardFormer integration: :class:`SemiMigPolicy` swaps semimig's layers into any policy;
:class:`UnevenPlan` makes its tensor-parallel shards uneven (DESIGN §8)."""
from semimig.shardformer.policy import SemiMigPolicy
from semimig.shardformer.uneven import UnevenPlan, plan_from_flags

__all__ = ["SemiMigPolicy", "UnevenPlan", "plan_from_flags"]
