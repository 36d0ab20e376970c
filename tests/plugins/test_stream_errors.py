"""A failure a server reports inside a stream, over real HTTP: llama.cpp's ``error:``
field and a gateway's ``event: error`` (each followed by ``data: [DONE]``), neither taken
as a whole reply; a stream that says ``[DONE]`` without a finish reason, which is."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from rlm_graph.contracts import ChatRequest, Message
from rlm_graph.errors import ContextLengthExceeded, ProviderTimeout
from rlm_graph_anthropic import AnthropicProvider
from rlm_graph_openai import OpenAIProvider
from tests.support.http import anthropic_kwargs, openai_kwargs
from tests.support.rawhttp import raw_server

REQUEST = ChatRequest(messages=(Message(role="user", content="hello"),), model="gpt-test")
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
OVERLOADED = {"code": 503, "message": "Overloaded: try again", "type": "unavailable_error"}
TOO_LONG = {
    "code": 400,
    "message": "the request exceeds the available context size, try increasing it",
    "type": "exceed_context_size_error",
}
_TEXT = b'data: {"choices": [{"delta": {"content": "The answer is 4"}}]}\n\n'
_WHOLE = (
    b'data: {"choices": [{"delta": {"content": "hello"}}]}\n\n'
    b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n\n'
    b"data: [DONE]\n\n"
)
_ANTHROPIC_WHOLE = (
    b'data: {"type": "message_start", "message": {"usage": {"input_tokens": 3}}}\n\n'
    b'data: {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hello"}}'
    b'\n\ndata: {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}\n\n'
    b'data: {"type": "message_stop"}\n\n'
)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _failed(how: str, error: dict[str, Any]) -> bytes:
    said = json.dumps(error).encode()
    if how == "error field":  # llama.cpp's server.cpp: server_sent_event(sink, "error", ...)
        return _TEXT + b"error: " + said + b"\n\ndata: [DONE]\n\n"
    return _TEXT + b"event: error\ndata: " + said + b"\n\ndata: [DONE]\n\n"


def _provider(port: int, api: str) -> Any:
    if api == "anthropic":
        server = SimpleNamespace(base_url=f"http://127.0.0.1:{port}")
        return AnthropicProvider(**anthropic_kwargs(server, max_attempts=3))
    server = SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1")
    return OpenAIProvider(**openai_kwargs(server, max_attempts=3))


async def _serve(
    first: bytes, api: str = "openai", always: bool = False
) -> tuple[Any, dict[str, int]]:
    """The reply after a first attempt (every one, ``always``) that streams ``first``;
    the server's counts."""
    whole = _ANTHROPIC_WHOLE if api == "anthropic" else _WHOLE

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        body = first if index == 1 or always else whole
        await stream.send_all(SSE_HEAD + _chunk(body) + b"0\r\n\r\n")
        return True

    async with raw_server(handler) as (port, stats):
        provider = _provider(port, api)
        try:
            return await provider.stream(REQUEST, lambda offset, text: None), stats
        except Exception as exc:  # out of the server's nursery as it is, not in a group
            return exc, stats
        finally:
            await provider.aclose()


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("how", ["error field", "event: error"])
async def test_an_error_reported_inside_a_stream_is_retried_not_taken_as_the_reply(
    api: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """llama.cpp writes ``error: {...}`` then ``data: [DONE]``; a gateway sends ``event:
    error`` whose data is the error object itself: both were read as a whole reply."""
    caplog.set_level(logging.DEBUG, logger="rlm_graph")
    reply, stats = await _serve(_failed(how, OVERLOADED), api)
    assert reply.content == "hello" and stats["requests"] == 2
    assert "failed mid-stream: Overloaded: try again" in caplog.text


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("how", ["error field", "event: error"])
async def test_a_streamed_error_that_says_the_window_is_passed_is_context_length_exceeded(
    api: str, how: str
) -> None:
    error, stats = await _serve(_failed(how, TOO_LONG), api)
    assert isinstance(error, ContextLengthExceeded) and stats["requests"] == 1
    assert "exceeds the available context size" in str(error)


async def test_a_done_without_a_finish_reason_is_a_whole_reply() -> None:
    """Some OpenAI-compatible servers never send a finish reason: their ``[DONE]`` ends a
    whole reply (an error they report before it is an error event, above)."""
    reply, stats = await _serve(_TEXT + b"data: [DONE]\n\n")
    assert reply.content == "The answer is 4" and stats["requests"] == 1


async def test_a_stream_of_keep_alive_comments_alone_is_a_stall(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A gateway that only sends ``: ping`` (wedged, or thinking for ever) reset the
    silence deadline with every comment: the call was held until the body's size cap.
    Comments count as the server heard for a while after the last event (an hour, or 8
    timeouts; here 8 x 0.1 s), no longer."""
    from rlm_graph._http import streaming

    monkeypatch.setattr(streaming, "QUIET_FLOOR", 0.0)
    pings = [0]

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(SSE_HEAD)
        for _ in range(600):  # 30 s of pings, unless the client goes
            await stream.send_all(_chunk(b": ping\n\n"))
            pings[0] += 1
            await trio.sleep(0.05)
        await stream.send_all(_chunk(_WHOLE) + b"0\r\n\r\n")
        return False

    async with raw_server(handler) as (port, stats):
        server = SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1")
        kwargs = openai_kwargs(server, timeout=0.1, max_attempts=1, max_timeouts=1)
        provider = OpenAIProvider(**kwargs)
        try:
            with pytest.raises(ProviderTimeout):
                await provider.stream(REQUEST, lambda offset, text: None)
        finally:
            await provider.aclose()
    assert stats["requests"] == 1
    assert pings[0] < 100  # 8 x 0.1 s of pings and the timeout: about 18, not 600
