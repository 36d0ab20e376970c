"""More answers a careless or hostile server sends, over real HTTP: a ``charset`` that
is no text encoding, JSON of millions of empty objects, keep-alive events that are not
comments, and a stream whose finish reason came but whose end marker never does. Each is
answered or fails its call with an error naming it; none crashes, eats the memory,
holds the loop or holds the call."""

from __future__ import annotations

import gzip
import json
import socket
import struct
from typing import Any

import pytest
import trio

from rlm_graph._http import bodies
from rlm_graph.errors import BadResponse, ProviderError, ProviderTimeout
from tests.support.rawhttp import raw_server
from tests.support.sse import REQUEST, SSE_HEAD, raw_provider, sse_chunk, sse_event


async def _call(provider: Any, streamed: bool) -> Any:
    """The call's reply, or the error it raised (out of the server's nursery as it is)."""
    try:
        if streamed:
            return await provider.stream(REQUEST, lambda offset, text: None)
        return await provider.complete(REQUEST)
    except Exception as exc:
        return exc
    finally:
        await provider.aclose()


CODECS = ["zlib_codec", "rot13", "idna", "base64", "hex", "punycode", "undefined"]


@pytest.mark.parametrize("charset", CODECS)
@pytest.mark.parametrize(
    ("status", "streamed"), [(500, False), (200, False), (500, True)], ids=["500", "200", "stream"]
)
async def test_a_charset_that_is_no_text_encoding_is_read_as_utf8(
    charset: str, status: int, streamed: bool
) -> None:
    """``Content-Type: text/plain; charset=zlib_codec`` on an error (or on a 2xx that is
    not JSON) failed the call at once with an ``AssertionError`` out of the codec
    (``rot13``: ``TypeError``; ``idna``: ``UnicodeError``), no retry, a traceback out of
    the CLI: the body is read as UTF-8, and the answer is the retried error it is."""
    head = b"HTTP/1.1 %d Oops\r\nContent-Type: text/plain; charset=%s\r\n" % (
        status,
        charset.encode("latin-1"),
    )
    body = "oops, not JSON \N{SNOWMAN}".encode()

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return True

    async with raw_server(handler) as (port, stats):
        error = await _call(raw_provider(port, max_attempts=2), streamed)
    assert isinstance(error, BadResponse if status == 200 else ProviderError), error
    assert "'oops, not JSON \N{SNOWMAN}'" in str(error) and "gave up after 2" in str(error)
    assert stats["requests"] == 2


async def test_a_charset_that_is_a_text_encoding_is_still_honoured() -> None:
    body = "oops, not JSON \N{SNOWMAN}".encode("utf-16")
    head = b"HTTP/1.1 500 Oops\r\nContent-Type: text/plain; charset=utf-16\r\n"

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return True

    async with raw_server(handler) as (port, stats):
        error = await _call(raw_provider(port, max_attempts=1), False)
    assert "'oops, not JSON \N{SNOWMAN}'" in str(error)


def _padded(head: dict[str, Any], containers: int) -> bytes:
    """``head`` as JSON with a ``pad`` of ``containers`` empty objects: a few megabytes
    that parse into as many dicts (`bodies.MAX_JSON_CONTAINERS` is a million)."""
    opened = json.dumps(head)[:-1].encode()
    return opened + b', "pad": [' + b"{}," * (containers - 1) + b"{}]}"


@pytest.mark.parametrize("coding", ["identity", "gzip"])
async def test_a_reply_of_millions_of_json_objects_is_refused_unparsed(coding: str) -> None:
    """64 KiB of gzip that inflate to 64 MiB of ``{},{},...`` parsed into 22 million
    dicts: 1.5 GB and the loop held 2 s a call (16 sub-calls at once: 24 s past a run's
    ``max_timeout=5``). A reply of more than a million objects and arrays is refused
    before it is parsed, a `BadResponse` not retried: the server would send it again."""
    reply = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]}
    body = _padded(reply, 1_200_000)
    if coding == "gzip":
        body = gzip.compress(body)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: %s\r\n"

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        length = b"Content-Length: %d\r\n\r\n" % len(body)
        await stream.send_all(head % coding.encode() + length + body)
        return True

    async with raw_server(handler) as (port, stats):
        error = await _call(raw_provider(port, max_attempts=3), streamed=False)
    assert isinstance(error, BadResponse) and not error.retryable, error
    assert "past the 1,000,000 objects and arrays the engine parses" in str(error)
    assert stats["requests"] == 1


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_streamed_event_of_millions_of_json_objects_is_refused_unparsed(
    api: str,
) -> None:
    """The same in one event of a stream (under its 4 MiB): refused before it is parsed,
    not retried."""
    if api == "anthropic":
        head = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hi"}}
        end = b'data: {"type": "message_stop"}\n\n'
    else:
        head = {"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]}
        end = b"data: [DONE]\n\n"
    event = b"data: " + _padded(head, 1_200_000) + b"\n\n"

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(SSE_HEAD + sse_chunk(event) + sse_chunk(end) + b"0\r\n\r\n")
        return True

    async with raw_server(handler) as (port, stats):
        error = await _call(raw_provider(port, api, max_attempts=3), streamed=True)
    assert isinstance(error, BadResponse) and not error.retryable, error
    assert "streamed an event of JSON with 1,200,0" in str(error)
    assert "past the 1,000,000 objects and arrays the engine parses" in str(error)
    assert stats["requests"] == 1


KEEP_ALIVES = {
    "no data": ("openai", b"data:\n\n"),
    "no choices": ("openai", b'data: {"choices": []}\n\n'),
    "empty delta": ("openai", b'data: {"choices": [{"index": 0, "delta": {}}]}\n\n'),
    "role alone": ("openai", b'data: {"choices": [{"delta": {"role": "assistant"}}]}\n\n'),
    "anthropic ping": ("anthropic", b'event: ping\ndata: {"type": "ping"}\n\n'),
}
FIRST = {
    "openai": sse_event({"choices": [{"delta": {"content": "thinking"}}]}),
    "anthropic": b"event: message_start\n"
    + sse_event({"type": "message_start", "message": {"model": "m", "usage": {"input_tokens": 5}}}),
}


@pytest.mark.parametrize("keep_alive", sorted(KEEP_ALIVES))
async def test_keep_alive_events_alone_are_a_stall_as_comments_are(
    keep_alive: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway that pings with events, not comments (``data:`` with nothing,
    ``{"choices": []}``, an empty delta, Anthropic's ``ping``), started the silence
    deadline again with each: a wedged one held the call until the body's 64 MiB (months
    of pings). Only text, reasoning, a tool call, usage or a finish is progress; the rest
    counts as comments do (here for 8 x 0.1 s after the last progress)."""
    from rlm_graph._http import streaming

    monkeypatch.setattr(streaming, "QUIET_FLOOR", 0.0)
    api, ping = KEEP_ALIVES[keep_alive]
    pings = [0]

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(SSE_HEAD + sse_chunk(FIRST[api]))
        for _ in range(600):  # 30 s of pings, unless the client goes
            await stream.send_all(sse_chunk(ping))
            pings[0] += 1
            await trio.sleep(0.05)
        return False

    async with raw_server(handler) as (port, stats):
        provider = raw_provider(port, api, timeout=0.1, max_attempts=1, max_timeouts=1)
        error = await _call(provider, streamed=True)
    assert isinstance(error, ProviderTimeout), error
    assert stats["requests"] == 1
    assert pings[0] < 100  # 8 x 0.1 s of pings and the timeout: about 18, not 600


AT_WORK = {
    "openai reasoning": ("openai", {"choices": [{"delta": {"reasoning_content": "hmm"}}]}),
    "openai tool call": (
        "openai",
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}}]},
    ),
    "openai delta.thinking": ("openai", {"choices": [{"delta": {"thinking": "hmm"}}]}),
    "mistral thinking parts": (
        "openai",
        {"choices": [{"delta": {"content": [{"type": "thinking", "thinking": [{"text": "h"}]}]}}]},
    ),
    "anthropic thinking": (
        "anthropic",
        {"type": "content_block_delta", "delta": {"type": "thinking_delta", "thinking": "hmm"}},
    ),
}
END = {
    "openai": sse_event({"choices": [{"delta": {"content": "hello"}, "finish_reason": "stop"}]})
    + b"data: [DONE]\n\n",
    "anthropic": sse_event(
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hello"}}
    )
    + sse_event({"type": "message_delta", "delta": {"stop_reason": "end_turn"}})
    + sse_event({"type": "message_stop"}),
}


@pytest.mark.parametrize("work", sorted(AT_WORK))
async def test_events_of_a_model_at_work_without_text_are_progress(
    work: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reasoning, or a tool call's arguments, streams no text for minutes: each such
    event is progress, and the stream is read to its end past the keep-alives' window."""
    from rlm_graph._http import streaming

    monkeypatch.setattr(streaming, "QUIET_FLOOR", 0.0)
    api, event = AT_WORK[work]

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(SSE_HEAD + sse_chunk(FIRST[api]))
        for _ in range(60):  # 3 s, past 8 x 0.3 s
            await stream.send_all(sse_chunk(sse_event(event)))
            await trio.sleep(0.05)
        await stream.send_all(sse_chunk(END[api]) + b"0\r\n\r\n")
        return True

    async with raw_server(handler) as (port, stats):
        provider = raw_provider(port, api, timeout=0.3, max_attempts=1, max_timeouts=1)
        reply = await _call(provider, streamed=True)
    assert reply.content.endswith("hello") and stats["requests"] == 1


def _openai_finish(usage: bool) -> bytes:
    """A reply's text and finish reason (and usage), with no ``[DONE]`` after them."""
    body = sse_event({"choices": [{"delta": {"content": "hello"}}]}) + sse_event(
        {"choices": [{"delta": {}, "finish_reason": "stop"}]}
    )
    if usage:
        body += sse_event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}})
    return body


def _anthropic_finish(usage: bool) -> bytes:
    """A message up to its stop reason, with no ``message_stop`` after it."""
    delta: dict[str, Any] = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}
    if usage:
        delta["usage"] = {"output_tokens": 1}
    return (
        sse_event({"type": "message_start", "message": {"usage": {"input_tokens": 3}}})
        + sse_event(
            {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hello"}}
        )
        + sse_event(delta)
    )


@pytest.mark.parametrize("usage", [True, False], ids=["usage", "no usage"])
@pytest.mark.parametrize("after", ["held open", "keep-alive comments", "reset"])
@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_stream_is_whole_at_its_finish_reason_whatever_the_server_does_after(
    api: str, after: str, usage: bool
) -> None:
    """Text, a finish reason and the usage came, then no ``[DONE]`` (Anthropic: no
    ``message_stop``) and the connection held open: the whole reply was thrown away as
    a timeout and asked for again, three requests billed and the call failed (with ``:
    ping`` comments, held for up to an hour); reset, retried as a stream cut short. What
    follows is read until the attempt's stall deadline (its timeout: here 1 s; keep-alives
    do not start it again once the reply is whole), then the reply is taken from one
    request (with no usage, the engine estimates it)."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        finish = _openai_finish if api == "openai" else _anthropic_finish
        await stream.send_all(SSE_HEAD + sse_chunk(finish(usage)))
        if after == "reset":  # an RST, not a FIN
            await trio.sleep(0.05)
            linger = struct.pack("ii", 1, 0)
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)  # type: ignore[attr-defined]
            return False
        while True:  # never the end marker, nor the body's end
            await trio.sleep(0.05)
            if after == "keep-alive comments":
                await stream.send_all(sse_chunk(b": ping\n\n"))

    async with raw_server(handler) as (port, stats):
        provider = raw_provider(port, api, max_attempts=3, timeout=1.0)
        with trio.fail_after(30):  # a guard against the hang this test is about
            started = trio.current_time()
            reply = await _call(provider, streamed=True)
            took = trio.current_time() - started
    assert reply.content == "hello" and stats["requests"] == 1, reply
    assert reply.finish_reason in ("stop", "end_turn") and took < 2.5
    assert reply.usage.input_tokens == (3 if usage or api == "anthropic" else 0)
    assert reply.usage.output_tokens == (1 if usage else 0)


async def test_text_after_a_finish_reason_is_read_on_to_the_end() -> None:
    """A server that names a finish reason on chunks before its last: the text that
    comes after one within the stall deadline is read on, to ``[DONE]``."""
    early = sse_event({"choices": [{"delta": {"content": "a"}, "finish_reason": "stop"}]})

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(SSE_HEAD)
        for _ in range(15):  # 1.5 s, past a grace of 1 s
            await stream.send_all(sse_chunk(early))
            await trio.sleep(0.1)
        await stream.send_all(sse_chunk(_openai_finish(True) + b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return True

    async with raw_server(handler) as (port, stats):
        provider = raw_provider(port, max_attempts=1, timeout=1.0)
        reply = await _call(provider, streamed=True)
    assert reply.content == "a" * 15 + "hello" and stats["requests"] == 1, reply


async def test_a_finish_reason_on_every_chunk_does_not_cut_a_pause_in_the_reply() -> None:
    """Gateways that put ``finish_reason: "stop"`` on every chunk, reasoning chunks
    too: the reply was cut 2 s after the first (a fixed grace), its text lost, and taken
    as whole. After a finish reason the reading goes on under the stall deadline (here
    5 s): a pause of 2.5 s, reasoning, then the text, all read."""
    thinking = sse_event(
        {"choices": [{"delta": {"reasoning_content": "hmm"}, "finish_reason": "stop"}]}
    )
    text = sse_event({"choices": [{"delta": {"content": "the answer"}, "finish_reason": "stop"}]})

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(SSE_HEAD + sse_chunk(thinking))
        await trio.sleep(2.5)
        await stream.send_all(sse_chunk(thinking))
        await trio.sleep(1.0)
        await stream.send_all(sse_chunk(text + b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return True

    async with raw_server(handler) as (port, stats):
        provider = raw_provider(port, max_attempts=1, timeout=5.0)
        reply = await _call(provider, streamed=True)
    assert reply.content == "the answer" and stats["requests"] == 1, reply


def test_a_reply_with_logprobs_is_read_though_it_holds_a_million_objects() -> None:
    """A reply asked for with ``logprobs`` (24,000 tokens at ``top_logprobs=20``) holds
    about a million objects, one in 22 bytes: it was refused unread, unretried. Only
    JSON that dense (more than one in `bodies.CONTAINER_BYTES` bytes) is refused."""
    token = {"token": "ab", "logprob": -0.5, "bytes": [97, 98]}
    logprobs = json.dumps([{**token, "top_logprobs": [token] * 20}] * 24_000).encode()
    assert logprobs.count(b"{") + logprobs.count(b"[") > bodies.MAX_JSON_CONTAINERS
    assert bodies.too_many_containers(logprobs) == 0
    dense = b"[" + b"{}," * 1_100_000 + b"{}]"
    assert bodies.too_many_containers(dense) > bodies.MAX_JSON_CONTAINERS
