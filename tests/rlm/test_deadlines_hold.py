"""The run's deadline (``max_timeout``) and a block's ``timeout`` hold whatever the
engine does on model code's behalf: a custom tool that blocks, and the check of the
answer model code gives against the user's ``schema=``. Each is handed to a worker
thread the deadline gives up, and the run answers at its deadline, not when the work
ends. (Real processes and real time: the guest is the ``subprocess`` environment's.)"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pydantic import BaseModel, field_validator

from rlm_graph import RLM, NodeKind
from tests.support.scripts import repl


@pytest.mark.parametrize("limit", ["max_timeout", "block timeout"])
def test_a_tool_that_blocks_does_not_hold_the_run_past_its_deadline(limit: str) -> None:
    """A synchronous tool (a fetch, a query, whose arguments the model picks) held a
    ``subprocess`` run until it returned: 20 s past a 3 s ``max_timeout``, the guest
    not killed at its block's timeout. The run answers at its deadline; the tool's
    thread is given up (it ends when the tool does)."""
    release = threading.Event()
    returned: list[str] = []

    def fetch(url: str) -> str:
        release.wait(30)
        returned.append(url)
        return "late"

    limits: dict[str, Any] = (
        {"max_timeout": 3}
        if limit == "max_timeout"
        else {"environment_kwargs": {"timeout": 2}, "max_iterations": 2}
    )
    rlm = RLM(
        "scripted",
        {"responses": [repl("print(fetch('https://example.test'))"), repl("FINAL('done')")]},
        environment="subprocess",
        custom_tools={"fetch": fetch},
        **limits,
    )
    try:
        result = rlm.completion("ctx")
        assert returned == []  # answered while the tool still blocked
    finally:
        release.set()
    if limit == "max_timeout":
        assert result.stop_reason == "max_timeout"
    else:
        assert result.response == "done"
        first = next(result.graph.records(NodeKind.REPL_BLOCK))
        assert "block exceeded 2 s" in str(first.error)


class Rows(BaseModel):
    rows: list[int]

    @field_validator("rows")
    @classmethod
    def _checked_elsewhere(cls, rows: list[int]) -> list[int]:
        _CHECKING.set()
        _RELEASE.wait(30)  # a check that takes its time (a lookup, a slow rule)
        _CHECKED.append(len(rows))
        return rows


_CHECKING, _RELEASE = threading.Event(), threading.Event()
_CHECKED: list[int] = []


def test_checking_the_answer_against_the_schema_does_not_hold_the_run() -> None:
    """The answer model code gives was checked against ``schema=`` on the engine's
    event loop: a check that takes its time held the run past ``max_timeout`` (nothing
    can fire while the loop is busy). It runs in a worker thread the deadline gives up."""
    rlm = RLM(
        "scripted",
        {"responses": [repl("FINAL({'rows': [1, 2, 3]})")] * 2},
        environment="subprocess",
        max_timeout=6,  # a guest started on a loaded machine reaches the check in 1-2 s
    )
    try:
        result = rlm.completion("ctx", schema=Rows)
        assert _CHECKING.is_set() and _CHECKED == []  # answered while the check ran
    finally:
        _RELEASE.set()
    assert result.stop_reason == "max_timeout" and result.parsed is None


def test_unique_items_of_a_users_schema_are_checked_in_linear_time() -> None:
    """``uniqueItems`` over thousands of objects, compared pairwise by jsonschema, took
    32 s for 5,000 (a minute past a 5 s ``max_timeout``, the answer lost): compared in
    one pass, the answer stands; a repeated item is still a mismatch."""
    schema = {"type": "array", "items": {"type": "object"}, "uniqueItems": True}
    rows = "[{'i': k, 'tags': [k, str(k)]} for k in range(5000)]"
    rlm = RLM(
        "scripted",
        {"responses": [repl(f"FINAL({rows} + [{{'i': 7}}] * 2)"), repl(f"FINAL({rows})")]},
        environment="subprocess",
        max_timeout=30,
    )
    result = rlm.completion("ctx", schema=schema)
    assert result.stop_reason is None and len(result.parsed) == 5000
    first = next(result.graph.records(NodeKind.REPL_BLOCK))
    assert "non-unique elements" in str(first.error)
