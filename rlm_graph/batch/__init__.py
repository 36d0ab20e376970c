"""Batches: many completions with resume, on one machine or a cluster (docs/batch.md).

- `run_batch` runs items through an executor plugin and yields results as they finish;
- `BatchItem` (an input line), `BatchResult` (an output line), `BatchSummary` (and
  `BatchTally`, which sums one as results come);
- `ResultsFile` makes a batch resumable; `scan_items`/`read_items` read an input file.
"""

from __future__ import annotations

from .items import (
    ITEM_LIMITS as ITEM_LIMITS,
    BatchItem as BatchItem,
    coerce_items as coerce_items,
    read_items as read_items,
    scan_items as scan_items,
)
from .results import (
    BatchError as BatchError,
    BatchResult as BatchResult,
    BatchSummary as BatchSummary,
    BatchTally as BatchTally,
    ItemUsage as ItemUsage,
    ResultsFile as ResultsFile,
)
from .run import Executor as Executor, make_executor as make_executor, run_batch as run_batch

__all__ = [
    "ITEM_LIMITS",
    "BatchError",
    "BatchItem",
    "BatchResult",
    "BatchSummary",
    "BatchTally",
    "Executor",
    "ItemUsage",
    "ResultsFile",
    "coerce_items",
    "make_executor",
    "read_items",
    "run_batch",
    "scan_items",
]
