"""`rlm_graph.repl.compiled`: a block compiled once, kept by its exact text, and what
is never kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlm_graph.contracts import SubcallRequest
from rlm_graph.repl import compiled as compiled_module
from rlm_graph.repl.compiled import CACHED_CHARS, REPL_FILENAME, STOP_CHECK, compiled
from rlm_graph.repl.session import ReplSession


class _NoCalls:
    def call(self, request: SubcallRequest) -> Any:
        raise AssertionError("no sub-call expected")


def test_a_block_run_in_two_sessions_is_compiled_once_and_runs_in_each_alone(
    tmp_path: Path,
) -> None:
    code = "x = int(context) * 2\nx + 1"
    first = ReplSession(_NoCalls(), scratch_dir=str(tmp_path))
    second = ReplSession(_NoCalls(), scratch_dir=str(tmp_path))
    first.set_variable("context", "20")
    second.set_variable("context", "5")
    before = compiled_module._cached.cache_info()
    one, two = first.execute(code), second.execute(code)
    after = compiled_module._cached.cache_info()
    assert (one.stdout, two.stdout) == ("41\n", "11\n")
    assert first.ns["x"] == 40 and second.ns["x"] == 10
    assert after.misses - before.misses <= 1 and after.hits - before.hits >= 1
    first.close()
    second.close()


def test_the_stop_check_and_the_file_name_are_in_a_cached_block() -> None:
    code = "try:\n    pass\nexcept BaseException:\n    pass\nfinally:\n    pass\n"
    body, last = compiled(code)
    assert compiled(code)[0] is body and last is None
    assert STOP_CHECK in body.co_names and body.co_filename == REPL_FILENAME


def test_a_block_that_does_not_compile_is_an_error_each_time_and_never_kept() -> None:
    before = compiled_module._cached.cache_info().currsize
    for _ in range(2):
        with pytest.raises(SyntaxError):
            compiled("def broken(:\n")
    assert compiled_module._cached.cache_info().currsize == before


def test_a_long_block_is_compiled_every_time() -> None:
    code = "x = 1\n" + "# filler\n" * (CACHED_CHARS // 9 + 1)
    assert len(code) > CACHED_CHARS
    assert compiled(code)[0] is not compiled(code)[0]
