"""Trace files rlm-graph cannot read (another version's, another producer's, edited by
hand): ``trace show``, ``trace export`` and ``report`` each say so in one line naming the
file, the span and the field, and exit 2; never a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlm_graph import Engine, Workflow
from rlm_graph.tracing import close_tracing, configure_tracing
from tests.cli.test_command import rlm_graph

Attributes = list[dict[str, Any]]


@pytest.fixture(scope="module")
def good_trace(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The OTLP lines of a real run's trace file."""
    folder = tmp_path_factory.mktemp("traces")
    provider = configure_tracing("file", directory=folder, formats=("otlp",))
    engine = Engine("scripted", {"respond": lambda r: "ok"}, tracer_provider=provider)
    wf = Workflow()
    wf.function(lambda a, b: a + b, wf.llm("one", id="one"), wf.llm("two", id="two"), id="join")
    engine.run(wf)
    assert close_tracing(provider)
    (path,) = folder.glob("*.otlp.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def edited(lines: list[dict[str, Any]], change: Callable[[Attributes], None]) -> str:
    lines = json.loads(json.dumps(lines))
    for line in lines:
        for resource in line["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    change(span.setdefault("attributes", []))
    return "".join(json.dumps(line) + "\n" for line in lines)


def setting(
    key: str, value: dict[str, Any], only: str | None = None
) -> Callable[[Attributes], None]:
    def change(attributes: Attributes) -> None:
        for attribute in attributes:
            if attribute["key"] == key and only in (None, attribute["value"].get("stringValue")):
                attribute["value"] = value

    return change


CASES = {
    "kind": (setting("rlm.node.kind", {"stringValue": "sub_call"}, "llm_call"), "rlm.node.kind"),
    "status": (setting("rlm.node.status", {"stringValue": "failed"}), "rlm.node.status"),
    "depth": (setting("rlm.depth", {"stringValue": "zero"}), "rlm.depth"),
    "tokens": (
        setting("gen_ai.usage.input_tokens", {"stringValue": "many"}),
        "gen_ai.usage.input_tokens",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_field_this_version_cannot_read_is_one_line_naming_it(
    case: str, good_trace: list[dict[str, Any]], tmp_path: Path
) -> None:
    change, field = CASES[case]
    path = tmp_path / f"{case}.otlp.jsonl"
    path.write_text(edited(good_trace, change))
    for line in refusals(path, tmp_path):
        assert str(path) in line and " span " in line and field in line, line


def refusals(path: Path, tmp_path: Path) -> list[str]:
    """The one line `trace export` and `report` each refuse ``path`` with (exit 2)."""
    lines = []
    for command in (
        ["trace", "export", str(path)],
        ["report", str(path), "-o", str(tmp_path / "r.html")],
    ):
        done = rlm_graph(*command)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        lines.append(line)
    return lines


def test_a_token_count_that_is_text_is_one_line_for_trace_show_too(
    good_trace: list[dict[str, Any]], tmp_path: Path
) -> None:
    path = tmp_path / "tokens.otlp.jsonl"
    path.write_text(edited(good_trace, CASES["tokens"][0]))
    done = rlm_graph("trace", "show", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "gen_ai.usage.input_tokens is 'many', not a whole number" in done.stderr


def jaeger(*spans: dict[str, Any]) -> str:
    return json.dumps({"data": [{"traceID": "a" * 32, "spans": list(spans)}]})


def jaeger_span(span_id: str, trace_id: Any = "a" * 32) -> dict[str, Any]:
    return {
        "traceID": trace_id,
        "spanID": span_id,
        "operationName": "chat m",
        "startTime": 1,
        "duration": 1,
        "tags": [{"key": "rlm.node.id", "type": "string", "value": "turn-1"}],
    }


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (jaeger(jaeger_span("1" * 16, trace_id=1)), "a Jaeger traceID is 1, not hex"),
        (
            jaeger(jaeger_span("1" * 16, trace_id="a" * 32 + "\x1b]0;owned\x07")),
            "a Jaeger traceID is 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\\x1b]0;owned\\x07', not hex",
        ),
        (jaeger(jaeger_span("1" * 16), jaeger_span("2" * 16)), "rlm.node.id 'turn-1' is another"),
    ],
    ids=["trace-id-a-number", "trace-id-with-an-escape", "one-node-two-spans"],
)
def test_a_jaeger_file_no_run_could_write_is_one_line(text: str, says: str, tmp_path: Path) -> None:
    path = tmp_path / "t.jaeger.json"
    path.write_text(text)
    for line in refusals(path, tmp_path):
        assert str(path) in line and says in line, line


def test_a_cost_that_is_not_a_number_is_unknown(
    good_trace: list[dict[str, Any]], tmp_path: Path
) -> None:
    path = tmp_path / "nan.otlp.jsonl"
    nan = {"key": "rlm.cost_usd", "value": {"doubleValue": "NaN"}}
    path.write_text(edited(good_trace, lambda attributes: attributes.append(nan)))
    report = tmp_path / "r.html"
    done = rlm_graph("report", str(path), "-o", str(report))
    assert done.returncode == 0, done.stderr
    assert "NaN" not in report.read_text()


def test_a_graph_json_holding_nan_is_one_line(tmp_path: Path) -> None:
    from rlm_graph.graph import to_json

    engine = Engine("scripted", {"respond": lambda r: "ok"})
    wf = Workflow()
    wf.llm("x", id="ask")
    data = json.loads(to_json(engine.run(wf).graph))
    data["nodes"][0]["cost"] = float("nan")
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(data))
    done = rlm_graph("report", str(path), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert str(path) in line and "NaN is not a number" in line


def test_an_error_line_quoting_a_file_has_no_control_sequences(tmp_path: Path) -> None:
    """A trace file handed over whose name sets a terminal's title: the error line naming
    it is printed without the sequence, by every command that reads one."""
    path = tmp_path / "run\x1b]0;owned\x07\x1b[2J.otlp.jsonl"
    path.write_text("{}\n")
    for command in (
        ["trace", "show", str(path)],
        ["trace", "export", str(path)],
        ["report", str(path), "-o", str(tmp_path / "r.html")],
    ):
        done = rlm_graph(*command)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert "/run.otlp.jsonl: not a trace" in line
        assert "\x1b" not in line and "\x07" not in line
