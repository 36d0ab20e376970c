"""What a workflow refuses or writes before it runs: a handle made into text or hidden
where its result would not replace it, a timeout no clock holds, an async prompt
function; the plan as strict JSON; which callables are async."""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
import os
import types
from typing import Any

import pytest

from rlm_graph import ConfigError, Workflow
from rlm_graph.graph.spec import NodeRef, is_async


def test_a_handle_in_an_f_string_is_refused_with_the_fix() -> None:
    wf = Workflow()
    draft = wf.llm("Write a haiku about rain", id="draft")
    with pytest.raises(ConfigError, match=r"wf.llm\(lambda text: f\"... \{text\}\", handle\)"):
        wf.llm(f"Improve this haiku: {draft}")
    with pytest.raises(ConfigError, match="its id is 'draft'"):
        format(draft, ">10")
    # str() shows the handle, never the bare id: print and logging still work.
    assert str(draft) == repr(draft) == "NodeRef(id='draft')" and f"{draft!r}" == repr(draft)
    assert len(wf) == 1  # the refused node was not added


@pytest.mark.parametrize(
    "made",
    [
        lambda draft: {"prompt": "Improve this haiku: %s" % draft},  # noqa: UP031
        lambda draft: {"prompt": "Improve this haiku: " + str(draft)},
        lambda draft: {"prompt": "Improve it", "system": "You edit %s" % draft},  # noqa: UP031
        lambda draft: {"prompt": lambda text: text, "args": ("Improve: " + str(draft),)},
    ],
    ids=["percent", "str", "system", "a text argument"],
)
def test_a_handle_made_into_text_otherwise_is_refused_too(made: Any) -> None:
    """``"..." % handle`` (or ``+ str(handle)``) passed the f-string guard: the model was
    asked about "NodeRef(id='draft')" and the node did not wait for the draft."""
    wf = Workflow()
    draft = wf.llm("Write a haiku about rain", id="draft")
    given = made(draft)
    with pytest.raises(ConfigError, match=r"holds the node handle NodeRef\(id='draft'\)"):
        wf.llm(given.pop("prompt"), *given.pop("args", ()), **given)
    assert len(wf) == 1
    wf.llm("Mention NodeRef(ids) in passing")  # the words alone are not a handle


@dataclasses.dataclass
class Job:
    text: object


@pytest.mark.parametrize(
    ("argument", "where"),
    [
        (lambda ref: collections.deque([ref]), "inside a deque"),
        (lambda ref: collections.UserList([[ref]]), "inside a UserList"),
    ],
)
def test_a_handle_where_its_result_would_not_replace_it_is_refused(
    argument: Any, where: str
) -> None:
    wf = Workflow()
    draft = wf.llm("q", id="draft")
    with pytest.raises(ConfigError, match=f"'draft' {where} would reach the node as the handle"):
        wf.function(lambda value: value, argument(draft))


@dataclasses.dataclass
class Linked:
    """A list whose items point back at each other, as ORM rows and trees do."""

    value: int
    next: Linked | None = None
    previous: Linked | None = None


def test_objects_are_passed_unread_even_when_they_point_back_at_each_other() -> None:
    """Reading objects' fields for handles walked every path of a structure with
    back-references (a doubly linked list of 40 items did not finish), and read ORM
    rows' lazy fields."""
    head = Linked(0)
    item = head
    for value in range(1, 40):
        item.next = Linked(value, previous=item)
        item = item.next
    wf = Workflow()
    node = wf.function(lambda first, *_: first.value, head, types.SimpleNamespace(a=1), Job("x"))
    assert wf[node].deps == ()


def test_objects_and_sequences_without_a_handle_are_still_plain_values() -> None:
    wf = Workflow()
    draft = wf.llm("q", id="draft")
    node = wf.function(
        lambda *values: values,
        collections.deque([1, 2]),
        Job("text"),
        range(10**12),
        b"bytes",
        [draft],
    )
    assert wf[node].deps == ("draft",)


@pytest.mark.parametrize(
    "timeout", [10**400, -(10**400), math.inf, 0], ids=["10**400", "-10**400", "inf", "0"]
)
def test_a_timeout_no_clock_holds_is_a_config_error_naming_the_node(timeout: object) -> None:
    def work() -> None:  # not print: Ray, imported by other tests, replaces print
        pass

    with pytest.raises(
        ConfigError,
        match=r"node 'work-1': timeout must be a positive number of seconds \(finite\)",
    ):
        Workflow().function(work, timeout=timeout)


def test_an_async_prompt_function_is_refused_when_added() -> None:
    async def prompt(text: str) -> str:
        return text

    with pytest.raises(ConfigError, match="prompt function is async.*wf.function node"):
        Workflow().llm(prompt, "x")


def test_the_plan_is_strict_json_that_can_be_written_as_utf8(tmp_path: Any) -> None:
    wf = Workflow()
    wf.function(lambda x, y, z: x, math.nan, -math.inf, [1.5], id="f")
    name = os.fsdecode(b"report-\xff.txt")  # a file name that is not UTF-8
    wf.function(len, name, id=name)

    def strict(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    text = wf.to_json()
    plan = json.loads(text, parse_constant=strict)
    assert plan["nodes"][0]["args"] == [{"repr": "nan"}, {"repr": "-inf"}, [1.5]]
    assert plan["nodes"][1]["id"] == name  # the escape reads back as the same id
    (tmp_path / "plan.json").write_text(text, encoding="utf-8")


class Fetcher:
    async def __call__(self, url: str) -> str:
        return url


def test_a_partial_of_an_async_callable_is_async() -> None:
    async def fetch(url: str) -> str:
        return url

    assert is_async(functools.partial(Fetcher(), "a"))
    assert is_async(functools.partial(functools.partial(fetch), "a"))
    assert not is_async(functools.partial(len, "a"))
    assert not is_async(NodeRef("x").__class__)
