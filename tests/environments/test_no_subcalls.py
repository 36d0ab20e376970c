"""``environment_kwargs={"subcalls": False}``: a REPL with no door to another model (the
RLM paper's "no sub-calls" ablation), in both first-party environments."""

from __future__ import annotations

import pytest

from rlm_graph import RLM
from rlm_graph.contracts import ChatRequest
from rlm_graph.errors import ConfigError
from tests.support.scripts import is_root_turn, repl, turn_number

PROBE = """
names = ["llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched"]
print("present:", [n for n in names if n in globals()])
try:
    llm_query("hello")
except NameError as exc:
    print("calling it:", type(exc).__name__)
"""


def _run(environment: str, subcalls: bool) -> tuple[str, list[ChatRequest]]:
    seen: list[ChatRequest] = []

    def respond(request: ChatRequest) -> str:
        seen.append(request)
        if not is_root_turn(request):
            return "a sub-model answered"
        if turn_number(request) == 1:
            return repl(PROBE)
        return repl("FINAL('done')")

    rlm = RLM(
        "scripted",
        {"respond": respond},
        environment=environment,
        environment_kwargs={"subcalls": subcalls},
    )
    rlm.completion("some context", root_prompt="q")
    second_turn = next(r for r in seen if is_root_turn(r) and turn_number(r) == 2)
    return second_turn.messages[-1].content, seen


@pytest.mark.parametrize("environment", ["local", "subprocess"])
def test_without_subcalls_the_repl_has_no_llm_query_and_no_model_is_asked(environment: str) -> None:
    output, seen = _run(environment, subcalls=False)
    assert "present: []" in output and "calling it: NameError" in output
    assert all(is_root_turn(r) for r in seen)  # only the root model was ever called


@pytest.mark.parametrize("environment", ["local", "subprocess"])
def test_by_default_the_four_functions_are_there(environment: str) -> None:
    output, seen = _run(environment, subcalls=True)
    assert "present: ['llm_query', 'llm_query_batched', 'rlm_query', 'rlm_query_batched']" in output
    assert any(not is_root_turn(r) for r in seen)


@pytest.mark.parametrize("environment", ["local", "subprocess"])
def test_subcalls_must_be_a_bool(environment: str) -> None:
    with pytest.raises(ConfigError, match="subcalls must be True or False"):
        RLM(
            "scripted",
            {"responses": ["x"]},
            environment=environment,
            environment_kwargs={"subcalls": "no"},
        )
