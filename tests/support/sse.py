"""Raw streamed answers for the hostile-server tests: a chunked event-stream head, one
chunk, one ``data:`` event, and a provider pointed at a `raw_server` port."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from rlm_graph.contracts import ChatRequest, Message
from rlm_graph_anthropic import AnthropicProvider
from rlm_graph_openai import OpenAIProvider
from tests.support.http import anthropic_kwargs, openai_kwargs

REQUEST = ChatRequest(messages=(Message(role="user", content="hello"),), model="gpt-test")
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def sse_chunk(data: bytes) -> bytes:
    """``data`` as one HTTP chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse_event(data: Any) -> bytes:
    """``data`` as one server-sent ``data:`` event."""
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def raw_provider(port: int, api: str = "openai", **overrides: Any) -> Any:
    """An OpenAI (or Anthropic) provider for the server on ``port`` of 127.0.0.1."""
    if api == "anthropic":
        server = SimpleNamespace(base_url=f"http://127.0.0.1:{port}")
        return AnthropicProvider(**anthropic_kwargs(server, **overrides))
    server = SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1")
    return OpenAIProvider(**openai_kwargs(server, **overrides))
