"""Batches: many completions with resume, on one machine or a cluster (docs/batch.md).

- `run_batch` runs items through an executor plugin and yields results as they finish;
- `BatchItem` (an input line), `BatchResult` (an output line), `BatchSummary`;
- `ResultsFile` makes a batch resumable; `scan_items`/`read_items` read an input file.
"""

from __future__ import annotations

from .items import (
    ITEM_LIMITS as ITEM_LIMITS,
)
from .items import (
    BatchItem as BatchItem,
)
from .items import (
    coerce_items as coerce_items,
)
from .items import (
    read_items as read_items,
)
from .items import (
    scan_items as scan_items,
)
from .results import (
    BatchError as BatchError,
)
from .results import (
    BatchResult as BatchResult,
)
from .results import (
    BatchSummary as BatchSummary,
)
from .results import (
    ItemUsage as ItemUsage,
)
from .results import (
    ResultsFile as ResultsFile,
)
from .run import Executor as Executor
from .run import make_executor as make_executor
from .run import run_batch as run_batch

__all__ = [
    "ITEM_LIMITS",
    "BatchError",
    "BatchItem",
    "BatchResult",
    "BatchSummary",
    "Executor",
    "ItemUsage",
    "ResultsFile",
    "coerce_items",
    "make_executor",
    "read_items",
    "run_batch",
    "scan_items",
]
