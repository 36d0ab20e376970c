"""``rlm-graph mcp`` cancelled and stopped while its client holds stdin open: a call
cancelled in the middle of reading its files, and the stop signals.

The installed command is spoken to over the raw protocol (one JSON-RPC message a line on
its stdin and stdout), not through the SDK's client: leaving, that client closes stdin and
then kills the server, which would hide a server that does not end by itself. It starts
with the stop signals as a terminal gives them (`as_from_a_terminal`): a signal it
inherits ignored stays ignored, as docs/cli.md says (``nohup`` ignores SIGHUP)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from rlm_graph.testing import FakeOpenAIServer
from tests.cli.test_mcp import COMMAND, KEY, model_server, tree_path
from tests.support.terminal import as_from_a_terminal

pytestmark = pytest.mark.processes  # the installed command, as an MCP server

GUARD = 120  # seconds: only a hang runs these out


def model_flags(server: FakeOpenAIServer) -> list[str]:
    return ["--base-url", server.base_url, "--api-key-env", "OPENAI_API_KEY"]


class RawClient:
    """The installed ``rlm-graph mcp``, and the JSON-RPC lines of an MCP client."""

    def __init__(
        self, root: Path, log: IO[bytes], *extra: str, tmp: Path | None, then: Any
    ) -> None:
        assert COMMAND.exists(), f"{COMMAND} is missing: run `make install`"
        env = {"OPENAI_API_KEY": KEY, "PYTHONPATH": tree_path(), "PATH": os.environ["PATH"]}
        self.process = subprocess.Popen(
            [str(COMMAND), "mcp", "--read-path", str(root), "--model", "gpt-test", *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env={**env, "TMPDIR": str(tmp)} if tmp is not None else env,
            # Under `nohup make test` the server inherited SIGHUP ignored and kept it so
            # (as it should): the SIGHUP test waited out its guard.
            preexec_fn=as_from_a_terminal(then),
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
def raw_server(
    root: Path, log: Path, *extra: str, tmp: Path | None = None, then: Any = None
) -> Iterator[RawClient]:
    """The server, initialized; ``then``: a ``preexec_fn`` after `as_from_a_terminal`'s."""
    with log.open("wb") as errlog:
        client = RawClient(root, errlog, *extra, tmp=tmp, then=then)
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


@pytest.mark.parametrize(
    ("stop", "code", "line"),
    [
        (signal.SIGTERM, 143, "rlm-graph mcp: interrupted (SIGTERM)"),
        (signal.SIGHUP, 129, "rlm-graph mcp: interrupted (SIGHUP)"),
        (signal.SIGINT, 130, "rlm-graph mcp: interrupted"),
    ],
    ids=["SIGTERM", "SIGHUP", "SIGINT"],
)
def test_a_stop_signal_ends_the_server_while_the_client_holds_stdin_open(
    tmp_path: Path, stop: signal.Signals, code: int, line: str
) -> None:
    """It stopped answering and lived on until the client closed stdin (docs/cli.md:
    SIGTERM and SIGHUP stop every command, 143 and 129; Ctrl-C 130)."""
    with (
        model_server() as server,
        raw_server(tmp_path, tmp_path / "server.log", *model_flags(server)) as client,
    ):
        client.process.send_signal(stop)
        assert client.process.wait(GUARD) == code  # stdin still open
    assert (tmp_path / "server.log").read_text().splitlines()[-1] == line


@contextmanager
def suite_under_nohup() -> Iterator[None]:
    """The test's own process ignores SIGHUP, as the suite's does under ``nohup``."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_hang_up_ends_the_server_however_the_suite_was_started(tmp_path: Path) -> None:
    """Under ``nohup make test`` the server inherited SIGHUP ignored, kept it ignored (a
    stop it was started ignoring stays ignored), and the SIGHUP test above waited out its
    guard: the servers here start with the signals a terminal gives."""
    with (
        suite_under_nohup(),
        model_server() as server,
        raw_server(tmp_path, tmp_path / "server.log", *model_flags(server)) as client,
    ):
        client.process.send_signal(signal.SIGHUP)
        assert client.process.wait(GUARD) == 129  # stdin still open
    assert (tmp_path / "server.log").read_text().splitlines()[-1] == (
        "rlm-graph mcp: interrupted (SIGHUP)"
    )


def test_a_server_started_under_nohup_serves_on_after_a_hang_up_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    """docs/cli.md: a signal the command was started ignoring stays ignored."""
    with (
        model_server() as server,
        raw_server(
            tmp_path,
            tmp_path / "server.log",
            *model_flags(server),
            then=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
        ) as client,
    ):
        client.process.send_signal(signal.SIGHUP)
        client.send({"id": 1, "method": "ping"})
        assert client.receive() == {"jsonrpc": "2.0", "id": 1, "result": {}}
        assert client.process.poll() is None
        client.process.send_signal(signal.SIGTERM)
        assert client.process.wait(GUARD) == 143  # stdin still open
    log = (tmp_path / "server.log").read_text()
    assert log.splitlines()[-1] == "rlm-graph mcp: interrupted (SIGTERM)"
    assert "SIGHUP" not in log  # not taken, not even as the stop before the last


GUEST_BLOCK = "```repl\nimport time\ntime.sleep(600)\n```"


def test_a_server_stopped_mid_call_kills_the_guest_and_removes_its_folders_first(
    tmp_path: Path,
) -> None:
    (tmp_path / "root").mkdir()
    tmp = tmp_path / "tmp"  # the server's temporary folder, where its guests' folders go
    tmp.mkdir()
    with (
        model_server(GUEST_BLOCK) as server,
        raw_server(
            tmp_path / "root",
            tmp_path / "server.log",
            *model_flags(server),
            "--report-dir",
            str(tmp_path / "reports"),
            tmp=tmp,
        ) as client,
    ):
        client.call(1, {"question": "Wait.", "text": "a document"})
        for _ in range(GUARD * 20):  # until the model has answered and the guest runs
            guests = descendants(client.process.pid)
            if server.requests and guests:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the guest never started")
        client.process.send_signal(signal.SIGTERM)
        assert client.process.wait(GUARD) == 143  # stdin still open
    assert [pid for pid in guests if alive(pid)] == []
    assert list(tmp.glob("rlm-graph-*")) == []


def test_a_second_stop_while_the_calls_close_still_ends_the_server(tmp_path: Path) -> None:
    """A second SIGTERM while the stopped server waited for its calls to close (a
    ``local`` block gets a second to stop) raised a KeyboardInterrupt past its exit: the
    server lived on until the client closed stdin."""
    (tmp_path / "root").mkdir()
    sleeping = "```repl\nimport time\nfor _ in range(100):\n    time.sleep(600)\n```"
    flags = ("--environment", "local", "--allow-local")
    with (
        model_server(sleeping) as server,
        raw_server(
            tmp_path / "root", tmp_path / "server.log", *model_flags(server), *flags
        ) as client,
    ):
        client.call(1, {"question": "Wait.", "text": "a document"})
        for _ in range(GUARD * 20):  # until the model has answered: the block sleeps
            if server.requests:
                break
            time.sleep(0.05)
        time.sleep(0.5)
        client.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)  # the block is being stopped (up to a second)
        client.process.send_signal(signal.SIGTERM)
        assert client.process.wait(GUARD) == 143  # stdin still open


def descendants(pid: int) -> list[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found += frontier
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
