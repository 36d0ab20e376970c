"""What ``rlm-graph report`` and ``trace export`` read and where they write: an output
that is the file read (or the run's journal, or its context) is refused before anything
is written; a pipe is read once; a file no run could write is one line, exit 2; what the
page holds stays bounded (an error's text, the graph's canvas)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from rlm_graph import RLM
from rlm_graph.graph import Graph, NodeKind, NodeRecord, NodeStatus, to_json
from rlm_graph.report import write_report
from tests.cli.test_command import COMMAND, _env, rlm_graph
from tests.support.report_page import needs_node, run_page_script

FINAL = "```repl\nFINAL('ok')\n```"


def _journal(path: Path) -> Path:
    RLM("scripted", {"respond": lambda request: FINAL}, journal=str(path)).completion(
        "ctx", root_prompt="q"
    )
    return path


def _graph_json(path: Path) -> Path:
    graph = Graph()
    graph.add(
        NodeRecord(id="turn-1", kind=NodeKind.ROOT_TURN, status=NodeStatus.OK, start=0, end=1)
    )
    path.write_text(to_json(graph))
    return path


def _data(path: Path) -> Any:
    found = re.search(r'id="run-data">(.*?)</script>', path.read_text(), re.S)
    assert found is not None
    return json.loads(found.group(1))


def _one_line(done: subprocess.CompletedProcess[str], *says: str) -> str:
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert all(part in line for part in says), line
    return line


# -- an output that is an input -------------------------------------------------------------


def test_report_and_trace_export_refuse_to_write_over_the_file_they_read(tmp_path: Path) -> None:
    """``report run.sqlite -o run.sqlite`` replaced the journal with the page (exit 0)."""
    journal = _journal(tmp_path / "run.sqlite")
    before = journal.read_bytes()
    link = tmp_path / "page.html"
    link.symlink_to(journal)
    for output in (journal, link, Path(f"{journal}-wal")):
        _one_line(rlm_graph("report", str(journal), "-o", str(output)), "-o", "give another path")
        _one_line(rlm_graph("trace", "export", str(journal), "-o", str(output)), "destroy it")
    assert journal.read_bytes() == before and not Path(f"{journal}-wal").exists()
    assert rlm_graph("journal", "ls", str(journal)).returncode == 0

    graph = _graph_json(tmp_path / "graph.json")
    text = graph.read_text()
    _one_line(rlm_graph("report", str(graph), "-o", str(graph)), "is the run it reads")
    assert graph.read_text() == text


def test_run_refuses_a_report_written_over_its_journal_or_its_context(tmp_path: Path) -> None:
    context = tmp_path / "ctx.txt"
    context.write_text("my only copy of the document\n")
    journal = tmp_path / "j.sqlite"
    run = ["run", "--backend", "scripted", "--model", "scripted", "--context", str(context)]
    run += ["--query", "q", "--backend-kwargs", json.dumps({"responses": [FINAL]}), "-q"]
    _one_line(
        rlm_graph(*run, "--journal", str(journal), "--report", str(journal)),
        "--report",
        "is the --journal file",
    )
    assert not journal.exists()  # refused before the run: nothing journaled, nothing asked
    _one_line(rlm_graph(*run, "--report", str(context)), "is the --context file")
    assert context.read_text() == "my only copy of the document\n"
    done = rlm_graph(*run, "--journal", str(journal), "--report", str(tmp_path / "run.html"))
    assert done.returncode == 0, done.stderr


# -- what is read ---------------------------------------------------------------------------


def test_a_graph_json_through_a_pipe_is_read_once(tmp_path: Path) -> None:
    """It was opened three times (to sniff SQLite, a graph JSON, then to read it): the
    pipe was empty by the third, "the file is empty", exit 2."""
    text = _graph_json(tmp_path / "graph.json").read_bytes()
    page = tmp_path / "r.html"
    done = rlm_graph("report", "/dev/stdin", "-o", str(page), stdin=text)
    assert done.returncode == 0, done.stderr
    assert _data(page)["nodes"]["id"] == ["turn-1"]
    done = rlm_graph("trace", "export", "/dev/stdin", stdin=text)
    assert done.returncode == 0 and '"turn-1"' in done.stdout, done.stderr


def test_a_fifo_nobody_writes_to_is_one_line_not_a_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = rlm_graph("report", str(fifo), "-o", str(tmp_path / "r.html"), timeout=20)
    _one_line(done, "nothing was written to", "start the program that writes it first")
    done = rlm_graph("trace", "export", str(fifo), timeout=20)
    _one_line(done, "nothing was written to")


def test_a_pipe_whose_writer_is_slow_is_waited_for(tmp_path: Path) -> None:
    """``report <(zcat run.json.gz)``: the command opens /dev/fd/N, a pipe whose writer
    is there but has written nothing yet."""
    text = _graph_json(tmp_path / "graph.json").read_bytes()
    page = tmp_path / "r.html"
    read, write = os.pipe()
    process = subprocess.Popen(
        [str(COMMAND), "report", f"/dev/fd/{read}", "-o", str(page)],
        pass_fds=[read],
        stderr=subprocess.PIPE,
        env=_env(),
    )
    os.close(read)
    time.sleep(1)
    os.write(write, text)
    os.close(write)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert _data(page)["nodes"]["id"] == ["turn-1"]


def test_a_journal_through_a_pipe_or_a_device_is_one_line(tmp_path: Path) -> None:
    journal = _journal(tmp_path / "run.sqlite")
    done = rlm_graph(
        "report", "/dev/stdin", "-o", str(tmp_path / "r.html"), stdin=journal.read_bytes()
    )
    _one_line(done, "a journal given through a pipe", "give the journal's path")
    _one_line(rlm_graph("report", "/dev/null", "-o", str(tmp_path / "r.html")), "neither a file")


@pytest.mark.parametrize("number", ["1e999", "-1e999"])
def test_a_graph_json_with_an_infinite_number_is_one_line(number: str, tmp_path: Path) -> None:
    """1e999 is read as infinity by Python's json: the report then died in a 38-line
    traceback when it wrote the page."""
    graph = _graph_json(tmp_path / "graph.json")
    data = json.loads(graph.read_text())
    data["nodes"][0]["cost"] = 12345.5
    graph.write_text(json.dumps(data).replace("12345.5", number))
    for command in (
        ["report", str(graph), "-o", str(tmp_path / "r.html")],
        ["trace", "export", str(graph)],
    ):
        _one_line(rlm_graph(*command), str(graph), f"{number} is not a number a graph export holds")


def test_a_graph_json_node_pydantic_refuses_is_one_line(tmp_path: Path) -> None:
    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps({"format": "rlm-graph/1", "nodes": [{"id": "a"}], "edges": []}))
    line = _one_line(rlm_graph("report", str(graph), "-o", str(tmp_path / "r.html")))
    assert "node 0 of the export is not a node record: kind: Field required" in line


# -- what the page holds --------------------------------------------------------------------


def test_costs_that_overflow_are_unknown_in_the_page_not_a_traceback(tmp_path: Path) -> None:
    """Two calls at cost_per_call=1e308 add up to infinity, which JSON cannot hold."""
    result = RLM(
        "scripted",
        {
            "respond": lambda r: (
                "```repl\nFINAL(llm_query('a') + llm_query('b'))\n```"
                if "Question" in r.prompt
                else "x"
            ),
            "cost_per_call": 1e308,
        },
    ).completion("ctx", root_prompt="q")
    page = write_report(result.graph, tmp_path / "r.html")
    data = _data(page)
    assert any(row["cost"] is None for row in data["usage"])


def test_an_error_of_megabytes_is_cut_in_the_report(tmp_path: Path) -> None:
    """One line of model code raised an error of 20 MB: the report was 20 MB, the text
    shown twice."""
    result = RLM(
        "scripted",
        {
            "responses": [
                "```repl\nraise ValueError('A' * 2_000_000)\n```",
                "```repl\nFINAL(1)\n```",
            ]
        },
    ).completion("c", root_prompt="q")
    page = write_report(result.graph, tmp_path / "r.html")
    assert page.stat().st_size < 100_000
    data = _data(page)
    (error,) = [e for e in data["nodes"]["error"] if e]
    assert error.startswith("ValueError: ") and error.endswith("more characters]")
    assert "… [cut: " in error and len(error) < 2_100


def _chain(n: int) -> Graph:
    graph, previous = Graph(), None
    for i in range(n):
        record = NodeRecord(
            id=f"step-{i}", kind=NodeKind.FUNCTION, status=NodeStatus.OK, start=i, end=i + 1
        )
        graph.add(record, after=[previous] if previous else [])
        previous = record.id
    return graph


def _batch(n: int) -> Graph:
    graph = Graph()
    graph.add(
        NodeRecord(id="turn-1", kind=NodeKind.ROOT_TURN, status=NodeStatus.OK, start=0, end=1)
    )
    graph.add(
        NodeRecord(
            id="turn-1/block-1", kind=NodeKind.REPL_BLOCK, status=NodeStatus.OK, start=1, end=2
        ),
        after=["turn-1"],
    )
    for i in range(n):  # every slot in flight at once: one lane each
        graph.add(
            NodeRecord(id=f"turn-1/block-1/llm-1.{i}", kind=NodeKind.LLM_CALL, depth=1,
                       status=NodeStatus.OK, start=1.0, end=1.5),
            parent="turn-1/block-1",
        )  # fmt: skip
    return graph


@needs_node
@pytest.mark.parametrize("shape", ["chain", "batch"])
def test_the_canvases_stay_within_what_browsers_draw(shape: str, tmp_path: Path) -> None:
    """The graph's canvas reached 12,024 pixels across for a 1,500-node chain and 40,020
    down for a batch of 20,000 (docs: 8,000 at most); the timeline 60,000 down for
    20,000 lanes. The page's own script runs under node with a stub DOM."""
    graph = _chain(1_500) if shape == "chain" else _batch(20_000)
    sizes = run_page_script(write_report(graph, tmp_path / "r.html"))
    assert max(sizes["dag"]) <= 8_000 and max(sizes["timeline"]) <= 30_000, sizes
    assert sizes["drawn"] == [len(graph), len(graph)] and sizes["errors"] == "0"


def test_the_trajectory_shows_what_a_node_that_did_not_finish_was_given(
    tmp_path: Path,
) -> None:
    """A cancelled block and a failed sub-call showed a bare title: no code, no prompt."""
    from rlm_graph.errors import ProviderError

    code = (
        "try:\n    llm_query('a sub-call whose provider fails')\nexcept Exception as e:\n"
        "    print('caught', e)\nimport time; time.sleep(30)"
    )

    def respond(request: Any) -> Any:
        if "Question" in request.prompt:
            return f"```repl\n{code}\n```"
        return ProviderError("scripted: upstream 500")

    result = RLM("scripted", {"respond": respond}, record_content=True, max_timeout=1.5).completion(
        "ctx", root_prompt="q"
    )
    page = write_report(result.graph, tmp_path / "r.html", stop_reason=result.stop_reason)
    nodes = _data(page)["nodes"]
    given = dict(zip(nodes["id"], nodes["content_in"], strict=True))
    assert given["turn-1/block-1"].startswith("try:\n    llm_query(")
    assert given["turn-1/block-1/llm-1"] == "a sub-call whose provider fails"
    if shutil.which("node") is not None:
        steps = {step[0].split()[1]: step for step in run_page_script(page)["steps"]}
        block = steps["turn-1/block-1"]
        assert block[1] == "code (its preview only: the node did not finish)"
        assert block[2].startswith("try:")
        assert steps["turn-1/block-1/llm-1"][2] == "a sub-call whose provider fails"
