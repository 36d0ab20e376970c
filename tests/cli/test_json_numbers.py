"""What rlm-graph writes as JSON is JSON every reader takes: a cost that overflowed (two
replies a server said cost 1e308 each) is ``null``, never ``Infinity``, which a browser's
``JSON.parse``, ``jq`` or a strict Python reader refuse whole."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlm_graph.cli import main
from rlm_graph.testing import FakeOpenAIServer, last_user_message
from tests.support.batch import write_items
from tests.support.http import KEY


def _strict(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _two_calls(body: dict[str, Any]) -> str:
    if any(m.get("role") == "system" for m in body["messages"]):
        return '```repl\nFINAL(llm_query("sub") + " done")\n```'
    return "ok:" + last_user_message(body)


def test_run_json_and_batch_lines_hold_no_infinity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    context = tmp_path / "ctx.txt"
    context.write_text("ctx")
    common = ["--model", "m", "--api-key-env", "OPENAI_API_KEY", "--environment", "local"]
    with FakeOpenAIServer(_two_calls, cost_per_call=1e308) as server:
        common += ["--base-url", server.base_url]
        run = ["run", "--context", str(context), "--query", "q", "--json", *common]
        assert main(run) == 0
        payload = _strict(capsys.readouterr().out)
        assert payload["answer"] == "ok:sub done"
        assert payload["usage"]["total_cost"] is None  # 2e308: no number JSON holds
        write_items(tmp_path / "in.jsonl", [{"id": "a", "context": "ctx", "query": "q"}])
        out = tmp_path / "out.jsonl"
        batch = ["batch", "--input", str(tmp_path / "in.jsonl"), "--output", str(out)]
        assert main([*batch, *common, "--quiet"]) == 0
    (line,) = [_strict(text) for text in out.read_text().splitlines()]
    assert line["answer"] == "ok:sub done" and line["cost"] is None


def test_the_one_json_writer_gives_half_a_character_as_the_replacement_character() -> None:
    """``journal ls --json``, the report's data and ``run --json`` share it: a lone
    surrogate (in a value or a key) was written as the escape strict parsers refuse."""
    from rlm_graph._json import dumps

    written = dumps({"half \ud800": ["x\udc00y", "😀", float("nan")]})
    assert "\\ud800" not in written and "\\udc00" not in written
    assert json.loads(written) == {"half \ufffd": ["x\ufffdy", "😀", None]}
