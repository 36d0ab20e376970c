"""A key the engine knows never stays in a record, even when a model echoes it."""

from __future__ import annotations

import pytest

from rlm_graph import RLM
from rlm_graph.contracts import ChatRequest
from rlm_graph.graph import to_json
from tests.support.scripts import is_root_turn, repl

KEY = "sk-planted-key-0123456789abcdef"


def test_an_echoed_key_is_redacted_from_records_and_verbose_output(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)

    def respond(request: ChatRequest) -> str:
        if is_root_turn(request):
            return repl(f"print(llm_query('repeat {KEY}'))\nFINAL('done')")
        return f"the key is {KEY}"

    result = RLM("scripted", {"respond": respond}, verbose=True).completion("ctx")
    assert result.response == "done"
    assert KEY not in to_json(result.graph)
    assert "[REDACTED]" in to_json(result.graph)
    assert KEY not in capsys.readouterr().err
