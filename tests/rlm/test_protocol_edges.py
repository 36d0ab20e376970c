"""The REPL protocol at its edges, as a model meets them: code that raises the engine's
own stop, a text ``FINAL_VAR`` of a name that does not exist, a text ``FINAL`` the
schema refuses, and ``FINAL_VAR("answer")``."""

from __future__ import annotations

import pytest

from rlm_graph import RLM
from tests.support.scripts import repl, scripted


@pytest.mark.parametrize("environment", ["local", "subprocess"])
def test_code_raising_the_engines_own_stop_is_only_the_blocks_error(environment: str) -> None:
    """Model code can import ``BlockInterrupted`` and raise it: in ``local`` it escaped
    ``completion()`` (not an ``Exception``), in ``subprocess`` it killed the guest and
    its variables. It is the block's error, shown to the model, as anything it raises."""
    forged = "kept = 41\nfrom rlm_graph.repl import BlockInterrupted\nraise BlockInterrupted('x')"
    rlm = RLM(
        "scripted",
        {"responses": [repl(forged), repl("FINAL(kept + 1)")]},
        environment=environment,
    )
    result = rlm.completion("ctx")
    assert result.response == "42"
    shown = scripted(rlm).requests[1].messages[-1].content
    assert "BlockInterrupted" in shown and "restarted" not in shown


def test_a_text_final_var_of_a_missing_name_is_told_to_the_model() -> None:
    """``FINAL_VAR(name)`` written as text, of a name that does not exist, is "a message,
    not an end": the message was never sent (the next request ended with the model's
    own reply, a prefill to some APIs)."""
    rlm = RLM(
        "scripted",
        {"responses": ["I have it.\nFINAL_VAR(result)", repl("FINAL('second')")]},
        accept_text_final=True,
    )
    assert rlm.completion("ctx").response == "second"
    second = scripted(rlm).requests[1].messages
    assert second[-1].role == "user"
    assert "there is no variable 'result'" in second[-1].content


def test_a_text_final_the_schema_refuses_counts_toward_max_errors() -> None:
    """Refusals "count as failing turns for max_errors": a text FINAL's did not (the run
    went on to max_iterations), a code FINAL's did."""
    rlm = RLM(
        "scripted",
        {"responses": ["FINAL(not a number)"] * 6},
        accept_text_final=True,
        max_errors=2,
        max_iterations=6,
    )
    result = rlm.completion("ctx", schema=int)
    assert (result.stop_reason, result.iterations) == ("max_errors", 2)
    assert "SchemaMismatch" in scripted(rlm).requests[1].messages[-1].content


@pytest.mark.parametrize("environment", ["local", "subprocess"])
def test_final_var_of_answer_finishes_with_its_content(environment: str) -> None:
    rlm = RLM(
        "scripted",
        {"responses": [repl('answer["content"] = "42"\nFINAL_VAR("answer")')]},
        environment=environment,
    )
    assert rlm.completion("ctx").response == "42"
