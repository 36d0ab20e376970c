"""Files that hold a run's content are created readable by their owner only (0600):
trace files, reports, graph exports, batch and evaluation results, the journal. A file
the user made beforehand keeps its own mode."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from rlm_graph import RLM
from rlm_graph.batch import BatchResult, ResultsFile
from rlm_graph.cli import main
from rlm_graph.report import write_report
from rlm_graph.tracing import TraceFileExporter
from tests.support.scripts import repl


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _completion(**kwargs: object) -> object:
    rlm = RLM(
        "scripted", {"respond": lambda r: repl("FINAL('done')")}, environment="local", **kwargs
    )
    return rlm.completion("a private document")


def test_trace_files_reports_and_the_journal_are_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask: without care, files come out 0644
    try:
        exporter = TraceFileExporter(tmp_path / "traces")
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        result = _completion(tracer_provider=provider, journal=str(tmp_path / "run.sqlite"))
        provider.shutdown()
        report = write_report(result.graph, tmp_path / "run.html")  # type: ignore[attr-defined]
    finally:
        os.umask(old)
    written = [*exporter.paths, report, tmp_path / "run.sqlite"]
    assert len(written) >= 4
    assert {p.name: _mode(p) for p in written} == {p.name: 0o600 for p in written}


def test_batch_results_are_0600_and_a_file_made_beforehand_keeps_its_mode(
    tmp_path: Path,
) -> None:
    fresh, shared = tmp_path / "out.jsonl", tmp_path / "shared.jsonl"
    shared.touch(mode=0o644)
    shared.chmod(0o644)
    result = BatchResult(id="a", answer="x", started_at=0.0, finished_at=1.0, seconds=1.0)
    for path in (fresh, shared):
        results = ResultsFile(path).open()
        results.append(result)
        results.close()
    assert (_mode(fresh), _mode(shared)) == (0o600, 0o644)


def test_the_demos_graph_export_is_0600(tmp_path: Path) -> None:
    out = tmp_path / "graph.json"
    assert main(["demo", "--latency", "0", "--out", str(out), "--quiet"]) == 0
    assert _mode(out) == 0o600


def test_a_report_over_a_file_made_beforehand_keeps_its_mode_owner_and_links(
    tmp_path: Path,
) -> None:
    """Written whole (a file beside, then renamed), a report over an existing file took
    0600 and the writer's owner (a run under sudo left the user unable to read their own
    report), and a hard link to it kept the old text."""
    from rlm_graph._files import write_private

    shared = tmp_path / "shared.html"
    shared.write_text("old")
    shared.chmod(0o644)
    if os.geteuid() == 0:
        os.chown(shared, 1000, 1000)
    write_private(shared, "new")
    info = shared.stat()
    assert (stat.S_IMODE(info.st_mode), shared.read_text()) == (0o644, "new")
    if os.geteuid() == 0:
        assert (info.st_uid, info.st_gid) == (1000, 1000)

    linked = tmp_path / "linked.json"
    linked.write_text("old")
    os.link(linked, tmp_path / "other-name.json")
    write_private(linked, "new")
    assert (tmp_path / "other-name.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "linked.json",
        "other-name.json",
        "shared.html",
    ]


def test_a_stream_named_by_its_process_fd_is_written_in_place(tmp_path: Path) -> None:
    """``/proc/<pid>/fd/1`` when stdout is redirected to a file names that file: replaced
    whole, the process went on printing into the old one, lost."""
    from rlm_graph._files import write_private

    out = tmp_path / "stdout.txt"
    with out.open("w") as handle:
        inode = out.stat().st_ino
        write_private(f"/proc/{os.getpid()}/fd/{handle.fileno()}", "written\n")
        assert out.stat().st_ino == inode and out.read_text() == "written\n"


def test_a_write_cut_by_ctrl_c_leaves_the_old_file_and_no_stray_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C midway through a report's write: the old report is whole, and the file
    beside it that the new one was being written to is gone."""
    from rlm_graph import _files

    report = tmp_path / "run.html"
    report.write_text("the old report")

    def interrupted(text: str) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(_files, "utf8_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _files.write_private(report, "the new report")
    assert report.read_text() == "the old report"
    assert [p.name for p in tmp_path.iterdir()] == ["run.html"]
