"""Every Python block of docs/graph-executor.md and docs/writing-a-provider.md runs as
written: the blocks of a page in order, in one namespace (a reader's session), offline
(the scripted backend, fake servers on 127.0.0.1 that the blocks start themselves)."""

from __future__ import annotations

import linecache
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["graph-executor.md", "writing-a-provider.md"]


def blocks(page: str) -> list[str]:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```$", text, re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_of_the_page_runs(page: str, capsys: pytest.CaptureFixture[str]) -> None:
    found = blocks(page)
    assert len(found) >= 4, f"docs/{page} lost its examples"
    namespace: dict[str, object] = {"__name__": f"docs_{page.split('.')[0].replace('-', '_')}"}
    for index, source in enumerate(found):
        # A file name the tracebacks, inspect.getsource and the journal's keys can read.
        filename = f"<docs/{page} block {index + 1}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        try:
            exec(compile(source, filename, "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"docs/{page}, block {index + 1} fails: {exc!r}") from exc
    capsys.readouterr()


def test_the_graph_executor_page_prints_what_its_comments_say(
    capsys: pytest.CaptureFixture[str],
) -> None:
    namespace: dict[str, object] = {"__name__": "docs_graph_executor"}
    for index, source in enumerate(blocks("graph-executor.md")):
        filename = f"<docs/graph-executor.md block {index + 1}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), namespace)
    out = capsys.readouterr().out
    for expected in [
        "unknown request parameter 'temprature' (did you mean 'temperature'?)",
        "['FETCHED INDEX.HTML', 'failed'] 2",
        "['a', 'b']",
        "skipped skipped: dependency 'parse' failed",
        "ValueError True",
        "max_timeout NodeCancelled",
        "large: improve small: draft it large",
        "4 0",
        "join small: part 0 | small: part 1 | small: part 2",
    ]:
        assert expected in out, expected


def _page(name: str) -> str:
    return (ROOT / "docs" / name).read_text(encoding="utf-8")


def test_the_provider_page_documents_the_whole_contract() -> None:
    import dataclasses

    from rlm_graph.contracts import ChatRequest, ChatResponse, ProviderCapabilities
    from rlm_graph.testing import FakeServer

    page = _page("writing-a-provider.md")
    names = [
        *ChatRequest.model_fields,
        "prompt",
        "system",
        *ChatResponse.model_fields,
        *(field.name for field in dataclasses.fields(ProviderCapabilities)),
        *("name", "model", "max_concurrent", "complete", "aclose"),
        *("paths", "check_request", "success_body", "error_body", "responder", "replies"),
        *("requests", "bodies", "responses", "peak_in_flight", "connections_opened"),
        "base_url",
    ]
    missing = [name for name in names if f"`{name}" not in page]
    assert not missing, missing
    assert all(hasattr(FakeServer, hook) for hook in ("check_request", "success_body"))
    assert "request.messages" in page


def test_the_executor_page_documents_every_option_and_result_field() -> None:
    import inspect

    from rlm_graph import Workflow, WorkflowResult

    page = _page("graph-executor.md")
    options = {
        *inspect.signature(Workflow.llm).parameters,
        *inspect.signature(Workflow.function).parameters,
    } - {"self", "prompt", "fn", "args", "params"}
    fields = set(WorkflowResult.model_fields) - {"failures"}
    missing = [name for name in sorted(options | fields) if f"`{name}" not in page]
    assert not missing, missing
    for needed in ("parallel_efficiency", "diverged_at", "NodeCancelled", "other_backends"):
        assert needed in page
