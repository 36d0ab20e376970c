"""The HTML report: its data (lanes, layout, critical path, usage), the file (one, with
nothing fetched), the CLI, and the page in a real headless Chromium."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from rlm_graph import RLM
from rlm_graph.cli import main
from rlm_graph.contracts import ChatRequest
from rlm_graph.graph import Graph, NodeKind, NodeRecord, NodeStatus, peak_concurrency, to_json
from rlm_graph.report import render_report, report_data, write_report
from tests.support.chromium import dump_in_chromium, needs_chromium, open_in_chromium
from tests.support.scripts import is_root_turn, repl, turn_number


def depth2_run() -> Any:
    """A depth-2 run with a failing sub-call among its batch (the report's showcase)."""

    def respond(request: ChatRequest) -> str:
        if not is_root_turn(request):
            if "bad" in request.prompt:
                raise RuntimeError("the sub-model choked on <script>alert(1)</script>")
            return f"sub:{request.prompt[:20]}"
        if turn_number(request) > 1:
            return repl("FINAL('done')")
        code = (
            "r = rlm_query_batched(['part a', 'part b'])\nprint(r)",
            "r = llm_query_batched([context + ' x', context + ' y', 'bad ' + context])\n"
            "FINAL(' / '.join(r))",
        )[min(request.depth, 1)]
        return repl(code)

    return RLM("scripted", {"respond": respond, "latency": 0.01}, max_depth=2).completion("ctx")


def test_lanes_never_overlap_and_count_the_peak_in_flight() -> None:
    result = depth2_run()
    graph = result.graph
    data = report_data(graph)
    nodes = data["nodes"]
    by_lane: dict[int, list[tuple[float, float]]] = {}
    for start, end, lane in zip(nodes["start"], nodes["end"], nodes["lane"], strict=True):
        by_lane.setdefault(lane, []).append((start, end))
    for spans in by_lane.values():
        spans.sort()
        assert all(
            a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False)
        )
    assert len(by_lane) == peak_concurrency(graph)
    assert [nodes["id"][i] for i in data["critical"]] == list(result.critical_path.nodes)
    assert {u["model"] for u in data["usage"]} == set(result.usage_summary.model_usage_summaries)
    failed = [nodes["id"][i] for i in data["errors"]]
    assert failed == [r.id for r in graph.records() if r.status == NodeStatus.ERROR] and failed
    # Every edge goes to a later column: the layout reads left to right.
    edges = data["edges"]
    for k in range(0, len(edges), 3):
        assert nodes["col"][edges[k]] < nodes["col"][edges[k + 1]]


def test_the_page_is_one_file_that_fetches_nothing_and_cannot_be_broken_out_of() -> None:
    page = render_report(depth2_run().graph, title="<b>title</b>")
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\(", page)
    assert "<b>title</b>" not in page and "&lt;b&gt;title&lt;/b&gt;" in page
    # A preview holding </script> cannot end the data block early.
    assert page.count("</script>") == 2 and "alert(1)" in page
    data = re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page, re.S)
    assert data is not None and json.loads(data.group(1))["title"] == "<b>title</b>"


def test_report_command_reads_a_graph_json_and_a_trace_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph_file = tmp_path / "graph.json"
    graph_file.write_text(to_json(depth2_run().graph))
    out = tmp_path / "from-graph.html"
    assert main(["report", str(graph_file), "-o", str(out)]) == 0
    assert "nodes)" in capsys.readouterr().err and out.read_text().startswith("<!DOCTYPE html>")
    trace_dir = tmp_path / "traces"
    assert (
        main(
            [
                "demo",
                "--size",
                "20000",
                "--latency",
                "0",
                "--out",
                str(tmp_path / "d.json"),
                "--trace",
                "file",
                "--trace-dir",
                str(trace_dir),
                "--quiet",
            ]
        )
        == 0
    )
    trace = next(trace_dir.glob("*.otlp.jsonl"))
    assert main(["report", str(trace), "-o", str(tmp_path / "from-trace.html")]) == 0
    data = _data(tmp_path / "from-trace.html")
    assert len(data["nodes"]["id"]) == len(json.loads((tmp_path / "d.json").read_text())["nodes"])


def test_report_command_rejects_what_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("hello")
    assert main(["report", str(bad), "-o", str(tmp_path / "x.html")]) == 2
    assert main(["report", str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("rlm-graph report:") == 2


def test_demo_report_flag_writes_the_report_at_the_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "sub" / "run.html"
    assert (
        main(
            [
                "demo",
                "--size",
                "20000",
                "--latency",
                "0",
                "--out",
                str(tmp_path / "d.json"),
                "--report",
                str(target),
            ]
        )
        == 0
    )
    assert f"report written to {target}" in capsys.readouterr().err
    assert len(_data(target)["nodes"]["id"]) == len(
        json.loads((tmp_path / "d.json").read_text())["nodes"]
    )


def _data(path: Path) -> Any:
    found = re.search(r'id="run-data">(.*?)</script>', path.read_text(), re.S)
    assert found is not None
    return json.loads(found.group(1))


# -- in a real browser ---------------------------------------------------------------------


@needs_chromium
@pytest.mark.browser
def test_the_report_draws_every_node_in_chromium_without_a_console_error(tmp_path: Path) -> None:
    graph = depth2_run().graph
    page = write_report(graph, tmp_path / "run.html")
    body, console = open_in_chromium(page, tmp_path, "#selftest")
    assert console == [] and body["data-errors"] == "0"
    timed = sum(1 for r in graph.records() if r.start is not None)
    assert int(body["data-timeline-nodes"]) == timed == len(graph)
    assert int(body["data-dag-nodes"]) == len(graph)
    assert int(body["data-lanes"]) == peak_concurrency(graph)
    # A click at each node's centre, in either view, finds that node.
    assert body["data-hit-exact"] == body["data-hit-tried"] == str(2 * len(graph))
    failed = next(r.id for r in graph.records() if r.status == NodeStatus.ERROR)
    body, console = open_in_chromium(page, tmp_path, f"#node={failed}")
    assert console == [] and body["data-selected"] == failed


def test_a_click_on_a_short_node_finds_it_not_its_neighbour_in_the_lane(tmp_path: Path) -> None:
    """Nodes shorter than a pixel are drawn a pixel wide: the one before overlapped the
    next one's centre, and a click there found the one before (a real run's selftest
    missed one node in 32 now and then)."""
    graph = Graph()
    graph.add(
        NodeRecord(id="long", kind=NodeKind.ROOT_TURN, status=NodeStatus.OK, start=0.0, end=100.0)
    )
    for n, start in enumerate((50.0, 50.002, 50.004)):
        graph.add(
            NodeRecord(
                id=f"short-{n}", kind=NodeKind.LLM_CALL, depth=1, status=NodeStatus.OK,
                start=start, end=start + 0.001, model="sub",
            ),
            after=["long"],
        )  # fmt: skip
    page = write_report(graph, tmp_path / "run.html")
    body, console = open_in_chromium(page, tmp_path, "#selftest")
    assert console == [] and body["data-errors"] == "0"
    assert body["data-hit-exact"] == body["data-hit-tried"] == str(2 * len(graph))


def ten_thousand_nodes() -> Graph:
    """100 root turns, each with a REPL block spawning 98 sub-calls: 10,000 nodes."""
    graph = Graph()
    t, previous = 0.0, None
    for turn in range(1, 101):
        turn_id = f"turn-{turn}"
        graph.add(
            NodeRecord(
                id=turn_id,
                kind=NodeKind.ROOT_TURN,
                iteration=turn,
                status=NodeStatus.OK,
                start=t,
                end=t + 1.0,
                model="root",
            ),
            after=[previous] if previous else [],
        )
        block = f"{turn_id}/block-1"
        graph.add(
            NodeRecord(
                id=block,
                kind=NodeKind.REPL_BLOCK,
                iteration=turn,
                status=NodeStatus.OK,
                start=t + 1.0,
                end=t + 3.0,
            ),
            after=[turn_id],
        )
        for slot in range(98):
            status = NodeStatus.ERROR if slot == 97 else NodeStatus.OK
            graph.add(
                NodeRecord(
                    id=f"{block}/llm-1.{slot}",
                    kind=NodeKind.LLM_CALL,
                    depth=1,
                    status=status,
                    start=t + 1.0 + slot % 16 * 0.1,
                    end=t + 1.5 + slot % 16 * 0.1,
                    model="sub",
                    error="boom" if status == NodeStatus.ERROR else None,
                    input_preview="x" * 200,
                    output_preview="y" * 200,
                ),
                parent=block,
            )
        t += 3.0
        previous = block
    return graph


@needs_chromium
@pytest.mark.browser
def test_a_10000_node_report_opens_and_draws_every_node(tmp_path: Path) -> None:
    graph = ten_thousand_nodes()
    assert len(graph) == 10_000
    page = write_report(graph, tmp_path / "big.html")
    body, console = open_in_chromium(page, tmp_path, "#selftest")
    assert console == [] and body["data-errors"] == "0"
    assert body["data-timeline-nodes"] == body["data-dag-nodes"] == "10000"
    assert int(body["data-lanes"]) == peak_concurrency(graph)
    # A click on a drawn node always finds one there (at this zoom, 98 sub-calls of a turn
    # share a few pixels of the timeline; in the graph each has its own place).
    assert int(body["data-hit-tried"]) > 0 and body["data-hit-misses"] == "0"


def test_run_report_flag_writes_the_report_even_when_the_provider_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlm_graph.testing import FakeOpenAIServer, Reply

    context = tmp_path / "context.txt"
    context.write_text("some context")
    target = tmp_path / "run.html"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-report-test")
    replies = ["```repl\nprint(len(context))\n```", Reply(400, "this request is malformed")]
    with FakeOpenAIServer(replies=replies) as server:
        code = main(
            [
                "run",
                "--context",
                str(context),
                "--query",
                "q?",
                "--model",
                "m",
                "--base-url",
                server.base_url,
                "--environment",
                "local",
                "--report",
                str(target),
                "--quiet",
            ]
        )
    assert code == 4
    assert f"report written to {target}" in capsys.readouterr().err
    data = _data(target)
    assert data["stop_reason"] == "provider_error"
    failed = [data["nodes"]["id"][i] for i in data["errors"]]
    assert failed == ["turn-2"] and "malformed" in data["nodes"]["error"][data["errors"][0]]


def _recorded_run(record_content: bool) -> Any:
    def respond(request: ChatRequest) -> str:
        if not is_root_turn(request):
            return f"summary of {request.prompt}"
        if turn_number(request) == 1:
            return repl(
                "parts = llm_query_batched(['chapter one', 'chapter two'])\nprint('got', len(parts), 'parts')"
            )
        return repl("FINAL(' / '.join(parts))")

    rlm = RLM("scripted", {"respond": respond}, environment="local", record_content=record_content)
    return rlm.completion("the whole book", root_prompt="Summarise it.")


def test_the_trajectory_holds_whole_replies_code_outputs_prompts_and_answers() -> None:
    data = report_data(_recorded_run(True).graph)
    steps = [(data["kinds"][data["nodes"]["kind"][i]], level) for i, level in data["trajectory"]]
    assert steps == [
        ("root_turn", 0),
        ("repl_block", 1),
        ("llm_call", 2),
        ("llm_call", 2),
        ("root_turn", 0),
        ("repl_block", 1),
    ]
    code = data["nodes"]["content_in"][data["trajectory"][1][0]]
    assert code.startswith("parts = llm_query_batched(") and "print('got'" in code
    assert data["nodes"]["content_out"][data["trajectory"][1][0]] == "got 2 parts\n"
    assert data["nodes"]["content_out"][data["trajectory"][2][0]] == "summary of chapter one"


def test_without_recorded_content_there_is_no_trajectory_and_no_text() -> None:
    data = report_data(_recorded_run(False).graph)
    assert data["trajectory"] is None and "content_in" not in data["nodes"]


@needs_chromium
@pytest.mark.browser
def test_the_trajectory_is_drawn_and_searchable_in_chromium(tmp_path: Path) -> None:
    page = write_report(_recorded_run(True).graph, tmp_path / "run.html")
    body, console, dom = dump_in_chromium(page, tmp_path)
    assert body["data-errors"] == "0" and not [c for c in console if "Uncaught" in c]
    assert body["data-trajectory-steps"] == "6" and body["data-trajectory-shown"] == "6"
    steps = re.findall(r'<div class="step"[^>]*data-node="([^"]+)"', dom)
    assert steps[:3] == ["turn-1", "turn-1/block-1", "turn-1/block-1/llm-1.0"]
    block = dom.split('data-node="turn-1/block-1"', 1)[1].split('class="step"', 1)[0]
    assert "parts = llm_query_batched([" in html.unescape(block)  # the block's code
    assert "got 2 parts" in block  # and its output
    # Searching: ?q= opens the page searched; only the steps that hold the text stay.
    searched, _, _ = dump_in_chromium(page, tmp_path, "?q=chapter%20two")
    # The first reply and its block (the code names it), the slot that asked it, and the
    # last block (its output is the answer); not the other slot, nor the second reply.
    assert searched["data-trajectory-shown"] == "4"


@needs_chromium
@pytest.mark.browser
def test_a_stray_percent_in_the_address_is_text_not_a_broken_page(tmp_path: Path) -> None:
    """run.html?q=50% (or #node=x%) is not valid percent-encoding: the page searches
    for it as written and still draws its trajectory."""
    page = write_report(_recorded_run(True).graph, tmp_path / "run.html")
    for suffix in ("?q=50%", "#node=turn-1%"):
        body, console, _ = dump_in_chromium(page, tmp_path, suffix)
        assert body["data-errors"] == "0", (suffix, console)
        assert not [c for c in console if "Uncaught" in c or "URIError" in c]
        assert body["data-trajectory-steps"] == "6"
    searched, _, _ = dump_in_chromium(page, tmp_path, "?q=chapter+two")
    assert searched["data-trajectory-shown"] == "4"  # + is a space, as in any query


def test_a_child_completion_comes_under_its_rlm_call_in_the_order_things_ran() -> None:
    """A child's steps were drawn after every step of its parent (under the parent's last
    block), and a block's sub-calls by their ids (``llm-2`` before ``rlm-1``)."""

    def respond(request: ChatRequest) -> str:
        if request.depth == 1 and is_root_turn(request):
            return repl("FINAL('child answer')")
        if not is_root_turn(request):
            return "leaf"
        if turn_number(request) == 1:
            return repl("a = rlm_query('part one')\nb = llm_query('part two')")
        return repl("FINAL(a + b)")

    rlm = RLM("scripted", {"respond": respond}, max_depth=2, record_content=True)
    data = report_data(rlm.completion("doc").graph)
    ids = data["nodes"]["id"]
    rows = [(ids[i], level) for i, level in data["trajectory"]]
    assert rows == [
        ("turn-1", 0),
        ("turn-1/block-1", 1),
        ("turn-1/block-1/rlm-1", 2),
        ("turn-1/block-1/rlm-1/turn-1", 3),
        ("turn-1/block-1/rlm-1/turn-1/block-1", 4),
        ("turn-1/block-1/llm-2", 2),
        ("turn-2", 0),
        ("turn-2/block-1", 1),
    ]
