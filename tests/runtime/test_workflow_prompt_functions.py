"""Prompt functions and callables as a run sees them: a prompt function fails only its
node, whatever it raises; async callables behind a partial or
returned by a plain function; a journal that cannot read an argument's repr; cache=False
and divergence; a stream's capacity."""

from __future__ import annotations

import functools
import itertools
import sys
from pathlib import Path

import pytest
import trio

from rlm_graph import ConfigError, Engine, Workflow
from tests.support.scripts import scripted


def echo_engine() -> Engine:
    return Engine("scripted", {"respond": lambda request: f"<{request.prompt}>"})


class Abort(BaseException):
    pass


async def test_a_prompt_function_raising_what_is_not_an_exception_fails_its_node_only() -> None:
    def prompt(text: str) -> str:
        if "2" in text:
            raise Abort("gave up")
        return f"Summarize {text}"

    wf = Workflow()
    parts = [wf.llm(f"part {i}", id=f"part-{i}") for i in range(4)]
    for i, part in enumerate(parts):
        wf.llm(prompt, part, id=f"sum-{i}")
    wf.llm(lambda text: sys.exit(2), parts[0], id="exits")
    result = await echo_engine().arun(wf)
    assert result.errors == {
        "sum-2": "[ERROR] RuntimeError: prompt function 'test_a_prompt_function_raising_what_is_"
        "not_an_exception_fails_its_node_only.<locals>.prompt' raised Abort(gave up), which is "
        "not an Exception; a node cannot end the run: it fails (raise an Exception to fail a "
        "node on purpose)",
        "exits": "[ERROR] RuntimeError: prompt function 'test_a_prompt_function_raising_what_is_"
        "not_an_exception_fails_its_node_only.<locals>.<lambda>' called sys.exit(2); a node "
        "cannot end the program: raise an exception to fail the node",
    }
    assert result["sum-3"] == "<Summarize <part 3>>"


async def test_a_prompt_function_retried_after_it_raised(tmp_path: Path) -> None:
    calls = itertools.count()

    def prompt(text: str) -> str:
        if next(calls) == 0:
            raise ConnectionError("the template server blinked")
        return f"about {text}"

    wf = Workflow()
    wf.llm(prompt, "rain", id="p", retries=1)
    result = await echo_engine().arun(wf, journal=tmp_path / "wf.sqlite")
    assert result["p"] == "<about rain>"


class Fetcher:
    async def __call__(self, url: str) -> str:
        await trio.sleep(0)
        return f"fetched {url}"


async def fetch(url: str) -> str:
    await trio.sleep(0)
    return f"fetched {url}"


async def test_async_callables_behind_a_partial_or_a_plain_function_are_awaited() -> None:
    wf = Workflow()
    a = wf.function(functools.partial(Fetcher(), "a.html"))
    b = wf.function(lambda: fetch("b.html"))
    c = wf.function(functools.partial(fetch, "c.html"))
    result = await echo_engine().arun(wf)
    assert [result[a], result[b], result[c]] == [
        "fetched a.html",
        "fetched b.html",
        "fetched c.html",
    ]
    assert wf.to_jsonable()["nodes"][0]["loop"] == "trio"


async def test_a_plain_function_returning_a_coroutine_that_exits_fails_its_node() -> None:
    async def leave() -> None:
        sys.exit(4)

    wf = Workflow()
    node = wf.function(lambda: leave(), id="leaves")
    result = await echo_engine().arun(wf)
    assert "called sys.exit(4); a node cannot end the program" in result.errors[node.id]


class Row:
    """An ORM object whose repr needs a session it no longer has."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __repr__(self) -> str:
        raise RuntimeError("repr not available")


async def test_a_journal_keys_an_argument_whose_repr_raises_by_its_type_and_state(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "wf.sqlite"

    def build(n: int) -> Workflow:
        wf = Workflow()
        row = wf.function(Row, n, id="load")
        wf.function(lambda r: f"used {r.n}", row, id="use")
        return wf

    first = await echo_engine().arun(build(1), journal=journal)
    assert first.ok and first["use"] == "used 1"
    again = await echo_engine().arun(build(1), journal=journal)
    assert again["use"] == "used 1" and again.graph["use"].replayed
    changed = await echo_engine().arun(build(2), journal=journal)
    assert changed["use"] == "used 2" and changed.replay is not None
    assert changed.replay.diverged_at == "use"


async def test_a_changed_cache_false_node_diverges_only_through_what_receives_it(
    tmp_path: Path,
) -> None:
    """docs/graph-executor.md, ``cache=False``: such a node is never journaled; a node
    whose prompt or arguments change with its result diverges (and nothing after it
    replays), one that receives the same value replays."""
    journal = tmp_path / "wf.sqlite"
    engine = echo_engine()
    counter = itertools.count()

    def build() -> Workflow:
        wf = Workflow()
        clock = wf.function(lambda: next(counter), cache=False, id="clock")
        same = wf.function(lambda: "same", cache=False, id="same")
        later = wf.llm(lambda text: f"later {text}", same, id="later")
        wf.llm(lambda tick, text: f"at {tick}", clock, later, id="stamped")
        return wf

    await engine.arun(build(), journal=journal)
    second = await engine.arun(build(), journal=journal)
    assert second.replay is not None
    assert second.graph["later"].replayed and not second.graph["stamped"].replayed
    assert second.replay.diverged_at == "stamped" and second["stamped"] == "<at 1>"
    assert [r.prompt for r in scripted(engine).requests].count("later same") == 1


def test_a_stream_s_capacity_is_checked_as_configuration() -> None:
    wf = Workflow()
    wf.llm("x")
    for capacity in ("100", 0):
        with pytest.raises(ConfigError, match="capacity .* must be a whole number, at least 1"):
            echo_engine().stream(wf, capacity=capacity)  # type: ignore[arg-type]
