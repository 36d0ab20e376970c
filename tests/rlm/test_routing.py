"""Which provider serves a call: by depth (other_backends) and by model name."""

from __future__ import annotations

import pytest

from rlm_graph import RLM, NodeKind, NodeStatus
from rlm_graph.contracts import ChatRequest
from rlm_graph.errors import ConfigError
from tests.support.scripts import is_root_turn, repl, scripted


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
        {
            "model_name": "root-model",
            "respond": root,
            "rules": [("unknown", lambda r: f"root-served:{r.model}")],
        },
        other_backends=["scripted", "scripted"],
        other_backend_kwargs=[
            {"model_name": "cheap-model", "respond": lambda r: f"cheap:{r.prompt}"},
            {"model_name": "big-model", "respond": lambda r: f"big:{r.prompt}"},
        ],
        allowed_models=["some-other-model"],
    )
    result = engine.completion("ctx")
    assert result.response == "cheap:plain | big:pick big | root-served:some-other-model"
    models = {r.input_preview: r.model for r in result.graph.records(NodeKind.LLM_CALL)}
    assert models == {
        "plain": "cheap-model",
        "pick big": "big-model",
        "unknown": "some-other-model",
    }
    usage = result.usage_summary.model_usage_summaries
    assert set(usage) == {"root-model", "cheap-model", "big-model", "some-other-model"}
    assert usage["root-model"].total_calls == 1


def test_without_other_backends_everything_uses_the_main_backend() -> None:
    def respond(request: ChatRequest) -> str:
        return repl("FINAL(llm_query('x'))") if is_root_turn(request) else "sub"

    result = RLM("scripted", {"model_name": "only", "respond": respond}).completion("ctx")
    assert list(result.usage_summary.model_usage_summaries) == ["only"]
    assert result.usage_summary.model_usage_summaries["only"].total_calls == 2


def test_model_code_cannot_name_a_model_nobody_configured() -> None:
    """The attacker is the model's code: any other name fails its slot before a request."""

    def respond(request: ChatRequest) -> str:
        if is_root_turn(request):
            return repl(
                "a = llm_query('x', model='gpt-5-pro')\n"
                "b = llm_query_batched(['y', 'z'], model='o3-pro')\n"
                "c = rlm_query('w', model='claude-opus-4-1')\n"
                "d = llm_query('v', model='cheap-model')\n"
                "FINAL(repr([a, b, c, d]))"
            )
        return f"served:{request.model}"

    rlm = RLM(
        "scripted",
        {"model_name": "root-model", "respond": respond},
        allowed_models=["cheap-model"],
    )
    result = rlm.completion("ctx")
    a, b, c, d = eval(result.response)  # the REPL's repr of the four results
    for slot, name in [
        (a, "gpt-5-pro"),
        (b[0], "o3-pro"),
        (b[1], "o3-pro"),
        (c, "claude-opus-4-1"),
    ]:
        assert slot.startswith("[ERROR] ConfigError: ")
        assert f"model={name!r}" in slot and "'root-model', 'cheap-model'" in slot
        assert "allowed_models" in slot
    assert d == "served:cheap-model"
    requested = [r.model for r in scripted(rlm).requests]
    assert set(requested) == {"root-model", "cheap-model"}
    failed = [r for r in result.graph.records() if r.status == NodeStatus.ERROR]
    assert len(failed) == 4 and {r.error_type for r in failed} == {"ConfigError"}


def test_allowed_models_must_be_a_list_of_names() -> None:
    with pytest.raises(
        ConfigError, match=r"allowed_models must be a list of model names, e.g. \['m'\]"
    ):
        RLM("scripted", allowed_models="m")  # type: ignore[arg-type]


def test_a_provider_is_named_by_its_backend_with_an_index_only_where_two_share_it() -> None:
    """What the concurrency events and ``-v`` call a provider (docs/observing.md)."""
    engine = RLM(
        "scripted",
        {"model_name": "root-model", "respond": lambda r: "x"},
        other_backends=["scripted", "openai"],
        other_backend_kwargs=[
            {"model_name": "cheap-model", "respond": lambda r: "y"},
            {"model_name": "gpt-test", "base_url": "http://127.0.0.1:9/v1", "api_key": "k"},
        ],
    )
    names = engine.engine.router.names
    assert names == {"scripted/0": "scripted/0", "scripted/1": "scripted/1", "openai/2": "openai"}


def test_a_backend_whose_name_looks_like_another_s_key_keeps_its_own_name() -> None:
    from rlm_graph.routing import ProviderRouter
    from rlm_graph_scripted import ScriptedProvider

    providers = [
        ("x/0", ScriptedProvider(model_name="a")),
        ("x/0/1", ScriptedProvider(model_name="b")),
    ]
    names = ProviderRouter(providers, labels=["x", "x/0"]).names
    assert names == {"x/0": "x", "x/0/1": "x/0/1"}  # never the first one's key as a name
    assert len(set(names.values())) == len(names)
