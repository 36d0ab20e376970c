"""A key the engine knows never stays in a record, even when a model echoes it."""

from __future__ import annotations

import json
import traceback

import pydantic
import pytest

from rlm_graph import RLM, Engine, Workflow
from rlm_graph.contracts import ChatRequest
from rlm_graph.errors import ProviderError
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


def _refusing(request: ChatRequest) -> str:
    """A plugin whose error quotes the key it was given (a careless third party's)."""
    if is_root_turn(request):
        return repl("FINAL(llm_query_batched(['a', 'b'])[1] + ' | ' + llm_query('c'))")
    raise ProviderError(f"key {KEY} was refused", provider="careless")


def test_a_key_quoted_in_a_plugins_error_never_reaches_a_slot_or_a_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The record of a failed sub-call was redacted, but the slot the model read (and
    so its answer) and a workflow's ``result.errors`` quoted the key as the plugin's
    error had it."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    result = RLM("scripted", {"respond": _refusing}).completion("ctx")
    assert KEY not in result.response
    assert result.response.count("[ERROR] ProviderError: key [REDACTED] was refused") == 2

    workflow = Workflow()
    workflow.llm("hello", id="hello")
    outcome = Engine("scripted", {"respond": _refusing}).run(workflow)
    assert KEY not in outcome.errors["hello"] and "[REDACTED]" in outcome.errors["hello"]
    assert KEY not in json.dumps(outcome.to_dict())


class _Strict(pydantic.BaseModel):
    token: int


def _raising_by_fields(request: ChatRequest) -> str:
    """Errors whose message is made from fields, not from their arguments."""
    if is_root_turn(request):
        return repl("FINAL(' | '.join(llm_query_batched(['os', 'model'])))")
    if "os" in request.messages[-1].content:
        raise OSError(5, f"upstream said {KEY}")
    _Strict(token=f"bad {KEY}")  # type: ignore[arg-type]  # pydantic quotes the input
    return "unreachable"


def test_a_key_in_an_error_made_from_its_fields_never_reaches_a_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`OSError` and pydantic's `ValidationError` build their text from fields, so
    rewriting their arguments left the key in the slot the model read."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    result = RLM("scripted", {"respond": _raising_by_fields}).completion("ctx")
    assert KEY not in result.response
    assert "[ERROR] OSError: [Errno 5] upstream said [REDACTED]" in result.response
    assert "[ERROR] ValidationError:" in result.response
    assert result.response.count("[REDACTED]") == 2
    assert KEY not in to_json(result.graph)


def test_an_os_errors_own_text_is_redacted_in_its_traceback() -> None:
    """`OSError` prints its ``strerror`` and ``filename``, not its arguments: the slot
    was redacted, but the error's own text (a traceback, a log) still quoted the key."""
    from rlm_graph.errors import scrub_error

    error = OSError(5, f"upstream said {KEY}", f"/tmp/{KEY}")
    scrub_error(error, lambda text: text.replace(KEY, "[REDACTED]"))
    printed = "".join(traceback.format_exception(error))
    assert KEY not in printed and "upstream said [REDACTED]" in printed


def test_a_key_inside_an_exception_group_is_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin's nursery raises an `ExceptionGroup`: the errors it holds were never
    redacted, so the key was in the traceback of ``result.exception(...)``."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)

    def respond(request: ChatRequest) -> str:
        raise ExceptionGroup("transport failed", [ConnectionError(f"auth {KEY} rejected")])

    workflow = Workflow()
    node = workflow.llm("hello", id="hello")
    outcome = Engine("scripted", {"respond": respond}).run(workflow)
    printed = "".join(traceback.format_exception(outcome.exception(node)))
    assert "ConnectionError: auth [REDACTED] rejected" in printed
    assert KEY not in printed
