"""Broken answers over real HTTP: truncated, empty, reset and hung answers are retried;
every retry is counted on its node and summarised in one log line per run; replies cut
off by the token limit or without text reach the model with a note."""

from __future__ import annotations

import functools
import gzip
import json
import logging
import tracemalloc
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import trio

from rlm_graph import Engine, Workflow
from rlm_graph.contracts import ChatRequest, ChatResponse, Message
from rlm_graph.errors import BadResponse, ProviderError
from rlm_graph.testing import FakeAnthropicServer, FakeOpenAIServer, Reply
from rlm_graph_anthropic import AnthropicProvider
from rlm_graph_openai import OpenAIProvider
from tests.support.http import anthropic_kwargs, openai_kwargs
from tests.support.rawhttp import raw_server

REQUEST = ChatRequest(messages=(Message(role="user", content="hello"),), model="gpt-test")


async def _complete(provider: OpenAIProvider) -> str:
    try:
        return (await provider.complete(REQUEST)).content
    finally:
        await provider.aclose()


async def test_a_truncated_or_empty_200_is_retried_like_a_5xx() -> None:
    with FakeOpenAIServer(replies=[Reply.truncated("first"), Reply.empty(), "ok"]) as server:
        assert await _complete(OpenAIProvider(**openai_kwargs(server))) == "ok"
    assert len(server.requests) == 3


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_is_not_followed_and_names_where_it_points(status: int) -> None:
    """Following it would send the key elsewhere; the error says base_url is what to fix
    (not "the request arguments")."""
    moved = Reply.error(status, "moved", location="https://api.example.test/v1/chat/completions")
    with FakeOpenAIServer(replies=[moved]) as server:
        with pytest.raises(ProviderError) as caught:
            await _complete(OpenAIProvider(**openai_kwargs(server)))
    message = str(caught.value)
    assert f"answered {status}" in message and "https://api.example.test/v1" in message
    assert "set base_url" in message and "request arguments" not in message
    assert not caught.value.retryable and len(server.requests) == 1


async def test_a_reset_mid_response_and_a_hang_are_retried() -> None:
    with FakeOpenAIServer(replies=[Reply.reset(), Reply.hang(), "ok"]) as server:
        provider = OpenAIProvider(**openai_kwargs(server, timeout=0.3))
        assert await _complete(provider) == "ok"
    assert len(server.requests) == 3


async def test_a_200_of_the_wrong_shape_is_retried_then_explained() -> None:
    with FakeOpenAIServer(lambda body: {"unexpected": True}) as server:
        provider = OpenAIProvider(**openai_kwargs(server, max_attempts=3))
        with pytest.raises(BadResponse, match="choices") as info:
            await _complete(provider)
    assert len(server.requests) == 3
    assert "gave up after 3 attempts" in str(info.value)


@pytest.mark.parametrize("reason", [5, ["length"], True])
async def test_a_finish_reason_that_is_not_text_is_read_as_text(reason: Any) -> None:
    """Servers now and then put a number or a list in ``finish_reason``: the reply is
    otherwise fine and is answered, the reason kept as its text (as a streamed reply's
    is), for OpenAI's API and Anthropic's ``stop_reason`` alike."""
    openai = {"choices": [{"message": {"content": "42"}, "finish_reason": reason}]}
    with FakeOpenAIServer(replies=[Reply(200, openai)]) as server:
        provider = OpenAIProvider(**openai_kwargs(server))
        try:
            reply = await provider.complete(REQUEST)
        finally:
            await provider.aclose()
    assert (reply.content, reply.finish_reason) == ("42", str(reason))
    claude = {"content": [{"type": "text", "text": "42"}], "stop_reason": reason}
    with FakeAnthropicServer(replies=[Reply(200, claude)]) as server:
        anthropic = AnthropicProvider(**anthropic_kwargs(server))
        try:
            reply = await anthropic.complete(REQUEST)
        finally:
            await anthropic.aclose()
    assert (reply.content, reply.finish_reason) == ("42", str(reason))


async def test_a_reply_the_parser_cannot_make_into_a_reply_is_a_bad_response() -> None:
    """A provider plugin whose ``_parse`` passes on a field of the wrong type (here a
    number as the text) gets a `BadResponse` naming the field, retried like a reply of
    the wrong shape, never pydantic's report from deep inside."""

    class Careless(OpenAIProvider):
        def _parse(self, data: Any, request: ChatRequest) -> ChatResponse:
            return ChatResponse(content=data["choices"][0]["message"]["content"])

    numbers = {"choices": [{"message": {"content": 42}, "finish_reason": "stop"}]}
    with FakeOpenAIServer(lambda body: Reply(200, numbers)) as server:
        provider = Careless(**openai_kwargs(server, max_attempts=2))
        with pytest.raises(BadResponse) as info:
            await _complete(provider)
    assert len(server.requests) == 2
    said = str(info.value)
    assert "cannot read (content: Input should be a valid string)" in said
    assert "base_url" in said and "gave up after 2 attempts" in said
    assert "validation error" not in said and "pydantic" not in said


async def test_a_key_the_parser_does_not_find_is_a_bad_response_retried() -> None:
    """A plugin's ``_parse`` indexing a reply of another shape (a proxy's stand-in answer)
    raised a bare ``KeyError`` once, unretried; it is a `BadResponse` naming it, retried,
    and the next, right answer is the call's."""

    class Careless(OpenAIProvider):
        def _parse(self, data: Any, request: ChatRequest) -> ChatResponse:
            return ChatResponse(content=data["choices"][0]["message"]["content"])

    right = {"choices": [{"message": {"content": "42"}, "finish_reason": "stop"}]}
    replies = [Reply(200, {"detail": "busy"}), Reply(200, {"choices": []}), Reply(200, right)]
    with FakeOpenAIServer(replies=replies) as server:
        provider = Careless(**openai_kwargs(server, max_attempts=3))
        assert await _complete(provider) == "42"
    assert len(server.requests) == 3
    with FakeOpenAIServer(lambda body: Reply(200, {"detail": "busy"})) as server:
        provider = Careless(**openai_kwargs(server, max_attempts=2))
        with pytest.raises(BadResponse) as info:
            await _complete(provider)
    said = str(info.value)
    assert "cannot read (KeyError 'choices' in its parser)" in said
    assert "gave up after 2 attempts" in said


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_json_nested_past_the_stack_is_a_bad_response(streamed: bool) -> None:
    """A server's JSON nested 100,000 deep (a whole answer, or one streamed event) is a
    body that is not JSON to the engine: a `BadResponse`, retried, never the decoder's
    `RecursionError`."""
    deep = b"[" * 100_000 + b"]" * 100_000

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        if streamed:
            body = b"data: " + deep + b"\n\n"
            kind = b"text/event-stream"
        else:
            body, kind = deep, b"application/json"
        head = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
        await stream.send_all(head % (kind, len(body)) + body)
        return True

    async with raw_server(handler) as (port, stats):
        server = SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1")
        provider = OpenAIProvider(**openai_kwargs(server, max_attempts=2))
        with pytest.raises(BadResponse, match="not JSON" if not streamed else "not a JSON"):
            if streamed:
                await provider.stream(REQUEST, lambda attempt, text: None)
            else:
                await provider.complete(REQUEST)
        await provider.aclose()
    assert stats["requests"] == 2


def _sse_head() -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _delta(text: bytes) -> bytes:
    return b'data: {"choices": [{"delta": {"content": "' + text + b'"}}]}\n\n'


async def test_a_streamed_event_that_is_not_utf8_is_read_with_replacement_characters() -> None:
    """Bytes that are not UTF-8 in a streamed event read as U+FFFD, as the event-stream
    format says: the reply is answered, not failed with a decoding error."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        stop = b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n\n'
        body = _delta(b"caf\xe9 ") + _delta(b"ok") + stop + b"data: [DONE]\n\n"
        await stream.send_all(_sse_head() + _chunk(body) + b"0\r\n\r\n")
        return True

    async with raw_server(handler) as (port, _):
        server = SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1")
        provider = OpenAIProvider(**openai_kwargs(server))
        seen: list[str] = []
        reply = await provider.stream(REQUEST, lambda offset, text: seen.append(text))
        await provider.aclose()
    assert reply.content == "caf\ufffd ok" == "".join(seen)


@pytest.mark.parametrize("pool", ["lean", "httpx"])
@pytest.mark.parametrize("shape", ["tokens", "one event"])
async def test_a_stream_without_end_is_cut_off_not_kept(
    shape: str, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that streams without end, tokens past the body's limit (here lowered to
    1 MiB) or one event past `MAX_EVENT` (4 MiB) without its blank line, is cut off
    there: a `BadResponse` naming the limit, retried, never memory filled (nor, for the
    event, the same bytes joined and searched again for every chunk)."""
    if shape == "tokens":
        monkeypatch.setattr("rlm_graph._http.bodies.MAX_BODY", 1024 * 1024)
    token = _delta(b"x" * 200)
    piece = b"".join([token] * 256) if shape == "tokens" else b"y" * 65536

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        first = b"data: " if shape == "one event" else b""
        await stream.send_all(_sse_head() + _chunk(first + piece))
        while True:  # until the client hangs up
            await stream.send_all(_chunk(piece))

    limit = "an answer over 1 MiB" if shape == "tokens" else "an event over 4 MiB"
    async with raw_server(handler) as (port, stats):
        server = SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1")
        provider = OpenAIProvider(**openai_kwargs(server, max_attempts=2, http_transport=pool))
        with trio.fail_after(20), pytest.raises(BadResponse, match=f"streamed {limit}"):
            await provider.stream(REQUEST, lambda offset, text: None)
        await provider.aclose()
    assert stats["requests"] == 2


@pytest.mark.parametrize("answer", ["reply", "big", "bomb"])
async def test_httpxs_own_pool_reads_answers_within_the_same_limit(
    answer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through httpx's own pool (``http_transport="httpx"``, as behind a proxy) a whole
    answer is held to the same limit as through the lean transport (here lowered to
    1 MiB): a body past it, or a gzip body that inflates past it, fails the call naming
    the limit, after its retries; a gzip reply within it is read as always."""
    monkeypatch.setattr("rlm_graph._http.bodies.MAX_BODY", 1024 * 1024)
    reply = json.dumps({"choices": [{"message": {"content": "small"}}]}).encode()
    body = {
        "reply": gzip.compress(reply),
        "big": b"x" * (2 * 1024 * 1024),
        "bomb": gzip.compress(bytes(8 * 1024 * 1024)),
    }[answer]

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        coding = b"" if answer == "big" else b"Content-Encoding: gzip\r\n"
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n"
        await stream.send_all(head % (coding, len(body)) + body)
        return True

    async with raw_server(handler) as (port, stats):
        server = SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1")
        kwargs = openai_kwargs(server, max_attempts=2, http_transport="httpx")
        provider = OpenAIProvider(**kwargs)
        try:
            with trio.fail_after(20):
                if answer == "reply":
                    assert (await provider.complete(REQUEST)).content == "small"
                else:
                    with pytest.raises(ProviderError, match="over 1 MiB"):
                        await provider.complete(REQUEST)
        finally:
            await provider.aclose()
    assert stats["requests"] == (1 if answer == "reply" else 2)


@functools.cache
def _nested_bomb() -> bytes:
    """64 MiB of zeros, gzipped twice: a few hundred bytes on the wire."""
    return gzip.compress(gzip.compress(bytes(64 * 1024 * 1024)))


@pytest.mark.parametrize("pool", ["lean", "httpx"])
@pytest.mark.parametrize("shape", ["whole", "streamed"])
async def test_gzip_inside_gzip_is_cut_off_with_little_in_memory(
    pool: str, shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Content-Encoding: gzip, gzip`` on a few hundred bytes that inflate to 64 MiB:
    every path (the lean transport and httpx's pool, a whole answer and a streamed
    one) decodes it a bounded piece at a time and fails the call past the limit (here
    1 MiB), with a few MiB in memory at the most, never the 64 MiB at once."""
    monkeypatch.setattr("rlm_graph._http.bodies.MAX_BODY", 1024 * 1024)
    bomb = _nested_bomb()
    kind = b"text/event-stream" if shape == "streamed" else b"application/json"

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Encoding: gzip, gzip\r\n"
        await stream.send_all(head % kind + b"Content-Length: %d\r\n\r\n" % len(bomb) + bomb)
        return True

    async with raw_server(handler) as (port, stats):
        server = SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1")
        provider = OpenAIProvider(**openai_kwargs(server, max_attempts=1, http_transport=pool))
        tracemalloc.start()
        try:
            with trio.fail_after(20), pytest.raises(ProviderError, match="over 1 MiB"):
                if shape == "streamed":
                    await provider.stream(REQUEST, lambda offset, text: None)
                else:
                    await provider.complete(REQUEST)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            await provider.aclose()
    assert len(bomb) < 4096 and stats["requests"] == 1
    assert peak < 8 * 1024 * 1024, f"{peak / 2**20:.1f} MiB at the peak"


async def _labelled_gzip(pool: str, body: bytes, attempts: int) -> tuple[str | Exception, int]:
    """What a provider makes of answers labelled gzip holding ``body`` (its reply or its
    `BadResponse`), and how many requests it sent."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
        await stream.send_all(head % len(body) + body)
        return True

    async with raw_server(handler) as (port, stats):
        server = SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1")
        kwargs = openai_kwargs(server, max_attempts=attempts, http_transport=pool)
        try:
            got: str | Exception = await _complete(OpenAIProvider(**kwargs))
        except BadResponse as exc:
            got = exc
    return got, stats["requests"]


@pytest.mark.parametrize("pool", ["lean", "httpx"])
async def test_a_body_that_is_not_what_its_encoding_says_is_a_bad_response(pool: str) -> None:
    """A body labelled gzip that is not gzip fails its attempt as a `BadResponse`
    saying so, retried, not httpx's `DecodingError` from deep inside."""
    got, requests = await _labelled_gzip(pool, b"this is not gzip at all", attempts=2)
    assert isinstance(got, BadResponse) and "does not decode" in str(got)
    assert requests == 2


@pytest.mark.parametrize("pool", ["lean", "httpx"])
async def test_a_gzip_body_of_several_members_is_read_whole(pool: str) -> None:
    """gzip allows several members one after the other (RFC 1952): the body was cut to
    the first, read as JSON that is not, and retried, the error blaming base_url."""
    import gzip

    reply = json.dumps({"choices": [{"message": {"content": "whole"}}]}).encode()
    body = gzip.compress(reply[:20]) + gzip.compress(reply[20:])
    assert await _labelled_gzip(pool, body, attempts=1) == ("whole", 1)


@pytest.mark.parametrize("pool", ["lean", "httpx"])
@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_a_call_cancelled_mid_body_leaves_nothing_behind(pool: str, streamed: bool) -> None:
    """A call cancelled (a deadline, Ctrl-C) while a gzip body trickles in, whole or
    streamed, on either pool: nothing is left half-way (no iterator for the collector,
    which the test run would report), and with one connection allowed the next call
    gets it and its answer."""
    reply = json.dumps({"choices": [{"message": {"content": "next"}}]}).encode()

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        if index > 1:
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(reply)
            await stream.send_all(head + reply)
            return True
        kind = b"text/event-stream" if streamed else b"application/json"
        head = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Encoding: gzip\r\n"
        part = gzip.compress(b"x" * 1000)[:20]
        await stream.send_all(head % kind + b"Transfer-Encoding: chunked\r\n\r\n")
        await stream.send_all(b"%x\r\n%s\r\n" % (len(part), part))
        await trio.sleep(10)  # the rest never comes
        return False

    async with raw_server(handler) as (port, _):
        server = SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1")
        kwargs = openai_kwargs(server, max_attempts=1, max_concurrent=1, http_transport=pool)
        provider = OpenAIProvider(**kwargs)
        try:
            with trio.move_on_after(0.3) as cut:
                if streamed:
                    await provider.stream(REQUEST, lambda offset, text: None)
                else:
                    await provider.complete(REQUEST)
            with trio.fail_after(5):
                after = await provider.complete(REQUEST)
        finally:
            await provider.aclose()
    assert cut.cancelled_caught and after.content == "next"


async def test_a_web_page_answering_200_fails_at_once() -> None:
    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200, headers={"Content-Type": "text/html"}, text="<html>hi</html>")

    provider = OpenAIProvider(backend="vllm", model_name="m", transport=httpx.MockTransport(answer))
    with pytest.raises(BadResponse, match="not JSON.*base_url"):
        await _complete(provider)
    assert len(calls) == 1


def test_retries_are_counted_on_the_node_and_logged_once_per_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    replies = [
        Reply.error(429, "slow down", retry_after="0"),
        Reply.error(500, "boom"),
        Reply.truncated(),
        Reply.error(429, "slow down", retry_after="0"),
        "first",
        "second",
    ]
    with FakeOpenAIServer(replies=replies) as server:
        engine = Engine("openai", openai_kwargs(server, max_concurrent=1))
        wf = Workflow()
        first = wf.llm("a", id="first")
        second = wf.llm(lambda _: "b", first, id="second")
        with caplog.at_level(logging.DEBUG, logger="rlm_graph"):
            result = engine.run(wf)
    assert result[first] == "first" and result[second] == "second"
    assert result.graph["first"].attempts == 5 and result.graph["second"].attempts == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["openai: 4 retries over 2 calls: 429 x 2, 500 x 1, bad response x 1"]
    debug = [
        r for r in caplog.records if r.levelno == logging.DEBUG and "retrying in" in r.getMessage()
    ]
    assert len(debug) == 4


def test_a_dropped_connection_is_sent_again_only_as_a_counted_attempt() -> None:
    with FakeOpenAIServer(replies=[Reply.dropped(), "ok"]) as server:
        engine = Engine("openai", openai_kwargs(server))
        wf = Workflow()
        ref = wf.llm("a", id="a")
        result = engine.run(wf)
    assert result[ref] == "ok"
    assert len(server.requests) == 2 and result.graph["a"].attempts == 2


def test_a_reply_cut_off_or_without_text_reaches_the_model_with_a_note() -> None:
    def body(content: str | None, reason: str) -> dict[str, object]:
        return {
            "choices": [
                {"message": {"role": "assistant", "content": content}, "finish_reason": reason}
            ],
            "model": "gpt-test",
        }

    replies = [body("half an ans", "length"), body(None, "stop"), body("fine", "stop")]
    with FakeOpenAIServer(replies=replies) as server:
        engine = Engine("openai", openai_kwargs(server, max_concurrent=1))
        wf = Workflow()
        cut = wf.llm("a", id="cut")
        null = wf.llm(lambda _: "b", cut, id="null")
        fine = wf.llm(lambda _: "c", null, id="fine")
        result = engine.run(wf)
    assert result[cut].startswith("half an ans\n[rlm-graph: the reply was cut off")
    assert "finish_reason=length" in result[cut]
    assert result[null] == "[rlm-graph: the model returned no text (finish_reason=stop)]"
    assert result[fine] == "fine"
    records = result.graph
    assert records["cut"].finish_reason == "length" and "cut off" in (records["cut"].note or "")
    assert "no text" in (records["null"].note or "") and records["fine"].note is None


@pytest.mark.processes
def test_ctrl_c_mid_batch_cancels_every_request_then_raises_keyboard_interrupt() -> None:
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import os, signal, threading, time
        from rlm_graph import RLM
        from rlm_graph.testing import FakeOpenAIServer, Reply

        code = "llm_query_batched([f'q{i}' for i in range(8)])"
        started = threading.Event()

        def respond(body):
            if any(m["role"] == "system" for m in body["messages"]):
                return "```repl\\n" + code + "\\n```"
            started.set()
            return Reply.hang(60)

        with FakeOpenAIServer(respond) as server:
            def interrupt():
                started.wait(20)
                while server.in_flight < 8:
                    time.sleep(0.01)
                os.kill(os.getpid(), signal.SIGINT)
            threading.Thread(target=interrupt, daemon=True).start()
            rlm = RLM("vllm", {"model_name": "m", "base_url": server.base_url})
            try:
                rlm.completion("x")
            except KeyboardInterrupt:
                print("KeyboardInterrupt")
            # Every hung request ends when its client hangs up: nothing was left open.
            for _ in range(500):
                if server.in_flight == 0:
                    break
                time.sleep(0.01)
            print("in flight", server.in_flight)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split("\n")[:2] == ["KeyboardInterrupt", "in flight 0"], done.stderr
