"""The lean httpx transport over trio streams: keep-alive, chunked bodies,
connection loss and reuse, the connection limit, TLS, and the proxy fallback."""

from __future__ import annotations

import contextlib
import gc
import gzip
import re
import socket
import ssl
import struct
import threading
import time
from functools import partial
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from rlm_graph._http.bodies import read_whole
from rlm_graph._http.transport import LeanTransport, RequestNotSent, _Connection, proxy_configured
from rlm_graph.contracts import ChatRequest, Message
from rlm_graph.errors import ConfigError, ProviderError, ProviderTimeout
from rlm_graph.testing import FakeOpenAIServer
from rlm_graph_openai import OpenAIProvider
from tests.support.http import openai_kwargs
from tests.support.rawhttp import plain_response, raw_server, read_request

REQUEST = ChatRequest(messages=(Message(role="user", content="hello"),), model="gpt-test")


async def test_keep_alive_reuses_one_connection() -> None:
    with FakeOpenAIServer() as server:
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            for i in range(5):
                body = {"model": "m", "messages": [{"role": "user", "content": f"n{i}"}]}
                response = await client.post(server.base_url + "/chat/completions", json=body)
                assert response.json()["choices"][0]["message"]["content"] == f"echo: n{i}"
    assert server.connections_opened == 1


async def test_chunked_response_body_and_reuse_after_it() -> None:
    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(plain_response(b"hello chunked world %d" % index, chunked=True))
        return True

    async with raw_server(handler) as (port, stats):
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            first = await client.get(f"http://127.0.0.1:{port}/a")
            second = await client.get(f"http://127.0.0.1:{port}/b")
    assert first.text == "hello chunked world 1"
    assert second.text == "hello chunked world 2"
    assert stats["connections"] == 1


async def test_a_connection_the_server_closed_is_replaced() -> None:
    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(plain_response(b"once"))  # no "Connection: close", yet it closes
        return False

    async with raw_server(handler) as (port, stats):
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            for _ in range(3):
                assert (await client.post(f"http://127.0.0.1:{port}/", content=b"x")).text == "once"
                await trio.sleep(0.01)
    assert stats["connections"] == 3


async def test_a_request_written_to_a_dead_keep_alive_is_never_sent_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server reads the second request on a reused connection, then hangs up without
    answering: it may have started a completion, so the transport must not send it again."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        if index == 1:
            await stream.send_all(plain_response(b"ok"))
            return True
        return False  # read the request, close without a byte of answer

    async with raw_server(handler) as (port, stats):
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            assert (await client.post(f"http://127.0.0.1:{port}/", content=b"one")).text == "ok"
            with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
                await client.post(f"http://127.0.0.1:{port}/", content=b"two")
    assert stats["requests"] == 2 and stats["connections"] == 1


async def test_a_connection_reset_before_the_request_was_written_says_not_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reset that arrived before the write makes the write fail: provably not sent."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(plain_response(b"ok"))
        sock = stream.socket  # type: ignore[attr-defined]
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return False  # close with a reset

    async with raw_server(handler) as (port, stats):
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            await client.post(f"http://127.0.0.1:{port}/", content=b"one")
            await trio.sleep(0.05)
            # Make the reset connection look alive so the request really goes out on it.
            monkeypatch.setattr(_Connection, "looks_alive", lambda self: True)
            with pytest.raises(RequestNotSent):
                await client.post(f"http://127.0.0.1:{port}/", content=b"x" * 100_000)
    assert stats["requests"] == 1


async def test_a_server_that_closed_an_idle_connection_is_noticed_before_sending() -> None:
    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(plain_response(b"ok %d" % index))
        return False  # keep-alive in the headers, yet it closes

    async with raw_server(handler) as (port, stats):
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            for i in (1, 2):
                response = await client.post(f"http://127.0.0.1:{port}/", content=b"x")
                assert response.text == f"ok {i}"
                await trio.sleep(0.05)  # let the close arrive
    assert stats["requests"] == 2 and stats["connections"] == 2


async def test_an_informational_answer_then_close_is_a_protocol_error() -> None:
    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n")
        return False

    async with raw_server(handler) as (port, _):
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
                await client.post(f"http://127.0.0.1:{port}/", content=b"x")


async def test_a_malformed_answer_is_refused_and_its_connection_never_reused() -> None:
    """A server that frames its body wrongly (a chunk size with a sign): the error names
    the problem, and the next request goes on a new connection, never after the bad
    bytes."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        if index == 1:
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+2\r\nok\r\n0\r\n\r\n"
            )
        else:
            await stream.send_all(plain_response(b"fine"))
        return True

    async with raw_server(handler) as (port, stats):
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            with pytest.raises(httpx.RemoteProtocolError, match="not a valid chunk-size line"):
                await client.get(f"http://127.0.0.1:{port}/")
            assert (await client.get(f"http://127.0.0.1:{port}/")).text == "fine"
    assert stats["connections"] == 2


async def test_a_head_that_never_ends_is_cut_off() -> None:
    """A server that sends header bytes forever: the transport stops reading at the
    limit, with an error, instead of buffering all it is sent."""
    sent = 0

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        nonlocal sent
        await stream.send_all(b"HTTP/1.1 200 OK\r\nX-Long: ")
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while sent < 64 * 1024 * 1024:
                await stream.send_all(b"a" * 8192)
                sent += 8192
        return False

    async with raw_server(handler) as (port, _):
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            with pytest.raises(httpx.RemoteProtocolError, match="head is over 65536 bytes"):
                await client.get(f"http://127.0.0.1:{port}/")
    assert sent < 8 * 1024 * 1024  # cut off long before the server was done


async def test_the_provider_s_direct_path_has_a_deadline() -> None:
    """The provider calls the lean transport without httpx's client (and so without its
    per-phase timeouts): the attempt's own deadline still ends a silent server."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await trio.sleep(5)
        return False

    async with raw_server(handler) as (port, stats):
        provider = OpenAIProvider(
            backend="vllm",
            model_name="m",
            base_url=f"http://127.0.0.1:{port}",
            timeout=0.5,  # room for a loaded machine to connect; the server waits 5 s
            max_timeouts=1,
            stream=False,
        )
        assert provider._get_client().lean is not None  # the direct path
        request = ChatRequest(messages=(Message(role="user", content="hi"),), model="m")
        try:
            with trio.fail_after(3):  # a hang fails here, not after the server's 5 s
                with pytest.raises(ProviderTimeout, match="timed out"):
                    await provider.complete(request)
        finally:
            await provider.aclose()
    assert stats["requests"] == 1


async def test_a_drop_mid_body_is_a_read_error_and_leaks_nothing() -> None:
    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        return False

    async with raw_server(handler) as (port, _):
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
                await client.get(f"http://127.0.0.1:{port}/")


async def test_no_answer_at_all_on_a_fresh_connection_is_a_protocol_error() -> None:
    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        return False

    async with raw_server(handler) as (port, _):
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.get(f"http://127.0.0.1:{port}/")


async def test_read_timeout() -> None:
    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await trio.sleep(1)
        return False

    async with raw_server(handler) as (port, _):
        # The read times out; connecting may take a loaded machine longer than that.
        timeout = httpx.Timeout(5.0, read=0.05)
        async with httpx.AsyncClient(transport=LeanTransport(), timeout=timeout) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.get(f"http://127.0.0.1:{port}/")


async def test_never_more_connections_than_the_limit() -> None:
    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await trio.sleep(0.01)
        await stream.send_all(plain_response(b"ok"))
        return True

    async with raw_server(handler) as (port, stats):
        async with httpx.AsyncClient(transport=LeanTransport(max_connections=4)) as client:
            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(client.get, f"http://127.0.0.1:{port}/")
    assert stats["requests"] == 20
    assert stats["peak"] <= 4 and stats["connections"] <= 4


async def test_https_over_tls(tls_pair: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_ctx, client_ctx = tls_pair

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(plain_response(b"secure %d" % index))
        return True

    async with raw_server(handler, tls=server_ctx) as (port, stats):
        transport = LeanTransport(ssl_context=client_ctx)
        async with httpx.AsyncClient(transport=transport) as client:
            assert (await client.get(f"https://127.0.0.1:{port}/")).text == "secure 1"
            assert (await client.get(f"https://127.0.0.1:{port}/")).text == "secure 2"
        # Certificate checks are on: the default roots do not trust a self-signed cert.
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            with pytest.raises(httpx.ConnectError, match="TLS handshake"):
                await client.get(f"https://127.0.0.1:{port}/")
    assert stats["connections"] == 2


@pytest.mark.parametrize("pool", ["lean", "httpx"])
async def test_an_untrusted_certificate_is_named_and_not_retried(
    pool: str, tls_pair: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    # The same certificate comes back on every attempt: ten handshakes and their backoff
    # (about 40 s) bought nothing, and the lean transport's message had lost the reason.
    server_ctx, _ = tls_pair

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        raise AssertionError("no request gets through an untrusted handshake")

    async with raw_server(handler, tls=server_ctx) as (port, stats):
        server = SimpleNamespace(base_url=f"https://127.0.0.1:{port}/v1")
        provider = OpenAIProvider(**openai_kwargs(server, max_attempts=5, http_transport=pool))
        try:
            with pytest.raises(ProviderError) as raised:
                await provider.complete(REQUEST)
        finally:
            await provider.aclose()
    assert "certificate" in str(raised.value) and "is not trusted" in str(raised.value)
    assert "SSL_CERT_FILE" in str(raised.value) and not raised.value.retryable
    assert stats["connections"] == 1


async def test_a_tls_record_that_fails_its_check_is_an_error_not_the_bodys_end(
    tls_pair: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    # A body read until the connection closes, its last record corrupt (a bad MAC): an
    # error, never the body cut short as if the server had ended it there.
    server_ctx, client_ctx = tls_pair
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:  # stdlib TLS over its own buffers: records made by hand
        sock, _ = listener.accept()
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = server_ctx.wrap_bio(incoming, outgoing, server_side=True)
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(outgoing.read())
                incoming.write(sock.recv(65536))
        sock.sendall(outgoing.read())
        request = b""
        while b"\r\n\r\n" not in request:
            try:
                request += tls.read(65536)
            except ssl.SSLWantReadError:
                incoming.write(sock.recv(65536))

        def record(data: bytes) -> bytes:
            tls.write(data)
            return outgoing.read()

        corrupt = bytearray(record(b"B" * 10))
        corrupt[-3] ^= 0xFF
        head = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
        sock.sendall(record(head) + record(b"A" * 10) + bytes(corrupt))
        time.sleep(0.5)
        sock.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    transport = LeanTransport(ssl_context=client_ctx)
    url = f"https://127.0.0.1:{listener.getsockname()[1]}/"
    try:
        with pytest.raises(httpx.ReadError):
            response = await transport.handle_async_request(httpx.Request("GET", url))
            await response.aread()
    finally:
        await transport.aclose()
        thread.join(5)
        listener.close()


async def test_a_handshake_cut_by_its_timeout_closes_the_socket() -> None:
    # A server that takes the connection and never answers the TLS hello (an overloaded
    # balancer): the connect timeout ends the handshake, and the socket is closed then,
    # not left to the garbage collector.
    closed = trio.Event()

    async def silent(stream: trio.SocketStream) -> None:
        while await stream.receive_some(65536):  # the hello, then nothing until the close
            pass
        closed.set()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        transport = LeanTransport(ssl_context=ssl.create_default_context())
        gc.disable()  # only a close by the transport counts
        try:
            with pytest.raises(httpx.ConnectTimeout):
                await transport.exchange(
                    "GET", httpx.URL(f"https://127.0.0.1:{port}/"), [], b"", {"connect": 0.2}
                )
            with trio.fail_after(5):
                await closed.wait()
        finally:
            gc.enable()
        nursery.cancel_scope.cancel()


async def test_provider_over_the_lean_transport() -> None:
    with FakeOpenAIServer(latency=0.01) as server:
        provider = OpenAIProvider(
            backend="vllm",
            model_name="m",
            base_url=server.base_url,
            http_transport="lean",
            max_concurrent=4,
        )
        from rlm_graph.contracts import ChatRequest, Message

        request = ChatRequest(messages=(Message(role="user", content="hi"),), model="m")
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(12):
                    nursery.start_soon(provider.complete, request)
            assert isinstance(provider._client._transport, LeanTransport)  # type: ignore[union-attr]
        finally:
            await provider.aclose()
    assert server.peak_in_flight <= 4 and server.connections_opened <= 4


def test_a_configured_proxy_falls_back_to_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert proxy_configured()
    provider = OpenAIProvider(backend="vllm", model_name="m", http_transport="lean")
    assert provider._make_transport() is None


async def test_a_provider_resends_a_request_not_sent_at_once_as_a_counted_attempt(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import json
    import logging

    from rlm_graph import Engine, Workflow

    caplog.set_level(logging.DEBUG, logger="rlm_graph")

    answer = json.dumps({"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]})

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(plain_response(answer.encode()))
        if index == 1:  # then reset the connection the client keeps alive
            sock = stream.socket  # type: ignore[attr-defined]
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        return True

    async with raw_server(handler) as (port, stats):
        kwargs = {"model_name": "m", "base_url": f"http://127.0.0.1:{port}", "backoff_base": 60}
        async with Engine("vllm", kwargs) as engine:
            wf = Workflow()
            wf.llm("first", id="first")
            assert (await engine.arun(wf))["first"] == "ok"
            await trio.sleep(0.05)
            monkeypatch.setattr(_Connection, "looks_alive", lambda self: True)
            wf = Workflow()
            wf.llm("x" * 100_000, id="second")
            result = await engine.arun(wf)
    assert result["second"] == "ok"
    assert result.graph["second"].attempts == 2
    # Counted as its own kind, and sent again without the (60 s) backoff.
    assert "vllm: 1 retry over 1 call: not sent x 1" in caplog.text
    assert "retrying in 0.00 s" in caplog.text
    assert stats["requests"] == 2 and stats["connections"] == 2


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ({"X-Team": "a\r\nX-Injected: 1"}, "not a valid header"),
        ({"X Team": "a"}, "not a valid header"),
        ({"X-Team": "équipe"}, "must be ASCII"),
    ],
)
def test_a_header_the_wire_cannot_carry_is_a_config_error(
    headers: dict[str, str], says: str
) -> None:
    """Configured headers go on the wire as they are: one that would split the request
    or cannot be encoded is refused when the provider is made, naming the header."""
    with pytest.raises(ConfigError, match=says):
        OpenAIProvider(
            backend="vllm", model_name="m", base_url="http://127.0.0.1:9", headers=headers
        )


class _OneWrite(trio.abc.Stream):
    """A server's TCP stream that, while ``hold`` is set, keeps what is sent until
    `flush`: two TLS records then go out in one segment, and reach the client in one
    read."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream, self.hold, self.held = stream, False, b""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.hold:
            self.held += bytes(data)
        else:
            await self.stream.send_all(data)

    async def flush(self) -> None:
        held, self.held, self.hold = self.held, b"", False
        await self.stream.send_all(held)

    async def wait_send_all_might_not_block(self) -> None:
        pass

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.stream.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.stream.aclose()


async def test_tls_bytes_after_an_answer_never_become_the_next_answer(
    tls_pair: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    """A server sends an answer no request asked for, in a TLS record right after the
    real one: the client has taken both off the socket, so the socket looks idle, but
    the connection is not reused and the next request gets its own answer."""
    server_ctx, client_ctx = tls_pair
    connections = 0

    async def serve(raw: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        held = _OneWrite(raw)
        stream = trio.SSLStream(held, server_ctx, server_side=True)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while await read_request(stream):
                held.hold = True
                await stream.send_all(plain_response(b"answer %d" % connections))
                await stream.send_all(plain_response(b"SMUGGLED"))
                await held.flush()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        async with httpx.AsyncClient(transport=LeanTransport(ssl_context=client_ctx)) as client:
            first = await client.get(f"https://127.0.0.1:{port}/")
            await trio.sleep(0.1)
            second = await client.get(f"https://127.0.0.1:{port}/")
        nursery.cancel_scope.cancel()
    assert (first.text, second.text) == ("answer 1", "answer 2")
    assert connections == 2


async def test_a_body_read_after_its_connection_went_back_is_refused() -> None:
    """A response's body iterated after it was closed would read whatever comes next on
    its connection (the next request's answer): it is `StreamClosed` instead."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(plain_response(b"body of request %d" % index))
        return True

    async with raw_server(handler) as (port, stats):
        transport = LeanTransport()
        url = httpx.URL(f"http://127.0.0.1:{port}/")
        headers = [(b"Host", url.netloc)]
        first = await transport.exchange("GET", url, headers, b"")
        await first.aread()
        await first.aclose()  # the connection goes back to the pool
        second = await transport.exchange("GET", url, headers, b"")
        with pytest.raises(httpx.StreamClosed):
            async for _ in first.stream:  # type: ignore[union-attr]
                pass
        assert (await second.aread()) == b"body of request 2"
        await second.aclose()
        await transport.aclose()
    assert stats["connections"] == 1


async def test_a_header_that_would_split_the_request_is_not_retried() -> None:
    """A per-request header with a line break (here from a plugin's own headers) fails
    the call at once with what was wrong; nothing is sent, and no retry is made."""

    class Broken(OpenAIProvider):
        def _auth_headers(self) -> dict[str, str]:
            return {"X-Team": "a\r\nX-Injected: 1"}

    with FakeOpenAIServer() as server:
        provider = Broken(backend="vllm", model_name="m", base_url=server.base_url, stream=False)
        error = await _refused(provider, "could not be written.*X-Team")
    assert not error.retryable
    assert server.requests == []


async def _refused(provider: OpenAIProvider, match: str) -> ProviderError:
    """The error of ``provider``'s one call, which must fail with ``match``."""
    request = ChatRequest(messages=(Message(role="user", content="hi"),), model="m")
    try:
        with pytest.raises(ProviderError, match=match) as caught:
            await provider.complete(request)
    finally:
        await provider.aclose()
    return caught.value


@pytest.mark.parametrize("http_transport", ["lean", "httpx"])
async def test_a_propagator_s_header_that_is_not_ascii_fails_the_call_plainly(
    http_transport: str,
) -> None:
    """The application's OpenTelemetry propagator adds headers to every request; one
    that is not ASCII fails the call at once, naming the header, on either pool (not a
    UnicodeEncodeError from inside the transport)."""
    from opentelemetry import propagate
    from opentelemetry.propagators.textmap import TextMapPropagator

    class Careless(TextMapPropagator):
        def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
            carrier["x-team"] = "équipe"

        def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
            raise NotImplementedError

        @property
        def fields(self) -> set[str]:
            return {"x-team"}

    before = propagate.get_global_textmap()
    propagate.set_global_textmap(Careless())
    try:
        with FakeOpenAIServer() as server:
            provider = OpenAIProvider(
                backend="vllm",
                model_name="m",
                base_url=server.base_url,
                stream=False,
                http_transport=http_transport,
            )
            error = await _refused(provider, "'x-team' is not ASCII")
    finally:
        propagate.set_global_textmap(before)
    assert not error.retryable
    assert server.requests == []


@pytest.mark.parametrize("timeout", [0, -1, float("nan")])
def test_a_timeout_that_is_not_a_positive_number_is_a_config_error(timeout: float) -> None:
    with pytest.raises(ConfigError, match="timeout must be > 0"):
        OpenAIProvider(
            backend="vllm", model_name="m", base_url="http://127.0.0.1:9", timeout=timeout
        )


@pytest.mark.parametrize(
    ("keywords", "says"),
    [
        ({"timeout": "abc"}, "timeout must be > 0 seconds, or None, not 'abc'"),
        ({"headers": "x"}, "headers must be an object of name: value"),
        ({"headers": {"X-Team": 1}}, "headers must be an object of name: value, both text"),
        ({"extra_body": "x"}, "extra_body must be an object"),
        ({"transport": "x"}, "transport must be an httpx.AsyncBaseTransport"),
        ({"stream": "no"}, "stream must be True or False"),
        ({"requests_per_minute": 0}, "requests_per_minute must be a positive number"),
        ({"tokens_per_minute": "10"}, "tokens_per_minute must be a positive number"),
        ({"tokens_per_minute": float("inf")}, "or None for no limit, not inf"),
    ],
)
def test_a_keyword_of_the_wrong_shape_is_one_config_error_naming_it(
    keywords: dict[str, object], says: str
) -> None:
    """What --backend-kwargs passes as JSON may be any shape: each is named, not a
    ValueError or AttributeError from deep inside httpx at the first request."""
    with pytest.raises(ConfigError, match=re.escape(says)):
        OpenAIProvider(backend="vllm", model_name="m", base_url="http://127.0.0.1:9", **keywords)  # type: ignore[arg-type]


def test_an_api_key_with_a_newline_is_a_config_error_that_does_not_show_it() -> None:
    with pytest.raises(ConfigError, match="strip it") as caught:
        OpenAIProvider(
            backend="vllm", model_name="m", base_url="http://127.0.0.1:9", api_key="sk-abc\n"
        )
    assert "sk-abc" not in str(caught.value)


@pytest.mark.parametrize("cut", [True, False], ids=["cut-mid-chunk", "ended-by-close"])
async def test_a_paced_body_over_a_socket_ends_or_fails_as_framed(cut: bool) -> None:
    """Paced reads take what the socket holds directly after their tick (no trio
    receive), the close included: a chunked body the server cuts mid-chunk is an error,
    never a short body; a body framed by the close is read whole."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        if cut:
            head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            await stream.send_all(head + b"5\r\nhello\r\n")
            await trio.sleep(0.02)  # the rest, and the close, well before the next tick
            await stream.send_all(b"10\r\nonly part")
        else:
            await stream.send_all(b"HTTP/1.1 200 OK\r\n\r\nfirst ")
            await trio.sleep(0.02)
            await stream.send_all(b"and last")
        return False  # and close

    async with raw_server(handler) as (port, _):
        transport = LeanTransport()
        url = httpx.URL(f"http://127.0.0.1:{port}/")
        response = await transport.exchange("GET", url, [(b"Host", url.netloc)], b"", pace=0.1)
        pieces: list[bytes] = []
        try:
            if cut:
                with pytest.raises(httpx.RemoteProtocolError, match="mid-response"):
                    async for piece in response.stream:  # type: ignore[union-attr]
                        pieces.append(piece)
                assert b"".join(pieces).startswith(b"hello")
            else:
                async for piece in response.stream:  # type: ignore[union-attr]
                    pieces.append(piece)
                assert b"".join(pieces) == b"first and last"
        finally:
            await response.aclose()
            await transport.aclose()


def _as_httpx_reads(response: httpx.Response) -> tuple[object, ...]:
    """What a user of a read response sees of it."""
    return (
        response.content,
        response.text,
        response.read(),
        b"".join(response.iter_bytes()),
        response.num_bytes_downloaded,
        response.is_stream_consumed,
        response.is_closed,
        response.encoding,
    )


def _read_by_httpx(response: httpx.Response) -> tuple[object, ...]:
    """The same of a response with the same head and (raw) body, read by httpx itself."""
    encoded = "content-encoding" in response.headers
    raw = gzip.compress(response.content) if encoded else response.content
    reference = httpx.Response(
        status_code=response.status_code,
        headers=response.headers,
        stream=httpx.ByteStream(raw),
    )
    reference.read()
    seen = _as_httpx_reads(reference)
    if encoded:  # bytes downloaded: the server's compression, not this one's
        seen = (*seen[:4], response.num_bytes_downloaded, *seen[5:])
    return seen


@pytest.mark.parametrize("framing", ["content-length", "chunked", "close"])
async def test_fetch_reads_the_whole_answer_and_hands_the_connection_back(framing: str) -> None:
    """`fetch` is `exchange` with the body read: the content is there, the connection is
    back in the pool (reused when the answer allows it, closed when not), and the slot
    is free for the next request even with a limit of one connection."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        body = b"answer number %d, framed by %s" % (index, framing.encode())
        if framing == "close":  # no length, no chunks: the body ends with the connection
            await stream.send_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body)
            return False
        await stream.send_all(plain_response(body, chunked=framing == "chunked"))
        return True

    async with raw_server(handler) as (port, stats):
        transport = LeanTransport(max_connections=1)
        url = httpx.URL(f"http://127.0.0.1:{port}/")
        texts = []
        for _ in range(3):
            with trio.fail_after(5):
                response = await transport.fetch("GET", url, [(b"Host", url.netloc)], b"")
            assert response.status_code == 200
            assert _as_httpx_reads(response) == _read_by_httpx(response)
            texts.append(response.text)
        await transport.aclose()
    assert texts == [f"answer number {i}, framed by {framing}" for i in (1, 2, 3)]
    assert stats["connections"] == (3 if framing == "close" else 1)


async def test_fetch_decodes_a_compressed_answer() -> None:
    body = gzip.compress(b'{"ok": true}')

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
        await stream.send_all(head % len(body) + body)
        return True

    async with raw_server(handler) as (port, _):
        transport = LeanTransport()
        url = httpx.URL(f"http://127.0.0.1:{port}/")
        response = await transport.fetch("GET", url, [(b"Host", url.netloc)], b"")
        await transport.aclose()
    assert response.json() == {"ok": True}


@pytest.mark.parametrize("framing", ["content-length", "chunked", "close", "gzip"])
async def test_read_whole_reads_an_exchanged_answer_and_hands_the_connection_back(
    framing: str,
) -> None:
    """`read_whole` on an answer of `exchange` (a streamed call that the server answered
    whole): the content is there as ``aread`` leaves it, decoded when compressed, and
    the connection is back in the pool, reused when the answer allows. Closing the
    response afterwards frees nothing twice: with one connection allowed, requests sent
    at once never overlap at the server."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        body = b"answer %d" % index
        if framing == "close":
            await stream.send_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body)
            return False
        if framing == "gzip":
            zipped = gzip.compress(body)
            head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
            await stream.send_all(head % len(zipped) + zipped)
            return True
        await stream.send_all(plain_response(body, chunked=framing == "chunked"))
        return True

    texts: list[str] = []
    async with raw_server(handler) as (port, stats):
        transport = LeanTransport(max_connections=1)
        url = httpx.URL(f"http://127.0.0.1:{port}/")

        async def one() -> None:
            response = await transport.exchange("GET", url, [(b"Host", url.netloc)], b"")
            try:
                await read_whole(response)
                assert _as_httpx_reads(response) == _read_by_httpx(response)
                texts.append(response.text)
            finally:
                await response.aclose()

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(one)
        await transport.aclose()
    assert sorted(texts) == [f"answer {i}" for i in (1, 2, 3, 4)]
    assert stats["peak"] == 1
    assert stats["connections"] == (4 if framing == "close" else 1)


async def test_read_whole_of_a_cut_answer_fails_and_frees_its_slot_once() -> None:
    """A body cut short is an error from `read_whole`, never a short answer; its
    connection is closed and the only slot is free again, once: three requests sent at
    once afterwards still go one at a time."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        if index == 1:
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
            return False
        await trio.sleep(0.05)  # long enough for requests sent at once to overlap
        await stream.send_all(plain_response(b"fine"))
        return True

    texts: list[str] = []
    async with raw_server(handler) as (port, stats):
        transport = LeanTransport(max_connections=1)
        url = httpx.URL(f"http://127.0.0.1:{port}/")
        response = await transport.exchange("GET", url, [(b"Host", url.netloc)], b"")
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            await read_whole(response)
        await response.aclose()

        async def one() -> None:
            answer = await transport.fetch("GET", url, [(b"Host", url.netloc)], b"")
            texts.append(answer.text)

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(one)
        await transport.aclose()
    assert texts == ["fine"] * 3
    assert stats["connections"] == 2 and stats["peak"] == 1


async def _refused_read(transport: LeanTransport, url: httpx.URL, read: str, match: str) -> None:
    """One GET read whole by ``read`` (``fetch``, or ``exchange`` then `read_whole`),
    which must fail as the server's answer breaks a limit, saying ``match``."""
    with pytest.raises(httpx.RemoteProtocolError, match=match):
        if read == "fetch":
            await transport.fetch("GET", url, [(b"Host", url.netloc)], b"")
        else:
            response = await transport.exchange("GET", url, [(b"Host", url.netloc)], b"")
            try:
                await read_whole(response)
            finally:
                await response.aclose()


@pytest.mark.parametrize("read", ["fetch", "read_whole"])
async def test_a_compressed_body_that_inflates_past_the_limit_is_refused(
    read: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gzip answer of a few kilobytes that inflates past `MAX_BODY` (here lowered to
    1 MiB; 8 MiB of zeros) is refused once one slice of it has been decoded, not after
    all of it: the limit holds for what a body decodes to, not only for its bytes."""
    monkeypatch.setattr("rlm_graph._http.bodies.MAX_BODY", 1024 * 1024)
    bomb = gzip.compress(bytes(8 * 1024 * 1024))

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        if index > 1:
            await stream.send_all(plain_response(b"fine"))
            return True
        head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
        await stream.send_all(head % len(bomb) + bomb)
        return True

    async with raw_server(handler) as (port, _):
        transport = LeanTransport(max_connections=1)
        url = httpx.URL(f"http://127.0.0.1:{port}/")
        with trio.fail_after(10):
            await _refused_read(transport, url, read, "decodes to over 1 MiB")
            again = await transport.fetch("GET", url, [(b"Host", url.netloc)], b"")
        await transport.aclose()
    assert len(bomb) < 64 * 1024 and again.text == "fine"


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_body_over_the_limit_is_refused_and_its_slot_freed(
    framing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole answer's body past `MAX_BODY` (here lowered to 1 MiB) is an error, not a
    reply kept in memory, whether its length is announced or it comes in chunks without
    end; its connection is closed and the next request is answered."""
    monkeypatch.setattr("rlm_graph._http.bodies.MAX_BODY", 1024 * 1024)
    piece = b"x" * 65536

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        if index > 1:
            await stream.send_all(plain_response(b"fine"))
            return True
        if framing == "content-length":
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (4 << 20))
            for _ in range(64):
                await stream.send_all(piece)
        else:
            await stream.send_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            while True:  # without end, until the client hangs up
                await stream.send_all(b"%x\r\n%s\r\n" % (len(piece), piece))
        return False

    async with raw_server(handler) as (port, stats):
        transport = LeanTransport(max_connections=1)
        url = httpx.URL(f"http://127.0.0.1:{port}/")
        with trio.fail_after(10):
            await _refused_read(transport, url, "fetch", "over 1 MiB")
            response = await transport.exchange("GET", url, [(b"Host", url.netloc)], b"")
            await read_whole(response)
        await transport.aclose()
    assert response.text == "fine"
    assert stats["connections"] == 2


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    ],
    ids=["short-body", "cut-chunk", "bad-chunk-size"],
)
async def test_fetch_of_a_broken_answer_fails_and_frees_its_slot(answer: bytes) -> None:
    """A body cut short or framed wrong is an error, never a short answer; its connection
    is closed, and the only slot is free for the next request, which opens a new one."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        await stream.send_all(answer if index == 1 else plain_response(b"fine"))
        return index != 1

    async with raw_server(handler) as (port, stats):
        transport = LeanTransport(max_connections=1)
        url = httpx.URL(f"http://127.0.0.1:{port}/")
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            await transport.fetch("GET", url, [(b"Host", url.netloc)], b"")
        with trio.fail_after(5):
            again = await transport.fetch("GET", url, [(b"Host", url.netloc)], b"")
        await transport.aclose()
    assert again.text == "fine"
    assert stats["connections"] == 2


async def test_a_request_larger_than_the_socket_buffer_is_written_whole() -> None:
    """Written straight to the socket (`_http.sockets.write_all`): a body the kernel
    cannot take at once goes in parts, waiting while the buffer is full, and arrives
    whole, byte for byte, to a server that reads it slowly."""
    body = bytes(range(256)) * (8 * 1024 * 1024 // 256)  # 8 MiB
    got: list[bytes] = []

    async def serve(stream: trio.abc.Stream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head, _, rest = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(rest) < length:
            await trio.sleep(0.001)  # slower than the client writes: its buffer fills
            rest += await stream.receive_some(65536)
        got.append(rest)
        await stream.send_all(plain_response(b"%d" % len(rest)))
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        transport = LeanTransport()
        url = httpx.URL(f"http://127.0.0.1:{port}/")
        with trio.fail_after(30):
            response = await transport.fetch("POST", url, [(b"Host", url.netloc)], body)
        await transport.aclose()
        nursery.cancel_scope.cancel()
    assert response.text == str(len(body))
    assert got == [body]


async def test_a_send_cancelled_while_the_buffer_is_full_closes_its_connection() -> None:
    """Cancelled half-way through a large write: the error is the cancellation, the
    connection (its request cut short) is closed, never reused, and its slot is free."""
    stalled = trio.Event()

    async def serve(stream: trio.abc.Stream) -> None:
        first = await stream.receive_some(65536)
        if first.startswith(b"POST"):  # read nothing more: the client's buffer fills
            stalled.set()
            await trio.sleep_forever()
        await stream.send_all(plain_response(b"fresh"))

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        transport = LeanTransport(max_connections=1)
        url = httpx.URL(f"http://127.0.0.1:{port}/")
        with trio.move_on_after(0.5) as scope:
            await transport.fetch("POST", url, [(b"Host", url.netloc)], b"x" * (32 << 20))
        assert scope.cancelled_caught and stalled.is_set()
        with trio.fail_after(5):
            again = await transport.fetch("GET", url, [(b"Host", url.netloc)], b"")
        await transport.aclose()
        nursery.cancel_scope.cancel()
    assert again.text == "fresh"


async def test_a_server_that_hangs_mid_body_is_a_timeout_that_frees_the_connection() -> None:
    """The provider reads a whole answer in the transport (`fetch`): a server that sends
    the head and half the body, then nothing, ends at the attempt's deadline; the
    connection is closed, never reused, and the next call gets a new one and its answer."""

    async def handler(stream: trio.abc.Stream, index: int) -> bool:
        if index == 1:
            await stream.send_all(b'HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{"choi')
            await trio.sleep(5)
            return False
        body = b'{"choices": [{"message": {"content": "whole"}}], "model": "m"}'
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        return True

    async with raw_server(handler) as (port, stats):
        provider = OpenAIProvider(
            backend="vllm",
            model_name="m",
            base_url=f"http://127.0.0.1:{port}",
            timeout=0.5,  # the second call's whole answer, on a loaded machine too
            max_timeouts=1,
            max_concurrent=1,
            stream=False,
        )
        request = ChatRequest(messages=(Message(role="user", content="hi"),), model="m")
        try:
            with trio.fail_after(3):  # a hang fails here, not after the server's 5 s
                with pytest.raises(ProviderTimeout, match="timed out"):
                    await provider.complete(request)
                reply = await provider.complete(request)
        finally:
            await provider.aclose()
    assert reply.content == "whole"
    assert stats["connections"] == 2
