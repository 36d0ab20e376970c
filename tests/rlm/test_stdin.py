"""Model code that asks for input gets end-of-file, never a hang, in every environment."""

from __future__ import annotations

import pytest

from rlm_graph import RLM
from rlm_graph.contracts import ChatRequest
from tests.support.scripts import repl


@pytest.mark.parametrize("environment", ["local", "subprocess"])
def test_input_and_stdin_reads_end_at_once(environment: str) -> None:
    def respond(request: ChatRequest) -> str:
        if "EOFError" in request.messages[-1].content:
            return repl("import sys\nFINAL(repr(sys.stdin.read()))")
        return repl("name = input('your name? ')")

    result = RLM(
        "scripted", {"respond": respond}, environment=environment, max_timeout=60
    ).completion("ctx")
    assert result.stop_reason is None
    assert result.response == "''"
