"""The offline demo finds the hidden fact by reading chunks in parallel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlm_graph.cli import main
from rlm_graph.demo import build_document


def test_the_document_hides_exactly_one_fact() -> None:
    setup = build_document(200_000, seed=3)
    assert 200_000 <= len(setup.document) < 201_000
    assert setup.document.count("vault access code is") == 1
    assert setup.document[setup.position : setup.position + 9] == setup.code


def test_demo_answers_correctly_and_writes_the_graph(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "graph.json"
    code = main(["demo", "--latency", "0.01", "--out", str(out), "--trace", "none"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "(correct)" in printed
    assert "Peak sub-calls in flight: 16" in printed
    assert "Parallel efficiency" in printed and "Critical path" in printed
    graph = json.loads(out.read_text())
    kinds = [n["kind"] for n in graph["nodes"]]
    assert kinds.count("llm_call") == 21
    assert kinds.count("root_turn") == 3


def test_demo_rejects_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--size", "5"]) == 2
    assert "--size" in capsys.readouterr().err
