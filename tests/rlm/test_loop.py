"""End-to-end RLM completions with the scripted provider and the local environment."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from rlm_graph import RLM, NodeKind, NodeStatus
from rlm_graph.errors import ConfigError, IterationLimitExceeded, PluginError
from rlm_graph.graph import peak_concurrency
from tests.support.scripts import repl, root_and_sub, scripted

L = 1.0


def rlm(root: object, sub: object = None, **kwargs: object) -> RLM:
    respond = root_and_sub(root) if sub is None else root_and_sub(root, sub)  # type: ignore[arg-type]
    backend_kwargs = {"respond": respond, **kwargs.pop("backend_kwargs", {})}  # type: ignore[dict-item]
    return RLM("scripted", backend_kwargs, **kwargs)  # type: ignore[arg-type]


async def test_answer_by_the_answer_dict() -> None:
    engine = rlm(
        [
            repl("print(len(context))"),
            repl('answer["content"] = context.upper()\nanswer["ready"] = True'),
        ]
    )
    result = await engine.acompletion("hello world", root_prompt="shout it")
    assert result.response == "HELLO WORLD"
    assert result.stop_reason is None
    assert result.iterations == 2
    kinds = [r.kind for r in result.graph.records()]
    assert kinds == [
        NodeKind.ROOT_TURN,
        NodeKind.REPL_BLOCK,
        NodeKind.ROOT_TURN,
        NodeKind.REPL_BLOCK,
    ]
    # The model saw what its first block printed.
    second_turn = scripted(engine).requests[1]
    assert "REPL output:\n11" in second_turn.messages[-1].content
    assert "Question: shout it" in second_turn.messages[1].content


async def test_answer_by_final_var_and_final() -> None:
    by_var = rlm([repl('total = 6 * 7\nFINAL_VAR("total")')])
    assert (await by_var.acompletion("ctx")).response == "42"
    by_final = rlm([repl("FINAL(len(context))")])
    assert (await by_final.acompletion("abcd")).response == "4"


async def test_final_var_of_a_missing_variable_tells_the_model_and_goes_on() -> None:
    engine = rlm([repl('print(FINAL_VAR("nope"))'), repl("FINAL('done')")])
    result = await engine.acompletion("ctx")
    assert result.response == "done"
    second = scripted(engine).requests[1]
    assert "there is no variable 'nope'" in second.messages[-1].content


async def test_text_final_counts_only_when_opted_in() -> None:
    reply = "I know it.\nFINAL(the answer (with parentheses))"
    strict = rlm([reply, repl("FINAL('from code')")])
    assert (await strict.acompletion("ctx")).response == "from code"
    lenient = rlm([reply], accept_text_final=True)
    assert (await lenient.acompletion("ctx")).response == "the answer (with parentheses)"


async def test_llm_query_batched_fans_out_in_parallel_and_keeps_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    code = (
        "chunks = [context[i:i+10] for i in range(0, len(context), 10)]\n"
        "answers = llm_query_batched(chunks)\n"
        'answer["content"] = "|".join(answers)\n'
        'answer["ready"] = True'
    )
    engine = rlm([repl(code)], backend_kwargs={"latency": L, "max_concurrent": 16})
    context = "".join(f"{i:010d}" for i in range(64))
    start = trio.current_time()
    result = await engine.acompletion(context)
    makespan = trio.current_time() - start
    assert result.response == "|".join(f"sub:{i:010d}" for i in range(64))
    # One root turn (L), 64 calls 16 at a time (4 L): 5 L, and that is the critical path.
    assert makespan == pytest.approx(5 * L)
    assert result.critical_path.length == pytest.approx(5 * L)
    assert result.parallel_efficiency == pytest.approx(1.0)
    assert peak_concurrency(result.graph, NodeKind.LLM_CALL) == 16
    calls = list(result.graph.records(NodeKind.LLM_CALL))
    assert sorted(c.batch_index for c in calls) == list(range(64))  # type: ignore[type-var]
    assert all(c.depth == 1 for c in calls)
    block = next(result.graph.records(NodeKind.REPL_BLOCK))
    assert all(list(result.graph.predecessors(c.id)) == [block.id] for c in calls)


async def test_a_failed_slot_is_an_error_string_and_the_batch_goes_on() -> None:
    def sub(request: object) -> str:
        if request.prompt == "bad":  # type: ignore[attr-defined]
            raise RuntimeError("sub-model fell over")
        return "fine"

    engine = rlm([repl('r = llm_query_batched(["a", "bad", "c"])\nFINAL(repr(r))')], sub)
    result = await engine.acompletion("ctx")
    assert result.response == repr(["fine", "[ERROR] RuntimeError: sub-model fell over", "fine"])
    statuses = [r.status for r in result.graph.records(NodeKind.LLM_CALL)]
    assert statuses.count(NodeStatus.ERROR) == 1 and statuses.count(NodeStatus.OK) == 2


async def test_sequential_calls_in_a_block_depend_on_each_other() -> None:
    engine = rlm([repl('a = llm_query("one")\nb = llm_query("two " + a)\nFINAL(b)')])
    result = await engine.acompletion("ctx")
    assert result.response == "sub:two sub:one"
    first, second = result.graph.records(NodeKind.LLM_CALL)
    assert first.id in set(result.graph.predecessors(second.id, kind="after"))


async def test_a_batch_after_a_batch_comes_after_the_last_slot_to_return() -> None:
    # Each slot of the second batch waited for the whole first batch: one edge from the
    # first batch's last slot to return says so (one from each made 200 x 200 edges).
    async def sub(request: object) -> str:
        prompt = request.messages[-1].content  # type: ignore[attr-defined]
        if prompt == "a3":
            await trio.sleep(0.01)  # the last of the first batch to return
        return prompt.upper()

    code = (
        "a = llm_query_batched([f'a{i}' for i in range(200)])\n"
        "b = llm_query_batched([f'b{i}' for i in range(200)])\n"
        "c = llm_query('c')\n"
        "FINAL(a[3] + b[199] + c)"
    )
    result = await rlm([repl(code)], sub).acompletion("ctx")
    assert result.response == "A3B199C"
    graph = result.graph
    calls = {r.input_preview: r.id for r in graph.records(NodeKind.LLM_CALL)}
    for i in range(200):
        assert list(graph.predecessors(calls[f"b{i}"], kind="after")) == [calls["a3"]]
    assert len(list(graph.predecessors(calls["c"], kind="after"))) == 1
    assert sum(kind == "after" for _, _, kind in graph.edges()) < 2 * 200 + 10


async def test_code_that_raises_is_shown_to_the_model() -> None:
    engine = rlm([repl("1 / 0"), repl("FINAL('recovered')")])
    result = await engine.acompletion("ctx")
    assert result.response == "recovered"
    feedback = scripted(engine).requests[1].messages[-1].content
    assert "ZeroDivisionError: division by zero" in feedback
    block = next(result.graph.records(NodeKind.REPL_BLOCK))
    assert block.status == NodeStatus.ERROR and block.error_type == "ZeroDivisionError"


async def test_printing_10_mb_is_truncated_for_the_next_turn() -> None:
    engine = rlm([repl("print('x' * 10_000_000)"), repl("FINAL('ok')")], output_chars=5_000)
    result = await engine.acompletion("ctx")
    assert result.response == "ok"
    feedback = scripted(engine).requests[1].messages[-1].content
    assert len(feedback) < 6_000
    assert "characters truncated" in feedback


async def test_no_answer_after_max_iterations_asks_once_for_a_final_answer() -> None:
    def root(request: object) -> str:
        last = request.messages[-1].content  # type: ignore[attr-defined]
        if "used all" in last:
            return "my best guess"
        return repl("print('still looking')")

    engine = rlm(root, max_iterations=3)
    result = await engine.acompletion("ctx")
    assert result.response == "my best guess"
    assert result.stop_reason == "max_iterations"
    assert len(list(result.graph.records(NodeKind.ROOT_TURN))) == 4
    raising = rlm(root, max_iterations=2, on_limit="raise")
    with pytest.raises(IterationLimitExceeded) as info:
        await raising.acompletion("ctx")
    assert info.value.partial == "my best guess"


async def test_a_reply_without_code_is_told_so() -> None:
    engine = rlm(["I think the answer is 4.", repl("FINAL(4)")])
    result = await engine.acompletion("ctx")
    assert result.response == "4"
    feedback = scripted(engine).requests[1].messages[-1].content
    assert "no ```repl block" in feedback


async def test_a_model_that_overwrites_llm_query_gets_it_back() -> None:
    engine = rlm(
        [
            repl("llm_query = lambda p: 'hijacked'\ncontext = 'gone'"),
            repl("FINAL(llm_query('q') + ' ' + context)"),
        ]
    )
    result = await engine.acompletion("original")
    assert result.response == "sub:q original"
    feedback = scripted(engine).requests[1].messages[-1].content
    assert (
        "llm_query, context are part of the REPL protocol or your tools and were restored"
        in feedback
    )


async def test_a_custom_tool_overwritten_by_model_code_is_restored() -> None:
    engine = rlm(
        [repl("double = 3"), repl("FINAL(double(21))")],
        custom_tools={"double": lambda v: 2 * v},
    )
    result = await engine.acompletion("ctx")
    assert result.response == "42"


async def test_show_vars_and_custom_tools() -> None:
    engine = rlm(
        [repl("x = 3\nprint(SHOW_VARS())"), repl("FINAL(double(x) + len(LOOKUP))")],
        custom_tools={
            "double": {"tool": lambda v: 2 * v, "description": "doubles a number"},
            "LOOKUP": {"a": 1, "b": 2},
        },
    )
    result = await engine.acompletion("ctx")
    assert result.response == "8"
    system = scripted(engine).requests[0].messages[0].content
    assert "- `double`: doubles a number" in system
    assert "- `LOOKUP`: a dict value" in system
    shown = scripted(engine).requests[1].messages[-1].content
    assert "Variables: context_0: str, context: str, x: int" in shown


def test_sync_completion_returns_the_reference_result_shape() -> None:
    engine = rlm([repl("FINAL(context[::-1])")], backend_kwargs={"model_name": "root-model"})
    result = engine.completion("abc", root_prompt="reverse")
    assert result.response == "cba"
    assert result.root_model == "root-model"
    assert result.execution_time > 0
    usage = result.usage_summary.model_usage_summaries["root-model"]
    assert usage.total_calls == 1 and usage.total_input_tokens > 0
    assert (
        result.to_dict()["usage_summary"]["model_usage_summaries"]["root-model"]["total_calls"] == 1
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_iteratons": 3}, "unknown keyword.*'max_iteratons'"),
        ({"max_timeout": -1}, "max_timeout"),
        ({"max_depth": -1}, "max_depth"),
        ({"custom_tools": {"llm_query": len}}, "reserved REPL name"),
    ],
)
def test_bad_configuration_fails_at_construction(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RLM("scripted", {"responses": []}, **kwargs)  # type: ignore[arg-type]


def test_unknown_backend_and_environment_list_what_is_registered() -> None:
    with pytest.raises(PluginError, match=r"unknown backend 'nope'; registered: .*scripted"):
        RLM("nope")
    with pytest.raises(PluginError, match=r"unknown environment 'docker'; registered: .*local"):
        RLM("scripted", {"responses": []}, environment="docker")


async def test_a_context_of_the_wrong_type_is_refused() -> None:
    engine = rlm([repl("FINAL(1)")])
    with pytest.raises(ConfigError, match="must be a str, list or dict"):
        await engine.acompletion(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("environment", ["local", "subprocess"])
async def test_a_block_can_define_dataclasses_and_enums(environment: str) -> None:
    code = (
        "import dataclasses, enum, typing\n"
        "@dataclasses.dataclass\n"
        "class Hit:\n"
        "    where: int\n"
        "    tags: typing.ClassVar[list[str]] = []\n"
        "class Colour(enum.Enum):\n"
        "    RED = 1\n"
        "FINAL(f'{Hit(context.index(\"x\")).where} {Colour.RED.name}')"
    )
    engine = rlm([repl(code)], environment=environment)
    assert (await engine.acompletion("abcx")).response == "3 RED"


def test_the_protocols_errors_name_the_function_and_the_prompt() -> None:
    """No internal names (ReplSession._protocol_names.<locals>...), no stray "()"."""
    code = (
        "out = []\n"
        "calls = (lambda: llm_query_batched(['ok', None]), lambda: llm_query('x', foo=1))\n"
        "for call in calls:\n"
        "    try:\n"
        "        call()\n"
        "    except TypeError as exc:\n"
        "        out.append(str(exc))\n"
        "out.append(FINAL_VAR('llm_query'))\n"
        "FINAL(' || '.join(out))"
    )
    rlm = RLM("scripted", {"respond": root_and_sub([repl(code)])}, environment="local")
    batched, keyword, final_var = rlm.completion("ctx").response.split(" || ")
    assert batched == (
        "llm_query_batched() prompt 1 must be a str, or a list of str and images, not NoneType"
    )
    assert keyword == "llm_query() got an unexpected keyword argument 'foo'"
    assert final_var.startswith("FINAL_VAR: 'llm_query' is the REPL's own")
