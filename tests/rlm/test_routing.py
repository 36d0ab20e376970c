"""Which provider serves a call: by depth (other_backends) and by model name."""

from __future__ import annotations

from rlm_graph import RLM, NodeKind
from rlm_graph.contracts import ChatRequest

from .scripts import is_root_turn, repl


def test_sub_calls_go_to_the_first_other_backend_and_named_models_to_theirs() -> None:
    def root(request: ChatRequest) -> str:
        assert is_root_turn(request)
        return repl(
            "a = llm_query('plain')\n"
            "b = llm_query('pick big', model='big-model')\n"
            "c = llm_query('unknown', model='some-other-model')\n"
            "FINAL(' | '.join([a, b, c]))"
        )

    engine = RLM(
        "scripted",
        {"model_name": "root-model", "respond": root, "rules": [("unknown", lambda r: f"root-served:{r.model}")]},
        other_backends=["scripted", "scripted"],
        other_backend_kwargs=[
            {"model_name": "cheap-model", "respond": lambda r: f"cheap:{r.prompt}"},
            {"model_name": "big-model", "respond": lambda r: f"big:{r.prompt}"},
        ],
    )
    result = engine.completion("ctx")
    assert result.response == "cheap:plain | big:pick big | root-served:some-other-model"
    models = {r.input_preview: r.model for r in result.graph.records(NodeKind.LLM_CALL)}
    assert models == {"plain": "cheap-model", "pick big": "big-model", "unknown": "some-other-model"}
    usage = result.usage_summary.model_usage_summaries
    assert set(usage) == {"root-model", "cheap-model", "big-model", "some-other-model"}
    assert usage["root-model"].total_calls == 1


def test_without_other_backends_everything_uses_the_main_backend() -> None:
    def respond(request: ChatRequest) -> str:
        return repl("FINAL(llm_query('x'))") if is_root_turn(request) else "sub"

    result = RLM("scripted", {"model_name": "only", "respond": respond}).completion("ctx")
    assert list(result.usage_summary.model_usage_summaries) == ["only"]
    assert result.usage_summary.model_usage_summaries["only"].total_calls == 2
