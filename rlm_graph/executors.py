"""The public toolkit for batch executor plugins (hook ``rlm_register_executors``).

An executor runs each item of a batch as one completion and yields its `BatchResult` as
it finishes. Wherever it runs a completion, it builds the engine with ``RLM(**rlm_kwargs,
limiter=...)`` and answers the item with `complete_item`; every engine of one batch gets
the same `SharedLimiter`, so that the providers' limits hold across the batch::

    from rlm_graph import RLM
    from rlm_graph.executors import InProcessLimiter, complete_item

    async def answer_all(items, rlm_kwargs):
        async with RLM(**rlm_kwargs, limiter=InProcessLimiter()) as rlm:
            for item in items:
                yield await complete_item(rlm, item, executor="mine")

A limiter shared beyond one process implements `SharedLimiter` (a ``gate(key,
capacity)`` async context manager and ``rate(key, rpm, tpm)`` buckets, whose arithmetic
`RateBucket` does), as the ``ray`` executor's does with a Ray actor. `frozen_heap` keeps the garbage collector's full passes
short while completions run. See docs/batch.md. Plugins (ours under ``plugins/`` and
third parties') import from here, never from ``rlm_graph.runtime``.
"""

from __future__ import annotations

from .batch import BatchError, BatchItem, BatchResult, Executor
from .batch.complete import complete_item
from .batch.heap import frozen_heap
from .concurrency.limiter import InProcessLimiter
from .contracts import RateGate, SharedLimiter
from .limits import RateBucket

__all__ = [
    "BatchError",
    "BatchItem",
    "BatchResult",
    "Executor",
    "InProcessLimiter",
    "RateBucket",
    "RateGate",
    "SharedLimiter",
    "complete_item",
    "frozen_heap",
]
