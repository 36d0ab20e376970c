"""A fake OpenAI-compatible server for the benchmarks, in a process of its own.

It plays every model of a scenario (see `bench/scenarios.py`; the scenario is the model
name in the request) and simulates latency by sleeping on the server side, so both
engines under test face exactly the same model. It is deliberately cheap per request
(asyncio streams, hand-parsed HTTP/1.1 with keep-alive), so that at zero latency the
client's cost, not the server's, is what the clock shows.

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


def completion_body(model: str, text: str) -> bytes:
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
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
    ).encode()


async def answer(method: str, path: str, body: bytes, arrived: float) -> tuple[int, bytes]:
    if method == "GET" and path == "/stats":
        return 200, json.dumps(STATS.as_dict()).encode()
    if method == "POST" and path == "/reset":
        STATS.__init__()  # type: ignore[misc]
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
                status, payload = await answer(method, path, body, arrived)
            finally:
                STATS.in_flight -= 1
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
