"""Typed sub-calls: ``llm_query(prompt, schema=...)`` in the local and subprocess REPLs."""

from __future__ import annotations

import json

from pydantic import BaseModel

from rlm_graph import RLM, NodeKind, NodeStatus
from rlm_graph.contracts import ChatRequest
from tests.support.scripts import repl, root_and_sub, scripted


class City(BaseModel):
    name: str
    population: int


def answer_json(request: ChatRequest) -> str:
    """Sub-model: a city as JSON, or a wrong shape for prompts that say 'wrong'."""
    if "wrong" in request.prompt:
        return '{"name": "Oslo"}'
    if "list" in request.prompt:
        return '["a", "b"]'
    word = request.prompt.split()[0]
    return f'```json\n{{"name": "{word}", "population": {len(word)}}}\n```'


def engine(code: str, environment: str = "local", **kwargs: object) -> RLM:
    respond = root_and_sub([repl(code)], answer_json)
    return RLM("scripted", {"respond": respond}, environment=environment, **kwargs)  # type: ignore[arg-type]


def sub_requests(rlm: RLM) -> list[ChatRequest]:
    return [r for r in scripted(rlm).requests if r.depth == 1]


async def test_a_typed_sub_call_returns_an_instance_of_the_class_the_code_passed() -> None:
    code = (
        "city = llm_query('Paris facts', schema=City)\n"
        "FINAL(f'{type(city).__name__} {city.name} {city.population}')"
    )
    rlm = engine(code, custom_tools={"City": City})
    result = await rlm.acompletion("ctx")
    assert result.response == "City Paris 5"
    (request,) = sub_requests(rlm)
    # The provider got the shape as a structured-output request and in the prompt.
    assert request.response_schema is not None
    assert request.response_schema.name == "City"
    assert request.response_schema.json_schema == City.model_json_schema()
    assert "JSON Schema" in request.prompt


async def test_a_mismatch_is_an_error_string_and_a_failed_node() -> None:
    code = "FINAL(llm_query('wrong one', schema=City))"
    result = await engine(code, custom_tools={"City": City}).acompletion("ctx")
    assert result.response.startswith("[ERROR] SchemaMismatch: ")
    assert "'population' is a required property" in result.response
    (call,) = result.graph.records(NodeKind.LLM_CALL)
    assert call.status == NodeStatus.ERROR and call.error_type == "SchemaMismatch"


async def test_batched_typed_calls_keep_order_and_fail_per_slot() -> None:
    code = (
        "got = llm_query_batched(['Rome x', 'wrong y', 'Lima z'], schema=City)\n"
        "FINAL(json.dumps([g.name if isinstance(g, City) else g[:30] for g in got]))"
    )
    rlm = engine("import json\n" + code, custom_tools={"City": City})
    result = await rlm.acompletion("ctx")
    assert json.loads(result.response) == ["Rome", "[ERROR] SchemaMismatch: the an", "Lima"]


async def test_json_schema_dicts_and_plain_types_give_plain_data() -> None:
    code = (
        "a = llm_query('list please', schema=list[str])\n"
        "b = llm_query('Oslo', schema={'type': 'object', 'required': ['name']})\n"
        "FINAL(json.dumps([a, b]))"
    )
    result = await engine("import json\n" + code).acompletion("ctx")
    assert json.loads(result.response) == [["a", "b"], {"name": "Oslo", "population": 4}]


async def test_a_bad_schema_from_the_code_fails_before_any_call() -> None:
    code = (
        "a = llm_query('Oslo', schema={'type': 'nonsense'})\n"
        "try:\n    llm_query('Oslo', schema=42)\n"
        "except TypeError as exc:\n    b = str(exc)\n"
        "FINAL(a + ' || ' + b)"
    )
    rlm = engine(code)
    result = await rlm.acompletion("ctx")
    refused, raised = result.response.split(" || ")
    assert refused.startswith("[ERROR] ConfigError: schema is not a valid JSON Schema")
    assert raised.startswith("llm_query(schema=...): schema=42 is a value, not a shape")
    assert sub_requests(rlm) == []


async def test_subprocess_guest_rebuilds_its_own_class_from_the_engines_json() -> None:
    code = (
        "from pydantic import BaseModel\n"
        "class Town(BaseModel):\n    name: str\n    population: int\n"
        "t = llm_query('Bergen facts', schema=Town)\n"
        "rows = llm_query_batched(['Oslo a', 'wrong b'], schema=Town)\n"
        "FINAL(f'{type(t).__name__} {t.name} {t.population} | '"
        " + ' '.join(type(r).__name__ for r in rows))"
    )
    rlm = engine(code, environment="subprocess")
    result = await rlm.acompletion("ctx")
    assert result.response == "Town Bergen 6 | Town str"
    schemas = [r.response_schema for r in sub_requests(rlm)]
    assert all(s is not None and s.name == "Town" for s in schemas)
