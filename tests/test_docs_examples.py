"""Every Python block of docs/graph-executor.md and docs/writing-a-provider.md runs as
written: the blocks of a page in order, in one namespace (a reader's session), offline
(the scripted backend, fake servers on 127.0.0.1 that the blocks start themselves)."""

from __future__ import annotations

import linecache
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["graph-executor.md", "writing-a-provider.md"]


def blocks(page: str) -> list[str]:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```$", text, re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_of_the_page_runs(page: str, capsys: pytest.CaptureFixture[str]) -> None:
    found = blocks(page)
    assert len(found) >= 4, f"docs/{page} lost its examples"
    namespace: dict[str, object] = {"__name__": f"docs_{page.split('.')[0].replace('-', '_')}"}
    for index, source in enumerate(found):
        # A file name the tracebacks, inspect.getsource and the journal's keys can read.
        filename = f"<docs/{page} block {index + 1}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        try:
            exec(compile(source, filename, "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"docs/{page}, block {index + 1} fails: {exc!r}") from exc
    capsys.readouterr()


def test_the_graph_executor_page_prints_what_its_comments_say(
    capsys: pytest.CaptureFixture[str],
) -> None:
    namespace: dict[str, object] = {"__name__": "docs_graph_executor"}
    for index, source in enumerate(blocks("graph-executor.md")):
        filename = f"<docs/graph-executor.md block {index + 1}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), namespace)
    out = capsys.readouterr().out
    for expected in [
        "unknown request parameter 'temprature' (did you mean 'temperature'?)",
        "['FETCHED INDEX.HTML', 'failed'] 2",
        "['a', 'b']",
        "skipped skipped: dependency 'parse' failed",
        "ValueError True",
        "max_timeout NodeCancelled",
        "large: improve small: draft it large",
        "4 0",
        "join small: part 0 | small: part 1 | small: part 2",
    ]:
        assert expected in out, expected
