"""Spans of RLM completions: turn > block > call > child completion, also from REPL threads."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from opentelemetry.trace import SpanKind, StatusCode

from rlm_graph import RLM
from rlm_graph.contracts import ChatRequest
from rlm_graph.errors import ProviderError
from rlm_graph.graph import NodeKind
from tests.support.tracing import Memory, assert_nesting, attrs, parent_id, span_id

ROOT_CODE = (
    "parts = llm_query_batched(['alpha', 'bad', 'gamma'])\n"
    "kids = rlm_query_batched(['task one', 'task two'])\n"
    "FINAL('|'.join(parts + kids))"
)
CHILD_CODE = "FINAL(llm_query('leaf ' + context))"


def respond(request: ChatRequest) -> str:
    is_turn = any(m.role == "system" for m in request.messages)
    if is_turn:
        code = ROOT_CODE if request.depth == 0 else CHILD_CODE
        return f"Working.\n```repl\n{code}\n```\n"
    if request.prompt == "bad":
        raise ProviderError("sub-model refused", provider="scripted")
    return f"sub:{request.prompt}"


def traced_rlm(memory: Memory) -> RLM:
    return RLM(
        "scripted",
        {"respond": respond, "latency": 1.0},
        environment="local",
        max_depth=2,
        tracer_provider=memory.provider,
    )


async def test_nesting_follows_the_graph_across_repl_threads_and_children(
    memory: Memory, autojump_clock: trio.testing.MockClock
) -> None:
    result = await traced_rlm(memory).acompletion("ctx", root_prompt="go")
    graph = result.graph
    spans = memory.by_node()
    (run,) = memory.run_spans()
    assert run.name == "invoke_agent rlm"
    assert sorted(spans) == sorted(r.id for r in graph.records())
    assert len(memory.spans) == len(graph) + 1
    assert_nesting(graph, spans, run)
    kinds = {r.id: r.kind for r in graph.records()}
    # Walk one path down the tree by span parents: leaf call > child block > child turn >
    # rlm_call > root block > root turn > run.
    leaf = next(i for i, r in kinds.items() if r == NodeKind.LLM_CALL and graph[i].depth == 2)
    chain = []
    by_span = {span_id(s): node for node, s in spans.items()}
    current = spans[leaf]
    while parent_id(current) in by_span:
        chain.append(kinds[by_span[parent_id(current)]])  # type: ignore[index]
        current = spans[by_span[parent_id(current)]]  # type: ignore[index]
    assert chain == [
        NodeKind.REPL_BLOCK,
        NodeKind.ROOT_TURN,
        NodeKind.RLM_CALL,
        NodeKind.REPL_BLOCK,
        NodeKind.ROOT_TURN,
    ]
    assert parent_id(current) == span_id(run)


async def test_every_span_kind_carries_its_attributes(
    memory: Memory, autojump_clock: trio.testing.MockClock
) -> None:
    result = await traced_rlm(memory).acompletion("ctx", root_prompt="go")
    spans = memory.by_node()
    for record in result.graph.records():
        span = spans[record.id]
        attrs = span.attributes or {}
        assert attrs["rlm.node.id"] == record.id
        assert attrs["rlm.node.kind"] == record.kind.value
        assert attrs["rlm.depth"] == record.depth
        assert attrs["rlm.completion.id"] == record.completion
        if record.kind in (NodeKind.ROOT_TURN, NodeKind.LLM_CALL):
            assert span.kind == SpanKind.CLIENT
            assert span.name == f"chat {record.model}"
            assert attrs["gen_ai.operation.name"] == "chat"
            assert attrs["gen_ai.provider.name"] == "scripted"
            assert attrs["gen_ai.request.model"] == record.model
        if record.kind == NodeKind.ROOT_TURN:
            assert attrs["rlm.iteration"] == record.iteration
            assert attrs["gen_ai.usage.input_tokens"] == record.usage.input_tokens  # type: ignore[union-attr]
            assert attrs["gen_ai.usage.output_tokens"] == record.usage.output_tokens  # type: ignore[union-attr]
        if record.kind == NodeKind.REPL_BLOCK:
            assert span.name == "execute_tool repl"
            assert attrs["gen_ai.tool.name"] == "repl"
        if record.kind == NodeKind.RLM_CALL:
            assert span.name == "invoke_agent rlm"
            assert attrs["gen_ai.operation.name"] == "invoke_agent"
            assert attrs["gen_ai.agent.name"] == "rlm"
        if record.batch_index is not None:
            assert attrs["rlm.batch.index"] == record.batch_index
            assert attrs["rlm.batch.size"] == record.batch_size
    batched = [r for r in result.graph.records() if r.batch_size == 3]
    assert sorted(r.batch_index for r in batched) == [0, 1, 2]  # type: ignore[type-var]


async def test_a_failed_sub_call_is_an_error_span(
    memory: Memory, autojump_clock: trio.testing.MockClock
) -> None:
    result = await traced_rlm(memory).acompletion("ctx", root_prompt="go")
    assert "[ERROR]" in result.response
    errors = [s for s in memory.spans if s.status.status_code == StatusCode.ERROR]
    assert len(errors) == 1
    (failed,) = errors
    assert attrs(failed)["error.type"] == "ProviderError"
    assert failed.status.description == "sub-model refused"
    record = result.graph[attrs(failed)["rlm.node.id"]]
    assert record.kind == NodeKind.LLM_CALL and record.batch_index == 1


async def test_concurrent_children_overlap_in_time(
    memory: Memory, autojump_clock: trio.testing.MockClock
) -> None:
    result = await traced_rlm(memory).acompletion("ctx", root_prompt="go")
    spans = memory.by_node()
    children = [spans[r.id] for r in result.graph.records(NodeKind.RLM_CALL)]
    assert len(children) == 2
    first, second = children
    assert first.start_time < second.end_time and second.start_time < first.end_time  # type: ignore[operator]


@pytest.mark.processes
def test_nesting_holds_for_sub_calls_from_a_subprocess_guest(memory: Memory) -> None:
    engine = RLM(
        "scripted",
        {"respond": respond},
        environment="subprocess",
        max_depth=2,
        tracer_provider=memory.provider,
    )
    result = engine.completion("ctx", root_prompt="go")
    spans = memory.by_node()
    (run,) = memory.run_spans()
    assert sorted(spans) == sorted(r.id for r in result.graph.records())
    assert_nesting(result.graph, spans, run)
    # A sub-call the guest process asked for is a child span of the block that asked.
    call = next(r for r in result.graph.records(NodeKind.LLM_CALL) if r.depth == 1)
    (block,) = result.graph.predecessors(call.id, kind="spawn")
    assert parent_id(spans[call.id]) == span_id(spans[block])
