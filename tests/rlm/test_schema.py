"""Typed answers: ``completion(..., schema=...)`` with the scripted provider."""

from __future__ import annotations

import dataclasses
import json

import pytest
from pydantic import BaseModel

from rlm_graph import RLM, NodeKind, NodeStatus
from rlm_graph.errors import ConfigError, IterationLimitExceeded
from rlm_graph.protocol.schema import AnswerSchema
from tests.support.scripts import repl, root_and_sub, scripted


class Person(BaseModel):
    name: str
    age: int


@dataclasses.dataclass
class Totals:
    count: int
    words: list[str]


def rlm(root: object, **kwargs: object) -> RLM:
    return RLM("scripted", {"respond": root_and_sub(root)}, **kwargs)  # type: ignore[arg-type]


def requests(engine: RLM) -> list[object]:
    return scripted(engine).requests  # type: ignore[no-any-return]


async def test_a_schema_answered_right_the_first_time() -> None:
    engine = rlm([repl('FINAL({"name": context.split()[0], "age": 41})')])
    result = await engine.acompletion("Ada Lovelace", root_prompt="who?", schema=Person)
    assert result.parsed == Person(name="Ada", age=41)
    assert json.loads(result.response) == {"name": "Ada", "age": 41}
    assert result.stop_reason is None and result.error is None
    assert result.iterations == 1
    # The model was told the shape in its task message.
    task = requests(engine)[0].messages[1].content  # type: ignore[attr-defined]
    assert "JSON Schema" in task and '"age":{"title":"Age","type":"integer"}' in task


async def test_a_pydantic_instance_or_json_text_in_answer_content_both_count() -> None:
    as_text = rlm(
        [repl('answer["content"] = \'{"name": "Bo", "age": "7"}\'\nanswer["ready"] = True')]
    )
    result = await as_text.acompletion("ctx", schema=Person)
    assert result.parsed == Person(name="Bo", age=7)
    # A model that builds the value with a class of its own: its JSON is what counts.
    code = (
        "from pydantic import BaseModel\n"
        "class T(BaseModel):\n    count: int\n    words: list\n"
        "FINAL(T(count=len(context.split()), words=context.split()))"
    )
    as_object = rlm([repl(code)])
    result = await as_object.acompletion("a b c", schema=Totals)
    assert result.parsed == Totals(count=3, words=["a", "b", "c"])


async def test_a_wrong_answer_goes_back_as_the_block_error_and_is_corrected() -> None:
    engine = rlm(
        [
            repl('FINAL({"name": "Ada", "age": "forty-one"})'),
            repl('FINAL({"name": "Ada", "age": 41})'),
        ]
    )
    result = await engine.acompletion("Ada Lovelace", schema=Person)
    assert result.parsed == Person(name="Ada", age=41)
    assert result.iterations == 2 and result.error is None
    second = requests(engine)[1].messages[-1].content  # type: ignore[attr-defined]
    assert "SchemaMismatch" in second and "age: Input should be a valid integer" in second
    assert "forty-one" in second
    blocks = list(result.graph.records(NodeKind.REPL_BLOCK))
    assert [b.status for b in blocks] == [NodeStatus.ERROR, NodeStatus.OK]
    assert blocks[0].error_type == "SchemaMismatch"


async def test_a_refused_answer_is_reset_so_a_later_block_does_not_finish_with_it() -> None:
    engine = rlm(
        [
            repl('answer["content"] = {"name": "Ada"}\nanswer["ready"] = True'),
            repl("print(answer)"),
            repl('FINAL({"name": "Ada", "age": 1})'),
        ]
    )
    result = await engine.acompletion("ctx", schema=Person)
    assert result.iterations == 3
    assert result.parsed == Person(name="Ada", age=1)
    third = requests(engine)[2].messages[-1].content  # type: ignore[attr-defined]
    assert "ready=False" in third


async def test_a_schema_never_matched_stops_at_the_limit_with_the_last_error() -> None:
    engine = rlm(
        [repl("FINAL([1, 2])"), repl('FINAL("nothing like it")'), "still not JSON"],
        max_iterations=2,
    )
    result = await engine.acompletion("ctx", schema=Person)
    assert result.stop_reason == "max_iterations"
    assert result.parsed is None
    # Three answers, three refusals; the result carries the last one (the plain reply).
    assert result.error is not None and "not JSON" in result.error
    assert result.response == "still not JSON"
    final_request = requests(engine)[-1].messages[-1].content  # type: ignore[attr-defined]
    assert "JSON value matching the answer schema" in final_request


async def test_on_limit_raise_carries_the_unmatched_result() -> None:
    engine = rlm([repl("FINAL(1)"), "1"], max_iterations=1, on_limit="raise")
    with pytest.raises(IterationLimitExceeded) as caught:
        await engine.acompletion("ctx", schema=Person)
    assert caught.value.result.error.startswith("SchemaMismatch")  # type: ignore[attr-defined]


async def test_the_last_plain_reply_counts_when_it_matches() -> None:
    engine = rlm([repl("print(1)"), '```json\n{"name": "Cy", "age": 3}\n```'], max_iterations=1)
    result = await engine.acompletion("ctx", schema=Person)
    assert result.stop_reason == "max_iterations"
    assert result.parsed == Person(name="Cy", age=3)


async def test_plain_types_and_json_schema_dicts() -> None:
    as_list = await rlm([repl("FINAL(context.split())")]).acompletion("x y", schema=list[str])
    assert as_list.parsed == ["x", "y"] and as_list.response == '["x","y"]'
    as_int = await rlm([repl("FINAL('42')")]).acompletion("ctx", schema=int)
    assert as_int.parsed == 42
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    engine = rlm([repl('FINAL({"ok": True, "extra": 1})'), repl('FINAL({"ok": True})')])
    as_dict = await engine.acompletion("ctx", schema=schema)
    assert as_dict.parsed == {"ok": True} and as_dict.iterations == 2
    refused = requests(engine)[1].messages[-1].content  # type: ignore[attr-defined]
    assert "Additional properties are not allowed ('extra' was unexpected)" in refused


async def test_text_final_is_validated_too() -> None:
    engine = rlm(
        ['FINAL({"name": "Ada"})', 'FINAL({"name": "Ada", "age": 2})'], accept_text_final=True
    )
    result = await engine.acompletion("ctx", schema=Person)
    assert result.parsed == Person(name="Ada", age=2)
    assert "age: Field required" in requests(engine)[1].messages[-1].content  # type: ignore[attr-defined]


async def test_children_answer_text_whatever_the_root_schema() -> None:
    def root(request: object) -> str:
        if request.depth == 0:  # type: ignore[attr-defined]
            return repl('FINAL({"name": rlm_query("who"), "age": 5})')
        return repl('FINAL("a plain child answer")')

    engine = RLM("scripted", {"respond": root}, max_depth=2)
    result = await engine.acompletion("ctx", schema=Person)
    assert result.parsed == Person(name="a plain child answer", age=5)


async def test_max_depth_0_answers_typed_in_one_call() -> None:
    engine = RLM("scripted", {"responses": ['{"name": "Di", "age": 9}']}, max_depth=0)
    result = await engine.acompletion("ctx", schema=Person)
    assert result.parsed == Person(name="Di", age=9)
    assert "JSON Schema" in requests(engine)[0].prompt  # type: ignore[attr-defined]


async def test_bad_schemas_are_config_errors() -> None:
    engine = rlm([repl("FINAL(1)")])
    for bad, words in [
        (3, "is a value"),
        ({"type": "nonsense"}, "not a valid JSON Schema"),
        (object(), "not a shape"),
    ]:
        with pytest.raises(ConfigError, match=words):
            await engine.acompletion("ctx", schema=bad)


def test_answer_schema_reports_every_problem_with_its_path() -> None:
    schema = AnswerSchema.of(list[Person])
    with pytest.raises(ValueError) as caught:
        schema.parse_text('[{"name": 1, "age": 2}, {"age": "x"}]')
    message = str(caught.value)
    assert "3 problems" in message
    assert "0.name: Input should be a valid string" in message
    assert "1.name: Field required" in message


@pytest.mark.parametrize("shape", [list, {"type": "array"}], ids=["type", "json-schema"])
def test_an_answer_nested_past_the_stack_is_a_mismatch_not_a_crash(shape: object) -> None:
    """A model's answer of JSON nested 100,000 deep (untrusted text) is an answer that
    is not JSON, said so, never the decoder's RecursionError."""
    schema = AnswerSchema.of(shape)
    with pytest.raises(ValueError, match="not JSON .it nests too deeply to read.") as caught:
        schema.parse_text("[" * 100_000 + "]" * 100_000)
    assert not isinstance(caught.value, RecursionError)


def test_sync_completion_takes_a_schema() -> None:
    result = rlm([repl('FINAL({"name": "E", "age": 1})')]).completion("ctx", schema=Person)
    assert result.parsed == Person(name="E", age=1)


async def test_the_subprocess_environment_sends_the_final_value_as_json() -> None:
    engine = RLM(
        "scripted",
        {
            "respond": root_and_sub(
                [
                    repl('FINAL({"name": "Ada", "age": "x"})'),
                    repl(
                        "from pydantic import BaseModel\n"
                        "class P(BaseModel):\n    name: str\n    age: int\n"
                        'answer["content"] = P(name="Ada", age=36)\nanswer["ready"] = True'
                    ),
                ]
            )
        },
        environment="subprocess",
    )
    result = await engine.acompletion("ctx", schema=Person)
    assert result.parsed == Person(name="Ada", age=36)
    assert result.iterations == 2
