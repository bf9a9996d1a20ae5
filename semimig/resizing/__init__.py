"""ZERO-resizing: pruning ratio (Eq. 1), lineage table, priority statistics (Alg. 1) and PriDiff ratios."""
from semimig.resizing.config import ResizingConfig
from semimig.resizing.lineage import LineageEntry, LineageTable
from semimig.resizing.pridiff import (
    achieved_savings,
    candidate_shares,
    layer_thresholds,
    pridiff_ratios,
    pridiff_ratios_for_savings,
)
from semimig.resizing.priority import ColumnVariationTracker, PriorityList, column_variation, priority_order, select_pruned
from semimig.resizing.ratio import columns_to_prune, pruning_ratio

__all__ = ["ColumnVariationTracker", "LineageEntry", "LineageTable", "PriorityList", "ResizingConfig",
           "achieved_savings", "candidate_shares", "column_variation", "columns_to_prune", "layer_thresholds",
           "pridiff_ratios", "pridiff_ratios_for_savings", "priority_order", "pruning_ratio", "select_pruned"]
