"""ShardFormer integration: :class:`SemiMigPolicy` swaps semimig's layers into any policy."""
from semimig.shardformer.policy import SemiMigPolicy

__all__ = ["SemiMigPolicy"]
