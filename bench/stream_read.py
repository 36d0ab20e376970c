"""Benchmark: how fast the lean transport reads a streamed reply that comes faster than its
paced reads (a very fast model, or tokens that queued up while the engine was busy).

    .venv/bin/python bench/stream_read.py

A local server (trio, 127.0.0.1, plain and TLS with a throw-away certificate made by the
``openssl`` command) answers one request with a streamed body sent all at once: either
``--events`` server-sent events of about 200 bytes, each written (and so, over TLS, each
encrypted as a record) on its own, as a server that flushes every token does; or
``--megabytes`` of one long event in 64 KiB writes. The client is `LeanTransport` with
the pace the providers use (`JSONProvider.stream_interval`, 0.1 s). Printed: the time
from the answer's head to the body's end, and the number of pieces the body was read in.
Before the reads took everything waiting, each tick read one socket read's worth (64 KiB)
or, over TLS, one record (ten events a second). Run by hand, never by the test suite.
"""

from __future__ import annotations

import argparse
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlm_graph._http.provider import JSONProvider  # noqa: E402
from rlm_graph._http.transport import LeanTransport  # noqa: E402

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def certificates(folder: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a throw-away self-signed certificate, and a client trusting it."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))


def body_writes(args: argparse.Namespace) -> list[bytes]:
    """The body's writes, each one HTTP chunk."""
    if args.megabytes:
        piece = b"x" * 65536
        writes = [b"data: " + piece] + [piece] * (args.megabytes * 16 - 1) + [b"\n\n"]
    else:
        writes = [
            b'data: {"token": %d, "pad": "%s"}\n\n' % (i, b"p" * 170) for i in range(args.events)
        ]
    return [b"%x\r\n%s\r\n" % (len(w), w) for w in writes] + [b"0\r\n\r\n"]


async def one(
    scheme: str, writes: list[bytes], server_tls: ssl.SSLContext, client_tls: ssl.SSLContext
) -> tuple[float, int, int]:
    """Seconds from the head to the body's end, pieces read, bytes read."""

    async def handler(stream: trio.abc.Stream) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            request += await stream.receive_some(65536)
        await stream.send_all(HEAD)
        for write in writes:
            await stream.send_all(write)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        if scheme == "https":
            listeners = await nursery.start(trio.serve_ssl_over_tcp, handler, 0, server_tls)
            port = listeners[0].transport_listener.socket.getsockname()[1]
        else:
            listeners = await nursery.start(trio.serve_tcp, handler, 0)
            port = listeners[0].socket.getsockname()[1]
        transport = LeanTransport(ssl_context=client_tls)
        url = httpx.URL(f"{scheme}://localhost:{port}/")
        response = await transport.exchange(
            "POST", url, [(b"Host", b"localhost")], b"{}", pace=JSONProvider.stream_interval
        )
        await trio.sleep(0.2)  # the whole body sent before it is read
        start, pieces, size = time.perf_counter(), 0, 0
        async for piece in response.stream:  # type: ignore[union-attr]
            pieces += 1
            size += len(piece)
        took = time.perf_counter() - start
        await response.aclose()
        await transport.aclose()
        nursery.cancel_scope.cancel()
    return took, pieces, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument(
        "--megabytes", type=int, default=0, help="one long event of this size instead"
    )
    args = parser.parse_args()
    writes = body_writes(args)
    with tempfile.TemporaryDirectory() as folder:
        server_tls, client_tls = certificates(Path(folder))
        what = f"{args.megabytes} MiB event" if args.megabytes else f"{args.events} events"
        print("| body, sent at once | scheme | read in | pieces |")
        print("| --- | --- | ---: | ---: |")
        for scheme in ("http", "https"):
            took, pieces, size = trio.run(one, scheme, writes, server_tls, client_tls)
            print(f"| {what} ({size:,} B) | {scheme} | {took:.3f} s | {pieces} |")


if __name__ == "__main__":
    main()
