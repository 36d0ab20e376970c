"""Shared pieces of the streaming tests: a fake model that answers root turns from a
script (an answer per attempt, so a test can cut the first attempt of a turn) and
sub-calls with ``sub:<prompt>``, for either fake server."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from rlm_graph.testing import Reply, last_user_message


def is_turn(body: dict[str, Any]) -> bool:
    """A root turn (a system prompt: OpenAI's as a message, Anthropic's at the top)."""
    return bool(body.get("system")) or any(
        m.get("role") == "system" for m in body.get("messages") or []
    )


def turn_number(body: dict[str, Any]) -> int:
    """1 + the assistant messages so far (the root's turns alternate with REPL output)."""
    return 1 + sum(m.get("role") == "assistant" for m in body.get("messages") or [])


class TurnScript:
    """A responder: turn ``i`` gets ``turns[i - 1]``, an answer or a list of answers, one
    per attempt (the last one repeats); sub-calls answer ``sub:<prompt>``.

    Attributes:
        attempts: root-turn requests seen, per turn.
        subcalls: the sub-call prompts seen, in arrival order.
    """

    def __init__(
        self,
        turns: Sequence[str | Reply | Sequence[str | Reply]],
        sub: Callable[[str], str | Reply] = lambda prompt: f"sub:{prompt}",
    ) -> None:
        self.turns = [list(t) if isinstance(t, list | tuple) else [t] for t in turns]
        self.sub = sub
        self.attempts: dict[int, int] = {}
        self.subcalls: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> str | Reply:
        if not is_turn(body):
            prompt = last_user_message(body)
            with self._lock:
                self.subcalls.append(prompt)
            return self.sub(prompt)
        turn = min(turn_number(body), len(self.turns))
        with self._lock:
            seen = self.attempts[turn] = self.attempts.get(turn, 0) + 1
        answers = self.turns[turn - 1]
        return answers[min(seen, len(answers)) - 1]


def repl(code: str, before: str = "Let me look.", after: str = "") -> str:
    """A reply: words, one ```repl block, then ``after`` (commentary)."""
    return f"{before}\n```repl\n{code.strip()}\n```\n{after}"


FINISH = 'answer["content"] = "done:" + str(x)\nanswer["ready"] = True'
COMMENTARY = (
    "While that runs, a word on the plan: the block above asks a sub-model, and the next "
    "turn will read what it printed before it decides anything else. " * 3
)
