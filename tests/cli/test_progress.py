"""Live progress of ``rlm-graph run``: in a pseudo-terminal while the run goes on, plain
lines in a pipe, ``--verbose``/``--quiet``, and never on stdout (``--json`` stays JSON)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rlm_graph.cli import main
from rlm_graph.testing import FakeOpenAIServer
from tests.support.terminal import as_from_a_terminal

pytestmark = pytest.mark.processes

KEY = "sk-progress-test"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class GatedModel:
    """Root turn 1 fans out 3 sub-calls; root turn 2 waits for ``release`` then answers.
    So the run cannot end before the test has seen what it waits for."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, body: dict[str, Any]) -> str:
        messages = body["messages"]
        if not any(m.get("role") == "system" for m in messages):
            return "sub-answer"
        turn = sum(1 for m in messages if m.get("role") == "assistant") + 1
        if turn == 1:
            return "```repl\nparts = llm_query_batched(['a', 'b', 'c'])\nprint(parts)\n```"
        self.release.wait(60)
        return "```repl\nFINAL('all done')\n```"


def _command(server: FakeOpenAIServer, context: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rlm_graph.cli",
        "run",
        "--context",
        str(context),
        "--query",
        "what?",
        "--model",
        "gpt-test",
        "--base-url",
        server.base_url,
        "--api-key-env",
        "OPENAI_API_KEY",
        *extra,
    ]


def _terminal() -> tuple[int, int]:
    """A pseudo-terminal 200 columns wide (so a progress line is not wrapped)."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    return controller, terminal


def _read_until(fd: int, pattern: str, seen: list[str], proc: subprocess.Popen[bytes]) -> str:
    """Read the terminal until ``pattern`` shows (ANSI codes stripped); fail if the
    process ends first or 60 s pass without it."""
    text = ANSI.sub("", "".join(seen))
    while not re.search(pattern, text):
        ready, _, _ = select.select([fd], [], [], 60)
        if not ready:
            pytest.fail(f"{pattern!r} never showed; got {text[-2000:]!r}")
        try:
            chunk = os.read(fd, 65536).decode("utf-8", "replace")
        except OSError:  # the other end closed: the process is gone
            pytest.fail(f"the process ended before {pattern!r} showed; got {text[-2000:]!r}")
        seen.append(chunk)
        text = ANSI.sub("", "".join(seen))
    return text


@pytest.fixture
def context_file(tmp_path: Path) -> Path:
    path = tmp_path / "context.txt"
    path.write_text("the context " * 100, encoding="utf-8")
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "OPENAI_API_KEY": KEY, "OTEL_TRACES_EXPORTER": "none"}


def test_progress_shows_in_a_terminal_while_the_run_goes_on(context_file: Path) -> None:
    model = GatedModel()
    controller, terminal = _terminal()
    with FakeOpenAIServer(model, api_key=KEY) as server:
        proc = subprocess.Popen(
            _command(server, context_file),
            stdin=subprocess.DEVNULL,
            stdout=terminal,
            stderr=terminal,
            env=_env(),
        )
        os.close(terminal)
        seen: list[str] = []
        try:
            text = _read_until(
                controller, r"turn 2 .*sub-calls 3 done, 0 running, 0 failed", seen, proc
            )
            # The run is waiting on turn 2, which the test has not released: it is still going.
            assert proc.poll() is None
            assert "[running]" in text and "all done" not in text
            model.release.set()
            text = _read_until(controller, r"all done", seen, proc)
        finally:
            model.release.set()
            code = proc.wait(60)
            os.close(controller)
    assert code == 0
    assert re.search(r"\[done\].*turn 2 .*sub-calls 3 done", text)
    assert KEY not in text


def test_with_json_stdout_holds_only_the_json(context_file: Path) -> None:
    model = GatedModel()
    model.release.set()
    controller, terminal = _terminal()
    with FakeOpenAIServer(model, api_key=KEY) as server:
        proc = subprocess.Popen(
            _command(server, context_file, "--json", "--verbose"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=terminal,
            env=_env(),
        )
        os.close(terminal)
        seen: list[str] = []
        try:
            progress = _read_until(controller, r"\[done\]", seen, proc)
            out, _ = proc.communicate(timeout=60)
        finally:
            os.close(controller)
    assert proc.returncode == 0
    assert json.loads(out)["answer"] == "all done"  # the whole of stdout is the JSON
    assert "sub-calls 3 done" in progress and "llm_call" in progress  # --verbose went to stderr


def _run_in_process(
    context: Path, *extra: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    model = GatedModel()
    model.release.set()
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with FakeOpenAIServer(model, api_key=KEY) as server:
        code = main(_command(server, context, *extra)[3:])
    out, err = capsys.readouterr()
    return code, out, err


def test_without_a_terminal_progress_is_one_plain_line_per_root_turn(
    context_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = _run_in_process(context_file, capsys=capsys, monkeypatch=monkeypatch)
    assert code == 0 and out.strip() == "all done"
    lines = [line for line in err.splitlines() if line.startswith("rlm-graph:")]
    assert len(lines) == 3  # turn 1, turn 2, the end
    assert "turn 1" in lines[0] and "turn 2" in lines[1] and lines[2].endswith("done")
    assert "sub-calls 3 done, 0 running, 0 failed" in lines[1]
    assert "\x1b[" not in err  # no escape codes in a log file


def test_verbose_prints_each_node_and_quiet_prints_none(
    context_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, verbose = _run_in_process(
        context_file, "--verbose", capsys=capsys, monkeypatch=monkeypatch
    )
    finished = re.findall(r"^\s+(\S+)\s+(root_turn|repl_block|llm_call)\s", verbose, re.MULTILINE)
    kinds = sorted(kind for _, kind in finished)
    assert kinds == ["llm_call"] * 3 + ["repl_block"] * 2 + ["root_turn"] * 2
    _, out, quiet = _run_in_process(context_file, "--quiet", capsys=capsys, monkeypatch=monkeypatch)
    assert out.strip() == "all done"
    assert "rlm-graph:" not in quiet and "root_turn" not in quiet


def test_ctrl_c_ends_the_progress_with_interrupted_and_counts_cancelled_calls(
    context_file: Path,
) -> None:
    """A real SIGINT to the installed command while three sub-calls are in flight: the
    last progress line says ``interrupted`` (not ``done``) and counts them as cancelled
    (not failed)."""
    command = Path(sys.executable).with_name("rlm-graph")
    release = threading.Event()

    def model(body: dict[str, Any]) -> str:
        if not any(m.get("role") == "system" for m in body["messages"]):
            release.wait(60)  # a sub-call: still in flight when Ctrl-C comes
            return "sub-answer"
        return "```repl\nparts = llm_query_batched(['a', 'b', 'c'])\nprint(parts)\n```"

    with FakeOpenAIServer(model, api_key=KEY) as server:
        proc = subprocess.Popen(
            [str(command), *_command(server, context_file)[3:]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_env(),
            preexec_fn=as_from_a_terminal(),
        )
        try:
            deadline = time.monotonic() + 60
            while len(server.requests) < 4 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)  # the root turn, then the three sub-calls of its block
            assert proc.poll() is None, "the command ended before it could be interrupted"
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            release.set()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130
    lines = [line for line in err.decode().splitlines() if line.startswith("rlm-graph: ")]
    assert lines, err
    last = lines[-1]
    assert last.endswith("  interrupted"), last
    assert "sub-calls 0 done, 0 running, 0 failed, 3 cancelled" in last, last
    assert err.decode().rstrip().endswith("rlm-graph run: interrupted")


def test_the_end_of_the_progress_names_how_the_run_ended() -> None:
    from rlm_graph.cli.progress import RunProgress
    from rlm_graph.events import RunFinished

    def ended(**fields: Any) -> str:
        progress = RunProgress()
        progress.update(RunFinished(seq=1, run_id="r", time=0.0, elapsed=0.0, **fields))
        return progress.outcome

    assert RunProgress().outcome == "running"
    assert ended() == "done"
    assert ended(stop_reason="max_tokens") == "stopped by max_tokens"
    assert ended(error="KeyboardInterrupt: ") == "interrupted"
    assert ended(error="Cancelled: cancelled") == "interrupted"
    assert ended(error="ProviderError: 500") == "failed (ProviderError)"
