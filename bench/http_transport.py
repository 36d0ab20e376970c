"""Benchmark: what one HTTP sub-call costs the client, per transport.

Starts a fake OpenAI-compatible server (rlm_graph.testing, stdlib ThreadingHTTPServer) in a
*separate process* on 127.0.0.1, then sends N small chat-completion requests with C in
flight through:

    raw-trio      a hand-written HTTP/1.1 exchange over C persistent trio streams (floor)
    httpx         httpx.AsyncClient with its default transport (httpcore pool)
    httpx+lean    httpx.AsyncClient over rlm_graph._http.transport.LeanTransport
    provider/...  the full OpenAIProvider.complete() (body building, retries wrapper,
                  JSON parsing) over each transport

and prints, per variant, wall time per request and the client process's CPU time per
request (the engine's cost; the server's CPU is in the other process).

Run: .venv/bin/python bench/http_transport.py [--requests 1000] [--concurrency 16]
Results go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import httpx
import trio

from rlm_graph._http.transport import LeanTransport
from rlm_graph.contracts import ChatRequest, Message
from rlm_graph_openai import OpenAIProvider

SERVER = """
import sys, time
from rlm_graph.testing import FakeOpenAIServer
with FakeOpenAIServer(lambda body: "ok") as server:
    print(server.base_url, flush=True)
    sys.stdin.read()
"""

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


async def _fan_out(n: int, c: int, one: Callable[[int], Awaitable[None]]) -> None:
    limiter = trio.CapacityLimiter(c)

    async def slot(i: int) -> None:
        async with limiter:
            await one(i)

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(slot, i)


async def raw_exchange(stream: trio.abc.Stream, request: bytes) -> bytes:
    """Send ``request`` (bytes as they go on the wire) and read the answer's body, framed
    by ``Content-Length``, by hand: the floor under any HTTP client."""
    await stream.send_all(request)
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(rest) < length:
        rest += await stream.receive_some(65536)
    return rest


async def bench_raw(base_url: str, n: int, c: int) -> None:
    url = httpx.URL(base_url + "/chat/completions")
    request = (
        f"POST {url.raw_path.decode()} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY
    streams = [await trio.open_tcp_stream(url.host, url.port or 80) for _ in range(c)]
    free = list(streams)

    async def one(i: int) -> None:
        stream = free.pop()
        json.loads(await raw_exchange(stream, request))
        free.append(stream)

    try:
        await _fan_out(n, c, one)
    finally:
        for stream in streams:
            await stream.aclose()


async def bench_client(base_url: str, n: int, c: int, lean: bool) -> None:
    limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
    transport = LeanTransport(max_connections=c) if lean else None
    async with httpx.AsyncClient(limits=limits, transport=transport) as client:
        url = base_url + "/chat/completions"

        async def one(i: int) -> None:
            response = await client.post(
                url, content=BODY, headers={"Content-Type": "application/json"}
            )
            response.json()

        await _fan_out(n, c, one)


async def bench_provider(base_url: str, n: int, c: int, lean: bool) -> None:
    # The provider's own choice of transport: "lean" (the default, sent straight to the
    # transport) or httpx's pool through the client.
    provider = OpenAIProvider(
        backend="vllm",
        model_name="m",
        base_url=base_url,
        max_concurrent=c,
        http_transport="lean" if lean else "httpx",
    )
    request = ChatRequest(messages=(Message(role="user", content="hi"),), model="m")

    async def one(i: int) -> None:
        await provider.complete(request)

    try:
        await _fan_out(n, c, one)
    finally:
        await provider.aclose()


def measure(name: str, fn: Callable[..., Awaitable[None]], *args: object) -> dict[str, object]:
    trio.run(fn, *args)  # warm-up run: imports, first connections
    wall0, cpu0 = time.perf_counter(), time.process_time()
    trio.run(fn, *args)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    n = args[1]
    assert isinstance(n, int)
    return {"variant": name, "wall_ms_per_req": 1000 * wall / n, "cpu_ms_per_req": 1000 * cpu / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    args = parser.parse_args()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        base_url = server.stdout.readline().strip()
        n, c = args.requests, args.concurrency
        variants: list[tuple[str, Callable[..., Awaitable[None]], tuple[object, ...]]] = [
            ("raw-trio", bench_raw, ()),
            ("httpx", bench_client, (False,)),
            ("httpx+lean", bench_client, (True,)),
            ("provider/httpx", bench_provider, (False,)),
            ("provider/lean", bench_provider, (True,)),
        ]
        print(f"{n} requests, {c} in flight, server {base_url} (separate process)")
        print(f"{'variant':<16}{'wall ms/req':>12}{'client CPU ms/req':>20}")
        for name, fn, extra in variants:
            runs = [measure(name, fn, base_url, n, c, *extra) for _ in range(args.repeat)]
            best = min(runs, key=lambda r: float(r["cpu_ms_per_req"]))  # type: ignore[arg-type]
            print(f"{name:<16}{best['wall_ms_per_req']:>12.3f}{best['cpu_ms_per_req']:>20.3f}")
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
