"""The CLI runs the model's code in the ``subprocess`` environment unless told otherwise."""

from __future__ import annotations

import io
import json
import os

import pytest

from rlm_graph.cli import main
from rlm_graph.testing import FakeOpenAIServer

pytestmark = pytest.mark.processes  # the default environment starts a guest process


def respond(body: dict[str, object]) -> str:
    messages = body["messages"]
    assert isinstance(messages, list)
    if any(m.get("role") == "system" for m in messages):
        code = "import os\nFINAL(os.environ.get('MY_SERVICE_TOKEN', 'no token') + f' pid={os.getpid()}')"
        return f"```repl\n{code}\n```"
    return "sub"


def run_cli(*extra: str, capsys: pytest.CaptureFixture[str]) -> str:
    with FakeOpenAIServer(respond) as server:
        code = main(
            [
                "run",
                "--context",
                "-",
                "--query",
                "q",
                "--model",
                "gpt-test",
                "--base-url",
                server.base_url,
                "--json",
                *extra,
            ]
        )
    assert code == 0
    return str(json.loads(capsys.readouterr().out)["answer"])


def test_the_cli_keeps_model_code_out_of_the_engine_by_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", "planted-service-token")
    monkeypatch.setattr("sys.stdin", io.StringIO("ctx"))
    assert run_cli(capsys=capsys).startswith("no token pid=")
    assert run_cli(capsys=capsys) != f"no token pid={os.getpid()}"
    monkeypatch.setattr("sys.stdin", io.StringIO("ctx"))
    local = run_cli("--environment", "local", capsys=capsys)
    assert local == f"planted-service-token pid={os.getpid()}"
