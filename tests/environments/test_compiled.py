"""`rlm_graph.repl.compiled`: a block compiled once and kept by its exact text, within a
weight budget; what is never kept (a block that warned, failed, or weighs too much)."""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlm_graph.contracts import SubcallRequest
from rlm_graph.repl import compiled
from rlm_graph.repl.compiled import CACHED_BYTES, CACHED_CHARS, REPL_FILENAME, STOP_CHECK
from rlm_graph.repl.session import ReplSession


class _NoCalls:
    def call(self, request: SubcallRequest) -> Any:
        raise AssertionError("no sub-call expected")


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Any]:
    """A factory of sessions, closed after the test."""
    made: list[ReplSession] = []

    def make() -> ReplSession:
        made.append(ReplSession(_NoCalls(), scratch_dir=str(tmp_path)))
        return made[-1]

    yield make
    for one in made:
        one.close()


def test_a_block_run_in_two_sessions_is_compiled_once_and_runs_in_each_alone(
    session: Any,
) -> None:
    code = "x = int(context) * 2\nx + 1  # two sessions"
    first, second = session(), session()
    first.set_variable("context", "20")
    second.set_variable("context", "5")
    assert compiled.cached(code) is None
    one = first.execute(code)
    kept = compiled.cached(code)
    two = second.execute(code)
    assert (one.stdout, two.stdout) == ("41\n", "11\n")
    assert first.ns["x"] == 40 and second.ns["x"] == 10
    assert kept is not None and compiled.cached(code) is kept


def test_the_stop_check_and_the_file_name_are_in_a_kept_block(session: Any) -> None:
    code = "try:\n    pass\nexcept BaseException:\n    pass\nfinally:\n    pass  # kept\n"
    session().execute(code)
    pair = compiled.cached(code)
    assert pair is not None and pair[1] is None
    assert STOP_CHECK in pair[0].co_names and pair[0].co_filename == REPL_FILENAME


def _printed(message: Any, category: Any, filename: str, lineno: int, *_: Any) -> None:
    """Python's own way of showing a warning (pytest records them instead)."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno))


def test_a_block_that_warns_warns_every_time_and_is_never_kept(session: Any) -> None:
    code = "x = 1\nprint(x is 1)  # warns"
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = _printed
        for _ in range(3):
            result = session().execute(code)
            assert "SyntaxWarning" in result.stderr and result.stdout == "True\n"
    assert compiled.cached(code) is None


def test_a_block_that_does_not_compile_is_an_error_each_time_and_never_kept(
    session: Any,
) -> None:
    for _ in range(2):
        result = session().execute("def broken(:\n")
        assert result.error is not None and result.error.startswith("SyntaxError")
    assert compiled.cached("def broken(:\n") is None


def test_a_long_block_is_never_kept(session: Any) -> None:
    code = "x = 1\n" + "# filler\n" * (CACHED_CHARS // 9 + 1)
    assert len(code) > CACHED_CHARS
    session().execute(code)
    assert compiled.cached(code) is None


def test_a_short_block_with_heavy_constants_is_never_kept(session: Any) -> None:
    """``"000" * 1365`` is folded into a 4 KB constant at compile time: 1,000 of them in
    14,000 characters of source would hold 4 MB if kept."""
    code = "x = [" + ",".join(f'"{i:03d}" * 1365' for i in range(1000)) + "]\nlen(x)"
    assert len(code) <= CACHED_CHARS
    assert session().execute(code).stdout == "1000\n"
    assert compiled.cached(code) is None


def test_the_kept_blocks_stay_within_their_weight(session: Any) -> None:
    """Blocks each just under the per-block limit, more than the budget holds: the
    oldest go, and what is kept never weighs more than the budget."""
    one = session()
    heavy = ",".join(f'"{i:03d}" * 1365' for i in range(50))  # about 200 KB folded
    blocks = [f"y{i} = [{heavy}]" for i in range(40)]
    for code in blocks:
        one.execute(code)
    assert compiled._weight <= CACHED_BYTES
    assert compiled.cached(blocks[-1]) is not None and compiled.cached(blocks[0]) is None


def test_threads_keeping_and_reading_blocks_at_once_keep_the_bounds(session: Any) -> None:
    """Sessions in many threads (the local environment's REPL threads) run blocks old and
    new at once: every block runs right, and the kept blocks stay within count and
    weight, their weight the sum of what is kept."""
    heavy = ",".join(f'"{i:03d}" * 1365' for i in range(20))  # about 80 KB folded each
    errors: list[BaseException] = []

    def work(t: int) -> None:
        one = session()
        try:
            for i in range(60):
                code = f"v = [{heavy}]\nlen(v) + {i % 30}  # race {i % 30}"
                assert one.execute(code).stdout == f"{20 + i % 30}\n"
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    with compiled._lock:
        assert len(compiled._kept) <= compiled.CACHED_BLOCKS
        assert compiled._weight == sum(weight for _, weight in compiled._kept.values())
        assert compiled._weight <= CACHED_BYTES
