"""ZERO-resizing: pruning ratio (Eq. 1), lineage table, priority statistics and PriDiff ratios."""
from semimig.resizing.config import ResizingConfig
from semimig.resizing.lineage import LineageEntry, LineageTable
from semimig.resizing.priority import (
    ColumnVariationTracker,
    achieved_savings,
    column_variation,
    pridiff_ratios,
    select_pruned,
)
from semimig.resizing.ratio import ReferenceTime, columns_to_prune, pruning_ratio, refresh_reference

__all__ = ["ColumnVariationTracker", "LineageEntry", "LineageTable", "ReferenceTime", "ResizingConfig",
           "achieved_savings", "column_variation", "columns_to_prune", "pridiff_ratios", "pruning_ratio",
           "refresh_reference", "select_pruned"]
