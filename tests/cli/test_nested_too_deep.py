"""JSON nested deeper than Python's stack (a fuzzer's, a hostile file's): every command
that reads JSON from a flag or a file refuses it in one line saying "nested too deep",
exit 2, and ``--json`` still prints one object; never a ``RecursionError`` traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_command import rlm_graph

pytestmark = pytest.mark.processes

DEEP_OBJECT = '{"a":' * 5000 + "1" + "}" * 5000
DEEP_ARRAY = "[" * 100_000 + "]" * 100_000


@pytest.fixture
def context(tmp_path: Path) -> str:
    path = tmp_path / "ctx.txt"
    path.write_text("a document")
    return str(path)


@pytest.mark.parametrize("flag", ["--backend-kwargs", "--hedge", "--schema"])
def test_a_flag_of_json_nested_too_deep_is_one_line(
    flag: str, context: str, tmp_path: Path
) -> None:
    value = DEEP_OBJECT
    if flag == "--schema":
        value = str(tmp_path / "deep.json")
        Path(value).write_text(DEEP_ARRAY)
    words = ["run", "--context", context, "--query", "q", "--backend", "scripted"]
    done = rlm_graph(*words, "--model", "m", flag, value)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"rlm-graph run: {flag}") and "nested too deep" in line
    as_json = rlm_graph(*words, "--model", "m", flag, value, "--json")
    assert as_json.returncode == 2 and "Traceback" not in as_json.stderr
    assert "nested too deep" in json.loads(as_json.stdout)["error"]["message"]


@pytest.mark.parametrize(
    "text",
    [DEEP_ARRAY, '{"resourceSpans": ' + DEEP_ARRAY + "}", '{"format": "rlm-graph/1", "nodes": '
     + DEEP_ARRAY + "}"],
    ids=["json", "otlp", "graph-json"],
)  # fmt: skip
def test_a_trace_or_graph_nested_too_deep_is_one_line(text: str, tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text(text)
    for command in (
        ["trace", "show", str(path)],
        ["trace", "export", str(path)],
        ["report", str(path), "-o", str(tmp_path / "r.html")],
    ):
        if command[1] == "show" and "rlm-graph/1" in text:
            continue  # trace show reads trace files only
        done = rlm_graph(*command)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert str(path) in line and "nested too deep" in line, line


def test_a_finish_reason_nested_too_deep_is_shown_as_text(tmp_path: Path) -> None:
    """A Jaeger ``gen_ai.response.finish_reasons`` tag is decoded as JSON: one nested past
    the stack stays the text it is, and the trace is shown."""
    from tests.cli.test_unreadable_traces import jaeger, jaeger_span

    span = jaeger_span("1" * 16)
    tag = {"key": "gen_ai.response.finish_reasons", "type": "string", "value": DEEP_ARRAY}
    span["tags"].append(tag)
    path = tmp_path / "t.jaeger.json"
    path.write_text(jaeger(span))
    done = rlm_graph("trace", "show", str(path), "--width", "100")
    assert done.returncode == 0, done.stderr
    assert "chat m" in done.stdout
