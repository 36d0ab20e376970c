"""The plugin host: entry points, plugins in code, unknown names, observers."""

from __future__ import annotations

import asyncio
import json
import re
import traceback
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rlm_graph import ChatResponse, Engine, Workflow, hookimpl
from rlm_graph.cli import main
from rlm_graph.contracts import ExecResult, Usage
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


def test_a_register_hook_that_forgot_its_return_is_said(caplog: pytest.LogCaptureFixture) -> None:
    """pluggy leaves a None answer out: the engine then said only "unknown backend"."""

    class Forgot:
        @hookimpl
        def rlm_register_providers(self) -> None:
            {"mine": object}  # noqa: B018 - the mistake under test

    with caplog.at_level("WARNING", logger="rlm_graph"):
        host = PluginHost([Forgot()])
    assert "mine" not in host.names("providers")
    assert "rlm_register_providers returned None, so it registers nothing" in caplog.text
    assert "a forgotten return?" in caplog.text


def test_a_register_hook_taking_arguments_is_refused_in_one_line_naming_the_rule() -> None:
    class Configured:
        @hookimpl
        def rlm_register_providers(self, config: object) -> dict[str, object]:
            return {}

    with pytest.raises(PluginError) as refused:
        PluginHost([Configured()], entry_points=False)
    said = str(refused.value)
    assert said.startswith("cannot register plugin Configured object (registered in code): ")
    assert "rlm_register_providers(config" in said and "\n" not in said
    assert "the rlm_register_* hooks none but self" in said


def test_two_plugins_in_code_registering_one_name_warn_and_the_later_is_used(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def registering(reply: str) -> object:
        class Registers:
            @hookimpl
            def rlm_register_providers(self) -> dict[str, object]:
                return {"twice-named": lambda **_: ConstantProvider(text=reply)}

        return Registers()

    with caplog.at_level("WARNING", logger="rlm_graph"):
        engine = Engine("twice-named", plugins=[registering("first"), registering("second")])
    wf = Workflow()
    node = wf.llm("q")
    assert engine.run(wf)[node] == "second"
    assert "backend 'twice-named' is registered by two plugins passed in code" in caplog.text


def test_an_async_observer_hook_is_refused_as_it_would_never_run() -> None:
    """Hooks are called, not awaited: an async one only made a coroutine nobody awaited."""

    class Metrics:
        @hookimpl
        async def rlm_node_finished(self, record: object) -> None:
            pass

    with pytest.raises(PluginError, match="hook rlm_node_finished is async, and would never run"):
        Engine("scripted", {"responses": []}, observers=[Metrics()])


def test_a_negative_token_count_fails_the_call_instead_of_shrinking_the_totals() -> None:
    """A provider passing on a server's bogus ``prompt_tokens: -5000``: the totals went
    down with every call and ``max_tokens`` was never reached."""

    class Bogus:
        name, model, max_concurrent = "bogus", "m", 4

        async def complete(self, request: object) -> ChatResponse:
            return ChatResponse(content="x", usage=Usage(input_tokens=-5000, output_tokens=10))

        async def aclose(self) -> None:
            pass

    wf = Workflow()
    refs = [wf.llm(f"q{i}") for i in range(3)]
    result = Engine(Bogus(), max_tokens=1000).run(wf)
    assert all("input_tokens" in result.errors[ref.id] for ref in refs)
    assert all(r.usage is None or r.usage.total_tokens >= 0 for r in result.graph.records())


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


@pytest.mark.parametrize("error", [RuntimeError("observer bug"), SystemExit("observer bug")])
def test_a_failing_observer_is_logged_and_the_run_goes_on(
    error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    """An observer's ``sys.exit()`` (SystemExit) went through the guard and ended the run."""

    class Broken:
        @hookimpl
        def rlm_node_finished(self, record: object, graph: object) -> None:
            raise error

    engine = Engine("scripted", {"respond": lambda r: "ok"}, observers=[Broken()])
    wf = Workflow()
    node = wf.llm("q")
    assert engine.run(wf)[node] == "ok"
    assert "failed in rlm_node_finished on node llm-1" in caplog.text
    assert "observer bug" in caplog.text


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


@pytest.mark.parametrize("error", [KeyError("MY_PLUGIN_REQUIRED_VAR"), SystemExit("MY_PLUGIN")])
def test_a_plugin_in_code_whose_hook_raises_is_named_with_its_hook(error: BaseException) -> None:
    """A hook's ``sys.exit()`` ended the program that built the engine, unnamed."""

    class Failing:
        @hookimpl
        def rlm_register_providers(self) -> dict[str, object]:
            raise error

    with pytest.raises(
        PluginError,
        match=rf"plugin .*Failing \(registered in code\): rlm_register_providers raised {type(error).__name__}: '?MY_PLUGIN",
    ):
        PluginHost([Failing()], entry_points=False)


def test_a_provider_that_exits_fails_its_slot_named_not_the_run() -> None:
    """A provider's ``sys.exit()`` passed the engine's guard: the whole run ended with
    SystemExit and the batch's other slots were lost."""
    from rlm_graph import RLM

    def respond(request: Any) -> str:
        text = request.messages[-1].content
        if "```repl" in str(request.messages[0].content) and "exit" not in str(text):
            return "```repl\nFINAL(' | '.join(llm_query_batched(['ok', 'exit'])))\n```"
        if "exit" in str(text):
            raise SystemExit(1)
        return "fine"

    result = RLM("scripted", {"respond": respond}).completion("ctx")
    first, second = result.response.split(" | ")
    assert first == "fine"
    assert second.startswith("[ERROR] PluginError: provider 'scripted' answered with SystemExit")


def test_models_a_plugin_registers_are_checked_and_a_dict_is_read_as_model_info() -> None:
    class AsDict:
        @hookimpl
        def rlm_register_models(self) -> dict[str, object]:
            return {"tiny-model": {"context_window": 1000, "input_usd_per_mtok": 0.5}}

    host = PluginHost([AsDict()], entry_points=False)
    assert host.models["tiny-model"].context_window == 1000

    class BadValue:
        @hookimpl
        def rlm_register_models(self) -> dict[str, object]:
            return {"tiny-model": {"context_window": "lots"}}

    with pytest.raises(
        PluginError,
        match=r"rlm_register_models\['tiny-model'\] is not a ModelInfo \(context_window",
    ):
        PluginHost([BadValue()], entry_points=False)

    class NotADict:
        @hookimpl
        def rlm_register_models(self) -> list[str]:
            return ["tiny-model"]

    with pytest.raises(PluginError, match="rlm_register_models must return a dict"):
        PluginHost([NotADict()], entry_points=False)


def test_a_registered_name_must_be_text() -> None:
    class NumberName:
        @hookimpl
        def rlm_register_providers(self) -> dict[object, object]:
            return {1: ConstantProvider}

    with pytest.raises(PluginError, match="returned the name 1; names are strings"):
        PluginHost([NumberName()], entry_points=False)


@pytest.mark.parametrize(
    ("plugins", "shown"),
    [
        ([ConstantPlugin], "the class ConstantPlugin"),
        ([None], "None"),
        (["rlm_graph_echo"], "'rlm_graph_echo'"),
    ],
)
def test_plugins_that_are_not_plugin_objects_are_refused_with_the_fix(
    plugins: list[object], shown: str
) -> None:
    with pytest.raises(
        PluginError, match=f"cannot register {shown} as a plugin .* plugins=\\[MyPlugin\\(\\)\\]"
    ):
        Engine("scripted", {"responses": []}, plugins=plugins)


def test_plugins_given_as_one_object_not_a_list_are_refused() -> None:
    with pytest.raises(
        PluginError,
        match=r"plugins must be a list .* not ConstantPlugin; pass plugins=\[MyPlugin\(\)\]",
    ):
        Engine("scripted", {"responses": []}, plugins=ConstantPlugin())  # type: ignore[arg-type]


def test_one_failing_observer_does_not_silence_the_others(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    class Counting:
        @hookimpl
        def rlm_node_finished(self, record: object, graph: object) -> None:
            seen.append(getattr(record, "id", "?"))

    class Failing:
        @hookimpl
        def rlm_node_finished(self, record: object, graph: object) -> None:
            raise RuntimeError("observer bug")

    for observers in ([Counting(), Failing()], [Failing(), Counting()]):
        seen.clear()
        engine = Engine("scripted", {"respond": lambda r: "ok"}, observers=observers)
        wf = Workflow()
        node = wf.llm("q")
        assert engine.run(wf)[node] == "ok"
        assert seen == [node.id]
    assert "observer" in caplog.text and "Failing" in caplog.text and "observer bug" in caplog.text


def _provider(**fields: object) -> object:
    """A ConstantProvider with some of its fields replaced."""
    provider = ConstantProvider()
    for name, value in fields.items():
        setattr(provider, name, value)
    return provider


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"max_concurrent": "4"}, "max_concurrent must be a whole number >= 1, not '4'"),
        ({"max_concurrent": 0}, "max_concurrent must be a whole number >= 1, not 0"),
        ({"model": None}, "model must be a non-empty string, not None"),
        ({"tokens_per_minute": "abc"}, "tokens_per_minute must be a positive number, or None"),
        ({"requests_per_minute": -5}, "requests_per_minute must be a positive number, or None"),
        ({"tokens_per_minute": float("inf")}, "tokens_per_minute must be .* not inf"),
        ({"requests_per_minute": float("nan")}, "requests_per_minute must be .* not nan"),
        ({"default_max_tokens": "lots"}, "default_max_tokens must be a whole number >= 1"),
        ({"reports_cost": "no"}, "reports_cost must be True or False, not 'no'"),
        ({"streams": True}, "streams is True but it has no stream\\(request, sink\\) method"),
        ({"complete": None}, "complete is not a method"),
    ],
)
def test_a_providers_fields_are_checked_when_the_engine_is_built(
    fields: dict[str, object], said: str
) -> None:
    if "complete" not in fields:  # an object without complete() is no provider at all
        with pytest.raises(
            PluginError, match=f"backend ConstantProvider \\(ConstantProvider\\): {said}"
        ):
            Engine(_provider(**fields))  # type: ignore[arg-type]

    class Registering:
        @hookimpl
        def rlm_register_providers(self) -> dict[str, object]:
            return {"odd": lambda **_: _provider(**fields)}

    with pytest.raises(PluginError, match=f"backend 'odd' \\(ConstantProvider\\): {said}"):
        Engine("odd", plugins=[Registering()])


def test_a_provider_answering_outside_the_contract_fails_its_node_with_the_fix() -> None:
    class Sync(ConstantProvider):
        def complete(self, request: object) -> ChatResponse:  # type: ignore[override]
            return ChatResponse(content="sync")

    class Text(ConstantProvider):
        async def complete(self, request: object) -> str:  # type: ignore[override]
            return "just text"

    class AsyncioTimer(ConstantProvider):  # an asyncio-only client, say aiohttp
        async def complete(self, request: object) -> ChatResponse:
            await asyncio.sleep(0.01)
            return ChatResponse(content="never")

    class AsyncioYield(ConstantProvider):
        async def complete(self, request: object) -> ChatResponse:
            await asyncio.sleep(0)
            return ChatResponse(content="never")

    for provider, said in (
        (
            Sync(),
            "answered with ChatResponse, not an awaitable; define complete\\(\\) with async def",
        ),
        (Text(), "answered with str, not a ChatResponse; return rlm_graph.contracts.ChatResponse"),
        (
            AsyncioTimer(),
            "answered with RuntimeError, asyncio's error \\(no running event loop\\); complete\\(\\) "
            "runs on trio's loop, not asyncio's: use a client that runs under trio",
        ),
        (AsyncioYield(), "answered with TypeError, asyncio's error \\(trio.run received"),
    ):
        wf = Workflow()
        node = wf.llm("q")
        result = Engine(provider).run(wf)  # type: ignore[arg-type]
        assert not result.ok
        assert re.search(f"provider 'constant' {said}", result.errors[node.id]), result.errors


def test_a_plain_def_aclose_does_not_lose_the_answer() -> None:
    class PlainClose(ConstantProvider):
        def aclose(self) -> None:  # type: ignore[override]
            pass

    wf = Workflow()
    node = wf.llm("q")
    assert Engine(PlainClose()).run(wf)[node] == "hi"  # type: ignore[arg-type]


def test_a_bug_inside_a_provider_factory_is_not_blamed_on_the_keywords() -> None:
    class Buggy:
        @hookimpl
        def rlm_register_providers(self) -> dict[str, object]:
            def factory(*, model_name: str = "x") -> object:
                return len(5)  # type: ignore[arg-type]

            return {"buggy": factory}

    with pytest.raises(
        PluginError, match="backend 'buggy' failed to build: object of type 'int' has no len"
    ):
        Engine("buggy", {"model_name": "m"}, plugins=[Buggy()])
    with pytest.raises(ConfigError, match="backend 'buggy' rejected its backend_kwargs"):
        Engine("buggy", {"modle_name": "m"}, plugins=[Buggy()])


def test_a_registered_compaction_or_environment_that_is_no_such_thing_is_named() -> None:
    from rlm_graph import RLM

    class Odd:
        @hookimpl
        def rlm_register_compaction_strategies(self) -> dict[str, object]:
            return {"odd-compaction": lambda **_: object()}

        @hookimpl
        def rlm_register_environments(self) -> dict[str, object]:
            return {"odd-env": lambda **_: object()}

    with pytest.raises(
        PluginError,
        match="compaction 'odd-compaction': its factory made object, which has no should_compact",
    ):
        RLM("scripted", {"responses": []}, compaction="odd-compaction", plugins=[Odd()])
    rlm = RLM(
        "scripted",
        {"responses": ["```repl\nprint(1)\n```"]},
        environment="odd-env",
        plugins=[Odd()],
    )
    with pytest.raises(
        PluginError, match="made object, which has no start\\(\\); an environment must follow"
    ):
        rlm.completion("context")


def _environment(execute: Any, closes: list[int], start_fails: bool = False) -> type:
    """An environment plugin whose ``execute`` is ``execute``; ``closes`` counts closes."""

    class Env:
        def __init__(self, **_: object) -> None:
            pass

        async def start(self) -> None:
            if start_fails:
                raise RuntimeError("the container did not start")

        async def add_context(self, value: object, index: int) -> None:
            pass

        async def add_history(self, messages: object, index: int) -> None:
            pass

        async def set_variable(self, name: str, value: object) -> None:
            pass

        async def reset_answer(self) -> None:
            pass

        async def answer_content(self) -> str:
            return ""

        async def aclose(self) -> None:
            closes.append(1)

    Env.execute = execute  # type: ignore[attr-defined]
    return Env


async def _answers_text(self: object, code: str) -> str:
    return "done"


def _plain_execute(self: object, code: str) -> ExecResult:
    return ExecResult(final_answer="done")


@pytest.mark.parametrize(
    ("execute", "start_fails", "error"),
    [
        (_answers_text, False, "execute\\(\\) answered with str, not an ExecResult; return"),
        (_plain_execute, False, "can't be used in 'await' expression"),
        (_answers_text, True, "the container did not start"),
    ],
    ids=["answers-text", "plain-def", "start-fails"],
)
def test_an_environment_plugin_outside_its_contract_is_named_and_closed_once(
    execute: Any, start_fails: bool, error: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An execute() answering text failed with an AttributeError from inside the engine's
    loop; a plain def one is warned of when the environment is made (it may return an
    awaitable: one delegating to another's); one whose start() failed was closed twice."""
    from rlm_graph import RLM

    closes: list[int] = []

    class Plugin:
        @hookimpl
        def rlm_register_environments(self) -> dict[str, object]:
            return {"mine": _environment(execute, closes, start_fails)}

    rlm = RLM(
        "scripted",
        {"responses": ["```repl\nFINAL('done')\n```"]},
        environment="mine",
        plugins=[Plugin()],
    )
    with caplog.at_level("WARNING", logger="rlm_graph"):
        with pytest.raises((PluginError, RuntimeError, TypeError), match=error):
            rlm.completion("context")
    assert len(closes) == 1
    plain = "Env.execute() is a plain def, and the engine awaits it" in caplog.text
    assert plain == (execute is _plain_execute)


def test_a_compaction_strategy_with_async_and_sync_swapped_is_named() -> None:
    """An async should_compact was always true (a coroutine), compacting every turn; a
    plain compact() failed with a TypeError from inside the engine."""
    from rlm_graph import RLM

    class AsyncCheck:
        async def should_compact(self, *args: object) -> bool:
            return False

        async def compact(self, messages: object) -> ChatResponse:
            return ChatResponse(content="summary")

    with pytest.raises(PluginError, match="async def should_compact\\(\\), which the engine calls"):
        RLM("scripted", {"responses": []}, compaction=AsyncCheck())


REPLY = "```repl\nFINAL('done')\n```"


class _Streams:
    """A streaming provider (``streams = True``) whose ``stream`` is set per test."""

    name, model, max_concurrent, streams = "streams", "m", 4, True

    async def complete(self, request: object) -> ChatResponse:
        return ChatResponse(content=REPLY)

    async def aclose(self) -> None:
        pass


async def _str_offset(self: object, request: object, sink: Any) -> ChatResponse:
    sink("0", REPLY)
    return ChatResponse(content=REPLY)


async def _bytes_text(self: object, request: object, sink: Any) -> ChatResponse:
    sink(0, REPLY.encode())
    return ChatResponse(content=REPLY)


def _plain_stream(self: object, request: object, sink: Any) -> ChatResponse:
    return ChatResponse(content=REPLY)


@pytest.mark.parametrize(
    ("stream", "error"),
    [
        (_str_offset, "called its sink with \\(str, str\\); a TextSink takes \\(offset: int"),
        (_bytes_text, "called its sink with \\(int, bytes\\)"),
        (_plain_stream, "not an awaitable; define stream\\(\\) with async def"),
    ],
    ids=["str-offset", "bytes-text", "plain-def-stream"],
)
def test_a_streaming_provider_outside_its_contract_is_named(stream: Any, error: str) -> None:
    """A TypeError from the block cutter, or advice to fix complete(), before."""
    from rlm_graph import RLM

    provider = _Streams()
    provider.stream = stream.__get__(provider)  # type: ignore[attr-defined]
    with pytest.raises(PluginError, match=error):
        RLM(provider).completion("context")


def test_a_provider_error_whose_message_cannot_be_made_is_still_that_error() -> None:
    """An error class formatting a field its server left out: the node was marked
    cancelled and the completion raised the KeyError of ``__str__``, its own type lost."""
    from rlm_graph import RLM
    from rlm_graph.errors import ProviderError

    class ServerError(ProviderError):
        def __init__(self, body: dict[str, Any]) -> None:
            super().__init__("server error", provider="mine")
            self.body = body

        def __str__(self) -> str:
            return f"server said {self.body['error']['message']}"

    class Provider:
        name, model, max_concurrent = "mine", "m", 2

        async def complete(self, request: object) -> ChatResponse:
            raise ServerError({})

        async def aclose(self) -> None:
            pass

    wf = Workflow()
    ref = wf.llm("q")
    result = Engine(Provider()).run(wf)
    assert result.graph[ref.id].status == "error"
    assert result.errors[ref.id].startswith("[ERROR] ServerError: (its message could not be made")
    with pytest.raises(ServerError):
        RLM(Provider()).completion("context")
    # Traced too: the node's span takes the same note as its status's description.
    exporter = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(exporter))
    with pytest.raises(ServerError):
        RLM(Provider(), tracer_provider=tracing).completion("context")
    failed = [s for s in exporter.get_finished_spans() if s.status.description]
    assert any("its message could not be made" in str(s.status.description) for s in failed)


def test_an_asyncio_cancellation_from_a_provider_fails_its_slot_not_the_completion() -> None:
    """An asyncio SDK's CancelledError is a BaseException: it crashed the completion, and
    the other slot's answer was lost."""
    import asyncio

    from rlm_graph import RLM

    class Provider:
        name, model, max_concurrent = "p", "m", 4

        async def complete(self, request: Any) -> ChatResponse:
            if request.depth == 0:
                return ChatResponse(
                    content='```repl\nr = llm_query_batched(["a", "b"])\nFINAL(repr(r))\n```'
                )
            if request.prompt == "a":
                raise asyncio.CancelledError()
            return ChatResponse(content="fine")

        async def aclose(self) -> None:
            pass

    answers = eval(RLM(Provider()).completion("context").response)
    assert answers[1] == "fine"
    assert answers[0].startswith("[ERROR] PluginError: provider 'p' answered with CancelledError")


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (ValueError, "backend 'picky' failed to build: ValueError: cannot use key"),
        (SystemExit, "backend 'picky' failed to build: SystemExit: cannot use key"),
        (TypeError, "backend 'picky' failed to build: cannot use key"),  # a bug of its own
        (ConfigError, "cannot use key"),  # its own verdict, as it is
    ],
)
def test_a_provider_factory_that_fails_is_named_and_its_key_redacted(
    error: type[BaseException], said: str
) -> None:
    """A factory raising anything but a TypeError reached the user as a raw traceback
    (or, for ``sys.exit()``, ended the program); a key it quoted went along, and a
    `TypeError` whose keywords fit and its own `ConfigError` kept it in the message and
    the printed chain."""
    key = "sk-factory-quoted-0123456789"

    class Picky:
        def __init__(self, *, api_key: str) -> None:
            raise error(f"cannot use key {api_key}")

    class Registers:
        @hookimpl
        def rlm_register_providers(self) -> dict[str, object]:
            return {"picky": Picky}

    with pytest.raises(ConfigError) as failed:
        Engine("picky", {"api_key": key}, plugins=[Registers()])
    assert str(failed.value).startswith(f"{said} [REDACTED]")
    printed = "".join(traceback.format_exception(failed.value))
    assert key not in printed


class _Unclosable(ConstantProvider):
    """A provider whose ``aclose`` hangs or raises; ``closed`` is set when it is done."""

    def __init__(self, how: str, model_name: str) -> None:
        super().__init__(model_name=model_name, text=model_name)
        self.how = how
        self.closed = False

    async def aclose(self) -> None:
        import trio

        if self.how == "hangs":
            await trio.sleep(20)  # "for ever"; bounded so that a regression fails, not hangs
        if self.how == "raises":
            raise RuntimeError("the pool is already gone")
        self.closed = True


@pytest.mark.parametrize("how", ["hangs", "raises"])
def test_a_provider_that_cannot_close_loses_neither_the_result_nor_the_others_close(
    how: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A provider's ``aclose`` that never returned hung ``Engine.run`` after the run was
    done (the close is shielded); one that raised threw the finished result away and
    left the next provider open."""
    import rlm_graph.engine

    monkeypatch.setattr(rlm_graph.engine, "CLOSE_SECONDS", 0.2)
    first, second = _Unclosable(how, "first"), _Unclosable("closes", "second")
    engine = Engine(first, other_backends=[second])
    wf = Workflow()
    one, two = wf.llm("q", model="first"), wf.llm("q", model="second")
    result = engine.run(wf)
    assert (result[one], result[two]) == ("first", "second")
    assert second.closed and not first.closed
    said = "did not close within 0.2 s" if how == "hangs" else "failed to close (RuntimeError"
    assert said in caplog.text


def test_an_environment_whose_close_hangs_is_left_and_the_answer_kept(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An environment's ``aclose`` that never returned held the completion for ever (it
    is shielded, so ``max_timeout`` could not end it): a batch or an MCP server hung."""
    import trio

    from rlm_graph import RLM
    from rlm_graph.runtime import session
    from rlm_graph_local import LocalEnvironment

    class Stuck(LocalEnvironment):
        async def aclose(self) -> None:
            await super().aclose()
            await trio.sleep(20)  # "for ever"; bounded so that a regression fails, not hangs

    class Plugin:
        @hookimpl
        def rlm_register_environments(self) -> dict[str, object]:
            return {"stuck": Stuck}

    monkeypatch.setattr(session, "CLOSE_SECONDS", 0.2)
    rlm = RLM(
        "scripted",
        {"responses": ["```repl\nFINAL('done')\n```"]},
        environment="stuck",
        plugins=[Plugin()],
    )
    with caplog.at_level("WARNING", logger="rlm_graph"):
        assert rlm.completion("context").response == "done"
    assert "environment Stuck did not close within 0.2 s" in caplog.text
