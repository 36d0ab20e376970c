"""What code written for the reference library (``rlm``) does here: the replies its
models write, the prompts, errors and results its users handle. Each works as it did
there, or fails naming the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlm_graph import RLM
from rlm_graph.errors import (
    BudgetExceededError,
    ConfigError,
    ErrorThresholdExceededError,
    TimeoutExceededError,
    TokenLimitExceededError,
)
from rlm_graph.protocol import find_code_blocks
from rlm_graph.protocol.final import find_text_final
from rlm_graph.result import ModelUsageSummary, RLMChatCompletion, UsageSummary
from tests.support.scripts import scripted

BODY = 'answer["content"] = "ran"\nanswer["ready"] = True'


@pytest.mark.parametrize("environment", ["local", "subprocess"])
@pytest.mark.parametrize(
    "reply",
    [
        "```repl\r\n" + BODY.replace("\n", "\r\n") + "\r\n```\r\n",
        "Steps:\n1. Look:\n   ```repl\n   " + BODY.replace("\n", "\n   ") + "\n   ```\n",
        "Let me run: ```repl\n" + BODY + "\n```\n",
    ],
    ids=["CRLF line ends", "a fence in a list item", "words before the fence"],
)
def test_replies_the_reference_runs_are_run(reply: str, environment: str) -> None:
    """A reply with CRLF line ends had no block that ran (the model's turn was lost), and
    a fence indented in a list item ran its code indented (an IndentationError)."""
    rlm = RLM(
        "scripted", {"responses": [reply, "fallback"]}, max_iterations=1, environment=environment
    )
    assert rlm.completion("ctx").response == "ran"


def test_an_indented_fence_gives_its_code_without_the_indentation() -> None:
    reply = "1. First:\n    ```repl\n    x = 1\n    if x:\n        print(x)\n    ```\n"
    assert find_code_blocks(reply) == ["x = 1\nif x:\n    print(x)"]


@pytest.mark.parametrize(
    ("reply", "value"),
    [
        ("I found it.\nFINAL(The author's name is Bob)", "The author's name is Bob"),
        ('FINAL(The screen is 27" wide)', 'The screen is 27" wide'),
        ("FINAL (42)", "42"),
        ("I'd write a ```repl block, but I know.\nFINAL(42)", "42"),
        ("```repl\nprint('use ``` fences')\n```\nFINAL(42)", "42"),
        ("FINAL(\"a (quoted) ')' value\")", "a (quoted) ')' value"),
        ("Answer: ```repl\nFINAL(x)\n```\nFINAL(42)", "42"),
    ],
)
def test_a_text_final_the_papers_parser_reads_is_read(reply: str, value: str) -> None:
    """An apostrophe or an inch mark opened a string that never closed, a space before
    the parenthesis, and three backticks inside a line (taken for a fence to the reply's
    end) each lost a text ``FINAL`` (``accept_text_final=True``): the run went on."""
    found = find_text_final(reply)
    assert found is not None and (found.kind, found.value) == ("FINAL", value)


def test_a_final_in_a_block_opened_after_words_is_code_not_a_text_answer() -> None:
    reply = "I'll compute it: ```repl\nresult = 6 * 7\nFINAL(result)\n```"
    assert find_code_blocks(reply) == ["result = 6 * 7\nFINAL(result)"]
    assert find_text_final(reply) is None
    rlm = RLM("scripted", {"responses": [reply]}, accept_text_final=True)
    assert rlm.completion("ctx").response == "42"


def test_a_reference_style_custom_prompt_is_formatted_as_the_reference_does() -> None:
    """The reference formats ``custom_system_prompt`` with ``str.format``, so prompts
    written for it double their braces: the model got ``{{"content": ...}}``."""
    reference_style = (
        'Finish with answer = {{"content": x}}; loop with f"chunk {{i}}".{custom_tools_section}'
    )
    ours = 'Finish with answer = {"content": x}.{custom_tools_section}'
    for prompt, expected in [
        (reference_style, 'answer = {"content": x}; loop with f"chunk {i}".'),
        (ours, 'answer = {"content": x}.'),
    ]:
        rlm = RLM(
            "scripted",
            {"responses": ["```repl\nFINAL('x')\n```"]},
            custom_system_prompt=prompt,
            custom_tools={"lookup": {"tool": len, "description": "lookup(x) -> int"}},
        )
        rlm.completion("ctx")
        system = scripted(rlm).requests[0].messages[0].content
        assert expected in system and "lookup(x) -> int" in system
        assert "{{" not in system and "{custom_tools_section}" not in system
    odd = "Use {{x}}. Tools: {custom_tools_section[x]}"  # not a format string after all
    rlm = RLM("scripted", {"responses": ["```repl\nFINAL('x')\n```"]}, custom_system_prompt=odd)
    rlm.completion("ctx")
    assert scripted(rlm).requests[0].messages[0].content.startswith("Use {{x}}.")


def test_results_round_trip_through_the_reference_dict_shape() -> None:
    rlm = RLM("scripted", {"responses": ["```repl\nFINAL(llm_query('hi'))\n```"]})
    result = rlm.completion("ctx")
    data = json.loads(json.dumps(result.to_dict()))
    again = RLMChatCompletion.from_dict(data)
    assert (again.response, again.root_model, again.prompt) == (
        result.response,
        result.root_model,
        "ctx",
    )
    assert again.usage_summary == result.usage_summary
    model, usage = next(iter(result.usage_summary.model_usage_summaries.items()))
    assert usage.to_dict()["total_calls"] == usage.total_calls
    assert ModelUsageSummary.from_dict(usage.to_dict()) == usage
    assert UsageSummary.from_dict(result.usage_summary.to_dict()) == result.usage_summary
    reference = {
        "model_usage_summaries": {
            model: {"total_calls": 2, "total_input_tokens": 5, "total_output_tokens": 1}
        }
    }
    assert UsageSummary.from_dict(reference).total_calls == 2


def test_the_reference_error_names_catch_the_same_stops() -> None:
    assert TimeoutExceededError.limit_name == "max_timeout"
    assert TokenLimitExceededError.limit_name == "max_tokens"
    assert BudgetExceededError.limit_name == "max_budget"
    assert ErrorThresholdExceededError.limit_name == "max_errors"
    rlm = RLM(
        "scripted",
        {"responses": ['```repl\nanswer["content"] = "so far"\nprint(undefined)\n```'] * 3},
        max_errors=2,
        on_limit="raise",
    )
    with pytest.raises(ErrorThresholdExceededError) as caught:
        rlm.completion("ctx")
    assert caught.value.partial_answer == caught.value.partial == "so far"


@pytest.mark.parametrize(
    ("keyword", "fix"),
    [
        ("sampling_args", "RLM(sampling_args={...})"),
        ("default_headers", "backend_kwargs['headers']"),
        ("max_retries", "backend_kwargs['max_attempts']"),
    ],
)
def test_a_reference_client_keyword_names_where_it_goes(keyword: str, fix: str) -> None:
    kwargs = {"model_name": "gpt-x", "api_key": "sk-not-a-key", keyword: {}}
    with pytest.raises(ConfigError) as caught:
        RLM("openai", kwargs)
    said = str(caught.value)
    assert "rejected its backend_kwargs" in said and f"'{keyword}'" in said and fix in said


def test_a_list_of_chat_messages_as_a_prompt_says_what_to_pass() -> None:
    """The reference hands ``llm_query([{"role": ..., "content": ...}])`` to its client;
    here a prompt is text (and images): the model is told to pass the text."""
    code = "llm_query([{'role': 'user', 'content': 'hi'}])"
    rlm = RLM("scripted", {"responses": [f"```repl\n{code}\n```", "```repl\nFINAL(1)\n```"]})
    rlm.completion("ctx")
    shown = scripted(rlm).requests[1].messages[-1].content
    assert "part 0 is a chat message" in shown and "join(m['content']" in shown


TOOL_CODE = "RUNS = globals().get('RUNS', 0) + 1\ndef shout(text):\n    return text.upper()\n"


@pytest.mark.parametrize("environment", ["local", "subprocess"])
def test_tool_code_and_tool_prompts_reach_every_repl_of_the_run(environment: str) -> None:
    """The reference's ``tool_prompts`` and ``tool_code``: the sections follow every
    system prompt, and the code runs once in each REPL (the root's and a child RLM's)
    before its first turn, so the model's code can call what it defined."""

    def respond(request: Any) -> str:
        if "str of 10 characters" in str(request.messages[1].content):  # the child
            return "```repl\nFINAL(shout(context) + str(RUNS))\n```"
        return "```repl\nFINAL(rlm_query('child task') + '|' + shout('root') + str(RUNS))\n```"

    rlm = RLM(
        "scripted",
        {"respond": respond},
        environment=environment,
        max_depth=2,
        tool_prompts=["Call `shout(text)` to shout.", "   ", "Be loud."],
        tool_code=TOOL_CODE,
    )
    assert rlm.completion("ctx").response == "CHILD TASK1|ROOT1"
    systems = [r.messages[0].content for r in scripted(rlm).requests]
    assert len(systems) == 2
    for system in systems:
        assert system.endswith("\n\nCall `shout(text)` to shout.\n\nBe loud.")
        assert system.startswith("You are a Recursive Language Model")


def test_tool_code_runs_once_in_a_persistent_session() -> None:
    rlm = RLM(
        "scripted",
        {"respond": lambda r: "```repl\nRUNS += 10\nFINAL(str(RUNS))\n```"},
        persistent=True,
        tool_code=TOOL_CODE,
    )
    assert [rlm.completion("a").response, rlm.completion("b").response] == ["11", "21"]


def test_tool_code_that_failed_runs_again_at_the_sessions_next_completion(
    tmp_path: Path,
) -> None:
    """A persistent session's tool_code that raised was never run again: the next
    completion went on in the same REPL with no tools, and no error."""
    flag = tmp_path / "ready"
    code = (
        f"import os\nif not os.path.exists({str(flag)!r}):\n"
        "    raise RuntimeError('the database is not ready')\n" + TOOL_CODE
    )
    rlm = RLM(
        "scripted",
        {"respond": lambda r: "```repl\nFINAL(shout('hi') + str(RUNS))\n```"},
        persistent=True,
        tool_code=code,
    )
    with pytest.raises(ConfigError, match="the database is not ready"):
        rlm.completion("a")
    with pytest.raises(ConfigError, match="the database is not ready"):
        rlm.completion("b")  # still failing: still said
    flag.touch()
    assert rlm.completion("c").response == "HI1"
    assert rlm.completion("d").response == "HI1"  # once it ran, never again


def test_tool_code_that_runs_past_the_blocks_timeout_stops_the_completion() -> None:
    rlm = RLM(
        "scripted",
        {"responses": ["```repl\nFINAL('x')\n```"]},
        environment_kwargs={"timeout": 0.5},
        tool_code="while True:\n    pass\n",
    )
    with pytest.raises(ConfigError, match="tool_code failed in the REPL before the first turn"):
        rlm.completion("ctx")
    assert scripted(rlm).requests == []


def test_tool_prompts_follow_a_custom_system_prompt() -> None:
    rlm = RLM(
        "scripted",
        {"responses": ["```repl\nFINAL('x')\n```"]},
        custom_system_prompt="Mine.",
        tool_prompts="Tools: none.",
    )
    rlm.completion("ctx")
    assert scripted(rlm).requests[0].messages[0].content == "Mine.\n\nTools: none."


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"tool_code": "def f(:\n    pass"}, "tool_code is not valid Python: "),
        ({"tool_code": b"x = 1"}, "tool_code must be a str of Python source, not bytes"),
        ({"tool_prompts": ["a", 3]}, "tool_prompts must be a str or a list of str"),
        ({"tool_prompts": {"a": "b"}}, "tool_prompts must be a str or a list of str"),
    ],
)
def test_bad_tool_code_or_prompts_are_refused_when_made(
    keywords: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        RLM("scripted", {"responses": ["x"]}, **keywords)


@pytest.mark.parametrize("environment", ["local", "subprocess"])
def test_tool_code_that_raises_stops_the_completion_with_its_error(environment: str) -> None:
    rlm = RLM(
        "scripted",
        {"responses": ["```repl\nFINAL('x')\n```"]},
        environment=environment,
        tool_code="import os\nraise LookupError('no table named vendors')\n",
    )
    with pytest.raises(ConfigError) as caught:
        rlm.completion("ctx")
    text = str(caught.value)
    assert "tool_code failed in the REPL before the first turn" in text
    assert "LookupError: no table named vendors" in text
    assert scripted(rlm).requests == []  # no turn was spent on it


def test_setup_code_in_environment_kwargs_points_to_tool_code() -> None:
    with pytest.raises(ConfigError, match=r"set-up code goes in RLM\(tool_code=...\)"):
        RLM("scripted", {"responses": []}, environment_kwargs={"setup_code": "x = 1"})
