"""The compaction node: a strategy rewriting a completion's history, journaled whole.

The strategy's own model calls (a summary) run on the node's record, their usage added
up there; the node's result is the rewritten history, which the journal keeps (so a
resumed run replays it without a call) and which the next turn sends.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import contracts
from ..contracts import ChatResponse, Message, image_json_default, image_json_hook
from ..graph import NodeRecord
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
    ``tally`` the completion's."""

    run: Run
    strategy: Any
    messages: list[Message]
    model: str
    window: int
    asked_model: str | None
    tally: Tally

    async def body(self, record: NodeRecord) -> list[Message]:
        got = await self.strategy.compact(self.messages, _CompactionCall(self.run, record, self))
        rewritten = contracts.compacted_history(self.strategy, got)
        record.output_preview = f"{len(self.messages)} -> {len(rewritten)} messages"
        return rewritten

    def journaled(self) -> Journaled[list[Message]]:
        """Keyed by the strategy, the model and the history it rewrites."""
        name = type(self.strategy).__name__
        request = value_hash("compaction", name, self.model, _messages_text(self.messages))
        return Journaled(request, _messages_text, _messages_of)


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
            tally=self.node.tally,
        )
        response = await call_model(call)
        if before is not None and self.record.usage is not None:  # a second call adds up
            self.record.usage = before + self.record.usage
            if cost is not None:
                self.record.cost = cost + (self.record.cost or 0.0)
        return response


def _messages_text(messages: list[Message]) -> str:
    """A compaction's result as the journal keeps it."""
    return json.dumps(
        [m.model_dump() for m in messages], ensure_ascii=False, default=image_json_default
    )


def _messages_of(text: str) -> list[Message]:
    return [Message.model_validate(m) for m in json.loads(text, object_hook=image_json_hook)]
