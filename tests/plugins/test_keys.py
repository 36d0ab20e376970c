"""Keys go only where they belong: an environment key reaches only the provider's own host
(or a base URL that also came from the environment), over real HTTP; and a server echoing
part of a key does not get it into logs, errors or records."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from rlm_graph import RLM, Engine, Workflow
from rlm_graph.cli import main
from rlm_graph.errors import ConfigError
from rlm_graph.graph import to_json
from rlm_graph.http import resolve_key
from rlm_graph.testing import FakeAnthropicServer, FakeOpenAIServer, FakeServer, Reply
from rlm_graph.tracing.scrub import Scrubber
from rlm_graph_anthropic.provider import KEYS as ANTHROPIC_KEYS
from rlm_graph_openai.provider import BACKENDS
from tests.support.http import KEY

FAST = {"backoff_base": 0.001, "timeout": 5.0, "max_attempts": 1}
# backend -> (fake server class, key variable, base-URL variable, header that carries the key)
HOSTED: dict[str, tuple[type[FakeServer], str, str, str]] = {
    "openai": (FakeOpenAIServer, "OPENAI_API_KEY", "OPENAI_BASE_URL", "authorization"),
    "openrouter": (FakeOpenAIServer, "OPENROUTER_API_KEY", "OPENROUTER_BASE_URL", "authorization"),
    "anthropic": (FakeAnthropicServer, "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "x-api-key"),
}


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for _, key_env, url_env, _ in HOSTED.values():
        monkeypatch.delenv(key_env, raising=False)
        monkeypatch.delenv(url_env, raising=False)


async def _call(backend: str, kwargs: dict[str, Any]) -> tuple[str, str | None]:
    """One model call through a workflow: (value or error, the node's error type)."""
    async with Engine(backend, {"model_name": "m", **FAST, **kwargs}) as engine:
        wf = Workflow()
        ref = wf.llm("hello")
        result = await engine.arun(wf)
    record = result.graph[ref.id]
    return (str(result[ref]) if record.error is None else record.error), record.error_type


def _sent(server: FakeServer, header: str) -> list[str | None]:
    return [r.headers.get(header) for r in server.requests]


@pytest.mark.parametrize("backend", sorted(HOSTED))
async def test_an_environment_key_is_not_sent_to_an_explicit_base_url_elsewhere(
    backend: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server_class, key_env, _, header = HOSTED[backend]
    monkeypatch.setenv(key_env, KEY)
    with server_class(api_key=KEY) as server:
        error, kind = await _call(backend, {"base_url": server.base_url})
        sent = _sent(server, header)
    assert sent == [None]
    # The 401 says which rule withheld the key, and how to opt in.
    assert kind == "ProviderAuthError"
    assert f"${key_env} is not sent to 127.0.0.1" in error and "api_key_env" in error
    assert any("is not sent to 127.0.0.1" in r.getMessage() for r in caplog.records)
    assert KEY not in error + caplog.text


@pytest.mark.parametrize("backend", sorted(HOSTED))
async def test_api_key_env_opts_in_to_sending_it_there(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server_class, key_env, _, header = HOSTED[backend]
    monkeypatch.setenv("MY_PROXY_KEY", KEY)
    with server_class(api_key=KEY) as server:
        value, kind = await _call(
            backend, {"base_url": server.base_url, "api_key_env": "MY_PROXY_KEY"}
        )
        sent = _sent(server, header)
    assert kind is None and value.endswith("hello")
    assert sent == [f"Bearer {KEY}" if header == "authorization" else KEY]


@pytest.mark.parametrize("backend", sorted(HOSTED))
async def test_a_base_url_from_the_environment_gets_the_environment_key(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server_class, key_env, url_env, header = HOSTED[backend]
    with server_class(api_key=KEY) as server:
        monkeypatch.setenv(key_env, KEY)
        monkeypatch.setenv(url_env, server.base_url)
        value, kind = await _call(backend, {})
        sent = _sent(server, header)
    assert kind is None and value.endswith("hello")
    assert sent == [f"Bearer {KEY}" if header == "authorization" else KEY]


@pytest.mark.parametrize("backend", ["openai", "vllm", "ollama", "anthropic"])
async def test_a_local_server_that_needs_no_key_works_without_one(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # set, and still not sent
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    server_class = FakeAnthropicServer if backend == "anthropic" else FakeOpenAIServer
    with server_class() as server:
        value, kind = await _call(backend, {"base_url": server.base_url})
        requests = list(server.requests)
    assert kind is None and value.endswith("hello")
    assert [r.headers.get("authorization") or r.headers.get("x-api-key") for r in requests] == [
        None
    ]


@pytest.mark.parametrize(
    ("base_url", "sent"),
    [
        (None, True),
        ("https://api.openai.com/v1", True),
        ("https://api.openai.com/v1/", True),
        ("http://api.openai.com/v1", False),  # not https
        ("https://api.openai.com.example.net/v1", False),
        ("https://example.net/api.openai.com/v1", False),
        ("http://127.0.0.1:8080/v1", False),
    ],
)
def test_only_the_official_host_over_https_gets_the_environment_key(
    base_url: str | None, sent: bool
) -> None:
    resolved = resolve_key(BACKENDS["openai"], base_url=base_url, environ={"OPENAI_API_KEY": KEY})
    assert (resolved.key == KEY) is sent
    assert KEY not in resolved.rule


def test_missing_or_contradictory_key_configuration_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"api_key_env='NOPE' but \$NOPE is not set"):
        resolve_key(ANTHROPIC_KEYS, base_url="http://127.0.0.1:1", api_key_env="NOPE", environ={})
    with pytest.raises(ConfigError, match="not both"):
        resolve_key(ANTHROPIC_KEYS, api_key=KEY, api_key_env="X", environ={"X": KEY})
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        resolve_key(ANTHROPIC_KEYS, environ={})
    # An explicit key goes wherever it is told to.
    assert (
        resolve_key(ANTHROPIC_KEYS, api_key=KEY, base_url="http://127.0.0.1:1", environ={}).key
        == KEY
    )


def test_the_variable_a_missing_key_is_read_from_is_named_not_redacted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scrubber took ``api_key_env='GATEWAY_TOKEN'`` for a key and value, so the
    error said ``api_key_env='[REDACTED]' but $GATEWAY_TOKEN is not set`` and the
    variable to set was hidden in the one place that names it (a value the user gave
    as a key stays redacted)."""
    monkeypatch.delenv("GATEWAY_TOKEN", raising=False)
    kwargs = {"model_name": "gpt-test", "api_key_env": "GATEWAY_TOKEN"}
    with pytest.raises(ConfigError) as raised:
        RLM("openai", kwargs)
    assert "api_key_env='GATEWAY_TOKEN' but $GATEWAY_TOKEN is not set" in str(raised.value)
    scrub = Scrubber([KEY], environ={}).scrub
    assert scrub("api_key_env='GATEWAY_TOKEN'") == "api_key_env='GATEWAY_TOKEN'"
    assert scrub("OPENAI_API_KEY=abcd1234efgh") == "OPENAI_API_KEY=[REDACTED]"
    assert scrub("password_env: 'PG_PASS', password: 'hunter22'") == (
        "password_env: 'PG_PASS', password: '[REDACTED]'"
    )
    # A name ending in _env whose value is not a variable's name is still redacted.
    assert scrub("DB_PASSWORD_ENV=hunter2hunter2") == "DB_PASSWORD_ENV=[REDACTED]"
    assert scrub("client-secret-env: s3cr3tvalue99") == "client-secret-env: [REDACTED]"
    assert scrub("token_env=abcd1234efgh5678") == "token_env=[REDACTED]"


@pytest.mark.parametrize(
    ("given", "environ", "variables"),
    [
        ({}, {"OPENAI_API_KEY": KEY}, ("OPENAI_API_KEY",)),  # the official host's key
        (
            {},
            {"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": "http://127.0.0.1:8080/v1"},
            ("OPENAI_API_KEY", "OPENAI_BASE_URL"),
        ),
        ({"api_key_env": "GATEWAY_TOKEN"}, {"GATEWAY_TOKEN": KEY}, ("GATEWAY_TOKEN",)),
        ({"api_key": KEY}, {"OPENAI_API_KEY": KEY}, ()),  # the explicit key, not the variable
        # Withheld from another host: nothing taken from the environment.
        ({"base_url": "http://127.0.0.1:8080/v1"}, {"OPENAI_API_KEY": KEY}, ()),
    ],
    ids=["official", "base-url-variable", "api_key_env", "api_key", "withheld"],
)
def test_the_variables_a_key_and_base_url_came_from_are_named(
    given: dict[str, str], environ: dict[str, str], variables: tuple[str, ...]
) -> None:
    # What an executor running the provider in another process sends it (the ray executor).
    assert resolve_key(BACKENDS["openai"], **given, environ=environ).variables == variables


async def test_a_server_echoing_part_of_the_key_leaks_none_of_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    part = KEY[3:15]  # "test-planted": 12 characters of "sk-test-planted-1234"
    replies = [
        Reply.error(500, f"upstream rejected ...{part}", retry_after="0"),
        f"your key ends in ...{KEY[5:]}",
        Reply.error(401, f"Incorrect API key provided: {KEY[:10]}..."),
    ]
    with FakeOpenAIServer(replies=replies) as server:
        kwargs = {
            "model_name": "m",
            "base_url": server.base_url,
            "api_key": KEY,
            **FAST,
            "max_attempts": 2,
        }
        async with Engine("openai", kwargs) as engine:
            wf = Workflow()
            first = wf.llm("one")
            second = wf.llm(lambda text: "two " + text, first)
            result = await engine.arun(wf)
    texts = {
        "logs": caplog.text,
        "graph": to_json(result.graph),
        "errors": "\n".join(result.errors.values()),
    }
    assert result.graph[second.id].error_type == "ProviderAuthError"
    assert "[REDACTED]" in texts["logs"] and "[REDACTED]" in texts["graph"]
    for name, text in texts.items():
        for start in range(len(KEY) - 7):
            assert KEY[start : start + 8] not in text, (name, start)


async def test_a_key_named_by_api_key_env_is_redacted_whatever_its_variable_is_called(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A team's variable name with no KEY or TOKEN in it: the key it holds is still one
    the engine knows, so a server echoing it leaves it in no record."""
    monkeypatch.setenv("TEAM_CREDS", KEY)
    with FakeOpenAIServer(replies=[f"you sent {KEY}"]) as server:
        kwargs = {"model_name": "m", "base_url": server.base_url, "api_key_env": "TEAM_CREDS"}
        async with Engine("openai", {**kwargs, **FAST}) as engine:
            wf = Workflow()
            wf.llm("hello")
            result = await engine.arun(wf)
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    graph = to_json(result.graph)
    assert KEY not in graph and "you sent [REDACTED]" in graph


def test_a_key_in_the_question_is_not_in_the_journals_list_of_runs(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`journal ls` shows each run's question: it is kept redacted, as every record is."""
    journal = tmp_path / "run.sqlite"
    with FakeOpenAIServer(replies=["```repl\nFINAL('done')\n```"]) as server:
        kwargs = {"model_name": "m", "base_url": server.base_url, "api_key": KEY, **FAST}
        rlm = RLM("openai", kwargs, journal=str(journal))
        assert rlm.completion("ctx", root_prompt=f"why was {KEY} refused?").response == "done"
    assert main(["journal", "ls", str(journal), "--json"]) == 0
    listed = capsys.readouterr().out
    assert "why was [REDACTED] refused?" in listed and KEY not in listed
