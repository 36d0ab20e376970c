"""Files the commands write are written whole or not at all: a write that fails leaves
the file that was there as it was."""

from __future__ import annotations

import json
import resource
import subprocess
from pathlib import Path

import pytest

from rlm_graph.cli import main
from tests.cli.test_command import COMMAND, _env

LIMIT = 4_096  # bytes a process may write to one file: the file-size limit of `ulimit -f`


def _limited(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))

    return subprocess.run(
        [str(COMMAND), *args], cwd=cwd, env=_env(), capture_output=True, text=True,
        timeout=120, preexec_fn=cap, check=False,
    )  # fmt: skip


@pytest.fixture
def graph(tmp_path: Path) -> Path:
    path = tmp_path / "graph.json"
    assert main(["demo", "-q", "--latency", "0", "--size", "20000", "--out", str(path)]) == 0
    assert path.stat().st_size > LIMIT
    return path


def test_a_failed_export_leaves_the_file_that_was_there(tmp_path: Path, graph: Path) -> None:
    """``trace export -o`` over a file truncated it first: a full disk (here a file-size
    limit) left 8 KiB of cut-off GraphML where the good export had been."""
    out = tmp_path / "g.graphml"
    assert main(["trace", "export", str(graph), "--format", "graphml", "-o", str(out)]) == 0
    good = out.read_bytes()
    assert len(good) > LIMIT
    done = _limited(
        "trace", "export", str(graph), "--format", "graphml", "-o", str(out), cwd=tmp_path
    )
    assert done.returncode == 2 and "cannot write" in done.stderr
    assert out.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.graphml", "graph.json"]


def test_a_failed_demo_out_is_one_line_and_keeps_the_old_graph(tmp_path: Path, graph: Path) -> None:
    kept = graph.read_bytes()
    done = _limited(
        "demo", "-q", "--latency", "0", "--size", "20000", "--out", str(graph), cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("rlm-graph demo: cannot write") and "Traceback" not in done.stderr
    assert graph.read_bytes() == kept and json.loads(kept)


@pytest.mark.parametrize(
    "flags", [["--latency", "nan"], ["--latency", "inf"], ["--size", str(10**12)]]
)
def test_demo_refuses_a_latency_or_size_it_cannot_run_in_one_line(
    flags: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """NaN and inf latencies were a traceback after the document was built; a size of a
    trillion characters was built (memory until the machine ran out)."""

    def never(*args: object) -> None:
        raise AssertionError("the document was built")

    monkeypatch.setattr("rlm_graph.cli.demo.build_document", never)
    assert main(["demo", "-q", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlm-graph demo: --size must be") and "Traceback" not in err
