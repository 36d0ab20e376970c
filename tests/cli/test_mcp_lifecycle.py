"""``rlm-graph mcp`` cancelled and stopped while its client holds stdin open: a call
cancelled in the middle of reading its files, and the stop signals.

The installed command is spoken to over the raw protocol (one JSON-RPC message a line on
its stdin and stdout), not through the SDK's client: leaving, that client closes stdin and
then kills the server, which would hide a server that does not end by itself."""

from __future__ import annotations

import json
import os
import select
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from rlm_graph.testing import FakeOpenAIServer
from tests.cli.test_mcp import COMMAND, KEY, model_server, tree_path

pytestmark = pytest.mark.processes  # the installed command, as an MCP server

GUARD = 120  # seconds: only a hang runs these out


def model_flags(server: FakeOpenAIServer) -> list[str]:
    return ["--base-url", server.base_url, "--api-key-env", "OPENAI_API_KEY"]


class RawClient:
    """The installed ``rlm-graph mcp``, and the JSON-RPC lines of an MCP client."""

    def __init__(self, root: Path, log: IO[bytes], *extra: str) -> None:
        assert COMMAND.exists(), f"{COMMAND} is missing: run `make install`"
        self.process = subprocess.Popen(
            [str(COMMAND), "mcp", "--read-path", str(root), "--model", "gpt-test", *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env={"OPENAI_API_KEY": KEY, "PYTHONPATH": tree_path(), "PATH": os.environ["PATH"]},
        )

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        self.process.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], GUARD)
        assert ready, "the server did not answer"
        answer: dict[str, Any] = json.loads(self.process.stdout.readline())
        return answer

    def initialize(self) -> None:
        self.send(
            {
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "1"},
                },
            }
        )
        assert "result" in self.receive()
        self.send({"method": "notifications/initialized"})

    def call(self, request: int, arguments: dict[str, Any]) -> None:
        self.send(
            {
                "id": request,
                "method": "tools/call",
                "params": {"name": "rlm_answer", "arguments": arguments},
            }
        )

    def cancel(self, request: int) -> None:
        self.send(
            {
                "method": "notifications/cancelled",
                "params": {"requestId": request, "reason": "user"},
            }
        )

    def close_stdin_and_wait(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.close()
        return self.process.wait(GUARD)


@contextmanager
def raw_server(root: Path, log: Path, *extra: str) -> Iterator[RawClient]:
    with log.open("wb") as errlog:
        client = RawClient(root, errlog, *extra)
        try:
            client.initialize()
            yield client
        finally:
            if client.process.poll() is None:
                client.process.kill()
                client.process.wait()
            for stream in (client.process.stdin, client.process.stdout):
                if stream is not None:
                    stream.close()


@contextmanager
def opened_by_the_server(fifo: Path) -> Iterator[threading.Event]:
    """An event set once the server opens ``fifo``: a walk opens each file it meets, and
    an open for writing returns once a reader has opened the pipe, even if it already
    closed it. Leaving, the pipe is opened here so the waiting thread ends."""
    os.mkfifo(fifo)
    opened = threading.Event()

    def wait() -> None:
        os.close(os.open(fifo, os.O_WRONLY))
        opened.set()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    try:
        yield opened
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        waiter.join(GUARD)


def test_a_call_cancelled_while_reading_stops_reading_and_the_server_exits(
    tmp_path: Path,
) -> None:
    """The walk of a folder of binary files (which count toward no read limit) went on to
    its end after the cancel, and the server could not exit on stdin's end until then."""
    root = tmp_path / "root"
    (root / "b").mkdir(parents=True)
    (root / "c").mkdir()
    for i in range(20_000):  # a walk of them takes seconds; the cancel comes first
        (root / "b" / f"{i:05}.bin").write_bytes(b"\0")
    with (
        model_server() as server,
        opened_by_the_server(root / "a-first") as first,  # a folder's files before its folders
        opened_by_the_server(root / "c" / "z-last") as last,
        raw_server(root, tmp_path / "server.log", *model_flags(server)) as client,
    ):
        client.call(1, {"question": "Which files?", "paths": ["."]})
        assert first.wait(GUARD), "the walk did not start"
        client.cancel(1)
        assert client.close_stdin_and_wait() == 0
        assert not last.is_set(), "the cancelled walk read the folder to its end"
        assert not server.requests
