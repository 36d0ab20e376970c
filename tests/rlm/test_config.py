"""Configuration details of the facade: compaction objects, the model table."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from rlm_graph import RLM, ModelInfo, hookimpl
from rlm_graph.contracts import Message
from rlm_graph.errors import ConfigError
from rlm_graph.hooks import PluginHost


class KeepAll:
    name = "keep-all"

    def should_compact(self, messages: Sequence[Message], **kwargs: object) -> bool:
        return False

    async def compact(self, messages: Sequence[Message], ctx: object) -> list[Message]:
        return list(messages)


def test_compaction_takes_a_strategy_object() -> None:
    strategy = KeepAll()
    engine = RLM("scripted", {"responses": []}, compaction=strategy)
    assert engine.settings.compaction is strategy
    with pytest.raises(ConfigError, match="has no should_compact"):
        RLM("scripted", {"responses": []}, compaction=object())


def test_compaction_kwargs_reach_the_strategy_and_bad_ones_are_named() -> None:
    with pytest.raises(ConfigError, match="rejected compaction_kwargs"):
        RLM("scripted", {"responses": []}, compaction="truncate", compaction_kwargs={"nope": 1})


def test_model_tables_from_two_plugins_merge_field_by_field() -> None:
    class Windows:
        @hookimpl
        def rlm_register_models(self) -> dict[str, ModelInfo]:
            return {"m": ModelInfo(context_window=1000)}

    class Prices:
        @hookimpl
        def rlm_register_models(self) -> dict[str, ModelInfo]:
            return {"m": ModelInfo(input_usd_per_mtok=1.0, output_usd_per_mtok=2.0)}

    info = PluginHost([Windows(), Prices()], entry_points=False).models["m"]
    assert info == ModelInfo(context_window=1000, input_usd_per_mtok=1.0, output_usd_per_mtok=2.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend_kwargs": [1, 2]}, "must be a dict"),
        ({"custom_tools": [1]}, "custom_tools must be a dict"),
        ({"other_backends": "scripted"}, "other_backends must be a list"),
        ({"max_depth": "2"}, "max_depth"),
        ({"max_iterations": True}, "max_iterations"),
        (
            {"environment_kwargs": {"bogus": 1}},
            "does not take environment_kwargs \\['bogus'\\]; it takes timeout, scratch_dir, "
            "output_cap, stop_grace, subcalls",
        ),
        ({"environment_kwargs": {"timeout": -1}}, "timeout must be a positive"),
        (
            {"environment": "subprocess", "environment_kwargs": {"memory_limit_mb": "lots"}},
            "memory_limit_mb",
        ),
        ({"backend_kwargs": {"rules": {"x": "y"}}}, "rules must be a list"),
    ],
)
def test_bad_input_is_refused_when_the_rlm_is_built(
    kwargs: dict[str, object], message: str
) -> None:
    backend_kwargs = kwargs.pop("backend_kwargs", {"responses": []})
    with pytest.raises(ConfigError, match=message):
        RLM("scripted", backend_kwargs, **kwargs)  # type: ignore[arg-type]


async def test_the_sync_api_inside_trio_points_to_the_async_one() -> None:
    engine = RLM("scripted", {"responses": []})
    with pytest.raises(ConfigError, match="use `await rlm.acompletion"):
        engine.completion("x")


@pytest.mark.processes
def test_ctrl_c_reaches_the_caller_as_a_plain_keyboard_interrupt() -> None:
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import os, signal, threading
        from rlm_graph import RLM
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            RLM("scripted", {"respond": lambda r: "```repl\\nwhile True:\\n    pass\\n```"}).completion("x")
        except KeyboardInterrupt:
            print("KeyboardInterrupt")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "KeyboardInterrupt", done.stderr


def test_reference_keywords_sampling_args_and_iteration_callbacks() -> None:
    from rlm_graph.contracts import ChatRequest
    from tests.support.scripts import is_root_turn, repl

    seen: list[ChatRequest] = []
    turns: list[tuple[str, int, int]] = []

    def respond(request: ChatRequest) -> str:
        seen.append(request)
        return repl("FINAL(llm_query('q'))") if is_root_turn(request) else "sub"

    engine = RLM(
        "scripted",
        {"respond": respond},
        sampling_args={"temperature": 0.2, "max_completion_tokens": 50, "reasoning_effort": "low"},
        sub_sampling_args={"temperature": 0.9},
        on_iteration_start=lambda depth, it: turns.append(("start", depth, it)),
        on_iteration_complete=lambda depth, it, seconds: turns.append(("end", depth, it)),
    )
    assert engine.completion("ctx").response == "sub"
    root, sub = seen
    assert (root.temperature, root.max_tokens, dict(root.extra)) == (
        0.2,
        50,
        {"reasoning_effort": "low"},
    )
    assert sub.temperature == 0.9 and sub.max_tokens is None
    assert turns == [("start", 0, 1), ("end", 0, 1)]
    with pytest.raises(ConfigError, match="sampling_args: temperature"):
        RLM("scripted", {"responses": []}, sampling_args={"temperature": "hot"})
    with pytest.raises(ConfigError, match="depth= is the reference"):
        RLM("scripted", {"responses": []}, depth=1)


def test_max_depth_zero_is_one_plain_call_without_a_repl() -> None:
    from rlm_graph import NodeKind

    engine = RLM("scripted", {"respond": lambda r: f"plain:{r.prompt[:12]}"}, max_depth=0)
    result = engine.completion("the context", root_prompt="Q?")
    assert result.response == "plain:Q?\n\nthe cont"
    assert [r.kind for r in result.graph.records()] == [NodeKind.LLM_CALL]


@pytest.mark.parametrize(
    ("keywords", "says"),
    [
        ({"custom_system_prompt": 5}, "custom_system_prompt must be a str"),
        ({"accept_text_final": "no"}, "accept_text_final must be True or False"),
        ({"persistent": "no"}, "persistent must be True or False"),
        ({"verbose": "x"}, "verbose must be True or False"),
        ({"record_content": "no"}, "record_content must be True or False"),
        ({"compaction_threshold_pct": "0.8"}, "compaction_threshold_pct must be"),
        ({"output_chars": "x"}, "output_chars must be a whole number"),
        ({"on_iteration_start": 5}, "on_iteration_start must be a function"),
        ({"compaction_kwargs": {"target_pct": 0.4}}, "compaction is off"),
        ({"models": [1]}, "models must be a dict"),
        ({"models": {"scripted": {"input_usd_per_mtok": -1}}}, "greater than or equal to 0"),
        ({"models": {"scripted": {"context_window": -5}}}, "context_window"),
        ({"sampling_args": {"max_tokens": -1}}, "max_tokens"),
    ],
)
def test_a_keyword_of_the_wrong_type_or_range_is_refused_when_built(
    keywords: dict[str, object], says: str
) -> None:
    """A truthy string would turn a feature on, a negative price would make max_budget
    never stop: each is refused at RLM(...), naming the keyword."""
    with pytest.raises(ConfigError, match=says):
        RLM("scripted", {"responses": []}, **keywords)  # type: ignore[arg-type]


def test_an_observer_that_implements_no_hook_is_refused() -> None:
    from rlm_graph.errors import PluginError

    class Forgot:  # methods without @hookimpl
        def rlm_node_finished(self, record: object, graph: object) -> None: ...

    for given in (5, object(), Forgot()):
        with pytest.raises(PluginError, match="implements no rlm-graph hook"):
            RLM("scripted", {"responses": []}, observers=[given])


def test_limits_for_one_completion_from_sync_code_and_bad_limits_named() -> None:
    from tests.support.scripts import repl

    engine = RLM("scripted", {"respond": lambda request: repl("print(1)")}, max_iterations=9)
    result = engine.completion("ctx", limits={"max_iterations": 2})
    assert result.stop_reason == "max_iterations" and result.iterations == 2
    with pytest.raises(ConfigError, match="limits must be a dict"):
        engine.completion("ctx", limits=["max_iterations"])  # type: ignore[arg-type]
