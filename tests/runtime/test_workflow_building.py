"""What a workflow refuses while it is built, and what it keeps of a node's arguments:
another workflow's handles, iterators, references as dict keys, bad model and system
values, prompt keywords given as request parameters, containers changed after a node
was added; and a wide fan-in added in linear time."""

from __future__ import annotations

import pytest

from rlm_graph import ConfigError, Engine, Workflow
from rlm_graph.errors import GraphError, NodeFailed
from rlm_graph.graph.spec import NodeRef


def echo_engine() -> Engine:
    return Engine("scripted", {"respond": lambda request: f"<{request.prompt}>"})


async def test_a_handle_from_another_workflow_is_refused_not_read_as_a_same_named_node() -> None:
    first, second = Workflow(), Workflow()
    foreign = first.llm("question of the first workflow")
    second.llm("unrelated question")  # llm-1 here too
    with pytest.raises(GraphError, match="'llm-1' of another Workflow"):
        second.function(lambda text: text, foreign)
    # A handle typed by hand names a node of whichever workflow it is given to.
    mine = second.function(lambda text: f"got {text}", NodeRef("llm-1"))
    result = await echo_engine().arun(second)
    assert result[mine] == "got <unrelated question>"


async def test_a_list_changed_after_its_node_was_added_does_not_change_what_the_node_gets() -> None:
    wf = Workflow()
    parts = [wf.llm("a")]
    joined = wf.function(lambda items: list(items), parts, id="join")
    parts.append(wf.llm("b"))  # after the join was added: not one of its dependencies
    result = await echo_engine().arun(wf)
    assert result.ok
    assert result[joined] == ["<a>"]
    assert wf["join"].deps == ("llm-1",)


async def test_a_reference_put_in_an_argument_after_its_node_was_added_fails_that_node() -> None:
    # A container without a reference is passed as it is (not copied): one filled with
    # handles afterwards would hand the node raw handles, which a prompt function turns
    # into text the model reads. The node fails, naming the fix; the others run.
    wf = Workflow()
    notes: list[object] = ["intro"]
    summary = wf.llm(lambda ns: "Summarize: " + " / ".join(map(str, ns)), notes, id="final")
    notes.append(wf.llm("detail", id="detail"))
    gathered: dict[str, object] = {}
    gather = wf.function(lambda parts: parts, gathered, id="gather")
    gathered["late"] = wf.llm("late", id="late")
    settings = {"n": 1}
    uses = wf.function(lambda c: dict(c), settings, id="uses")
    settings["n"] = 2  # a constant changed before the run: the node sees it, as passed
    tree: dict[str, object] = {"name": "root", "children": []}
    named = wf.function(lambda t: t["name"], tree, id="named")
    tree["children"] = [{"name": "leaf", "parent": tree}]  # a link back, added after
    result = await echo_engine().arun(wf)
    assert result[named] == "root"
    for node, late in ((summary, "detail"), (gather, "late")):
        with pytest.raises(NodeFailed, match=f"reference to '{late}' in an argument after"):
            result[node]
    assert result["detail"] == "<detail>" and result[uses] == {"n": 2}


def test_an_iterator_argument_is_refused_with_what_to_pass_instead() -> None:
    wf = Workflow()
    a = wf.llm("a")
    with pytest.raises(ConfigError, match=r"node 'sink'.*iterator \(generator\).*list\(\.\.\.\)"):
        wf.function(lambda items: list(items), (x for x in [a]), id="sink")
    assert len(wf) == 1  # nothing half-added


def test_a_reference_as_a_dict_key_is_refused() -> None:
    wf = Workflow()
    a = wf.llm("a")
    with pytest.raises(ConfigError, match="cannot be a dict key"):
        wf.function(lambda mapping: mapping, {a: "value"})


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [("model", 5, "int 5"), ("model", "", "str ''"), ("system", 5, "int 5")],
)
def test_a_model_or_system_that_is_not_text_is_refused_when_added(
    field: str, value: object, shown: str
) -> None:
    wf = Workflow()
    with pytest.raises(
        ConfigError, match=f"node 'q': {field} must be a non-empty string or None, not {shown}"
    ):
        wf.llm("question", id="q", **{field: value})  # type: ignore[arg-type]


def test_kwargs_that_is_not_a_mapping_is_refused() -> None:
    wf = Workflow()
    with pytest.raises(ConfigError, match="node 'q': kwargs must be a dict .* not list"):
        wf.llm(lambda **k: "x", id="q", kwargs=[1, 2])  # type: ignore[arg-type]


def test_a_prompt_functions_keyword_given_as_a_parameter_points_to_kwargs() -> None:
    wf = Workflow()
    a = wf.llm("a")
    with pytest.raises(
        ConfigError, match=r"'text' is not a request parameter; .* kwargs=\{'text': \.\.\.\}"
    ):
        wf.llm(lambda text: f"x {text}", id="q", text=a)


def test_a_wide_fan_in_finds_every_dependency_in_order() -> None:
    wf = Workflow()
    leaves = [wf.function(lambda i: i, i) for i in range(20_000)]
    total = wf.function(lambda values: sum(values), leaves)
    assert len(wf[total].deps) == 20_000  # found in one pass (a list scan per reference took 9 s)
    assert wf[total].deps[:2] == (leaves[0].id, leaves[1].id)


async def test_a_function_calling_sys_exit_fails_its_node_and_the_workflow_goes_on() -> None:
    import sys

    wf = Workflow()
    quits = wf.function(sys.exit, 3, id="quits")
    answer = wf.llm("still asked", id="asked")

    async def trio_quits() -> None:
        sys.exit(4)

    native = wf.function(trio_quits, id="native")
    result = await echo_engine().arun(wf)
    assert result[answer] == "<still asked>"
    assert "called sys.exit(3); a node cannot end the program" in result.errors[quits.id]
    assert "called sys.exit(4)" in result.errors[native.id]


class _Halt(BaseException):
    """A user's own BaseException, not an Exception."""


async def test_a_function_raising_what_is_not_an_exception_fails_its_node_only() -> None:
    import asyncio

    def plain() -> None:
        raise _Halt("stop everything")

    async def on_trio() -> None:
        raise _Halt("from trio")

    async def closes() -> None:  # ended the run, every result lost
        raise GeneratorExit("oops")

    async def awaits_a_cancelled_task() -> None:
        task = asyncio.ensure_future(asyncio.sleep(10))
        await asyncio.sleep(0)
        task.cancel()
        await task  # asyncio.CancelledError, a BaseException

    wf = Workflow()
    failing = [
        wf.function(plain, id="plain"),
        wf.function(on_trio, id="trio"),
        wf.function(closes, id="closes"),
        wf.function(awaits_a_cancelled_task, id="asyncio", loop="asyncio"),
    ]
    answer = wf.llm("still asked", id="asked")
    result = await echo_engine().arun(wf)
    assert result[answer] == "<still asked>"
    assert result.stop_reason is None
    assert "raised _Halt(stop everything), which is not an Exception" in result.errors["plain"]
    assert "raised _Halt(from trio)" in result.errors["trio"]
    assert "raised GeneratorExit(oops), which is not an Exception" in result.errors["closes"]
    assert "raised CancelledError (a task it awaited was cancelled?)" in result.errors["asyncio"]
    assert sorted(result.errors) == sorted(node.id for node in failing)


async def test_a_set_argument_that_cannot_hold_a_dependencys_value_fails_its_node_only() -> None:
    wf = Workflow()
    listed = wf.function(lambda: [1, 2], id="listed")
    counted = wf.function(len, {listed}, id="counted")
    other = wf.function(lambda: "independent", id="other")
    result = await echo_engine().arun(wf)
    assert result[other] == "independent"
    assert result[listed] == [1, 2]
    assert "a set among the node's arguments cannot hold a list" in result.errors[counted.id]
    assert "pass the references in a list or a tuple" in result.errors[counted.id]


async def test_a_dict_subclass_holding_a_reference_arrives_as_its_own_class() -> None:
    from collections import OrderedDict, defaultdict

    wf = Workflow()
    asked = wf.llm("q")

    def grow(groups: defaultdict[str, list[object]]) -> tuple[str, list[object], list[object]]:
        groups["new"].append(1)  # the default the user gave still works
        return type(groups).__name__, groups["seen"], groups["new"]

    grown = wf.function(grow, defaultdict(list, {"seen": [asked]}))
    ordered = wf.function(lambda d: (type(d).__name__, list(d)), OrderedDict(b=asked, a=1))
    result = await echo_engine().arun(wf)
    assert result[grown] == ("defaultdict", ["<q>"], [1])
    assert result[ordered] == ("OrderedDict", ["b", "a"])


class _Rows(list):  # type: ignore[type-arg]
    def __init__(self, items: object = (), sep: str = " | ") -> None:
        super().__init__(items)  # type: ignore[call-overload]
        self.sep = sep

    def joined(self) -> str:
        return self.sep.join(map(str, self))


class _Tags(frozenset):  # type: ignore[type-arg]
    pass


async def test_a_list_or_frozenset_subclass_holding_a_reference_keeps_its_class() -> None:
    """A list subclass arrived as a plain list once it held a reference (its methods
    gone: AttributeError in the node), a frozenset subclass as a mutable set."""
    wf = Workflow()
    asked = wf.llm("q")
    rows = wf.function(lambda r: r.joined(), _Rows(["x", asked], sep=" / "))
    tags = wf.function(lambda t: (type(t).__name__, sorted(t)), _Tags({"a", asked}))
    result = await echo_engine().arun(wf)
    assert result.ok, result.errors
    assert result[rows] == "x / <q>"
    assert result[tags] == ("_Tags", ["<q>", "a"])


async def test_a_value_whose_repr_raises_is_a_value_not_a_failure() -> None:
    class Opaque:
        def __repr__(self) -> str:
            raise RuntimeError("no repr for you")

    wf = Workflow()
    made = wf.function(Opaque, id="made")
    used = wf.function(lambda thing: type(thing).__name__, made, id="used")
    result = await echo_engine().arun(wf)
    assert result.ok, result.errors
    assert result[used] == "Opaque"
    assert result.graph["made"].output_preview == "<Opaque object; its repr raised RuntimeError>"


async def test_a_result_refuses_a_handle_of_another_workflow() -> None:
    first, second = Workflow(), Workflow()
    theirs = first.llm("question A")  # llm-1
    mine = second.llm("question B")  # llm-1 too
    result = await echo_engine().arun(second)
    assert result[mine] == "<question B>"
    assert result["llm-1"] == "<question B>"
    with pytest.raises(KeyError, match="'llm-1' is a handle of another Workflow"):
        result[theirs]
    with pytest.raises(KeyError, match="another Workflow"):
        result.exception(theirs)
    assert theirs not in second and mine in second and NodeRef("llm-1") in second
    with pytest.raises(KeyError, match="another Workflow"):
        second[theirs]


async def test_a_function_node_waiting_for_a_thread_is_queueing_not_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    import rlm_graph.runtime.workflow as runtime_workflow

    monkeypatch.setattr(runtime_workflow, "FUNCTION_THREADS", 1)
    wf = Workflow()
    for name in ("one", "two"):
        wf.function(time.sleep, 0.1, id=name)
    result = await echo_engine().arun(wf)
    first, second = sorted((result.graph[n] for n in ("one", "two")), key=lambda r: r.start or 0)
    assert first.end is not None and second.start is not None and second.submitted is not None
    # Both were ready at once; the second got the one thread when the first gave it
    # back, and that wait is queueing (start - submitted), not part of its duration.
    assert second.submitted < first.end
    assert second.start - second.submitted >= 0.5 * first.duration
    assert result.parallel_efficiency < 0.75  # one thread: two sleeps end to end


async def test_a_function_gets_keywords_named_like_node_options_through_kwargs() -> None:
    def fetch(url: str, timeout: float | None = None, cache: bool | None = None) -> str:
        return f"{url} timeout={timeout} cache={cache}"

    wf = Workflow()
    a = wf.llm("a")
    got = wf.function(fetch, a, kwargs={"timeout": 5, "cache": False}, timeout=30)
    result = await echo_engine().arun(wf)
    assert result[got] == "<a> timeout=5 cache=False"  # the node's own timeout stays 30
    assert wf[got].timeout == 30
    with pytest.raises(ConfigError, match="keyword 'url' given twice"):
        wf.function(fetch, kwargs={"url": "x"}, url="y")
    with pytest.raises(ConfigError, match="kwargs must be a dict of the function's keyword"):
        wf.function(fetch, "x", kwargs=["timeout"])  # type: ignore[arg-type]


def test_the_plan_says_a_plain_function_runs_in_a_thread() -> None:
    async def on_trio() -> None:
        return None

    wf = Workflow()
    plain, native = wf.function(len, "abc"), wf.function(on_trio)
    loops = {node["id"]: node["loop"] for node in wf.to_jsonable()["nodes"]}
    assert loops == {plain.id: "thread", native.id: "trio"}


async def test_a_timed_out_asyncio_function_is_stopped_and_not_counted_as_leaked() -> None:
    import asyncio

    stopped: list[str] = []

    async def slow() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.append("cancelled in its loop")
            raise
        return "never"

    wf = Workflow()
    # One second: the worker thread's asyncio loop has started the function by then
    # (a timeout before that stops a function that never ran, nothing to cancel).
    node = wf.function(slow, timeout=1.0, loop="asyncio")
    for _ in range(3):  # the unwinding raced the count before
        stopped.clear()
        result = await echo_engine().arun(wf)
        assert "did not finish within timeout=1 s" in result.errors[node.id]
        assert stopped == ["cancelled in its loop"]
        assert result.leaked_threads == 0


def test_arguments_nested_too_deep_say_how_to_pass_such_data() -> None:
    deep: list[object] = []
    for _ in range(150):
        deep = [deep]
    holds_itself: list[object] = []
    holds_itself.append(holds_itself)
    for value in (deep, holds_itself):
        with pytest.raises(ConfigError, match="pass data that deep as one string"):
            Workflow().function(len, value)

    class Tree:  # the user's own object: not searched for references, however deep
        def __init__(self, inner: object) -> None:
            self.inner = inner

    Workflow().function(lambda tree: 1, Tree(deep))
