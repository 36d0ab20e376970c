"""Scripted models for end-to-end RLM runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlm_graph.contracts import ChatRequest


def repl(code: str) -> str:
    """A root reply holding one ```repl block."""
    return f"Let me work in the REPL.\n```repl\n{code}\n```\n"


def is_root_turn(request: ChatRequest) -> bool:
    return any(m.role == "system" for m in request.messages)


def turn_number(request: ChatRequest) -> int:
    """1 for the first root turn of a completion, 2 for the next..."""
    return sum(1 for m in request.messages if m.role == "assistant") + 1


def root_and_sub(
    root: Sequence[str] | Callable[[ChatRequest], str],
    sub: Callable[[ChatRequest], str] = lambda r: f"sub:{r.prompt}",
) -> Callable[[ChatRequest], str]:
    """A respond function: root turns get ``root`` (by turn number), sub-calls ``sub``."""

    def respond(request: ChatRequest) -> str:
        if not is_root_turn(request):
            return sub(request)
        if callable(root):
            return root(request)
        n = turn_number(request)
        return root[min(n, len(root)) - 1]

    return respond
