"""A compaction strategy's two methods, called and checked for the loop: what a strategy
raises or answers wrongly is a `PluginError` naming it (not a ``KeyError`` from deep
inside a turn, losing the run), and a history it did not make smaller is not taken.

Invariants:
    - The engine's own errors pass as they are: a summary call's `ProviderError` (the
      node records it and the turn goes on uncompacted), a limit, a cancellation.
    - A rewritten history no smaller than the one given (by the chars/4 estimate) is a
      `ProviderError` of provider ``"compaction"``: the node records it and the turn goes
      on with the history it had, as when a summary is not whole (docs/compaction.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from ..contracts import Message, compacted_history, estimate_tokens, strategy_name
from ..errors import PluginError, ProviderError, RLMGraphError, message_of

__all__ = ["asks_to_compact", "compact", "history_text"]


def asks_to_compact(strategy: Any, messages: list[Message], **sizes: Any) -> bool:
    """``strategy.should_compact(messages, **sizes)``, its error named as the strategy's."""
    try:
        return bool(strategy.should_compact(messages, **sizes))
    except RLMGraphError:
        raise
    except Exception as exc:
        raise PluginError(
            f"compaction strategy {strategy_name(strategy)!r}: should_compact() raised "
            f"{type(exc).__name__}: {message_of(exc)} (it takes the messages and the "
            "keywords tokens, context_window, threshold_pct: docs/compaction.md)"
        ) from exc


async def compact(strategy: Any, messages: list[Message], ctx: Any) -> list[Message]:
    """``await strategy.compact(messages, ctx)``, checked: a list of `Message` with the
    task kept (`compacted_history`), and smaller than ``messages``."""
    name = strategy_name(strategy)
    try:
        pending = strategy.compact(messages, ctx)
        if not inspect.isawaitable(pending):
            raise PluginError(
                f"compaction strategy {name!r}: compact() returned "
                f"{type(pending).__name__}, not an awaitable; define it with async def"
            )
        got = await pending
    except RLMGraphError:
        raise
    except Exception as exc:
        raise PluginError(
            f"compaction strategy {name!r}: compact() raised {type(exc).__name__}: "
            f"{message_of(exc)}"
        ) from exc
    rewritten = compacted_history(strategy, got)
    before, after = _tokens(messages), _tokens(rewritten)
    if after >= before:
        raise ProviderError(
            f"compaction strategy {name!r} made a history of ~{after:,} tokens from one of "
            f"~{before:,}: no smaller, so the history is kept as it is",
            provider="compaction",
        )
    return rewritten


def _tokens(messages: Sequence[Message]) -> int:
    return sum(estimate_tokens(m.content) for m in messages)


def history_text(messages: Sequence[Message]) -> str:
    """Messages past the task, as text (what a compaction node records of the history it
    was given and of the one it made, for runs that record content)."""
    return "\n\n".join(f"[{m.role}] {m.content}" for m in messages[2:])
