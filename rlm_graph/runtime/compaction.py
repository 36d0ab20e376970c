"""The compaction node: a strategy rewriting a completion's history, journaled whole.

The strategy's own model calls (a summary) run on the node's record, their usage added
up there; the node's result is the rewritten history, which the journal keeps (so a
resumed run replays it without a call) and which the next turn sends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..contracts import ChatResponse, Message, messages_from_json, messages_json
from ..graph import NodeRecord
from ..hooks.compaction import compact, history_text
from ..journal import value_hash
from ..journal.seam import Journaled
from ..limits import Tally
from .calls import ModelCall, call_model
from .context import Run

__all__ = ["DEFAULT_CONTEXT_WINDOW", "CompactionNode"]

DEFAULT_CONTEXT_WINDOW = 128_000
"""The window assumed for a model the model table does not know (see docs/compaction.md)."""


@dataclass(slots=True)
class CompactionNode:
    """One compaction: ``strategy`` rewriting ``messages`` for ``model`` (whose window is
    ``window``); ``asked_model`` is the completion's own model name (None: the default),
    ``tally`` the completion's; its calls take the root turns' ``params`` (but their
    ``max_tokens``: a summary needs its room) and ``cache_key`` (the same prefix)."""

    run: Run
    strategy: Any
    messages: list[Message]
    model: str
    window: int
    asked_model: str | None
    tally: Tally
    params: Mapping[str, Any] | None
    cache_key: str | None

    async def body(self, record: NodeRecord) -> list[Message]:
        call = _CompactionCall(self.run, record, self)
        rewritten = await compact(self.strategy, self.messages, call)
        record.output_preview = f"{len(self.messages)} -> {len(rewritten)} messages"
        if self.run.record_content:
            record.keep_content(history_text(self.messages), history_text(rewritten))
        return rewritten

    def journaled(self) -> Journaled[list[Message]]:
        """Keyed by the strategy, the model and the history it rewrites."""
        name = type(self.strategy).__name__
        request = value_hash("compaction", name, self.model, messages_json(self.messages))
        return Journaled(request, messages_json, messages_from_json)


class _CompactionCall:
    """The `CompactionContext` a strategy gets: root-model calls on the compaction node."""

    def __init__(self, run: Run, record: NodeRecord, node: CompactionNode) -> None:
        self.run = run
        self.record = record
        self.node = node
        self.model = node.model
        self.context_window = node.window

    async def complete(self, messages: Sequence[Message]) -> ChatResponse:
        before, cost = self.record.usage, self.record.cost
        call = ModelCall(
            self.run,
            self.record,
            messages,
            model=self.node.asked_model,
            params={k: v for k, v in (self.node.params or {}).items() if k != "max_tokens"},
            tally=self.node.tally,
            cache_key=self.node.cache_key,
        )
        response = await call_model(call)
        if before is not None and self.record.usage is not None:  # a second call adds up
            self.record.usage = before + self.record.usage
            if cost is not None:
                self.record.cost = cost + (self.record.cost or 0.0)
        return response
