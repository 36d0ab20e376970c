"""``rlm-graph run`` against a fake OpenAI-compatible server: answers, limits, provider
errors and bad usage map to exit codes 0, 3, 4 and 2; keys come from the environment."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from rlm_graph.cli import main
from rlm_graph.testing import FakeOpenAIServer, Reply, last_user_message
from tests.support.http import KEY


def respond(body: dict[str, object]) -> str:
    messages = body["messages"]
    assert isinstance(messages, list)
    if any(m.get("role") == "system" for m in messages):
        code = 'answer["content"] = llm_query("sub") + " over " + str(len(context)); answer["ready"] = True'
        return f"```repl\n{code}\n```"
    return "ANSWER:" + last_user_message(body)


@pytest.fixture
def context_file(tmp_path: Path) -> Path:
    path = tmp_path / "context.txt"
    path.write_text("x" * 1234, encoding="utf-8")
    return path


def _args(server: FakeOpenAIServer, context: Path | str, *extra: str) -> list[str]:
    return [
        "run",
        "--context",
        str(context),
        "--query",
        "what?",
        "--model",
        "gpt-test",
        "--base-url",
        server.base_url,
        *extra,
    ]


KEY_ENV = ("--api-key-env", "OPENAI_API_KEY")


def test_answers_and_exits_0(
    context_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with FakeOpenAIServer(respond, api_key=KEY) as server:
        code = main(_args(server, context_file, *KEY_ENV))
    out, err = capsys.readouterr()
    assert code == 0
    assert out.strip() == "ANSWER:sub over 1234"
    assert "calls" in err and KEY not in out + err


def test_json_output_and_stdin_context_and_sub_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("y" * 10))
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with FakeOpenAIServer(respond) as server:
        code = main(
            _args(server, "-", *KEY_ENV, "--sub-model", "gpt-small", "--max-depth", "1", "--json")
        )
        models = [b["model"] for b in server.bodies]
    payload = json.loads(capsys.readouterr().out)
    assert code == 0
    assert payload["answer"] == "ANSWER:sub over 10" and payload["stop_reason"] is None
    assert models == ["gpt-test", "gpt-small"]


def test_a_limit_exits_3_with_the_partial_answer(
    context_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeOpenAIServer(respond) as server:
        code = main(_args(server, context_file, "--max-tokens", "5"))
    _, err = capsys.readouterr()
    assert code == 3
    assert "stopped by max_tokens" in err


def test_a_provider_error_exits_4_naming_the_key(
    context_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with FakeOpenAIServer(replies=[Reply.error(401, "Incorrect API key provided")]) as server:
        code = main(_args(server, context_file, *KEY_ENV))
    _, err = capsys.readouterr()
    assert code == 4
    assert "API key" in err and KEY not in err
    # The first call failed: there is no partial answer, and the line says so.
    assert "[stopped by provider_error; no partial answer]" in err
    assert "; partial answer]" not in err


def test_backend_kwargs_pass_a_plugin_s_own_settings(
    context_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = json.dumps({"extra_body": {"house_setting": 7}, "base_url": "http://nowhere"})
    with FakeOpenAIServer(respond) as server:
        code = main(_args(server, context_file, "--backend-kwargs", settings))
        bodies = server.bodies
    assert code == 0, capsys.readouterr().err
    assert bodies and all(body["house_setting"] == 7 for body in bodies)  # and --base-url won


@pytest.mark.parametrize(
    "given, said",
    [
        ("{not json", "--backend-kwargs is not JSON"),
        ("[1, 2]", "must be a JSON object, not list"),
        ('{"api_key": "sk-x"}', "cannot carry api_key"),
    ],
)
def test_bad_backend_kwargs_exit_2(
    context_file: Path, given: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeOpenAIServer() as server:
        assert main(_args(server, context_file, "--backend-kwargs", given)) == 2
        assert server.bodies == []
    err = capsys.readouterr().err
    assert said in err and "sk-x" not in err


@pytest.mark.parametrize("extra", [["--backend", "no-such-backend"], ["--max-depth", "-1"]])
def test_bad_configuration_exits_2(
    context_file: Path, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeOpenAIServer() as server:
        assert main(_args(server, context_file, *extra)) == 2
    assert "rlm-graph run:" in capsys.readouterr().err


def test_a_missing_context_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeOpenAIServer() as server:
        assert main(_args(server, tmp_path / "missing.txt")) == 2
    assert "cannot read --context" in capsys.readouterr().err


def test_there_is_no_key_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--context", "-", "--query", "q", "--model", "m", "--api-key", KEY]) == 2
    err = capsys.readouterr().err
    assert "there is no --api-key flag" in err and KEY not in err


SCHEMA = {
    "type": "object",
    "properties": {"length": {"type": "integer"}},
    "required": ["length"],
}


def _typed_respond(answers: list[str]) -> object:
    """Root turns answer from ``answers`` in order (each a FINAL value's source)."""

    def respond(body: dict[str, object]) -> str:
        return f"```repl\nFINAL({answers.pop(0)})\n```" if len(answers) > 1 else answers[0]

    return respond


def test_schema_file_types_the_answer(
    context_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    answers = ['{"length": "long"}', '{"length": len(context)}', "unused"]
    with FakeOpenAIServer(_typed_respond(answers)) as server:
        code = main(_args(server, context_file, "--schema", str(schema_file), "--json"))
        task = server.bodies[0]["messages"][1]["content"]
    payload = json.loads(capsys.readouterr().out)
    assert code == 0
    assert json.loads(payload["answer"]) == {"length": 1234}
    assert '"required":["length"]' in task


def test_schema_never_matched_exits_3_with_the_last_error(
    context_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    with FakeOpenAIServer(_typed_respond(["1", "not json"])) as server:
        code = main(
            _args(server, context_file, "--schema", str(schema_file), "--max-iterations", "1")
        )
    out, err = capsys.readouterr()
    assert code == 3
    assert out.strip() == "not json"
    assert "SchemaMismatch: the answer is not JSON" in err


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("[1]", "must hold a JSON Schema object"),
        ("{", "is not JSON"),
        ('{"type": 5}', "not a valid JSON Schema"),
    ],
)
def test_a_bad_schema_file_exits_2(
    tmp_path: Path, context_file: Path, capsys: pytest.CaptureFixture[str], content: str, words: str
) -> None:
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(content)
    with FakeOpenAIServer(respond) as server:
        code = main(_args(server, context_file, "--schema", str(schema_file)))
        assert server.bodies == []
    assert code == 2
    assert words in capsys.readouterr().err


def test_an_environment_key_goes_to_another_base_url_only_with_api_key_env(
    context_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with FakeOpenAIServer(respond, api_key=KEY) as server:
        code = main(_args(server, context_file))
        sent = [r.headers.get("authorization") for r in server.requests]
    _, err = capsys.readouterr()
    assert code == 4
    assert sent == [None]
    assert "api_key_env" in err and KEY not in err
    assert "--api-key-env OPENAI_API_KEY" in err  # the hint in this command's own words
