"""A fake OpenAI-compatible server for the benchmarks, in a process of its own.

It plays every model of a scenario (see `bench/scenarios.py`; the scenario is the model
name in the request) and simulates latency by sleeping on the server side, so both
engines under test face exactly the same model. It is deliberately cheap per request
(asyncio streams, hand-parsed HTTP/1.1 with keep-alive), so that at zero latency the
client's cost, not the server's, is what the clock shows.

A scenario with a token ``rate`` (bench/scenarios.py, ``realistic:N``) generates its root
replies at that rate after ``first_token``: asked for a stream (``"stream": true``), the
reply goes out as chat-completion chunks, a token per chunk, as it is generated (usage
in a last chunk with ``stream_options.include_usage``); asked for a whole reply, it is
sent once all of it is generated. Usage counts about four characters a token, and a
prompt cache works as OpenAI's automatic one: the longest prefix of messages already
seen (of at least 1,024 tokens) is reported as ``prompt_tokens_details.cached_tokens``.

Endpoints:
    POST {base}/chat/completions   the model (``{base}`` is ``/v1``)
    GET  /stats                    JSON: requests served, and per bench run id the
                                   CLOCK_MONOTONIC time its first request arrived
    POST /reset                    forget the stats

Run: ``python bench/fake_server.py`` prints ``http://127.0.0.1:PORT/v1`` on its first
line and serves until its stdin closes (the parent exits) or ``--max-seconds`` pass.
Binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scenarios


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


class Stats:
    def __init__(self) -> None:
        self.requests = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.first_arrival: dict[str, float] = {}

    def as_dict(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "peak_in_flight": self.peak_in_flight,
            "first_arrival": self.first_arrival,
        }


STATS = Stats()
CACHE: set[str] = set()  # prefixes of messages seen, for the prompt cache
CACHE_MIN_TOKENS = 1024


def count(text: str) -> int:
    return max(1, (len(text) + 3) // 4)


def usage_of(data: dict, text: str) -> dict:
    """Prompt, completion and cached tokens of a request of a streaming scenario."""
    digest = hashlib.sha256(str(data.get("model")).encode())
    seen, cached = "", 0
    for message in data["messages"]:
        seen += str(message.get("content"))
        digest.update(f"\x00{message.get('role')}\x00{message.get('content')}".encode())
        key, tokens = digest.hexdigest(), count(seen)
        if key in CACHE:
            cached = tokens
        elif tokens >= CACHE_MIN_TOKENS:
            CACHE.add(key)
    prompt, completion = count(seen), count(text)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def chunk(model: str, delta: dict, finish: str | None = None, **more: object) -> bytes:
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
        if delta or finish
        else [],
        **more,
    }
    data = b"data: " + json.dumps(body).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


async def stream(writer: asyncio.StreamWriter, data: dict, text: str, scenario) -> None:
    """The reply as chunks, a token each, at the scenario's rate (chunked encoding)."""
    model = data["model"]
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunk(model, {"role": "assistant", "content": ""})
    )
    await writer.drain()
    await asyncio.sleep(scenario.first_token)
    gap = 1.0 / scenario.rate
    for token in scenarios.tokens(text):
        writer.write(chunk(model, {"content": token}))
        await writer.drain()
        await asyncio.sleep(gap)
    tail = chunk(model, {}, "stop")
    if (data.get("stream_options") or {}).get("include_usage"):
        tail += chunk(model, {}, None, usage=usage_of(data, text))
    done = b"data: [DONE]\n\n"
    writer.write(tail + b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
    await writer.drain()


def completion_body(model: str, text: str, usage: dict | None = None) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": text},
                }
            ],
            "usage": usage or {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
    ).encode()


async def answer(
    method: str, path: str, body: bytes, arrived: float, writer: asyncio.StreamWriter
) -> tuple[int, bytes | None]:
    if method == "GET" and path == "/stats":
        return 200, json.dumps(STATS.as_dict()).encode()
    if method == "POST" and path == "/reset":
        STATS.__init__()  # type: ignore[misc]
        CACHE.clear()
        return 200, b"{}"
    if method != "POST" or not path.endswith("/chat/completions"):
        return 404, json.dumps({"error": {"message": f"no route {method} {path}"}}).encode()
    data = json.loads(body)
    messages = data["messages"]
    run_id = scenarios.run_id_of(messages)
    if run_id is not None and run_id not in STATS.first_arrival:
        STATS.first_arrival[run_id] = arrived
    try:
        text, latency = scenarios.model_reply(data["model"], messages)
    except KeyError as error:
        return 404, json.dumps({"error": {"message": str(error)}}).encode()
    scenario = scenarios.get(data["model"])
    root = any(m.get("role") == "system" for m in messages)
    if scenario.rate and root:
        if data.get("stream"):
            await stream(writer, data, text, scenario)
            return 200, None
        await asyncio.sleep(scenarios.generation(scenario, text)[1])
        return 200, completion_body(data["model"], text, usage_of(data, text))
    if latency:
        await asyncio.sleep(latency)
    return 200, completion_body(data["model"], text)


async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            arrived = now()
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            if "content-length" not in headers and headers.get("transfer-encoding"):
                writer.write(
                    b"HTTP/1.1 411 Length Required\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                await writer.drain()
                return
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            STATS.requests += 1
            STATS.in_flight += 1
            STATS.peak_in_flight = max(STATS.peak_in_flight, STATS.in_flight)
            try:
                status, payload = await answer(method, path, body, arrived, writer)
            finally:
                STATS.in_flight -= 1
            if payload is None:  # streamed: already written
                continue
            reason = {200: "OK", 404: "Not Found"}.get(status, "Error")
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
            if headers.get("connection", "").lower() == "close":
                return
    finally:
        writer.close()


async def main(port: int, max_seconds: float) -> None:
    server = await asyncio.start_server(serve_connection, "127.0.0.1", port, backlog=512)
    bound = server.sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{bound}/v1", flush=True)
    loop = asyncio.get_running_loop()
    stdin_closed = loop.run_in_executor(None, sys.stdin.read)
    async with server:
        await asyncio.wait_for(stdin_closed, timeout=max_seconds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=1800.0)
    args = parser.parse_args()
    try:
        asyncio.run(main(args.port, args.max_seconds))
    except (TimeoutError, KeyboardInterrupt):
        pass
    # The stdin reader thread may still be blocked: leave without joining it.
    sys.stdout.flush()
    os._exit(0)
