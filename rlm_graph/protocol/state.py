"""What the RLM loop keeps: its settings, and one completion's state and outcome.

Pure data (no trio): `rlm_graph.runtime.loop` runs completions over it; the persistent
session (`rlm_graph.runtime.session`) and the completion run read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..contracts import Message, estimate_tokens
from .schema import AnswerSchema

__all__ = ["CompletionOutcome", "CompletionState", "LoopSettings", "ToolTable"]

ToolTable = Mapping[str, tuple[Any, "str | None"]]


@dataclass(frozen=True, slots=True)
class LoopSettings:
    """What every completion of one RLM call needs, root and children alike."""

    environment: str
    environment_kwargs: Mapping[str, Any]
    tools: ToolTable
    sub_tools: ToolTable
    custom_system_prompt: str | None = None
    accept_text_final: bool = False
    output_chars: int = 20_000
    compaction: Any = None  # a CompactionStrategy, or None
    compaction_threshold_pct: float = 0.85
    root_params: Mapping[str, Any] | None = None  # request parameters of depth-0 turns
    sub_params: Mapping[str, Any] | None = None  # of sub-calls and children's turns
    schema: AnswerSchema | None = None  # the root's answer shape (completion(schema=...))
    tool_prompts: tuple[str, ...] = ()  # sections after every system prompt
    tool_code: str | None = None  # the user's code, run in every REPL before its first turn


@dataclass(slots=True)
class CompletionState:
    """What one completion has so far; read after a cut for the partial answer."""

    messages: list[Message] = field(default_factory=list)
    last_reply: str = ""
    answer_content: str = ""
    iterations: int = 0
    consecutive_errors: int = 0
    trajectory: list[Message] = field(default_factory=list)
    counted_tokens: int | None = None  # reported by the last turn, for its messages
    counted_messages: int = 0
    parsed: Any = None  # the typed answer, when the root has a schema and it matched
    schema_error: str | None = None  # why the last answer was refused, if it was
    direct: str | None = None  # whether the direct path was taken, and why

    def partial(self) -> str:
        """The best partial answer: ``answer["content"]`` if set, else the last reply."""
        return self.answer_content or self.last_reply

    def accept(self, schema: AnswerSchema, parsed: Any) -> str:
        """Keep a typed answer, ``schema.parse_text`` of its text (``parsed``: the engine
        checks it off its event loop, as model code's answer may be costly to check), and
        return its JSON."""
        self.parsed = parsed
        self.schema_error = None
        return schema.dump_json(parsed)

    def add(self, message: Message) -> None:
        """Append to the history the model sees, and to the full trajectory."""
        self.messages.append(message)
        self.trajectory.append(message)

    def history_tokens(self) -> int:
        """The size of ``messages``: reported usage where known, the estimate after it."""
        if self.counted_tokens is None:
            return sum(estimate_tokens(m.content) for m in self.messages)
        later = self.messages[self.counted_messages :]
        return self.counted_tokens + sum(estimate_tokens(m.content) for m in later)


@dataclass(slots=True)
class CompletionOutcome:
    answer: str
    stop_reason: str | None
    state: CompletionState
