"""One batch item as one completion: the coroutine every executor runs per item.

A failure of the item (its provider, its context file, a bad override, a bug) becomes a
`BatchResult` with ``error`` set: one item never fails a batch. Cancellation passes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import trio

from ..batch.items import BatchItem
from ..batch.results import BatchError, BatchResult, ItemUsage
from ..errors import LimitExceeded
from ..result import RLMChatCompletion

if TYPE_CHECKING:
    from ..rlm import RLM

__all__ = ["complete_item"]


def _usage(result: RLMChatCompletion) -> tuple[ItemUsage, float | None]:
    summary, replay = result.usage_summary, result.replay
    usage = ItemUsage(
        replayed=replay.replayed if replay is not None else 0,
        tokens_saved=replay.tokens_saved if replay is not None else 0,
        cost_saved=replay.cost_saved if replay is not None else 0.0,
        calls=summary.total_calls,
        input_tokens=summary.total_input_tokens,
        output_tokens=summary.total_output_tokens,
        models={
            name: m.model_dump(exclude_none=True)
            for name, m in summary.model_usage_summaries.items()
        },
    )
    return usage, summary.total_cost


async def complete_item(
    rlm: RLM, item: BatchItem, *, executor: str, attempts: int = 1
) -> BatchResult:
    """Answer ``item`` with ``rlm`` (in the caller's trio loop) and say how it went.

    Args:
        rlm: the engine; its limiter is the batch's.
        item: the item; a ``context_file`` is read here, off the trio thread.
        executor: the executor's name, recorded on the result.
        attempts: the how-many-th attempt this is (an executor that reruns items after
            a worker died counts them).
    """
    started_at, started = time.time(), time.perf_counter()
    answer: str | None = None
    stop_reason: str | None = None
    usage, cost, error = ItemUsage(), None, None
    try:
        # A file is read off the trio thread; an inline context needs no thread hop.
        if item.context_file is None:
            context = item.load_context()
        else:
            context = await trio.to_thread.run_sync(item.load_context)
        # Items that ask the same are each answered: their id is in the journal's key.
        result = await rlm.acompletion(
            context, root_prompt=item.query, limits=item.limits, journal_key=item.id
        )
    except LimitExceeded as exc:  # on_limit="raise": still an answer, partial
        answer, stop_reason = exc.partial, exc.reason
        if isinstance(exc.result, RLMChatCompletion):
            usage, cost = _usage(exc.result)
    except Exception as exc:  # any failure of one item is that item's result, not the batch's
        error = BatchError(type=type(exc).__name__, message=str(exc) or type(exc).__name__)
        partial = getattr(exc, "result", None)  # a ProviderError's: what was spent before
        if isinstance(partial, RLMChatCompletion):
            usage, cost = _usage(partial)
    else:
        answer, stop_reason = result.response, result.stop_reason
        usage, cost = _usage(result)
    return BatchResult(
        id=item.id,
        answer=answer,
        stop_reason=stop_reason,
        usage=usage,
        cost=cost,
        started_at=started_at,
        finished_at=time.time(),
        seconds=time.perf_counter() - started,
        attempts=attempts,
        executor=executor,
        error=error,
        asked=item.asked(),
    )
