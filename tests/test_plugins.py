"""The plugin host: entry points, plugins in code, unknown names, observers."""

from __future__ import annotations

import json

import pytest

from rlm_graph import ChatResponse, Engine, Workflow, hookimpl
from rlm_graph.cli import main
from rlm_graph.errors import ConfigError, PluginError
from rlm_graph.hooks import PluginHost


class ConstantProvider:
    name = "constant"
    max_concurrent = 2

    def __init__(self, *, model_name: str = "constant", text: str = "hi") -> None:
        self.model = model_name
        self.text = text

    async def complete(self, request: object) -> ChatResponse:
        return ChatResponse(content=self.text)

    async def aclose(self) -> None:
        pass


class ConstantPlugin:
    @hookimpl
    def rlm_register_providers(self) -> dict[str, object]:
        return {"constant": ConstantProvider}


def test_first_party_plugins_come_from_entry_points() -> None:
    host = PluginHost()
    assert {"scripted", "openai", "anthropic"} <= set(host.names("providers"))
    assert "local" in host.names("environments")
    origins = {r.name: r.origin for r in host.registrations()}
    assert origins["scripted"] == "entry point 'scripted' of rlm-graph"


def test_a_provider_registered_in_code_is_used_by_name() -> None:
    engine = Engine("constant", {"text": "from a plugin"}, plugins=[ConstantPlugin()])
    wf = Workflow()
    node = wf.llm("q")
    assert engine.run(wf)[node] == "from a plugin"


def test_unknown_names_list_what_is_registered() -> None:
    with pytest.raises(PluginError) as info:
        Engine("nonexistent")
    message = str(info.value)
    assert "unknown backend 'nonexistent'" in message
    assert "scripted" in message and "openai" in message
    host = PluginHost()
    with pytest.raises(PluginError, match="unknown compaction strategy 'zip'; registered:"):
        host.lookup("compaction_strategies", "zip")


def test_bad_backend_kwargs_and_limits_fail_at_configuration() -> None:
    with pytest.raises(ConfigError, match="rejected its backend_kwargs"):
        Engine("scripted", {"no_such_option": 1})
    with pytest.raises(ConfigError, match="unknown keyword"):
        Engine("scripted", {}, max_tokenz=5)
    with pytest.raises(ConfigError, match="max_tokens"):
        Engine("scripted", {}, max_tokens=0)


def test_a_plugin_that_returns_garbage_is_named() -> None:
    class Broken:
        @hookimpl
        def rlm_register_providers(self) -> list[str]:
            return ["not", "a", "dict"]

    with pytest.raises(PluginError, match="must return a dict"):
        PluginHost([Broken()])


def test_plugins_command_lists_names_and_origins(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = {(r["category"], r["name"]) for r in rows}
    assert ("providers", "scripted") in names and ("environments", "local") in names


def test_a_misspelled_hook_is_refused_with_the_real_names() -> None:
    class Typo:
        @hookimpl
        def rlm_node_finishd(self, record: object, graph: object) -> None:
            pass

    with pytest.raises(
        PluginError, match="rlm_node_finishd.*rlm-graph hooks are: .*rlm_node_finished"
    ):
        Engine("scripted", {"responses": []}, observers=[Typo()])


def test_a_failing_observer_is_logged_and_the_run_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        @hookimpl
        def rlm_node_finished(self, record: object, graph: object) -> None:
            raise RuntimeError("observer bug")

    engine = Engine("scripted", {"respond": lambda r: "ok"}, observers=[Broken()])
    wf = Workflow()
    node = wf.llm("q")
    assert engine.run(wf)[node] == "ok"
    assert "observer failed on node" in caplog.text and "observer bug" in caplog.text


def test_a_provider_object_can_be_the_backend() -> None:
    from rlm_graph import RLM
    from rlm_graph_scripted import ScriptedProvider

    main = ScriptedProvider(respond=lambda r: "```repl\nFINAL(llm_query('x'))\n```")
    sub = ScriptedProvider(model_name="sub", respond=lambda r: "from sub")
    result = RLM(main, other_backends=[sub]).completion("ctx")
    assert result.response == "from sub"
    assert len(main.requests) == 1 and len(sub.requests) == 1
    with pytest.raises(ConfigError, match="provider object with complete"):
        Engine(main, {"model_name": "x"})


def test_a_plugin_module_registers_alike_in_every_engine_and_typos_still_fail() -> None:
    # Hook options of a module are parsed once per process and reused by every engine.
    import types

    module = types.ModuleType("constant_plugin_module")
    module.rlm_register_providers = hookimpl(lambda: {"constant": ConstantProvider})  # type: ignore[attr-defined]
    for _ in range(3):
        engine = Engine("constant", {"text": "again"}, plugins=[module])
        wf = Workflow()
        node = wf.llm("q")
        assert engine.run(wf)[node] == "again"
    typo = types.ModuleType("typo_plugin_module")
    typo.rlm_node_finishd = hookimpl(lambda record, graph: None)  # type: ignore[attr-defined]
    for _ in range(2):
        with pytest.raises(PluginError, match="rlm_node_finishd"):
            Engine("scripted", {"responses": []}, observers=[typo])
