"""Child completions: depth, fallback, limits shared by the tree, usage roll-up, and the
local environment's three traps (deadlock, mixed output, process-wide state)."""

from __future__ import annotations

import os

import pytest
import trio
import trio.testing

from rlm_graph import RLM, NodeKind
from rlm_graph.contracts import ChatRequest
from tests.support.scripts import is_root_turn, repl, scripted, turn_number

L = 1.0


def tree_model(root_code: str, child_code: str) -> object:
    """Root (depth 0) runs ``root_code``; each child completion runs ``child_code``;
    plain sub-calls answer ``sub:<prompt>``."""

    def respond(request: ChatRequest) -> str:
        if not is_root_turn(request):
            return f"sub:{request.prompt}"
        code = root_code if request.depth == 0 else child_code
        return repl(code) if turn_number(request) == 1 else repl("FINAL('no answer')")

    return respond


async def test_rlm_query_runs_a_child_completion_with_its_own_repl() -> None:
    respond = tree_model(
        root_code="FINAL(rlm_query('child task'))",
        child_code="FINAL('child saw: ' + context)",
    )
    engine = RLM("scripted", {"respond": respond}, max_depth=2)
    result = await engine.acompletion("root context")
    assert result.response == "child saw: child task"
    rlm_call = next(result.graph.records(NodeKind.RLM_CALL))
    assert rlm_call.depth == 1
    child_turns = [
        r for r in result.graph.records(NodeKind.ROOT_TURN) if r.completion == rlm_call.id
    ]
    assert len(child_turns) == 1 and child_turns[0].depth == 1
    assert rlm_call.id in set(result.graph.predecessors(child_turns[0].id, kind="spawn"))


async def test_at_max_depth_rlm_query_falls_back_to_a_plain_call() -> None:
    respond = tree_model(root_code="FINAL(rlm_query('task'))", child_code="FINAL('unused')")
    engine = RLM("scripted", {"respond": respond}, max_depth=1)
    result = await engine.acompletion("ctx")
    assert result.response == "sub:task"
    assert not list(result.graph.records(NodeKind.RLM_CALL))
    assert len(list(result.graph.records(NodeKind.LLM_CALL))) == 1
    system = scripted(engine).requests[0].messages[0].content
    assert "fall back to a plain `llm_query`" in system


async def test_depth_2_fan_out_never_exceeds_the_provider_limit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    respond = tree_model(
        root_code="r = rlm_query_batched([f'part {i}' for i in range(8)])\nFINAL(str(len(r)))",
        child_code="r = llm_query_batched([context + f' q{i}' for i in range(16)])\nFINAL(r[0])",
    )
    engine = RLM(
        "scripted",
        {"respond": respond, "latency": L, "max_concurrent": 8},
        max_depth=2,
        max_concurrent_subcalls=4,
        batch_max_concurrent=16,
    )
    result = await engine.acompletion("ctx")
    assert result.response == "8"
    # 4 children in flight x 16 slots each would be 64; the provider allows 8.
    assert scripted(engine).peak_in_flight == 8
    assert peak_children(result) == 4
    assert len(list(result.graph.records(NodeKind.LLM_CALL))) == 8 * 16


def peak_children(result: object) -> int:
    from rlm_graph.graph import peak_concurrency

    return peak_concurrency(result.graph, NodeKind.RLM_CALL)  # type: ignore[attr-defined]


async def test_max_concurrent_subcalls_holds_per_completion_and_may_be_overridden(
    patient_clock: trio.testing.MockClock,
) -> None:
    """The children's limiter was the engine's, per trio loop: a completion's own
    ``limits={"max_concurrent_subcalls": 2}`` was ignored, and every completion of the
    loop (every asyncio caller, which share one) shared the engine's 4 slots."""
    respond = tree_model(
        root_code="r = rlm_query_batched([f'part {i}' for i in range(8)])\nFINAL(str(len(r)))",
        child_code="FINAL(context)",
    )
    engine = RLM(
        "scripted", {"respond": respond, "latency": L}, max_depth=2, max_concurrent_subcalls=4
    )
    alone = await engine.acompletion("ctx", limits={"max_concurrent_subcalls": 2})
    assert alone.response == "8" and peak_children(alone) == 2
    wider = await engine.acompletion("ctx", limits={"max_concurrent_subcalls": 8})
    assert peak_children(wider) == 8
    results = []

    async def one() -> None:
        results.append(await engine.acompletion("ctx"))

    async with trio.open_nursery() as nursery:  # two trees in one loop: 4 children each
        nursery.start_soon(one)
        nursery.start_soon(one)
    assert [peak_children(r) for r in results] == [4, 4]
    # Together 8 in flight at once: neither tree waited for the other's slots.
    spans = [(r.start, r.end) for x in results for r in x.graph.records(NodeKind.RLM_CALL)]
    assert max(sum(s <= t < e for s, e in spans) for t, _ in spans) == 8


async def test_child_usage_rolls_up_into_the_parent() -> None:
    respond = tree_model(
        root_code="FINAL(rlm_query('go'))",
        child_code="x = llm_query('leaf')\nFINAL(x)",
    )
    engine = RLM("scripted", {"respond": respond, "model_name": "m"}, max_depth=2)
    result = await engine.acompletion("ctx")
    records = list(result.graph.records())
    leaves = [r for r in records if r.kind != NodeKind.RLM_CALL and r.usage is not None]
    expected_in = sum(r.usage.input_tokens for r in leaves)  # type: ignore[union-attr]
    usage = result.usage_summary.model_usage_summaries["m"]
    assert usage.total_calls == 3  # root turn, child turn, leaf call
    assert usage.total_input_tokens == expected_in
    rlm_call = next(result.graph.records(NodeKind.RLM_CALL))
    child_nodes = [r for r in leaves if r.completion == rlm_call.id]
    assert rlm_call.usage is not None
    assert rlm_call.usage.input_tokens == sum(r.usage.input_tokens for r in child_nodes)  # type: ignore[union-attr]


def test_fifty_children_calling_llm_query_batched_do_not_deadlock() -> None:
    # More children in flight than trio's default thread limit (40): each child's block
    # holds a worker thread while it waits on its own batch.
    respond = tree_model(
        # The answer is the count of good slots, then what the first bad ones said.
        root_code="r = rlm_query_batched([f'c{i}' for i in range(50)])\n"
        "bad = [x for x in r if not x.startswith('ok')]\n"
        "FINAL(' '.join([str(len(r) - len(bad))] + bad[:2]))",
        child_code="r = llm_query_batched([context + '-a', context + '-b'])\nFINAL('ok ' + ','.join(r))",
    )
    engine = RLM(
        "scripted",
        {"respond": respond, "latency": 0.05, "max_concurrent": 64},
        max_depth=2,
        max_concurrent_subcalls=50,
        batch_max_concurrent=50,
        max_timeout=60,
    )
    result = engine.completion("ctx")
    assert result.stop_reason is None
    assert result.response == "50"
    assert peak_children(result) > 40


def test_concurrent_children_never_see_each_others_output() -> None:
    child_code = (
        "import time\n"
        "for i in range(200):\n"
        "    print(context)\n"
        "    if i % 50 == 0: time.sleep(0.001)\n"
        "FINAL('ok')"
    )
    outputs: list[str] = []

    def respond(request: ChatRequest) -> str:
        if not is_root_turn(request):
            return "sub"
        if request.depth == 0:
            if turn_number(request) == 1:
                return repl(
                    "r = rlm_query_batched([f'child-{i}' for i in range(8)])\nFINAL(','.join(r))"
                )
            return repl("FINAL('x')")
        if turn_number(request) == 1:
            return repl(child_code.replace("FINAL('ok')", "pass"))
        outputs.append(request.messages[-1].content)
        return repl("FINAL('ok')")

    engine = RLM("scripted", {"respond": respond}, max_depth=2, max_concurrent_subcalls=8)
    result = engine.completion("ctx")
    assert result.response == ",".join(["ok"] * 8)
    assert len(outputs) == 8
    for feedback in outputs:
        lines = [ln for ln in feedback.splitlines() if ln.startswith("child-")]
        assert len(lines) == 200
        assert len(set(lines)) == 1, "a child received another child's printed output"


def test_blocks_never_change_the_working_directory_and_files_land_in_scratch() -> None:
    cwd = os.getcwd()

    def respond(request: ChatRequest) -> str:
        if request.depth == 0 and turn_number(request) == 1:
            return repl("r = rlm_query_batched([f'n{i}' for i in range(6)])\nFINAL(','.join(r))")
        code = (
            "import os\n"
            "with open('note.txt', 'w') as f: f.write(context)\n"
            "with open('note.txt') as f: mine = f.read()\n"
            "FINAL(mine + ':' + str(os.path.isabs(SCRATCH_DIR)))"
        )
        return repl(code)

    engine = RLM("scripted", {"respond": respond}, max_depth=2, max_concurrent_subcalls=6)
    result = engine.completion("ctx")
    assert result.response == ",".join(f"n{i}:True" for i in range(6))
    assert os.getcwd() == cwd
    assert not os.path.exists(os.path.join(cwd, "note.txt"))


@pytest.mark.parametrize("depth", [1])
def test_children_get_custom_sub_tools_not_the_roots(depth: int) -> None:
    respond = tree_model(
        root_code="FINAL(rlm_query('x') + ' ' + root_tool())",
        child_code="FINAL(str('root_tool' in dir()) + ' ' + child_tool())",
    )
    engine = RLM(
        "scripted",
        {"respond": respond},
        max_depth=2,
        custom_tools={"root_tool": lambda: "R"},
        custom_sub_tools={"child_tool": lambda: "C"},
    )
    assert engine.completion("ctx").response == "False C R"


@pytest.mark.processes
def test_a_run_under_a_tracer_or_profiler_finishes() -> None:
    # Coverage tools, debuggers and profilers install a trace function; the local
    # environment's thread interrupts must not hang the process under one.
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import sys
        from rlm_graph import RLM
        def respond(request):
            if any(m.role == "system" for m in request.messages):
                return "```repl\\nr = llm_query_batched(['a', 'b'])\\nFINAL(','.join(r))\\n```"
            return request.prompt.upper()
        sys.settrace(lambda *args: None)
        print(RLM("scripted", {"respond": respond}, environment_kwargs={"timeout": 5}).completion("x").response)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "A,B"


def test_the_subcall_callbacks_name_the_childs_model_when_rlm_query_names_none() -> None:
    """The reference passes the resolved model to on_subcall_start/complete; a child
    with no model named runs on the default for its depth (the sub-call backend)."""
    respond = tree_model(root_code="FINAL(rlm_query('task'))", child_code="FINAL('done')")
    seen: list[tuple[str, object]] = []
    engine = RLM(
        "scripted",
        {"respond": respond, "model_name": "root-model"},
        other_backends=["scripted"],
        other_backend_kwargs=[{"respond": respond, "model_name": "sub-model"}],
        max_depth=2,
        on_subcall_start=lambda depth, model, prompt: seen.append(("start", model)),
        on_subcall_complete=lambda depth, model, seconds, error: seen.append(("end", model)),
    )
    assert engine.completion("ctx").response == "done"
    assert seen == [("start", "sub-model"), ("end", "sub-model")]
