"""semimig.shardformer."""
