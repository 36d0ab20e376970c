"""The ``summarize`` and ``truncate`` compaction strategies.

The engine asks a strategy before every root turn whether the history has outgrown the
share ``threshold_pct`` of the root model's window (``tokens`` is the last turn's
reported usage plus an estimate of what came after it), and if so hands it the history
to rewrite. The engine keeps the full trajectory in the REPL variable ``history``.

Invariants:
    - The first two messages, the system prompt and the task, are always kept as they
      are (``truncate`` appends a note to the task).
    - A rewritten history still alternates user and assistant after the system prompt,
      and ends with a user message, so the next root turn is a normal request.
    - A strategy only compacts a history with at least `MIN_TURN_PAIRS` turn pairs after
      the task: there must be something to drop or summarise.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlm_graph.contracts import CompactionContext, Message, estimate_tokens
from rlm_graph.errors import ConfigError, ProviderError
from rlm_graph.protocol.replies import is_whole

__all__ = ["MIN_TURN_PAIRS", "SUMMARY_PROMPT", "SummarizeStrategy", "TruncateStrategy"]

MIN_TURN_PAIRS = 2

SUMMARY_PROMPT = """\
Your conversation is about to be cut to fit your context window. Write a summary that \
lets you continue the task from it alone. Keep:
- every concrete result so far (numbers, names, quotes, partial answers), exactly;
- the names of the REPL variables that hold your work, and what each one holds;
- what you tried that did not work;
- the next step you were about to take.
Do not write code. The REPL keeps its variables; the full conversation will be in the \
REPL variable `history` (a list of {"role", "content"} dicts)."""

CONTINUE_NOTE = """\
[Your conversation was compacted; above is your summary of it. The \
REPL state is intact: your variables are still there, and the full conversation so far is \
in the REPL variable `history`. Continue the task from the next step.]"""

TRUNCATED_NOTE = """

[Earlier turns were dropped to fit your context window; the REPL keeps your variables, \
and the full conversation is in the REPL variable `history`.]"""


def _turn_pairs(messages: Sequence[Message]) -> int:
    return max(0, (len(messages) - 2) // 2)


def _over(tokens: int, context_window: int, threshold_pct: float) -> bool:
    return tokens >= threshold_pct * context_window


class _PastThreshold:
    """Compacts once the history passes ``threshold_pct`` of the window and holds at
    least `MIN_TURN_PAIRS` turns to rewrite."""

    def should_compact(
        self, messages: Sequence[Message], *, tokens: int, context_window: int, threshold_pct: float
    ) -> bool:
        return _turn_pairs(messages) >= MIN_TURN_PAIRS and _over(
            tokens, context_window, threshold_pct
        )


class SummarizeStrategy(_PastThreshold):
    """Replace the history with the root model's own summary of it.

    The new history is: system prompt, task, the summary (as the model's message), and a
    note to continue. One extra call of the root model per compaction, recorded on the
    ``compaction`` node.
    """

    name = "summarize"

    async def compact(self, messages: Sequence[Message], ctx: CompactionContext) -> list[Message]:
        response = await ctx.complete([*messages, Message(role="user", content=SUMMARY_PROMPT)])
        summary, reason = response.content.strip(), response.finish_reason
        if not is_whole(reason) or not summary or summary.startswith("[rlm-graph: "):
            # Cut off, refused or empty: no summary of the history to replace it with.
            raise ProviderError(
                f"the summary is not whole (finish_reason={reason!r}, {len(summary)} "
                "characters): the history is kept as it is",
                provider="compaction",
            )
        return [
            messages[0],
            messages[1],
            Message(role="assistant", content=summary),
            Message(role="user", content=CONTINUE_NOTE),
        ]


class TruncateStrategy(_PastThreshold):
    """Drop the oldest turn pairs until the history fits ``target_pct`` of the window.

    No model call; no state, so one instance serves every completion. The most recent
    turn pair is always kept, and the task message gets a
    note saying how much was dropped and where the rest is.

    Args:
        target_pct: the share of the window to shrink to (default 0.5), measured with
            the chars/4 estimate.
    """

    name = "truncate"

    def __init__(self, target_pct: float = 0.5) -> None:
        if not 0 < target_pct < 1:
            raise ConfigError("truncate: target_pct must be in (0, 1), e.g. 0.5")
        self.target_pct = target_pct

    async def compact(self, messages: Sequence[Message], ctx: CompactionContext) -> list[Message]:
        head, turns = list(messages[:2]), list(messages[2:])
        target = self.target_pct * ctx.context_window
        size = sum(estimate_tokens(m.content) for m in messages)
        drop = 0
        while len(turns) - drop > 2 and size > target:
            size -= estimate_tokens(turns[drop].content) + estimate_tokens(turns[drop + 1].content)
            drop += 2
        drop = max(drop, 2)  # asked to compact: always drop at least the oldest pair
        task = head[1]
        if not task.content.endswith(TRUNCATED_NOTE):
            task = Message(role=task.role, content=task.content + TRUNCATED_NOTE)
        return [head[0], task, *turns[drop:]]
