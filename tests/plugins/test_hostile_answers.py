"""Answers a careless or hostile server sends, over real HTTP: the key it echoes in a
streamed error, a stream that does not close after its end marker, a cost or a token
count no call has, a date no calendar has, codings stacked past reason, an error body of
megabytes, and a reply of a shape a plugin's parser did not check. Each is answered or
fails its attempt with an error naming it; none leaks the key, stalls, or crashes."""

from __future__ import annotations

import gzip
import json
import logging
import math
import socket
import struct
from types import SimpleNamespace
from typing import Any

import pydantic
import pytest
import trio

from rlm_graph.contracts import ChatRequest, ChatResponse
from rlm_graph.errors import BadResponse, ContextLengthExceeded, ProviderError
from rlm_graph.testing import FakeOpenAIServer, Reply
from rlm_graph_openai import OpenAIProvider
from tests.support.http import KEY, openai_kwargs
from tests.support.rawhttp import raw_server
from tests.support.sse import REQUEST, SSE_HEAD, raw_provider, sse_chunk, sse_event


@pytest.mark.parametrize("said", ["error event", "not JSON"])
@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_key_a_stream_echoes_never_reaches_the_error_or_the_logs(
    api: str, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A gateway that says "invalid key sk-..." in a streamed error event (or in an event
    that is not JSON) had the key put verbatim in the call's error and its retry log."""
    if said == "not JSON":
        event = b"data: oops " + KEY.encode() + b"\n\n"
    elif api == "openai":
        event = sse_event({"error": {"message": f"invalid api key {KEY}"}})
    else:
        event = sse_event({"type": "error", "error": {"message": f"invalid x-api-key {KEY}"}})

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(SSE_HEAD + sse_chunk(event) + b"0\r\n\r\n")
        return True

    caplog.set_level(logging.DEBUG)
    async with raw_server(handler) as (port, stats):
        provider = raw_provider(port, api, max_attempts=2)
        with pytest.raises(BadResponse) as caught:
            await provider.stream(REQUEST, lambda offset, text: None)
        await provider.aclose()
    assert stats["requests"] == 2
    assert "[REDACTED]" in str(caught.value)
    assert KEY not in str(caught.value) and KEY not in caplog.text


@pytest.mark.parametrize("after", ["held open", "keep-alive comments"])
async def test_a_stream_is_whole_at_its_end_marker_whatever_the_server_does_after(
    after: str,
) -> None:
    """After ``[DONE]`` a server that held the connection open (or kept sending ``:
    ping`` comments) had its whole reply thrown away as a timeout and sent again (paid
    twice), or waited for without end: the reply is the call's, from one request."""
    body = (
        sse_event({"choices": [{"delta": {"content": "hello"}}]})
        + sse_event({"choices": [{"delta": {}, "finish_reason": "stop"}]})
        + sse_event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}})
        + b"data: [DONE]\n\n"
    )

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(SSE_HEAD + sse_chunk(body))
        while True:  # never the body's end
            await trio.sleep(0.05)
            if after == "keep-alive comments":
                await stream.send_all(sse_chunk(b": ping\n\n"))

    async with raw_server(handler) as (port, stats):
        provider = raw_provider(port, max_attempts=2, timeout=1.0)
        with trio.fail_after(30):  # a guard against the hang this test is about
            reply = await provider.stream(REQUEST, lambda offset, text: None)
        await provider.aclose()
    assert reply.content == "hello" and reply.finish_reason == "stop"
    assert reply.usage.input_tokens == 3 and stats["requests"] == 1


async def test_a_stream_that_ends_after_its_marker_keeps_its_connection() -> None:
    """The body's end that follows the end marker is still read: the connection carries
    the next call."""
    body = sse_event({"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]})

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(SSE_HEAD + sse_chunk(body + b"data: [DONE]\n\n"))
        await trio.sleep(0.01)  # the terminating chunk in a write of its own
        await stream.send_all(b"0\r\n\r\n")
        return True

    async with raw_server(handler) as (port, stats):
        provider = raw_provider(port)
        for _ in range(3):
            assert (await provider.stream(REQUEST, lambda offset, text: None)).content == "hi"
        await provider.aclose()
    assert stats["requests"] == 3 and stats["connections"] == 1


@pytest.mark.parametrize("cost", ["-1.0", "NaN", "Infinity", "1e999", "9" * 400])
async def test_a_server_cost_that_is_no_price_is_not_taken(cost: str) -> None:
    """A negative or NaN ``usage.cost`` taken as it was switched ``max_budget`` off for
    the rest of the run (the total never passed the limit again): it is no cost, and the
    engine prices the call itself."""
    body = (
        '{"model": "m", "choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],'
        f' "usage": {{"prompt_tokens": 10, "completion_tokens": 5, "cost": {cost}}}}}'
    )

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        await stream.send_all(head % len(body) + body.encode())
        return True

    async with raw_server(handler) as (port, _):
        provider = raw_provider(port)
        reply = await provider.complete(REQUEST)
        await provider.aclose()
    assert reply.content == "ok" and reply.cost is None
    assert reply.usage.input_tokens == 10


def test_a_plugins_reply_may_not_carry_a_cost_that_is_no_price() -> None:
    for cost in (-0.01, math.nan, math.inf):
        with pytest.raises(pydantic.ValidationError):
            ChatResponse(content="x", cost=cost)
    assert ChatResponse(content="x", cost=0.25).cost == 0.25


async def test_a_token_count_past_any_calls_is_unknown_not_a_crash() -> None:
    """A count of 400 digits failed an answered call with ``OverflowError`` when priced:
    it is unknown (the usage is estimated), and the reply is the call's."""
    usage = {"prompt_tokens": int("9" * 400), "completion_tokens": 5}
    reply_body = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
    with FakeOpenAIServer(replies=[Reply(200, {**reply_body, "usage": usage})]) as server:
        provider = OpenAIProvider(**openai_kwargs(server))
        reply = await provider.complete(REQUEST)
        await provider.aclose()
    assert reply.content == "ok"
    assert reply.usage.input_tokens == 0 and reply.usage.output_tokens == 5


@pytest.mark.parametrize(
    "wait",
    [
        "Wed, 99999999999999999999 Oct 2015 07:28:00 GMT",
        "Fri, 31 Dec 99999 23:59:59 GMT",
        "nan",
        "inf",
    ],
)
async def test_a_retry_after_no_clock_can_read_falls_back_to_the_backoff(wait: str) -> None:
    """A 429 whose ``Retry-After`` is a date past any calendar failed the call at once
    with a bare ``OverflowError``: it is unreadable, so the engine's own backoff holds."""
    with FakeOpenAIServer(replies=[Reply.error(429, "slow", retry_after=wait), "ok"]) as server:
        provider = OpenAIProvider(**openai_kwargs(server))
        reply = await provider.complete(REQUEST)
        await provider.aclose()
    assert reply.content == "ok" and len(server.requests) == 2


async def test_codings_stacked_past_reason_are_a_bad_response_naming_them() -> None:
    """A body gzipped 1,200 times and labelled so ran the decoder's frames out
    (``RecursionError``): a body naming more than a few codings is refused, retried."""
    body = b'{"choices": []}'
    for _ in range(40):
        body = gzip.compress(body)

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        codings = b", ".join([b"gzip"] * 40)
        head = b"HTTP/1.1 200 OK\r\nContent-Encoding: %s\r\nContent-Length: %d\r\n\r\n"
        await stream.send_all(head % (codings, len(body)) + body)
        return True

    async with raw_server(handler) as (port, stats):
        provider = raw_provider(port, max_attempts=2)
        with pytest.raises(BadResponse, match="names 40 content codings, more than the 8"):
            await provider.complete(REQUEST)
        await provider.aclose()
    assert stats["requests"] == 2


async def test_an_error_body_of_megabytes_is_read_by_its_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every 4xx's whole body was searched for a context-length message on the event
    loop (a 60 MiB body held every other call for 14 s): the search, and the quote in
    the error, read its first 64 KiB, where a server says what went wrong."""
    import rlm_graph._http.answers as answers

    searched: list[int] = []
    check = answers.is_context_length_error

    def spy(text: str) -> bool:
        searched.append(len(text))
        return check(text)

    monkeypatch.setattr(answers, "is_context_length_error", spy)
    big = "maximum context length is 8192 tokens " + "x " * (4 * 1024 * 1024)
    with FakeOpenAIServer(replies=[Reply.error(400, big)] * 2) as server:
        provider = OpenAIProvider(**openai_kwargs(server))
        with pytest.raises(ContextLengthExceeded) as caught:
            await provider.complete(REQUEST)
        await provider.aclose()
    assert searched and max(searched) <= answers.ERROR_TEXT
    assert len(str(caught.value)) < 2000


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_a_reply_a_plugins_parser_did_not_expect_is_retried_as_a_bad_response(
    streamed: bool,
) -> None:
    """writing-a-provider.md: a reply of another shape is a retried `BadResponse`. A
    parser calling ``.get`` on a list, or a stream parser's own ``KeyError``, escaped as a
    bare exception from the first request, never retried."""

    class Careless(OpenAIProvider):
        def _parse(self, data: Any, request: ChatRequest) -> ChatResponse:
            return ChatResponse(content=data.get("text", ""))

        def _stream_parser(self, request: ChatRequest) -> Any:
            class Parser:
                finished = False

                def feed(self, event: str, data: str) -> str:
                    return str(json.loads(data)["delta"])

                def partial(self) -> ChatResponse:
                    return ChatResponse(content="")

                def result(self) -> ChatResponse:
                    return ChatResponse(content="")

            return Parser()

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        if streamed:
            await stream.send_all(SSE_HEAD + sse_chunk(sse_event({"other": 1})) + b"0\r\n\r\n")
        else:
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 6\r\n\r\n"
            await stream.send_all(head + b"[1, 2]")
        return True

    async with raw_server(handler) as (port, stats):
        server = SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1")
        provider = Careless(**openai_kwargs(server, max_attempts=3))
        with pytest.raises(BadResponse, match="cannot read") as caught:
            if streamed:
                await provider.stream(REQUEST, lambda offset, text: None)
            else:
                await provider.complete(REQUEST)
        await provider.aclose()
    name = "KeyError" if streamed else "AttributeError"
    assert f"({name} " in str(caught.value) and stats["requests"] == 3


async def test_a_plugins_own_verdict_on_a_reply_is_not_made_a_bad_response() -> None:
    """A parser that refuses a reply with an error of its own (not a `BadResponse`) is
    taken at its word: not retried, not renamed."""

    class Strict(OpenAIProvider):
        def _parse(self, data: Any, request: ChatRequest) -> ChatResponse:
            raise ProviderError("mine: the model refused", provider=self.name)

    with FakeOpenAIServer(replies=["ok", "ok"]) as server:
        provider = Strict(**openai_kwargs(server))
        with pytest.raises(ProviderError, match="the model refused") as caught:
            await provider.complete(REQUEST)
        await provider.aclose()
    assert not isinstance(caught.value, BadResponse) and len(server.requests) == 1


async def test_a_plugins_error_reader_that_slips_on_a_proxys_page_loses_no_retry() -> None:
    """writing-a-provider.md says to override ``_server_message`` for an API's error
    shape; one reading ``data.get(...)`` met a proxy's HTML 503 (``data`` is None) and
    the call failed at once with a bare AttributeError, the 503 never retried."""

    class Reads(OpenAIProvider):
        def _server_message(self, data: Any) -> str:
            return str(data.get("detail", ""))

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        if index == 1:  # the first request
            page = b"<html>Service Unavailable</html>"
            head = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/html\r\n"
            await stream.send_all(head + b"Content-Length: %d\r\n\r\n" % len(page) + page)
        else:
            body = json.dumps(
                {"choices": [{"message": {"content": "the answer"}, "finish_reason": "stop"}]}
            ).encode()
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            await stream.send_all(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return True

    async with raw_server(handler) as (port, stats):
        server = SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1")
        provider = Reads(**openai_kwargs(server, max_attempts=3))
        answer = await provider.complete(REQUEST)
        await provider.aclose()
    assert answer.content == "the answer" and stats["requests"] == 2


_WHOLE = (
    sse_event({"choices": [{"delta": {"content": "hello"}}]})
    + sse_event({"choices": [{"delta": {}, "finish_reason": "stop"}]})
    + sse_event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}})
    + b"data: [DONE]\n\n"
)
_ANTHROPIC_WHOLE = (
    sse_event({"type": "message_start", "message": {"usage": {"input_tokens": 3}}})
    + sse_event({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hello"}})
    + sse_event(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 1},
        }
    )
    + sse_event({"type": "message_stop"})
)


@pytest.mark.parametrize("how", ["closed", "reset"])
@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_stream_is_whole_at_its_end_marker_however_the_connection_ends(
    api: str, how: str
) -> None:
    """``[DONE]`` (or ``message_stop``) came, then the server or a proxy closed or reset
    the connection before the body's own end: the whole reply was thrown away and asked
    for again, every time (such a server failed every streamed call)."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(SSE_HEAD + sse_chunk(_WHOLE if api == "openai" else _ANTHROPIC_WHOLE))
        await trio.sleep(0.05)
        if how == "reset":  # an RST, not a FIN
            linger = struct.pack("ii", 1, 0)
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)  # type: ignore[attr-defined]
        return False  # closed without the 0-length chunk

    async with raw_server(handler) as (port, stats):
        provider = raw_provider(port, api, max_attempts=3)
        reply = await provider.stream(REQUEST, lambda offset, text: None)
        await provider.aclose()
    assert reply.content == "hello" and reply.usage.output_tokens == 1
    assert stats["requests"] == 1


async def test_a_stream_reset_midway_is_a_cut_stream_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A connection reset mid-stream was reported as a reply the parser could not read
    ("check that base_url points at the API") and counted as a bad response."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        if index == 1:
            await stream.send_all(
                SSE_HEAD + sse_chunk(sse_event({"choices": [{"delta": {"content": "hel"}}]}))
            )
            await trio.sleep(0.05)
            linger = struct.pack("ii", 1, 0)
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)  # type: ignore[attr-defined]
            return False
        await stream.send_all(SSE_HEAD + sse_chunk(_WHOLE) + b"0\r\n\r\n")
        return True

    caplog.set_level(logging.DEBUG, logger="rlm_graph")
    async with raw_server(handler) as (port, stats):
        provider = raw_provider(port, max_attempts=3)
        reply = await provider.stream(REQUEST, lambda offset, text: None)
        await provider.aclose()
    assert reply.content == "hello" and stats["requests"] == 2
    assert "broke off before its end" in caplog.text
    assert "in its parser" not in caplog.text


@pytest.mark.parametrize("after", ["silence", "keep-alive comments"])
async def test_an_error_event_mid_stream_ends_the_attempt_at_once(
    after: str, caplog: pytest.LogCaptureFixture
) -> None:
    """After a mid-stream error event the engine read on: a server that then went silent
    made the failure a timeout (its deadline doubled after), one that sent keep-alive
    comments held the call as long as they came; the server's message was lost."""
    error = sse_event({"error": {"message": "Overloaded", "type": "server_error"}})

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        if index > 1:
            await stream.send_all(SSE_HEAD + sse_chunk(_WHOLE) + b"0\r\n\r\n")
            return True
        await stream.send_all(
            SSE_HEAD + sse_chunk(sse_event({"choices": [{"delta": {"content": "hel"}}]}) + error)
        )
        while True:
            await trio.sleep(0.2)
            if after == "keep-alive comments":
                await stream.send_all(sse_chunk(b": ping\n\n"))

    caplog.set_level(logging.DEBUG, logger="rlm_graph")
    async with raw_server(handler) as (port, stats):
        provider = raw_provider(port, max_attempts=3, timeout=30.0)
        reply = await provider.stream(REQUEST, lambda offset, text: None)
        await provider.aclose()
    assert reply.content == "hello" and stats["requests"] == 2
    assert "failed mid-stream: Overloaded" in caplog.text
    assert "timed out" not in caplog.text and "within 30" not in caplog.text


@pytest.mark.parametrize("odd", ["leading spaces", "Content-Type in capitals"])
async def test_odd_but_valid_streams_are_read(odd: str) -> None:
    """``data:  {...}`` (SSE strips one space; JSON allows the rest) failed every attempt
    as "not a JSON object"; ``Text/Event-Stream`` (media types ignore case) was read as
    a plain body that is not JSON."""
    head, body = SSE_HEAD, _WHOLE
    if odd == "leading spaces":
        body = body.replace(b"data: {", b"data:   {")
    else:
        head = head.replace(b"text/event-stream", b"Text/Event-Stream")

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(head + sse_chunk(body) + b"0\r\n\r\n")
        return True

    async with raw_server(handler) as (port, stats):
        provider = raw_provider(port, max_attempts=2)
        reply = await provider.stream(REQUEST, lambda offset, text: None)
        await provider.aclose()
    assert reply.content == "hello" and stats["requests"] == 1


async def test_the_silence_deadline_starts_again_when_the_headers_come() -> None:
    """The headers, then every chunk, must each come within ``timeout`` of the one before
    (docs/providers.md); the headers did not restart it, so headers at 0.6 of the
    timeout and a first event 0.8 later were a timeout and a second request."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await trio.sleep(1.2)
        await stream.send_all(SSE_HEAD)
        await trio.sleep(1.6)
        await stream.send_all(sse_chunk(_WHOLE) + b"0\r\n\r\n")
        return True

    async with raw_server(handler) as (port, stats):
        provider = raw_provider(port, max_attempts=2, timeout=2.0)
        reply = await provider.stream(REQUEST, lambda offset, text: None)
        await provider.aclose()
    assert reply.content == "hello" and stats["requests"] == 1
