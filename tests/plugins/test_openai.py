"""The OpenAI-compatible provider: request building, reading answers, backends, lifecycle."""

from __future__ import annotations

import json

import httpx
import pytest

from rlm_graph import Engine, Workflow
from rlm_graph.contracts import ChatRequest, Message
from rlm_graph.errors import ConfigError
from rlm_graph.testing import FakeOpenAIServer, last_user_message
from rlm_graph_openai import OpenAIProvider
from tests.support.http import KEY, openai_kwargs


def _request(**fields: object) -> ChatRequest:
    messages = (Message(role="system", content="be brief"), Message(role="user", content="hi"))
    return ChatRequest(messages=messages, model="gpt-test", **fields)  # type: ignore[arg-type]


async def test_request_carries_sampling_arguments_and_extras() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = {
            "model": "gpt-test-2025",
            "choices": [{"message": {"content": "yo"}, "finish_reason": "length"}],
            "usage": {
                "prompt_tokens": 11,
                "completion_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 3},
                "completion_tokens_details": {"reasoning_tokens": 5},
                "cost": 0.0042,
            },
        }
        return httpx.Response(200, json=answer)

    provider = OpenAIProvider(
        backend="openrouter",
        model_name="gpt-test",
        api_key=KEY,
        transport=httpx.MockTransport(handler),
        extra_body={"user": "u1"},
    )
    request = _request(
        temperature=0.2,
        top_p=0.9,
        max_tokens=64,
        seed=7,
        stop=("END",),
        extra={"reasoning_effort": "low"},
    )
    response = await provider.complete(request)
    await provider.aclose()

    sent = seen[0]
    assert str(sent.url) == "https://openrouter.ai/api/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert json.loads(sent.content) == {
        "user": "u1",
        "model": "gpt-test",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 64,
        "seed": 7,
        "stop": ["END"],
        "reasoning_effort": "low",
    }
    assert response.content == "yo"
    assert response.finish_reason == "length"
    assert response.model == "gpt-test-2025"
    assert response.cost == pytest.approx(0.0042)
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens) == (11, 7)
    assert (usage.cached_tokens, usage.reasoning_tokens) == (3, 5)


async def test_unset_sampling_arguments_are_not_sent() -> None:
    bodies: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"message": {"content": None}}]})

    provider = OpenAIProvider(
        backend="vllm", model_name="m", transport=httpx.MockTransport(handler)
    )
    response = await provider.complete(_request())
    await provider.aclose()
    assert set(bodies[0]) == {"model", "messages"}
    assert response.content == "" and response.cost is None


@pytest.mark.parametrize(
    ("backend", "url"),
    [
        ("openai", "https://api.openai.com/v1"),
        ("openrouter", "https://openrouter.ai/api/v1"),
        ("vllm", "http://localhost:8000/v1"),
        ("ollama", "http://localhost:11434/v1"),
    ],
)
def test_backends_have_their_usual_base_urls(
    backend: str, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("OPENROUTER_API_KEY", KEY)
    engine = Engine(backend, {"model_name": "m"})
    assert engine.provider.base_url == url  # type: ignore[attr-defined]
    assert engine.provider.name == backend
    overridden = Engine(backend, {"model_name": "m", "base_url": "http://127.0.0.1:9/v1/"})
    assert overridden.provider.base_url == "http://127.0.0.1:9/v1"  # type: ignore[attr-defined]


def test_hosted_backend_without_a_key_fails_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        Engine("openai", {"model_name": "gpt-4o"})


def test_local_backends_never_read_a_cloud_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    provider = OpenAIProvider(backend="ollama", model_name="llama3")
    assert provider._auth_headers() == {}


def test_model_name_is_required() -> None:
    with pytest.raises(ConfigError, match="model_name"):
        OpenAIProvider(backend="vllm")


def test_repr_hides_the_key() -> None:
    provider = OpenAIProvider(backend="openai", model_name="gpt-4o", api_key=KEY)
    assert KEY not in repr(provider)
    assert "api_key=<set>" in repr(provider)


async def test_workflow_over_real_http_sums_usage_and_cost() -> None:
    with FakeOpenAIServer(
        lambda body: "R:" + last_user_message(body), cost_per_call=0.01
    ) as server:
        async with Engine("openrouter", openai_kwargs(server)) as engine:
            wf = Workflow()
            refs = [wf.llm(f"question {i}", temperature=0.0) for i in range(5)]
            result = await engine.arun(wf)
    assert [result[r] for r in refs] == [f"R:question {i}" for i in range(5)]
    records = [result.graph[r.id] for r in refs]
    assert all(r.provider == "openrouter" and r.model == "gpt-test" for r in records)
    assert sum(r.cost or 0 for r in records) == pytest.approx(0.05)
    assert sum(r.usage.output_tokens for r in records) == sum(
        max(1, (len(f"R:question {i}") + 3) // 4) for i in range(5)
    )
    assert all(b["temperature"] == 0.0 for b in server.bodies)


async def test_price_table_prices_calls_without_a_reported_cost() -> None:
    with FakeOpenAIServer(lambda body: "x" * 400) as server:  # 100 output tokens
        models = {"gpt-test": {"input_usd_per_mtok": 0.0, "output_usd_per_mtok": 10.0}}
        async with Engine("openai", openai_kwargs(server), models=models) as engine:
            wf = Workflow()
            ref = wf.llm("q")
            result = await engine.arun(wf)
    assert result.graph[ref.id].cost == pytest.approx(100 * 10.0 / 1_000_000)


def test_plugins_register_approximate_prices() -> None:
    engine = Engine("scripted")
    table = engine.router.models
    assert table["gpt-4o-mini"].input_usd_per_mtok is not None
    assert table["claude-sonnet-4-5"].output_usd_per_mtok is not None


def test_sync_runs_reopen_the_client_each_time() -> None:
    with FakeOpenAIServer() as server:
        engine = Engine("openai", openai_kwargs(server))
        for i in range(2):
            wf = Workflow()
            ref = wf.llm(f"run {i}")
            assert engine.run(wf)[ref] == f"echo: run {i}"
            assert engine.provider._client is None  # type: ignore[attr-defined]
    assert len(server.requests) == 2


async def test_one_client_and_keep_alive_across_calls() -> None:
    with FakeOpenAIServer() as server:
        async with Engine("openai", openai_kwargs(server, max_concurrent=1)) as engine:
            for _ in range(3):
                wf = Workflow()
                wf.llm("again")
                await engine.arun(wf)
    assert len(server.requests) == 3
    assert server.connections_opened == 1


async def test_openais_own_host_gets_the_output_limit_as_max_completion_tokens() -> None:
    """OpenAI's reasoning models (gpt-5*, o*) refuse ``max_tokens`` with a 400: every
    call with an output cap failed at once. Its own host gets ``max_completion_tokens``;
    another server under the ``openai`` backend keeps ``max_tokens``, unless told."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}]})

    provider = OpenAIProvider(
        backend="openai",
        model_name="gpt-5-mini",
        api_key=KEY,
        transport=httpx.MockTransport(handler),
    )
    await provider.complete(_request(max_tokens=256))
    await provider.aclose()
    assert str(seen[0].url) == "https://api.openai.com/v1/chat/completions"
    body = json.loads(seen[0].content)
    assert body["max_completion_tokens"] == 256 and "max_tokens" not in body

    with FakeOpenAIServer() as server:
        for field in (None, "max_completion_tokens"):
            kwargs = openai_kwargs(server, **({"max_tokens_field": field} if field else {}))
            wf = Workflow()
            wf.llm("q", max_tokens=32)
            async with Engine("openai", kwargs) as engine:
                assert (await engine.arun(wf)).ok
        first, second = server.bodies
    assert first["max_tokens"] == 32 and "max_completion_tokens" not in first
    assert second["max_completion_tokens"] == 32 and "max_tokens" not in second
    with pytest.raises(ConfigError, match="max_tokens_field must be one of"):
        OpenAIProvider(backend="vllm", model_name="m", max_tokens_field="max_output_tokens")
