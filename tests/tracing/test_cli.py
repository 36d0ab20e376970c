"""``rlm-graph trace show|export`` and the reusable ``--trace`` options."""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
from pathlib import Path
from subprocess import CompletedProcess

import networkx as nx
import pytest
from opentelemetry.trace import NoOpTracerProvider

from rlm_graph import Engine, Workflow
from rlm_graph.cli import main
from rlm_graph.cli.trace import add_trace_argument, finish_tracing, tracer_provider_for
from rlm_graph.tracing import TraceSpan, render_trace
from tests.cli.test_command import COMMAND, _env

US = 1_000_000


def span(
    sid: str, name: str, start: float, end: float, parent: str | None = None, **attrs: object
) -> dict[str, object]:
    """A Jaeger JSON span (times in seconds from 1000 s after the epoch)."""
    tags = [
        {"key": k, "type": "int64" if isinstance(v, int) else "string", "value": v}
        for k, v in attrs.items()
    ]
    if attrs.get("error.type"):
        tags.append({"key": "error", "type": "bool", "value": True})
    return {
        "traceID": "ab" * 16,
        "spanID": sid * 16 if len(sid) == 1 else sid,
        "operationName": name,
        "references": [{"refType": "CHILD_OF", "traceID": "ab" * 16, "spanID": parent * 16}]
        if parent
        else [],
        "startTime": int((1000 + start) * US),
        "duration": int((end - start) * US),
        "tags": tags,
        "logs": [],
        "processID": "p1",
    }


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    spans = [
        span("a", "invoke_agent rlm", 0, 2),
        span(
            "b",
            "chat m1",
            0,
            0.5,
            "a",
            **{
                "rlm.node.id": "turn-1",
                "rlm.node.kind": "root_turn",
                "gen_ai.request.model": "m1",
                "gen_ai.usage.input_tokens": 100,
                "gen_ai.usage.output_tokens": 20,
            },
        ),
        span(
            "c",
            "execute_tool repl",
            0.5,
            1.5,
            "b",
            **{"rlm.node.id": "block-1", "rlm.node.kind": "repl_block"},
        ),
        span(
            "d",
            "chat m2",
            0.5,
            1.5,
            "c",
            **{
                "rlm.node.id": "llm-1",
                "rlm.node.kind": "llm_call",
                "gen_ai.request.model": "m2",
                "gen_ai.usage.input_tokens": 10,
                "gen_ai.usage.output_tokens": 5,
            },
        ),
        span(
            "e",
            "chat m2",
            0.5,
            1.0,
            "c",
            **{
                "rlm.node.id": "llm-2",
                "rlm.node.kind": "llm_call",
                "gen_ai.request.model": "m2",
                "error.type": "ProviderError",
                "rlm.node.status": "error",
            },
        ),
    ]
    path = tmp_path / "t.jaeger.json"
    path.write_text(
        json.dumps(
            {
                "data": [
                    {
                        "traceID": "ab" * 16,
                        "spans": spans,
                        "processes": {"p1": {"serviceName": "rlm-graph"}},
                    }
                ]
            }
        )
    )
    return path


def test_show_draws_the_tree_and_a_shared_timeline(
    trace_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", "show", str(trace_file), "--width", "100"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"trace {'ab' * 16} · 5 spans · 2.000 s · 135 tokens · 1 error"
    labels = [
        "invoke_agent rlm",
        "└─ chat m1 [turn-1]",
        "   └─ execute_tool repl [block-1]",
        "      ├─ chat m2 [llm-1]",
        "      └─ chat m2 [llm-2]",
    ]
    assert [line[: len(label)] for line, label in zip(out[2:], labels, strict=True)] == labels
    rows = dict(zip(["run", "turn-1", "block-1", "llm-1", "llm-2"], out[2:], strict=True))
    start = out[1].index("0 s ")  # the timeline's first column
    bars = {name: line[start:] for name, line in rows.items()}
    assert bars["run"] == "█" * len(bars["run"])
    # The two sub-calls start together: their bars begin in the same column, after the turn.
    one, two = bars["llm-1"], bars["llm-2"]
    assert one.index("█") == two.index("▒") == bars["block-1"].index("█") > 0
    assert abs(len(one.strip()) - 2 * len(two.strip())) <= 1  # twice as long, give or take a cell
    assert "1.000s" in rows["llm-1"] and "10/5" in rows["llm-1"]
    assert "error (ProviderError)" in rows["llm-2"]


def test_show_ascii_without_timeline(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "show", str(trace_file), "--ascii", "--no-timeline"]) == 0
    out = capsys.readouterr().out
    assert "`- chat m1 [turn-1]" in out and "█" not in out and "─" not in out


def test_export_rebuilds_the_graph(
    trace_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", "export", str(trace_file)]) == 0
    dot = capsys.readouterr().out
    assert dot.startswith("digraph rlm_graph {")
    assert '"block-1" -> "llm-1" [style=dashed];' in dot
    assert '"turn-1" -> "block-1";' in dot
    out = tmp_path / "g.graphml"
    assert main(["trace", "export", str(trace_file), "--format", "graphml", "-o", str(out)]) == 0
    graph = nx.read_graphml(out)
    assert sorted(graph.nodes) == ["block-1", "llm-1", "llm-2", "turn-1"]
    assert graph.nodes["llm-2"]["status"] == "error"
    assert graph.nodes["turn-1"]["input_tokens"] == 100


@pytest.mark.parametrize("content", ["", "not json", '{"hello": 1}'])
def test_a_bad_file_is_a_clear_error(
    tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["trace", "show", str(path)]) == 2
    assert "bad.json" in capsys.readouterr().err
    assert main(["trace", "export", str(tmp_path / "missing.json")]) == 2
    assert "cannot read " in (err := capsys.readouterr().err) and "missing.json: No such" in err


def test_trace_options_give_a_provider_and_finish_says_where_files_went(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_trace_argument(parser)
    args = parser.parse_args(["--trace", "file", "--trace-dir", str(tmp_path), "--trace-content"])
    assert args.trace_content
    provider = tracer_provider_for(args)
    wf = Workflow()
    wf.llm("hi")
    Engine("scripted", {"respond": lambda r: "ok"}, tracer_provider=provider).run(wf)
    out = io.StringIO()
    finish_tracing(provider, out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and all(
        line.startswith(f"trace written to {tmp_path}") for line in lines
    )
    assert main(["trace", "show", lines[0].removeprefix("trace written to ")]) == 0
    provider.shutdown()  # type: ignore[union-attr]
    none = tracer_provider_for(parser.parse_args(["--trace", "none"]))
    assert isinstance(none, NoOpTracerProvider)
    with pytest.raises(SystemExit):
        parser.parse_args(["--trace", "jaeger"])


def test_render_of_an_empty_and_a_zero_length_trace() -> None:
    assert render_trace([]) == "(no spans)\n"
    one = TraceSpan(trace_id="1" * 32, span_id="2" * 16, name="x", start_us=5, duration_us=0)
    assert "x" in render_trace([one], width=60)


def test_show_takes_several_files_and_export_the_newest_or_a_graph_json(
    trace_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    second = tmp_path / "second.jaeger.json"
    second.write_text(trace_file.read_text())
    os.utime(trace_file, (1, 1))  # make `second` the newest
    assert main(["trace", "show", str(trace_file), str(second), "--no-timeline"]) == 0
    shown = capsys.readouterr().out
    assert f"== {trace_file}" in shown and f"== {second}" in shown
    assert main(["trace", "export", str(trace_file), str(second), "--format", "dot"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("digraph") and "using the newest" in captured.err

    from rlm_graph.graph import Graph, NodeKind, NodeRecord, to_json

    graph = Graph()
    graph.add(NodeRecord(id="a", kind=NodeKind.FUNCTION))
    graph_file = tmp_path / "graph.json"
    graph_file.write_text(to_json(graph, indent=1))
    assert main(["trace", "export", str(graph_file), "--format", "dot"]) == 0
    assert '"a" [label=' in capsys.readouterr().out


@pytest.mark.parametrize("command", [["demo", "--size", "20000"], ["run", "--backend", "scripted"]])
def test_bad_otel_settings_are_one_line_and_exit_2(
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rlm_graph.cli import main

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaeger")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.txt").write_text("ctx")
    extra = ["--context", "c.txt", "--query", "q", "--model", "m"] if command[0] == "run" else []
    assert main([*command, *extra, "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "OTEL_TRACES_EXPORTER='jaeger'" in err


def test_two_runs_in_one_trace_are_each_exported_and_reported_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A program running two completions under a span of its own writes one trace with
    two runs: export and report failed with a traceback (one graph, node ids twice),
    and a report took its stop reason from any run of the file."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from rlm_graph import RLM
    from rlm_graph.tracing import TraceFileExporter

    provider = TracerProvider(shutdown_on_exit=False)
    exporter = TraceFileExporter(tmp_path / "traces", formats=["otlp"])
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    endless = "```repl\nprint('working')\n```"
    with provider.get_tracer("app").start_as_current_span("my application"):
        RLM("scripted", {"responses": [endless, endless]}, tracer_provider=provider,
            max_iterations=1).completion("first")  # fmt: skip
        RLM("scripted", {"responses": ["```repl\nFINAL('two')\n```"]}, tracer_provider=provider
            ).completion("second")  # fmt: skip
    provider.shutdown()
    (path,) = exporter.paths
    assert main(["trace", "export", str(path)]) == 2
    said = capsys.readouterr().err
    keys = said.split("holds 2 runs (")[1].split(")")[0].split(", ")
    assert all("/" in key for key in keys) and "choose one with --trace-id" in said
    stops = []
    for key in keys:
        assert main(["trace", "export", str(path), "--trace-id", key]) == 0
        assert capsys.readouterr().out.count('"turn-1" [') == 1
        page = tmp_path / f"{key.split('/')[1]}.html"
        assert main(["report", str(path), "--trace-id", key, "-o", str(page)]) == 0
        stops.append(page.read_text().split('"stop_reason":')[1].split(",")[0])
    assert sorted(stops) == ['"max_iterations"', "null"]


def test_a_password_in_a_url_is_never_printed_or_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A base URL's ``user:password@`` reached the error line, both trace files and the
    report; an OTLP endpoint's, the line saying the trace could not be sent."""
    from rlm_graph.tracing.scrub import Scrubber, secret_values

    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.txt").write_text("ctx")
    base = "http://bob:s3cretPassw0rd@127.0.0.1:9/v1"
    args = ["run", "--context", "c.txt", "--query", "q", "--model", "m", "--base-url", base]
    report = tmp_path / "run.html"
    code = main([*args, "--max-attempts", "1", "-q", "--trace", "file", "--report", str(report)])
    assert code == 4
    said = capsys.readouterr().err
    assert "http://bob:[REDACTED]@127.0.0.1:9/v1" in said
    written = [report, *(tmp_path / "traces").iterdir()]
    assert len(written) == 3
    for path in [*written]:
        assert "s3cretPassw0rd" not in path.read_text(), path
    assert "s3cretPassw0rd" not in said
    assert secret_values({"base_url": base}, environ={}) == ["s3cretPassw0rd"]
    shown = Scrubber(environ={}).scrub("to http://user:hunter2pass@h:9 and ftp://u:longpass1@h")
    assert shown == "to http://user:[REDACTED]@h:9 and ftp://u:[REDACTED]@h"


@pytest.mark.parametrize(
    ("variable", "value", "trace"),
    [
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4096", "otlp"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "0", "otlp"),
        ("OTEL_BSP_SCHEDULE_DELAY", "0", "file"),
        # not whole numbers: the SDK logged a 7-line traceback and went on with its default
        ("OTEL_BSP_SCHEDULE_DELAY", "abc", "file"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "5s", "file"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "1.5", "otlp"),
    ],
)
def test_batch_settings_the_sdk_refuses_are_one_line_and_exit_2(
    variable: str,
    value: str,
    trace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """They were the SDK's ValueError from deep inside, exit 1."""
    monkeypatch.setenv(variable, value)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.txt").write_text("ctx")
    args = ["run", "--backend", "scripted", "--context", "c.txt", "--query", "q", "--model", "m"]
    assert main([*args, "--trace", trace, "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{variable}='{value}'" in err
    assert "the span batch settings are refused" in err


@pytest.mark.parametrize("variable", ["OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_BSP_SCHEDULE_DELAY"])
def test_an_empty_batch_setting_is_unset(
    variable: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``OTEL_BSP_SCHEDULE_DELAY=`` (a line of an env file) is unset, as OpenTelemetry's
    specification says: the run goes on, with no traceback of the SDK's."""
    monkeypatch.setenv(variable, "")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.txt").write_text("ctx")
    args = ["run", "--backend", "scripted", "--context", "c.txt", "--query", "q", "--model", "m"]
    assert main([*args, "--trace", "file", "-q"]) != 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_trace_file_whose_parents_loop_is_read_without_hanging(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file is input: two spans naming each other as parent must not keep the search
    for their run going forever."""
    node = {"rlm.node.kind": "llm_call"}
    spans = [
        span("a", "invoke_agent rlm", 0, 2),
        span("b", "invoke_agent rlm", 0, 2),
        span("c", "chat m", 0, 1, "a", **{"rlm.node.id": "turn-1", **node}),
        span("d", "chat m", 0, 1, "e", **{"rlm.node.id": "llm-1", **node}),
        span("e", "chat m", 0, 1, "d", **{"rlm.node.id": "llm-2", **node}),
    ]
    path = tmp_path / "loop.jaeger.json"
    document = {"traceID": "ab" * 16, "spans": spans, "processes": {"p1": {"serviceName": "x"}}}
    path.write_text(json.dumps({"data": [document]}))
    assert main(["trace", "export", str(path)]) == 2
    assert "holds 2 runs" in capsys.readouterr().err
    assert main(["trace", "export", str(path), "--trace-id", f"{'ab' * 16}/{'a' * 16}"]) == 0
    assert '"turn-1"' in capsys.readouterr().out


def _show_in_a_gigabyte(path: Path, *words: str, columns: str = "") -> CompletedProcess[str]:
    """``rlm-graph trace show`` as a process that may not take more than 1 GiB."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))

    env = {**_env(), "COLUMNS": columns} if columns else _env()
    return subprocess.run(
        [str(COMMAND), "trace", "show", str(path), *words], capture_output=True, text=True,
        env=env, preexec_fn=limit, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.skipif(os.name != "posix", reason="RLIMIT_AS")
@pytest.mark.parametrize("width", ["-5", "3", "1001", "1000000000"])
def test_a_width_no_screen_has_is_refused_in_one_line(trace_file: Path, width: str) -> None:
    """``--width 1000000000`` built lines of gigabytes (a MemoryError, or a machine
    swapping); a negative or tiny one was taken silently."""
    done = _show_in_a_gigabyte(trace_file, "--width", width)
    assert done.returncode == 2 and not done.stdout, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "--width: must be 0 (the terminal's width) or 40 to 1000 columns" in line


@pytest.mark.skipif(os.name != "posix", reason="RLIMIT_AS")
def test_a_terminal_width_past_a_thousand_columns_is_taken_as_a_thousand(
    trace_file: Path,
) -> None:
    done = _show_in_a_gigabyte(trace_file, columns="1000000000")
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) == 1000
