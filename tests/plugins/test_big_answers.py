"""Large JSON answers over real HTTP: an error's body past what the engine reads as text
is not parsed (its head is quoted), and a reply a parser cannot read is quoted from the
head of its raw text, not from the whole parsed structure turned back into text."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from rlm_graph._http.answers import ERROR_TEXT
from rlm_graph.contracts import ChatRequest, Message
from rlm_graph.errors import BadResponse, ProviderError
from rlm_graph.testing import FakeAnthropicServer, FakeOpenAIServer, Reply
from rlm_graph_anthropic import AnthropicProvider
from rlm_graph_openai import OpenAIProvider
from tests.support.http import anthropic_kwargs, openai_kwargs

REQUEST = ChatRequest(messages=(Message(role="user", content="hello"),), model="gpt-test")
PAD = [[]] * (ERROR_TEXT // 2)  # about 256 KiB of JSON: past ERROR_TEXT


async def test_an_error_body_past_the_error_text_limit_is_not_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 5xx's whole body was parsed as JSON on the event loop (a 60 MiB body of small
    arrays took seconds and gigabytes) though only its first 64 KiB are read as text."""
    parsed: list[int] = []
    real = httpx.Response.json

    def spy(self: httpx.Response, **kwargs: Any) -> Any:
        parsed.append(len(self.content))
        return real(self, **kwargs)

    monkeypatch.setattr(httpx.Response, "json", spy)
    body = {"error": {"message": "Overloaded"}, "pad": PAD}
    with FakeOpenAIServer(replies=[Reply(status=500, body=body)] * 2) as server:
        provider = OpenAIProvider(**openai_kwargs(server, max_attempts=1))
        with pytest.raises(ProviderError) as caught:
            await provider.complete(REQUEST)
        await provider.aclose()
    assert not [size for size in parsed if size > ERROR_TEXT]
    assert '{"error": {"message": "Overloaded"}' in str(caught.value)
    assert len(str(caught.value)) < 2000


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_reply_of_the_wrong_shape_is_quoted_from_its_raw_text(api: str) -> None:
    """The quote was ``str(data)`` of the whole parsed reply (megabytes of text made on
    the event loop to keep 300 characters of it)."""
    fake, kwargs, provider_class = (
        (FakeAnthropicServer, anthropic_kwargs, AnthropicProvider)
        if api == "anthropic"
        else (FakeOpenAIServer, openai_kwargs, OpenAIProvider)
    )
    with fake(replies=[Reply(body={"pad": PAD})] * 2) as server:
        provider = provider_class(**kwargs(server, max_attempts=1))
        with pytest.raises(BadResponse) as caught:
            await provider.complete(REQUEST)
        await provider.aclose()
    assert """'{"pad": [[], [], """ in str(caught.value)
