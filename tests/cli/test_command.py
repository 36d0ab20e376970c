"""The installed ``rlm-graph`` command as a user meets it: exit codes, stderr lines and
stdout JSON on every exit path, run as a real process against a fake server."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rlm_graph.testing import FakeOpenAIServer, Reply, last_user_message
from tests.support.guests import folder_the_guest_can_reach
from tests.support.terminal import as_from_a_terminal, read_until_closed

pytestmark = pytest.mark.processes

COMMAND = Path(sys.executable).with_name("rlm-graph")
LLAMA_CPP_WINDOW_ERROR = {
    "error": {
        "code": 400,
        "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 2310,
        "n_ctx": 2048,
    }
}
FIRST_TURN = "```repl\nanswer['content'] = 'half of the answer'\nprint(len(context))\n```"


def _env() -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OPENAI_", "ANTHROPIC_"))
    }
    env["PYTHONUNBUFFERED"] = "1"
    return env


def rlm_graph(
    *args: str, stdin: bytes = b"", timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    assert COMMAND.exists(), f"{COMMAND} is missing: run `make install`"
    done = subprocess.run(
        [str(COMMAND), *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        env=_env(),
        check=False,
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def without_progress(err: str) -> str:
    """stderr less the plain progress lines (`rlm_graph.cli.progress`) a pipe gets, and
    the subprocess environment's one warning on a machine that refuses it a namespace."""
    return "\n".join(
        line
        for line in err.splitlines()
        if not line.startswith(("rlm-graph: ", "subprocess environment: "))
    )


def run_args(server: FakeOpenAIServer, context: str | Path, *extra: str) -> list[str]:
    return [
        "run",
        "--context",
        str(context),
        "--query",
        "what?",
        "--model",
        "m",
        "--base-url",
        server.base_url,
        *extra,
    ]


def one_json(stdout: str) -> dict[str, Any]:
    """The single JSON object stdout must hold (json.loads fails on anything more)."""
    payload = json.loads(stdout)
    assert isinstance(payload, dict)
    assert set(payload) == {
        "answer",
        "stop_reason",
        "usage",
        "execution_time",
        "exit_code",
        "error",
    }
    return payload


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("x" * 500, encoding="utf-8")
    return path


# -- --json on every exit path ---------------------------------------------------------


def _usage_error(server: FakeOpenAIServer, text: Path) -> list[str]:
    return ["run", "--context", str(text), "--query", "q", "--json"]  # no --model


def _config_error(server: FakeOpenAIServer, text: Path) -> list[str]:
    return run_args(server, text, "--backend", "nope", "--json")


def _missing_file(server: FakeOpenAIServer, text: Path) -> list[str]:
    return run_args(server, text.with_name("missing.txt"), "--json")


def _binary_file(server: FakeOpenAIServer, text: Path) -> list[str]:
    binary = text.with_name("image.png")
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    return run_args(server, binary, "--json")


def _bad_max_attempts(server: FakeOpenAIServer, text: Path) -> list[str]:
    return run_args(server, text, "--max-attempts", "0", "--json")


@pytest.mark.parametrize(
    ("build", "code", "kind", "words"),
    [
        (_usage_error, 2, "UsageError", "--model"),
        (_config_error, 2, "PluginError", "nope"),
        (_missing_file, 2, "ConfigError", "cannot read --context"),
        (_binary_file, 2, "ConfigError", "binary"),
        (_bad_max_attempts, 2, "ConfigError", "max_attempts"),
    ],
)
def test_json_errors_are_one_object_with_the_exit_code(
    build: Any, code: int, kind: str, words: str, text_file: Path
) -> None:
    with FakeOpenAIServer() as server:
        done = rlm_graph(*build(server, text_file))
        assert not server.requests
    payload = one_json(done.stdout)
    assert done.returncode == code == payload["exit_code"] == payload["error"]["exit_code"]
    assert payload["error"]["type"] == kind and words in payload["error"]["message"]
    assert "Traceback" not in done.stderr


def test_json_answers_limits_and_provider_errors(text_file: Path) -> None:
    with FakeOpenAIServer(
        replies=["```repl\nanswer['content'] = 'done'; answer['ready'] = True\n```"]
    ) as server:
        answered = rlm_graph(*run_args(server, text_file, "--json"))
    with FakeOpenAIServer(lambda body: FIRST_TURN) as server:
        limited = rlm_graph(*run_args(server, text_file, "--json", "--max-iterations", "2"))
    with FakeOpenAIServer(replies=[Reply.error(401, "Incorrect API key provided")]) as server:
        refused = rlm_graph(*run_args(server, text_file, "--json"))
    ok, limit, error = (one_json(d.stdout) for d in (answered, limited, refused))
    assert (answered.returncode, ok["answer"], ok["error"]) == (0, "done", None)
    assert ok["usage"]["model_usage_summaries"]["m"]["total_calls"] == 1
    assert (limited.returncode, limit["stop_reason"], limit["answer"]) == (
        3,
        "max_iterations",
        FIRST_TURN,
    )
    assert refused.returncode == 4 == error["exit_code"]
    assert error["error"]["type"] == "ProviderAuthError" and "API key" in error["error"]["message"]
    assert error["answer"] is None  # no partial answer: null, as cli.md says, not ""


def test_a_refused_key_says_the_command_lines_way_to_give_one(text_file: Path) -> None:
    with FakeOpenAIServer(replies=[Reply.error(401, "Incorrect API key provided")]) as server:
        done = rlm_graph(*run_args(server, text_file, "--quiet"))
    assert done.returncode == 4
    assert "--api-key-env NAME" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "utf-8-sig"])
def test_a_file_with_a_byte_order_mark_is_read_as_its_mark_says(
    tmp_path: Path, encoding: str
) -> None:
    """A UTF-16 file from Windows is text (its NUL bytes do not make it binary)."""
    text = tmp_path / "notes.txt"
    text.write_bytes("héllo wörld".encode(encoding))
    with FakeOpenAIServer(lambda body: "```repl\nFINAL(context)\n```") as server:
        done = rlm_graph(*run_args(server, text, "--environment", "local"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "héllo wörld"


def test_price_lets_max_budget_hold_for_a_model_the_table_does_not_know(text_file: Path) -> None:
    with FakeOpenAIServer(lambda body: FIRST_TURN) as server:
        refused = rlm_graph(*run_args(server, text_file, "--max-budget", "0.01"))
        priced = rlm_graph(
            *run_args(server, text_file, "--max-budget", "0.01", "--price", "1000", "1000")
        )
        calls = len(server.requests)
    assert refused.returncode == 2 and "--price INPUT OUTPUT" in refused.stderr
    assert priced.returncode == 3, priced.stderr  # the budget stopped it: exit 3
    assert "max_budget" in priced.stderr and "$" in priced.stderr
    assert 1 <= calls < 30  # not the 30 turns of max_iterations


def test_the_usage_line_says_when_tokens_were_estimated(text_file: Path) -> None:
    reply = "```repl\nanswer['content'] = 'done'; answer['ready'] = True\n```"
    no_usage = {"choices": [{"message": {"role": "assistant", "content": reply}}]}
    with FakeOpenAIServer(replies=[Reply(body=no_usage)]) as server:
        done = rlm_graph(*run_args(server, text_file))
    assert done.returncode == 0 and done.stdout.strip() == "done"
    assert "(estimated for 1: the server reported none, or a hedged" in done.stderr


# -- a provider error after some turns; the context window -----------------------------


def test_a_context_length_error_says_what_to_do_and_keeps_the_partial_answer(
    text_file: Path,
) -> None:
    replies = [FIRST_TURN, Reply(400, LLAMA_CPP_WINDOW_ERROR)]
    with FakeOpenAIServer(replies=list(replies)) as server:
        text = rlm_graph(*run_args(server, text_file))
        assert len(server.requests) == 2  # not retried: the same request cannot fit later
    with FakeOpenAIServer(replies=list(replies)) as server:
        as_json = one_json(rlm_graph(*run_args(server, text_file, "--json")).stdout)
    assert text.returncode == 4
    assert text.stdout.strip() == "half of the answer"
    lines = without_progress(text.stderr).strip().splitlines()
    assert lines[0] == "[stopped by provider_error; partial answer]"
    assert lines[1].startswith("[1 call, ")  # the refused call used nothing
    assert "context window" in lines[2] and "--context-window" in lines[2] and len(lines) == 3
    assert as_json["answer"] == "half of the answer" and as_json["exit_code"] == 4
    assert as_json["stop_reason"] == "provider_error"
    assert as_json["error"]["type"] == "ContextLengthExceeded"
    assert as_json["usage"]["model_usage_summaries"]["m"]["total_input_tokens"] > 0


def test_window_flags_reach_the_requests(text_file: Path) -> None:
    """--max-output-tokens is every request's max_tokens; --context-window compacts the
    history (truncate: no extra model call) before it passes the window."""
    turns = ["```repl\nprint('" + "y" * 1200 + "')\n```"] * 6
    window = ("--context-window", "1500", "--compaction", "truncate")
    sizes = {}
    for flags in [(), window]:
        with FakeOpenAIServer(replies=list(turns)) as server:
            done = rlm_graph(
                *run_args(
                    server, text_file, "--max-output-tokens", "77", "--max-iterations", "5", *flags
                )
            )
            bodies = server.bodies
        assert done.returncode == 3, done.stderr
        assert {b["max_tokens"] for b in bodies} == {77}
        sizes[flags] = [len(json.dumps(b["messages"])) for b in bodies]
    assert max(sizes[()]) > 1500 * 4  # the window, in the estimate's characters per token
    assert max(sizes[window]) < 1500 * 4


def test_max_attempts_and_timeout(text_file: Path) -> None:
    answer = "```repl\nanswer['content'] = 'ok'; answer['ready'] = True\n```"
    with FakeOpenAIServer(replies=[Reply.error(500, "boom"), answer]) as server:
        once = rlm_graph(*run_args(server, text_file, "--max-attempts", "1"))
        assert len(server.requests) == 1
    with FakeOpenAIServer(
        replies=[Reply.error(500, "boom"), Reply.error(503, "busy"), answer]
    ) as server:
        thrice = rlm_graph(*run_args(server, text_file, "--max-attempts", "3"))
        assert len(server.requests) == 3
    with FakeOpenAIServer(replies=[Reply(200, answer, delay=3)]) as server:
        slow = rlm_graph(*run_args(server, text_file, "--timeout", "0.3", "--max-attempts", "1"))
    assert once.returncode == 4 and "--max-attempts" in once.stderr
    assert (thrice.returncode, thrice.stdout.strip()) == (0, "ok")
    assert slow.returncode == 4 and "--timeout" in slow.stderr


def test_max_timeouts_bounds_the_attempts_that_time_out(text_file: Path) -> None:
    answer = "```repl\nanswer['content'] = 'ok'; answer['ready'] = True\n```"
    with FakeOpenAIServer(lambda body: Reply(200, answer, delay=3)) as server:
        # max_attempts stays 10: the timeouts alone end the call.
        done = rlm_graph(*run_args(server, text_file, "--timeout", "0.2", "--max-timeouts", "1"))
        assert len(server.requests) == 1
    assert done.returncode == 4
    assert "1 attempt timed out" in done.stderr and "--max-timeouts" in done.stderr


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run", "--context", "c.txt", "--model", "m"], "rlm-graph run: error: the following"),
        (
            ["batch", "--input", "i", "--output", "o", "--model", "m", "--bogus"],
            "rlm-graph batch: error: unrecognized arguments: --bogus",
        ),
    ],
)
def test_bad_usage_is_one_line_naming_the_subcommand(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlm_graph.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(said)
    assert err.rstrip().endswith(f"(see rlm-graph {argv[0]} --help)")


# -- the context file ------------------------------------------------------------------


def test_a_binary_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    binary = tmp_path / "data.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    with FakeOpenAIServer() as server:
        done = rlm_graph(*run_args(server, binary))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "binary" in done.stderr and not done.stdout


def test_a_non_utf8_text_file_names_encoding_and_reads_with_it(tmp_path: Path) -> None:
    latin = tmp_path / "latin.txt"
    latin.write_bytes("Caf\xe9 cr\xe8me, d\xe9j\xe0 vu".encode("latin-1"))
    code = "```repl\nanswer['content'] = context; answer['ready'] = True\n```"
    with FakeOpenAIServer(lambda body: code) as server:
        refused = rlm_graph(*run_args(server, latin))
        read = rlm_graph(*run_args(server, latin, "--encoding", "latin-1"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "--encoding" in refused.stderr and "0xe9" in refused.stderr
    assert (read.returncode, read.stdout.strip()) == (0, "Café crème, déjà vu")


# -- control sequences in answers ------------------------------------------------------

HOSTILE = (
    "\x1b[2J\x1b[H\x1b]0;owned\x07\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\ done\x9b31m\rfake"
    "\u202e\u2066\u2069"  # bidirectional overrides: the rest of the line shown reversed
)


def _run_on_a_terminal(args: Sequence[str], *, stderr: bool = False) -> tuple[int, bytes]:
    """Run the command with stdout (and ``stderr``: stderr too) on a pseudo-terminal;
    return its exit code and output."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [str(COMMAND), *args],
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal if stderr else subprocess.DEVNULL,
        env=_env(),
    )
    os.close(terminal)
    shown = read_until_closed(controller)
    return process.wait(timeout=60), shown


def test_control_sequences_are_stripped_on_a_terminal_only(text_file: Path) -> None:
    code = f"```repl\nanswer['content'] = {HOSTILE!r}; answer['ready'] = True\n```"
    with FakeOpenAIServer(lambda body: code) as server:
        status, shown = _run_on_a_terminal(run_args(server, text_file))
        piped = rlm_graph(*run_args(server, text_file))
    assert status == 0
    assert shown.decode().strip() == "link donefake"
    assert piped.stdout.rstrip("\n") == HOSTILE  # a pipe gets the bytes as written


def test_verbose_lines_and_trace_show_strip_the_models_control_sequences(
    text_file: Path, tmp_path: Path
) -> None:
    """-v echoes the root model's reply and trace show prints what servers named: on a
    terminal neither sets its title, writes its clipboard or clears its screen."""
    reply = f"Thinking {HOSTILE}\n```repl\nanswer['content'] = 'ok'; answer['ready'] = True\n```"
    traces = tmp_path / "traces"
    with FakeOpenAIServer(lambda body: reply) as server:
        status, shown = _run_on_a_terminal(
            [
                *run_args(server, text_file, "-v"),
                "--trace",
                "file",
                "--trace-dir",
                str(traces),
            ],
            stderr=True,
        )
    assert status == 0
    assert b"Thinking" in shown
    for sequence in (b"]0;owned", b"]8;;http://evil", b"\x1b[2J", b"\x9b31m"):
        assert sequence not in shown
    (jaeger,) = traces.glob("*.jaeger.json")
    text = jaeger.read_text(encoding="utf-8").replace('"m"', json.dumps("m" + HOSTILE))
    jaeger.write_text(text, encoding="utf-8")
    status, shown = _run_on_a_terminal(["trace", "show", str(jaeger), "--no-timeline"])
    assert status == 0 and b"chat" in shown
    assert b"]0;owned" not in shown and b"\x1b[2J" not in shown
    # Stripped before the columns are padded: the rows' last column lines up.
    rows = [line for line in shown.decode().splitlines() if line.rstrip().endswith(" ok")]
    assert len(rows) >= 2 and len({len(row.rstrip()) for row in rows}) == 1, rows


def test_where_output_goes_is_checked_before_anything_runs(text_file: Path, tmp_path: Path) -> None:
    """A folder given for a file (or a file for a folder) is exit 2 before the run it
    would have recorded, not a lost report after the run was paid for."""
    folder, plain = tmp_path / "folder", tmp_path / "plain.txt"
    folder.mkdir()
    plain.write_text("x", encoding="utf-8")
    with FakeOpenAIServer(lambda body: "never") as server:
        cases = [
            (run_args(server, text_file, "--report", str(folder)), "--report: "),
            (
                run_args(server, text_file, "--trace", "file", "--trace-dir", str(plain)),
                "not a folder",
            ),
            (run_args(server, text_file, "--trace-dir", str(folder)), "add --trace file"),
            (["demo", "--out", str(folder)], "--out: "),
            (["trace", "export", str(text_file), "-o", str(folder)], "-o: "),
        ]
        for args, says in cases:
            done = rlm_graph(*args)
            assert done.returncode == 2, (args, done.stderr)
            assert says in done.stderr and "Traceback" not in done.stderr
        assert server.requests == []


def test_trace_show_on_a_binary_file_or_a_journal_is_one_line(tmp_path: Path) -> None:
    binary = tmp_path / "bin.dat"
    binary.write_bytes(bytes(range(256)) * 8)
    for args in (["trace", "show", str(binary)], ["trace", "export", str(binary)]):
        done = rlm_graph(*args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


# -- Ctrl-C ----------------------------------------------------------------------------


def _interrupt(
    args: Sequence[str],
    started: Any,
    stop: signal.Signals = signal.SIGINT,
    *,
    preexec_fn: Any = None,
    first: Any = None,
) -> tuple[int, str, str, int]:
    """Run the command until ``started(process)``, then (after ``first(process)``, if
    given) send it ``stop``: its exit code, stdout, stderr and process id."""
    process = subprocess.Popen(
        [str(COMMAND), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
        preexec_fn=as_from_a_terminal(preexec_fn),
    )
    try:
        deadline = time.monotonic() + 60
        while not started(process) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert process.poll() is None, "the command ended before it could be interrupted"
        if first is not None:
            first(process)
        process.send_signal(stop)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, out.decode(), err.decode(), process.pid


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_during_run_is_one_line_and_exit_130(text_file: Path, as_json: bool) -> None:
    block = "```repl\nimport time\ntime.sleep(60)\n```"
    with FakeOpenAIServer(lambda body: block) as server:
        # --quiet: no progress lines (a feature of their own), so stderr is only what
        # Ctrl-C printed.
        extra = ("--json",) if as_json else ("--quiet",)
        code, out, err, _ = _interrupt(
            [*run_args(server, text_file, *extra)], lambda _: len(server.requests) >= 1
        )
    assert code == 130
    err = without_progress(err)
    assert len(err.splitlines()) <= 3 and "Traceback" not in err
    if as_json:
        assert one_json(out)["error"]["type"] == "Interrupted"
    else:
        assert err.strip() == "rlm-graph run: interrupted"


def test_ctrl_c_still_writes_the_report_of_what_ran(text_file: Path, tmp_path: Path) -> None:
    block = "```repl\nimport time\ntime.sleep(60)\n```"
    report = tmp_path / "run.html"
    with FakeOpenAIServer(lambda body: block) as server:
        code, out, err, _ = _interrupt(
            [*run_args(server, text_file, "--quiet", "--report", str(report))],
            lambda _: len(server.requests) >= 1,
        )
    assert code == 130, err
    assert f"report written to {report}" in err
    page = report.read_text(encoding="utf-8")
    assert "interrupted" in page and "repl_block" in page


def test_ctrl_c_during_demo_is_one_line_and_exit_130(tmp_path: Path) -> None:
    out_file = tmp_path / "graph.json"
    code, out, err = _interrupt_demo(out_file)
    assert code == 130
    assert without_progress(err).strip() == "rlm-graph demo: interrupted" and "Traceback" not in err
    assert "Question:" in out and not out_file.exists()


def _interrupt_demo(out_file: Path) -> tuple[int, str, str]:
    process = subprocess.Popen(
        [str(COMMAND), "demo", "--latency", "5", "--out", str(out_file), "--size", "20000"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
        preexec_fn=as_from_a_terminal(),
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        seen = b""
        while b"Question:" not in seen:  # the demo prints this, then starts the run
            line = process.stdout.readline()
            assert line, "the demo ended before it could be interrupted"
            seen += line
        progress = b""
        while b" turn 1 " not in progress:  # the first turn's progress line: its 5 s call began
            line = process.stderr.readline()
            assert line, "the demo ended before it could be interrupted"
            progress += line
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, (seen + out).decode(), (progress + err).decode()


def _as_background_job() -> None:
    """What a script's ``command &`` does to it without job control: SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background-job"])
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_clean_up_like_ctrl_c(
    text_file: Path, stop: signal.Signals, background: bool
) -> None:
    """Also in a background job of a script, whose SIGINT is ignored (a SIGTERM there
    was ignored with it: the run went on to its end)."""
    # The block says it runs (a sub-call the server sees), then sleeps.
    block = "```repl\nllm_query('the block runs')\nimport time\ntime.sleep(60)\n```"
    temp = tempfile.gettempdir()

    def started(process: subprocess.Popen[bytes]) -> bool:
        running = any(last_user_message(b) == "the block runs" for b in server.bodies)
        mine = f"rlm-graph-{process.pid}-subprocess"
        return running and any(n.startswith(mine) for n in os.listdir(temp))

    with FakeOpenAIServer(lambda body: block) as server:
        code, _, err, pid = _interrupt(
            run_args(server, text_file, "--quiet"),
            started,
            stop,
            preexec_fn=_as_background_job if background else None,
        )
    assert code == 128 + stop
    assert without_progress(err).strip() == f"rlm-graph run: interrupted ({stop.name})"
    assert [n for n in os.listdir(temp) if n.startswith(f"rlm-graph-{pid}-")] == []


def test_a_batch_stopped_by_sigterm_says_so_and_an_ignored_sighup_stays_ignored(
    tmp_path: Path,
) -> None:
    """A batch in a script's background (SIGINT ignored) under nohup (SIGHUP ignored): a
    hang-up does not stop it, a SIGTERM does, with 143 and how to resume."""
    items = tmp_path / "items.jsonl"
    items.write_text("".join(f'{{"id": {i}, "context": "c", "query": "q{i}"}}\n' for i in range(4)))

    def nohup_background() -> None:
        _as_background_job()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def hang_up(process: subprocess.Popen[bytes]) -> None:
        process.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert process.poll() is None, "a hang-up the command was started ignoring stopped it"

    slow = "```repl\nimport time\ntime.sleep(60)\n```"
    with FakeOpenAIServer(lambda body: slow) as server:
        args = ["batch", "--input", str(items), "--output", str(tmp_path / "results.jsonl")]
        code, _, err, _ = _interrupt(
            [*args, "--model", "m", "--base-url", server.base_url],
            lambda _: len(server.bodies) >= 4,
            signal.SIGTERM,
            preexec_fn=nohup_background,
            first=hang_up,
        )
    assert code == 143, err
    assert "rlm-graph batch: interrupted (SIGTERM) after 0 items; rerun" in err


def test_a_closed_stderr_loses_no_answer(text_file: Path) -> None:
    """Started with stderr closed (``2>&-``), where Python has no sys.stderr: the
    progress display failed and the answer was lost (exit 1, nothing on stdout)."""
    answer = "```repl\nFINAL('the answer')\n```"
    with FakeOpenAIServer(lambda body: answer) as server:
        done = subprocess.run(
            [str(COMMAND), *run_args(server, text_file)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=_env(),
            preexec_fn=lambda: os.close(2),
            timeout=60,
        )
    assert done.returncode == 0
    assert done.stdout.decode().strip() == "the answer"


def test_a_batch_whose_stderr_reader_left_writes_every_result(tmp_path: Path) -> None:
    """``rlm-graph batch ... 2>&1 >/dev/null | head -2``: the progress lines' reader goes
    away; the batch stopped at the next line (exit 1, most items never run, nothing said
    of them). It goes on, its results all written."""
    items = tmp_path / "items.jsonl"
    items.write_text("".join(f'{{"id": {i}, "context": "c", "query": "q"}}\n' for i in range(12)))
    out = tmp_path / "results.jsonl"
    answer = "```repl\nFINAL('ok')\n```"
    with FakeOpenAIServer(lambda body: answer) as server:
        args = ["batch", "--input", str(items), "--output", str(out), "--concurrency", "2"]
        process = subprocess.Popen(
            [str(COMMAND), *args, "--model", "m", "--base-url", server.base_url],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=_env(),
        )
        assert process.stderr is not None
        process.stderr.readline()  # one progress line, then the reader is gone
        process.stderr.close()
        code = process.wait(timeout=60)
    assert code == 0
    assert len(out.read_text().splitlines()) == 12


def test_context_from_a_closed_stdin_is_one_line_and_exit_2(text_file: Path) -> None:
    done = subprocess.run(
        [str(COMMAND), "run", "--context", "-", "--query", "q", "--model", "m"],
        capture_output=True,
        env=_env(),
        preexec_fn=lambda: os.close(0),
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.decode().strip().splitlines() == [
        "rlm-graph run: --context -: stdin is closed, nothing to read; pipe the "
        "context in (cat doc.txt | rlm-graph run --context - ...) or give its file"
    ]


def test_read_path_grants_the_guest_one_folder_and_nothing_else(text_file: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    # Beside the checkout, where the guest can reach it (not under the /tmp it sees as
    # its own); skipped, saying why, where there is no such folder.
    with folder_the_guest_can_reach(root) as folder:
        for name in ("granted", "other"):
            (folder / name).mkdir(mode=0o755)
            (folder / name / "notes.txt").write_text(f"{name} notes")
            (folder / name / "notes.txt").chmod(0o644)
        folder.chmod(0o755)
        reads = ", ".join(
            f"try_read({str(folder / name / 'notes.txt')!r})" for name in ("granted", "other")
        )
        code = (
            "```repl\ndef try_read(path):\n    try:\n        return open(path).read()\n"
            "    except OSError as exc:\n        return type(exc).__name__\n"
            f"answer['content'] = ' | '.join([{reads}]); answer['ready'] = True\n```"
        )
        with FakeOpenAIServer(lambda body: code) as server:
            done = rlm_graph(*run_args(server, text_file, "--read-path", str(folder / "granted")))
    assert done.returncode == 0, done.stderr
    granted, other = done.stdout.strip().split(" | ")
    assert granted == "granted notes"
    if "Landlock" not in done.stderr and other == "other notes":
        pytest.skip("no Landlock here: the guest reads what its uid can")
    assert other in {"PermissionError", "FileNotFoundError"}


def test_no_key_says_the_command_line_s_way_to_give_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlm_graph.cli import main

    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "c.txt").write_text("ctx")
    argv = ["run", "--context", str(tmp_path / "c.txt"), "--query", "q", "--model", "m"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no API key" in err and "OPENAI_API_KEY" in err and "--api-key-env NAME" in err


def test_version_from_the_command_and_from_python_m(capsys: pytest.CaptureFixture[str]) -> None:
    import rlm_graph
    from rlm_graph.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"rlm-graph {rlm_graph.__version__}"
    ran = subprocess.run(
        [sys.executable, "-m", "rlm_graph", "--version"], capture_output=True, text=True, timeout=60
    )
    assert (ran.returncode, ran.stdout.strip()) == (0, f"rlm-graph {rlm_graph.__version__}")


def test_a_collector_that_is_down_is_one_line_not_the_exporters_retries(tmp_path: Path) -> None:
    """The OTLP exporter retries a dead collector for seconds and logs each retry; the
    command waits a bounded time, says so once, and still exits 0 with its answer."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**_env(), "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
    done = subprocess.run(
        [str(COMMAND), "demo", "-q", "--latency", "0", "--out", str(tmp_path / "g.json")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Transient error" not in done.stderr and "Failed to export" not in done.stderr
    warnings = [line for line in done.stderr.splitlines() if "could not be sent" in line]
    assert len(warnings) == 1 and f"127.0.0.1:{port}" in warnings[0]


def test_a_resumed_run_says_what_came_from_the_journal(text_file: Path, tmp_path: Path) -> None:
    journal = tmp_path / "run.sqlite"
    with FakeOpenAIServer(lambda body: FIRST_TURN) as server:
        args = run_args(server, text_file, "--journal", str(journal), "--max-iterations", "2")
        first, second = rlm_graph(*args), rlm_graph(*args)
        empty = rlm_graph(*run_args(server, text_file, "--journal", ""))
    assert "replayed from the journal" not in first.stderr
    assert "calls replayed from the journal" in second.stderr
    assert empty.returncode == 2 and "--journal needs a file path" in empty.stderr


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_while_the_command_starts_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    """Its first import takes a quarter of a second; a Ctrl-C then ended in a traceback,
    and with --json in no JSON."""
    import types

    from rlm_graph.cli import main, output as real

    class Interrupted(types.ModuleType):  # a Ctrl-C in its first import, which Python undoes
        def __getattr__(self, name: str) -> object:
            sys.modules["rlm_graph.cli.output"] = real
            raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "rlm_graph.cli.output", Interrupted("output"))
    words = ["run", "--model", "m", *(["--json"] if as_json else [])]
    assert main(words) == 130
    printed = capsys.readouterr()
    if as_json:
        said = json.loads(printed.out)
        assert said["exit_code"] == 130 and said["error"]["type"] == "Interrupted"
    else:
        assert printed.err == "rlm-graph run: interrupted\n"


# The command as its script starts it, with a stop sent to itself while its first import
# runs (a finder the import asks first; the import is then done again without it).
STOPPED_IN_ITS_FIRST_IMPORT = """
import os, signal, sys

class StopHere:
    def find_spec(self, name, path=None, target=None):
        if name == "rlm_graph.cli.output":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), int(os.environ["STOP"]))
        return None

sys.meta_path.insert(0, StopHere())
from rlm_graph.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize(
    ("stop", "line"),
    [
        (signal.SIGTERM, "rlm-graph run: interrupted (SIGTERM)"),
        (signal.SIGHUP, "rlm-graph run: interrupted (SIGHUP)"),
        (signal.SIGINT, "rlm-graph run: interrupted"),
    ],
    ids=["SIGTERM", "SIGHUP", "Ctrl-C"],
)
def test_a_stop_while_the_command_starts_ends_it_with_its_code_and_line(
    stop: signal.Signals, line: str
) -> None:
    """SIGTERM and SIGHUP were taken once the first import (a quarter of a second, seconds
    on a loaded machine) was done: a supervisor's stop then killed the command by the
    signal, with no line, where a Ctrl-C got its line and 130."""
    done = _stopping(STOPPED_IN_ITS_FIRST_IMPORT, ["run", "--model", "m"], STOP=str(int(stop)))
    assert (done.returncode, done.stderr) == (128 + stop, line + "\n")


def _stopping(script: str, words: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """``script`` run as the command with ``words``, the signals a terminal gives and
    ``env``: a script that stops the command at a moment of its own choosing."""
    return subprocess.run(
        [sys.executable, "-c", script, *words],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env={**_env(), **env},
        preexec_fn=as_from_a_terminal(),
        check=False,
    )


# The command with a stop sent to itself the moment a signal handler of its own has been
# set (WHEN=set: the first, SIGTERM's or SIGHUP's) or put back (WHEN=back: the first
# one put back), seen by a profiler on the C function that sets it. Afterwards: the code,
# whether each stop has its default handler again.
STOPPED_WHILE_HANDLERS_CHANGE = """
import json, os, signal, sys
from rlm_graph import cli

if os.environ.get("IGNORE_CTRL_C"):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
stop, when, seen = int(os.environ["STOP"]), os.environ["WHEN"], []

def watch(frame, event, arg):
    if event != "c_return" or getattr(arg, "__name__", "") != "signal" or len(seen) > 1:
        return
    name = getattr(signal.getsignal(signal.SIGTERM), "__name__", "")
    if name == "interrupt" and not seen:
        seen.append("set")
    elif seen == ["set"] and name != "interrupt":
        seen.append("back")
    else:
        return
    if seen[-1] == when:
        os.kill(os.getpid(), stop)

sys.setprofile(watch)
code = cli.main(sys.argv[1:])
sys.setprofile(None)
after = {s.name: signal.getsignal(s) == signal.SIG_DFL for s in (signal.SIGTERM, signal.SIGHUP)}
print(json.dumps({"code": code, "after": after}), file=sys.stderr)
"""


@pytest.mark.parametrize(
    ("when", "stop", "ignore_ctrl_c", "code"),
    [
        ("set", signal.SIGTERM, False, 143),
        ("set", signal.SIGTERM, True, 143),  # a background job: Ctrl-C given back first
        ("back", signal.SIGHUP, False, 0),  # the command had done its work
    ],
    ids=["set", "set, Ctrl-C ignored", "put back"],
)
def test_a_stop_while_the_handlers_change_is_taken_once_and_they_are_put_back(
    when: str, stop: signal.Signals, ignore_ctrl_c: bool, code: int
) -> None:
    """A stop the moment its handler was set left that handler in place after the
    command (it was noted only once set); with Ctrl-C ignored, the SIGTERM it became was
    lost; a stop while they were put back skipped the others and said 'interrupted'
    after the command's own JSON."""
    env = {"STOP": str(int(stop)), "WHEN": when}
    if ignore_ctrl_c:
        env["IGNORE_CTRL_C"] = "1"
    done = _stopping(STOPPED_WHILE_HANDLERS_CHANGE, ["plugins", "--json"], **env)
    said = json.loads(done.stderr.strip().splitlines()[-1])
    assert said == {
        "code": code,
        "after": {"SIGTERM": True, "SIGHUP": True},  # their defaults again
    }
    printed = json.loads(done.stdout)  # one JSON object, or one list: never two
    if code:
        assert printed["exit_code"] == code and printed["error"]["type"] == "Interrupted"
    else:
        assert isinstance(printed, list)


# The command stopped as it starts its work (SIGHUP), then stopped again (STOP) the
# moment it has said so: the two functions wrapped to send them.
STOPPED_AGAIN_ONCE_SAID = """
import json, os, signal, sys
from rlm_graph import cli

work, say = cli._main, cli._interrupted
said = []

def stopped_at_once(*args):
    os.kill(os.getpid(), signal.SIGHUP)
    return work(*args)

def saying(*args):
    said.append(say(*args))
    os.kill(os.getpid(), int(os.environ["STOP"]))
    return said[-1]

cli._main, cli._interrupted = stopped_at_once, saying
print(json.dumps({"code": cli.main(sys.argv[1:]), "said": said}), file=sys.stderr)
"""


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_stop_after_the_command_said_it_was_stopped_is_not_said_again(
    stop: signal.Signals,
) -> None:
    """A second stop as the first one's line was said reached the command's last resort,
    which said 'interrupted' again: two lines, two JSON objects."""
    done = _stopping(STOPPED_AGAIN_ONCE_SAID, ["plugins", "--json"], STOP=str(int(stop)))
    assert json.loads(done.stderr.strip().splitlines()[-1]) == {"code": 129, "said": [129]}
    printed = json.loads(done.stdout)  # one object: a second would fail to parse
    assert printed["exit_code"] == 129 and printed["error"]["type"] == "Interrupted"
