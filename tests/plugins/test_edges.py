"""Edges a new user meets first, in the library: configuration that cannot work fails at
once with one line, odd but readable answers are read, and a context-length refusal says
what to do and keeps the partial answer and the usage."""

from __future__ import annotations

from typing import Any

import pytest

from rlm_graph import RLM, ConfigError, Engine, Workflow
from rlm_graph.errors import ContextLengthExceeded, is_context_length_error
from rlm_graph.testing import FakeAnthropicServer, FakeOpenAIServer, Reply
from tests.support.http import KEY, anthropic_kwargs, openai_kwargs

# -- configuration that cannot work: one ConfigError line, before any request ----------


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"base_url": "ftp://example.com/v1"}, "http:// or https://"),
        ({"base_url": "http//localhost:8000/v1"}, "http:// or https://"),
        ({"base_url": "http://[::1/v1"}, "not a valid URL"),
        ({"base_url": "localhost:8000/v1"}, "http:// or https://"),
        ({"prompt_cache_key": 1}, "prompt_cache_key must be True, False or the key to send"),
        ({"prompt_cache_key": ""}, "prompt_cache_key must be True, False or the key to send"),
    ],
)
def test_bad_backend_kwargs_are_one_config_error(overrides: dict[str, Any], words: str) -> None:
    with FakeOpenAIServer() as server:
        with pytest.raises(ConfigError) as info:
            RLM("openai", openai_kwargs(server, **overrides))
        assert not server.requests
    message = str(info.value)
    assert words in message and "\n" not in message and "pydantic" not in message


@pytest.mark.parametrize("tail", ["?api-key=S3CR3T-Q7xT2mVh", "#S3CR3T-Q7xT2mVh"])
def test_a_base_url_with_a_query_or_a_fragment_is_refused_unquoted(tail: str) -> None:
    """``http://h/v1?api-key=...`` was taken: requests went to ``...?api-key=.../chat/
    completions`` and the key in the query was printed in errors and reports."""
    with FakeOpenAIServer() as server:
        kwargs = openai_kwargs(server)
        with pytest.raises(ConfigError) as info:
            RLM("openai", {**kwargs, "base_url": kwargs["base_url"] + tail})
        assert not server.requests
    message = str(info.value)
    assert ("query string" if "?" in tail else "fragment") in message
    assert "api_key_env" in message and "S3CR3T" not in message


def test_other_backend_kwargs_must_match_other_backends() -> None:
    kwargs = {"model_name": "m", "api_key": KEY, "base_url": "http://127.0.0.1:9/v1"}
    with pytest.raises(
        ConfigError, match="other_backends has 1 entries but other_backend_kwargs has 0"
    ):
        RLM("openai", kwargs, other_backends=["openai"], other_backend_kwargs=[])
    with pytest.raises(ConfigError, match="must be a list with one kwargs dict"):
        RLM("openai", kwargs, other_backends=["openai"], other_backend_kwargs={"model_name": "s"})  # type: ignore[arg-type]
    RLM("openai", kwargs, other_backend_kwargs=[])  # no other backend, no kwargs: fine


def test_a_context_window_keeps_the_plugins_prices() -> None:
    engine = Engine("scripted", models={"gpt-4o-mini": {"context_window": 2048}})
    info = engine.router.models["gpt-4o-mini"]
    assert info.context_window == 2048 and info.input_usd_per_mtok is not None
    with pytest.raises(ConfigError, match=r"models\['x'\]"):
        Engine("scripted", models={"x": {"context_window": "big"}})


# -- odd answers that are still answers ------------------------------------------------


def _answer(content: Any, usage: Any) -> dict[str, Any]:
    return {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": usage,
        "model": "gpt-test",
    }


async def test_content_as_a_list_of_parts_is_joined_and_odd_usage_read() -> None:
    parts = [
        {"type": "text", "text": "Hello, "},
        {"type": "image_url", "image_url": {}},
        {"type": "text", "text": "world"},
    ]
    usage = {
        "prompt_tokens": "12",
        "completion_tokens": "n/a",
        "total_tokens": None,
        "prompt_tokens_details": None,
        "completion_tokens_details": {"reasoning_tokens": 3.0},
    }
    with FakeOpenAIServer(replies=[Reply(200, _answer(parts, usage))]) as server:
        async with Engine("openai", openai_kwargs(server)) as engine:
            wf = Workflow()
            ref = wf.llm("hi")
            result = await engine.arun(wf)
        assert len(server.requests) == 1  # read, not retried
    record = result.graph[ref.id]
    assert result[ref] == "Hello, world"
    assert (record.usage.input_tokens, record.usage.output_tokens) == (12, 0)
    assert record.usage.reasoning_tokens == 3


# -- context length --------------------------------------------------------------------

WORDINGS = {
    "openai": "This model's maximum context length is 8192 tokens. However, your messages "
    "resulted in 9100 tokens. Please reduce the length of the messages.",
    "anthropic": "prompt is too long: 208327 tokens > 200000 maximum",
    "anthropic-max-tokens": "input length and `max_tokens` exceed context limit: 197202 + "
    "21333 > 200000, decrease input length or `max_tokens` and try again",
    "vllm": "This model's maximum context length is 2048 tokens. However, you requested 2600 "
    "tokens (2100 in the messages, 500 in the completion). Please reduce the length of the "
    "messages or completion.",
    "vllm-decoder": "The decoder prompt (length 4097) is longer than the maximum model length "
    "of 4096. Make sure that `max_model_len` is no smaller than the number of text tokens.",
    "llama.cpp": "the request exceeds the available context size, try increasing it",
    "llama.cpp-old": "Context size has been exceeded.",
    "ollama": "prompt too long; exceeded max context length by 120 tokens",
    "ollama-embed": "the input length exceeds the context length",
}
NOT_CONTEXT = [
    "Rate limit reached for gpt-4 in organization org-x on tokens per min (TPM)",
    "The model `gpt-5` does not exist or you do not have access to it.",
    "Invalid 'temperature': decimal above maximum value. Expected a value <= 2",
    "'messages' is a required property",
    "max_tokens: Field required",
]


@pytest.mark.parametrize("server", sorted(WORDINGS))
def test_context_length_wordings_are_recognised(server: str) -> None:
    assert is_context_length_error(WORDINGS[server])


@pytest.mark.parametrize("text", NOT_CONTEXT)
def test_other_refusals_are_not_context_length(text: str) -> None:
    assert not is_context_length_error(text)


FIRST_TURN = "```repl\nanswer['content'] = 'most of it'\nprint(1)\n```"


@pytest.mark.parametrize(
    ("fake", "kwargs", "backend", "wording"),
    [
        (FakeOpenAIServer, openai_kwargs, "vllm", "vllm"),
        (FakeAnthropicServer, anthropic_kwargs, "anthropic", "anthropic"),
    ],
)
def test_a_context_length_refusal_keeps_the_partial_answer_and_usage(
    fake: Any, kwargs: Any, backend: str, wording: str
) -> None:
    replies = [FIRST_TURN, Reply.error(400, WORDINGS[wording])]
    with fake(replies=replies) as server:
        rlm = RLM(backend, kwargs(server))
        with pytest.raises(ContextLengthExceeded) as info:
            rlm.completion("some context", root_prompt="q")
        assert len(server.requests) == 2  # refused once, never retried
    error = info.value
    assert "compaction=True" in str(error) and "context_window" in str(error)
    assert error.partial == "most of it"
    assert error.result is not None
    assert error.result.stop_reason == "provider_error"  # type: ignore[attr-defined]
    assert error.result.usage_summary.total_input_tokens > 0  # type: ignore[attr-defined]
    assert KEY not in str(error)
