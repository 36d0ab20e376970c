"""Scripted models for end-to-end RLM runs, and the scripted provider behind an engine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from rlm_graph.contracts import ChatRequest
from rlm_graph_scripted import ScriptedProvider


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


def scripted(engine: Any, index: int = 0) -> ScriptedProvider:
    """The scripted provider of an `RLM` or an `Engine` (``index``: 0 the main backend,
    1 the first of ``other_backends``...): its ``requests``, ``peak_in_flight``..."""
    core = getattr(engine, "engine", engine)
    provider = core.providers[index]
    assert isinstance(provider, ScriptedProvider), provider
    return cast(ScriptedProvider, provider)
