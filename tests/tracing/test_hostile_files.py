"""Trace files no run writes, handed to ``trace show``, ``trace export`` and ``report``:
values of any size, times past any clock, devices and pipes. Each command prints lines
of bounded length, or refuses the file in one line (exit 2); never a traceback."""

from __future__ import annotations

import json
import os
import resource
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rlm_graph.cli import main
from tests.cli.test_command import COMMAND, _env, _run_on_a_terminal, rlm_graph


def otlp(*spans: dict[str, Any]) -> str:
    """One OTLP JSON line holding ``spans``."""
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]}) + "\n"


def otlp_span(
    number: int,
    name: str = "chat m",
    start: Any = "1000000000000000000",
    end: Any = "1000000001000000000",
    trace: int = 1,
    **attributes: Any,
) -> dict[str, Any]:
    """An OTLP span of a node (``n<number>``), string attributes (an int: intValue)."""
    values = {"rlm.node.id": f"n{number}", "rlm.node.kind": "llm_call", **attributes}
    return {
        "traceId": f"{trace:032x}",
        "spanId": f"{number:016x}",
        "name": name,
        "kind": 3,
        "startTimeUnixNano": start,
        "endTimeUnixNano": end,
        "attributes": [
            {"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}}
            for k, v in values.items()
        ],
    }


def test_show_cuts_every_column_so_a_line_stays_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One span's 20,000-character model, token count and status among 200 spans: each
    line is cut, not padded to the widest value (400 MB printed for a 1 MB file)."""
    spans = [otlp_span(i + 1, **{"gen_ai.request.model": "m"}) for i in range(200)]
    spans[0] = otlp_span(
        1,
        **{
            "gen_ai.request.model": "M" * 20_000,
            "gen_ai.usage.input_tokens": int("9" * 4000),
            "rlm.node.status": "S" * 20_000,
        },
    )
    path = tmp_path / "wide.otlp.jsonl"
    path.write_text(otlp(*spans))
    assert main(["trace", "show", str(path), "--width", "80"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 202
    assert max(len(line) for line in lines) <= 200
    assert "M" * 31 + "…" in lines[2] and "9" * 23 + "…" in lines[2]
    assert main(["trace", "show", str(path), "--width", "80", "--ascii"]) == 0
    shown = capsys.readouterr().out
    assert "M" * 31 + "~" in shown and "…" not in shown


def refusals(path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The one line each of `trace show`, `trace export` and `report` refuses ``path``
    with (exit 2)."""
    lines = []
    for command in (
        ["trace", "show", str(path)],
        ["trace", "export", str(path)],
        ["report", str(path), "-o", str(tmp_path / "r.html")],
    ):
        assert main(command) == 2, command
        captured = capsys.readouterr()
        (line,) = captured.err.splitlines()
        lines.append(line)
    return lines


JAEGER_SPAN = {"traceID": "a" * 32, "spanID": "b" * 16, "operationName": "chat m"}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (otlp(otlp_span(1, end="9" * 400)), "endTimeUnixNano is '99999"),
        (otlp(otlp_span(1, start="-" + "9" * 300, end="5")), "startTimeUnixNano is '-9999"),
        (otlp(otlp_span(1, start=1e300)), "startTimeUnixNano is 1e+300"),
        (json.dumps({"data": [{"spans": [{**JAEGER_SPAN, "startTime": 10**30}]}]}), "startTime"),
        (
            json.dumps({"data": [{"spans": [{**JAEGER_SPAN, "startTime": 1, "duration": 1e300}]}]}),
            "duration is 1e+300",
        ),
    ],
    ids=["otlp-end", "otlp-negative-start", "otlp-float-start", "jaeger-start", "jaeger-duration"],
)
def test_a_time_past_any_clock_is_one_line_naming_it(
    text: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A time of hundreds of digits overflowed a float: a traceback and exit 1."""
    path = tmp_path / "t.json"
    path.write_text(text)
    for line in refusals(path, tmp_path, capsys):
        assert str(path) in line and says in line, line
        assert "not a time" in line or "ending before the year 2554" in line, line


def test_a_cost_or_queueing_time_past_a_float_is_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.otlp.jsonl"
    huge = int("9" * 400)
    path.write_text(otlp(otlp_span(1, **{"rlm.cost_usd": huge, "rlm.queue_seconds": huge})))
    assert main(["trace", "show", str(path)]) == 0
    assert main(["trace", "export", str(path)]) == 0
    assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 0
    assert '"n1"' in capsys.readouterr().out


def _in_a_gigabyte(*args: str) -> subprocess.CompletedProcess[str]:
    """``rlm-graph *args`` as a process that may take neither more than 1 GiB nor 20 s."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))

    return subprocess.run(
        [str(COMMAND), *args], capture_output=True, text=True, env=_env(), preexec_fn=limit,
        timeout=20, check=False,
    )  # fmt: skip


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_show_refuses_a_device_and_a_fifo_nobody_writes_to_as_export_does(
    tmp_path: Path,
) -> None:
    """``trace show /dev/zero`` read until memory ran out; a FIFO with no writer held it
    for ever."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, says in (
        ("/dev/zero", "/dev/zero is neither a file nor a pipe; give a trace file"),
        (str(fifo), "nothing was written to"),
        (str(tmp_path), "is a folder; give a trace file"),
    ):
        done = _in_a_gigabyte("trace", "show", path)
        assert done.returncode == 2 and not done.stdout, done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith("rlm-graph trace show: ") and says in line, line


def test_show_reads_a_pipe_with_a_writer(tmp_path: Path) -> None:
    """``trace show <(zcat run.otlp.jsonl.gz)``: what the writer wrote is read once."""
    done = subprocess.run(
        [str(COMMAND), "trace", "show", "/dev/stdin", "--no-timeline"],
        input=otlp(otlp_span(1, name="from-a-pipe")),
        capture_output=True, text=True, env=_env(), timeout=20, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and "from-a-pipe [n1]" in done.stdout, done.stderr


SEQUENCES = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\x1b[0m\r\u202e"
CONTROL = (b"\x1b", b"\x07", b"\r\xe2\x80\xae", "\u202e".encode())


def test_names_and_labels_reach_a_terminal_without_control_sequences(tmp_path: Path) -> None:
    """A file named (by a glob) with a window title and a screen clear, a model label
    with more: ``== <path>`` of trace show, trace export's note and its DOT on a terminal
    carried them raw."""
    good = tmp_path / "ok.otlp.jsonl"
    good.write_text(otlp(otlp_span(1)))
    evil = tmp_path / f"evil{SEQUENCES}.otlp.jsonl"
    evil.write_text(otlp(otlp_span(1, **{"gen_ai.request.model": f"m{SEQUENCES}"})))
    os.utime(good, (1, 1))  # `evil` is the newest
    shows = [
        ["trace", "show", str(good), str(evil), "--no-timeline"],
        ["trace", "export", str(good), str(evil)],
        ["trace", "export", str(evil), "--format", "graphml"],
    ]
    for command in shows:
        status, shown = _run_on_a_terminal(command, stderr=True)
        assert status == 0, shown
        assert all(sequence not in shown for sequence in CONTROL), (command, shown)
        assert b"evil" in shown or b"mred" in shown, shown
    status, shown = _run_on_a_terminal(["trace", "export", str(evil)])
    assert b'[ok]\\n1.000s\\nmred"' in shown, shown


def test_export_to_a_pipe_or_a_file_keeps_the_labels_bytes(tmp_path: Path) -> None:
    path = tmp_path / "t.otlp.jsonl"
    path.write_text(otlp(otlp_span(1, **{"gen_ai.request.model": f"m{SEQUENCES}"})))
    piped = rlm_graph("trace", "export", str(path))
    assert piped.returncode == 0 and SEQUENCES in piped.stdout
    out = tmp_path / "g.dot"
    assert rlm_graph("trace", "export", str(path), "-o", str(out)).returncode == 0
    assert out.read_bytes().decode() == piped.stdout  # byte for byte (read_text: \r as \n)


def _export_refusal(path: Path, capsys: pytest.CaptureFixture[str], *words: str) -> str:
    assert main(["trace", "export", str(path), *words]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    return line


def test_an_error_quoting_a_huge_name_or_listing_many_runs_stays_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A span name of a megabyte was quoted whole; each of 20,000 runs was listed."""
    path = tmp_path / "dup.otlp.jsonl"
    path.write_text(otlp(otlp_span(1, name="X" * 1_000_000), otlp_span(2, name="Y" * 1_000_000)))
    path.write_text(path.read_text().replace('"n2"', '"n1"'))
    line = _export_refusal(path, capsys)
    assert "rlm.node.id 'n1' is another span's too" in line and len(line) < 400, line[:400]
    path = tmp_path / "many.otlp.jsonl"
    path.write_text(
        otlp(*(otlp_span(1, name="invoke_agent rlm", trace=t + 1) for t in range(2000)))
    )
    line = _export_refusal(path, capsys)
    assert "the file holds 2000 runs (" in line and "and 1995 more); choose one" in line
    assert len(line) < 400, line[:400]
    line = _export_refusal(path, capsys, "--trace-id", "f" * 32)
    assert "and 1995 more" in line and len(line) < 400, line[:400]


@pytest.mark.parametrize(
    ("span", "says"),
    [
        (otlp_span(1, **{"gen_ai.usage.input_tokens": -5}), "input_tokens is -5: Input should"),
        ({**otlp_span(1), "name": 5}, "malformed trace (ValidationError: name is 5: Input"),
    ],
    ids=["negative-tokens", "name-a-number"],
)
def test_a_value_the_model_refuses_is_one_line(
    span: dict[str, Any], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pydantic's refusal was a paragraph: four lines and a link."""
    path = tmp_path / "t.otlp.jsonl"
    path.write_text(otlp(span))
    line = _export_refusal(path, capsys)
    assert says in line and str(path) in line, line


def test_counts_of_thousands_of_digits_added_up_are_shown_by_their_size() -> None:
    """Two counts of 4,300 digits sum to one of 4,301, which Python will not write out:
    ``trace show`` ended in a traceback."""
    from rlm_graph.tracing.view import _digits

    huge = int("9" * 4300)
    assert _digits(2 * huge) == "~10^4300" and _digits(330) == "330"
