"""The one boundary between model code and the engine, played by the attacker: a real
guest process (the ``subprocess`` environment) sends what it likes through
``llm_query``'s schema, and writes what it likes to the engine's pipe."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from rlm_graph import RLM
from rlm_graph.events import NodeFinished, NodeStarted
from rlm_graph_subprocess.process import MAX_PENDING_BYTES, MAX_PENDING_PROMPTS
from tests.support.guests import engine, feedback
from tests.support.listening import listening
from tests.support.scripts import is_root_turn, repl, root_and_sub, scripted


async def test_a_schema_reference_sends_nothing_to_any_server_and_the_run_goes_on() -> None:
    with listening() as (url, seen):
        code = (
            f"a = llm_query('q', schema={{'$ref': {url!r} + '/x?d=' + context}})\n"
            f"b = llm_query_batched(['q'], schema={{'$defs': {{'s': {{'$ref': {url!r}}}}}, "
            "'$ref': '#/$defs/s'})\n"
            "FINAL(repr([a, b[0]]))"
        )
        rlm = engine([repl(code)], sub=lambda r: '"fine"')
        result = await rlm.acompletion("the secret document")
    assert seen == []  # nothing went out, the context least of all
    a, b = eval(result.response)
    for slot in (a, b):
        assert slot.startswith("[ERROR] ConfigError: schema: $ref")
        assert "points outside the schema" in slot and "nothing is ever fetched" in slot
    assert all(r.model == "scripted" for r in scripted(rlm).requests)
    assert len(scripted(rlm).requests) == 1  # the root turn only: no slot called a model


def test_a_users_schema_is_never_fetched_either() -> None:
    with listening() as (url, seen):
        rlm = RLM(
            "scripted",
            {"respond": lambda r: repl("FINAL('\"x\"')")},
            environment="local",
            max_iterations=1,
        )
        result = rlm.completion("ctx", schema={"$ref": url + "/answer.json"})
    assert seen == []
    assert result.parsed is None
    told = "\n".join(m.content for m in scripted(rlm).requests[1].messages)
    assert "is not in it: references must point into the schema itself" in told


# -- schemas that would stall the engine's loop (each run in a process of its own, so
#    that a regression fails by the timeout instead of hanging the suite) ------------------

ANSWER_SCRIPT = """
import json, resource, sys
from rlm_graph import RLM
schema, reply, limit = sys.argv[1], eval(sys.argv[2]), float(sys.argv[3])
options = json.loads(sys.argv[4])
def respond(request):
    if any(m.role == 'system' for m in request.messages):
        return '```repl\\nFINAL(llm_query("x", schema=' + schema + '))\\n```'
    return reply
rlm = RLM('scripted', {'respond': respond}, environment='subprocess', max_timeout=limit,
          environment_kwargs=options)
result = rlm.completion('ctx')
used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
cpu = sum(u.ru_utime + u.ru_stime for u in used)
print(json.dumps([result.response, result.stop_reason, cpu]))
"""


def answer_alone(schema: str, reply: str, **options: Any) -> tuple[str, str | None, float]:
    """In an engine process of its own, with a real guest (the environment's ``options``):
    the answer of ``FINAL(llm_query("x", schema=<schema>))`` (a Python expression the
    guest evaluates) when the model replies ``<reply>`` (an expression), the run's stop
    reason, and the CPU seconds the engine process (and the guests it reaped) used. The CPU
    time, not the wall time, says whether the engine stalled: a loaded machine stretches
    the second, not the first."""
    done = subprocess.run(
        [sys.executable, "-c", ANSWER_SCRIPT, schema, reply, "60", json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    response, stop_reason, cpu = json.loads(done.stdout.strip().splitlines()[-1])
    return response, stop_reason, cpu


STALLING = {
    "a backtracking pattern": (
        repr({"type": "string", "pattern": "^(a+)+$"}),
        repr('"' + "a" * 60 + '!"'),
        "[ERROR] SchemaMismatch",
        "does not match",
    ),
    "an exploding anyOf": (
        repr(
            {
                "$defs": {
                    **{f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(40)},
                    "d40": {"type": "integer"},
                },
                "$ref": "#/$defs/d0",
            }
        ),
        repr('"text"'),
        "[ERROR] SchemaMismatch",
        "too costly to check",
    ),
    "patternProperties hidden under dependencies": (
        repr(
            {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "dependencies": {"properties": {"patternProperties": {"^(a+)+$": {}}}},
            }
        ),
        repr(json.dumps({"properties": 1, "a" * 40 + "!": 1})),
        "[ERROR] ConfigError",
        "patternProperties is not taken",
    ),
    "uniqueItems over 3,000 objects": (  # compared pairwise, 25 s
        repr({"type": "array", "uniqueItems": True}),
        "json.dumps([{'n': i, 'more': [i, {'x': i}]} for i in range(3000)] + [{'n': 0, 'more': [0, {'x': 0}]}])",
        "[ERROR] SchemaMismatch",
        "has non-unique elements",
    ),
    "anyOf branches each quoting a 500 KB answer": (  # messages off the books: 56 s
        "{'anyOf': [{'type': 'null'}] * 3635}",
        "json.dumps([[0]] * 100_000)",
        "[ERROR] SchemaMismatch",
        "too costly to check",
    ),
    "an RE2 pattern over a 400 KB answer": (  # linear, but 27 s
        repr({"type": "string", "pattern": "(?:.{0,99}a){10}.{0,99}b"}),
        "json.dumps(('a' * 50 + 'x' * 50) * 4000)",
        "[ERROR] SchemaMismatch",
        "too costly to check",
    ),
}


@pytest.mark.processes
@pytest.mark.parametrize("case", sorted(STALLING))
def test_a_schema_built_to_stall_is_refused_or_a_mismatch_before_the_deadline(case: str) -> None:
    schema, reply, kind, told = STALLING[case]
    response, stop_reason, cpu = answer_alone(schema, reply)
    assert stop_reason is None  # answered, not cut by the 60 s deadline
    # Each of these held the engine's loop for 17 s of CPU or more, or for good; the
    # whole run (two interpreters starting, the schema checked) takes about 2.
    assert cpu < 8, f"{cpu:.1f} CPU seconds"
    assert response.startswith(kind) and told in response, response[:300]


@pytest.mark.processes
def test_a_schema_of_megabytes_is_refused_at_its_first_64_kib() -> None:
    # Some 12 MB of JSON on one line of the guest's pipe, a distinct pattern in each of
    # 250,000 definitions: walked and compiled in full it held the loop for 15 s. (Its
    # 3 million JSON values weigh 108 MB: at the default max_message_mb the guest
    # refuses to send it at all.)
    schema = "{'$defs': {f'd{i}': {'type': 'string', 'pattern': f'x{i}'} for i in range(250_000)}}"
    response, stop_reason, cpu = answer_alone(schema, repr('"x"'), max_message_mb=128)
    assert stop_reason is None
    assert cpu < 8, f"{cpu:.1f} CPU seconds"  # refused before 15 s of compiling
    assert response.startswith("[ERROR] ConfigError: schema is over 65,536 bytes of JSON")


async def test_patterns_re2_cannot_run_and_pattern_properties_are_refused_up_front() -> None:
    code = (
        "a = llm_query('q', schema={'type': 'string', 'pattern': '(a)\\\\1'})\n"
        "b = llm_query('q', schema={'type': 'object', 'patternProperties': {'^x': {}}})\n"
        "c = llm_query('q', schema={'type': 'object', 'properties': {'patternProperties': {}}})\n"
        "FINAL(repr([a, b, c]))"
    )
    rlm = engine([repl(code)], sub=lambda r: '{"patternProperties": 1}')
    a, b, c = eval((await rlm.acompletion("ctx")).response)
    assert a.startswith("[ERROR] ConfigError") and "not one RE2 takes" in a
    assert b.startswith("[ERROR] ConfigError") and "patternProperties is not taken" in b
    assert c == {"patternProperties": 1}  # a property of that name is only a name


# -- the pipe -----------------------------------------------------------------------------


def _forging(count: int, prompt_chars: int = 0) -> str:
    """A block that writes ``count`` forged sub-call lines straight to the engine's pipe
    (each prompt "forged", or ``prompt_chars`` x's), then asks once for real (read only
    after every forged line was read)."""
    line = {
        "type": "subcall",
        "id": 0,
        "request": {"fn": "llm_query", "prompts": ["forged"], "model": None, "json_schema": None},
    }
    return (
        "import json, os, stat\n"
        f"line = {line!r}\n"
        + (f"line['request']['prompts'] = ['x' * {prompt_chars}]\n" if prompt_chars else "")
        + "out = [fd for fd in map(int, os.listdir('/proc/self/fd'))\n"
        "       if os.path.exists(f'/proc/self/fd/{fd}') and stat.S_ISFIFO(os.fstat(fd).st_mode)]\n"
        "for fd in out:\n"
        "    try:\n"
        f"        for i in range({count}):\n"
        "            line['id'] = 10_000_000 + i\n"
        "            os.write(fd, (json.dumps(line) + '\\n').encode())\n"
        "    except OSError:\n"  # the read end of a pipe
        "        pass\n"
        "FINAL(llm_query('real'))"
    )


class _InFlight:
    """A listener counting the ``llm_call`` nodes running at once, and their peak."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def __call__(self, event: object) -> None:
        if isinstance(event, NodeStarted) and event.kind == "llm_call":
            self.now += 1
            self.peak = max(self.peak, self.now)
        elif isinstance(event, NodeFinished) and event.kind == "llm_call":
            self.now -= 1


@pytest.mark.processes
async def test_forged_sub_calls_wait_their_turn_instead_of_filling_the_engine() -> None:
    in_flight = _InFlight()
    forged = MAX_PENDING_PROMPTS * 3
    rlm = engine(
        [repl(_forging(forged))],
        sub=lambda r: f"answered {r.prompt}",
        backend_kwargs={"latency": 0.001, "max_concurrent": 8},
        listeners=[in_flight],
        environment_kwargs={"timeout": 120},
    )
    result = await rlm.acompletion("ctx")
    assert result.response == "answered real"
    served = [r for r in scripted(rlm).requests if not is_root_turn(r)]
    assert len(served) > forged - MAX_PENDING_PROMPTS  # the forged ones were served, in turn
    assert in_flight.peak <= MAX_PENDING_PROMPTS + 1  # never all of them at once


@pytest.mark.processes
async def test_forged_sub_calls_of_megabytes_wait_their_turn_by_their_bytes() -> None:
    # 24 calls of 4 MiB each, few prompts: before, all were read and held at once (60 of
    # 3 MB added 189 MB to the engine).
    size = MAX_PENDING_BYTES // 8
    in_flight = _InFlight()
    rlm = engine(
        [repl(_forging(24, prompt_chars=size))],
        sub=lambda r: f"answered {r.prompt[:8]}",
        backend_kwargs={"latency": 0.2, "max_concurrent": 1},
        listeners=[in_flight],
        environment_kwargs={"timeout": 120},
    )
    result = await rlm.acompletion("ctx")
    assert result.response == "answered real"
    served = [r for r in scripted(rlm).requests if not is_root_turn(r)]
    assert len(served) == 25  # every forged call was served, in turn
    assert in_flight.peak <= MAX_PENDING_BYTES // size + 1


@pytest.mark.processes
async def test_half_a_message_on_the_pipe_when_a_run_is_cut_keeps_the_partial_answer() -> None:
    blocks = [
        repl("answer['content'] = 'the partial answer'"),
        repl(
            "import os, stat, time\n"
            "for fd in map(int, os.listdir('/proc/self/fd')):\n"
            "    try:\n"
            "        if stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
            '            os.write(fd, b\'{"type": "subc\')\n'  # half a line, never ended
            "    except OSError:\n"
            "        pass\n"
            "time.sleep(60)"
        ),
    ]
    rlm = engine(blocks, max_timeout=5)  # a cold guest on a loaded machine starts within it
    result = await rlm.acompletion("ctx")  # before: pydantic's ValidationError
    assert result.stop_reason == "max_timeout"
    assert result.response == "the partial answer"


def _run(code: str, environment: str) -> tuple[RLM, Any]:
    """A completion whose root turn runs ``code``; sub-calls answer ``"sub"``."""
    rlm = RLM(
        "scripted",
        {"respond": lambda r: repl(code) if is_root_turn(r) else "sub"},
        environment=environment,
    )
    return rlm, rlm.completion("ctx")


def test_check_request_refuses_a_call_over_the_caps_before_any_node() -> None:
    from rlm_graph.protocol.subcalls import MAX_PROMPTS

    code = f"r = llm_query_batched(['p'] * {MAX_PROMPTS + 1})\nFINAL(r[0])"
    rlm, result = _run(code, "local")
    assert result.response.startswith("[ERROR] ConfigError") and "split the list" in result.response
    assert len(list(result.graph.records("llm_call"))) == 0


def test_a_prompt_over_16_mi_characters_is_refused_whole_before_any_node() -> None:
    from rlm_graph.protocol.subcalls import MAX_PROMPT_CHARS

    code = (
        f"big = 'x' * {MAX_PROMPT_CHARS + 1}\n"
        "a = llm_query(big)\n"
        "b = llm_query_batched(['fine', big])\n"
        "FINAL(repr([a, *b]))"
    )
    rlm, result = _run(code, "local")
    slots = eval(result.response)
    assert len(slots) == 3
    for slot in slots:  # the batch's fine prompt too: the call is refused whole
        assert slot.startswith("[ERROR] ConfigError") and "more than 16,777,216 characters" in slot
    assert len(list(result.graph.records("llm_call"))) == 0
    assert len(scripted(rlm).requests) == 1  # the root turn only


@pytest.mark.parametrize("environment", ["local", "subprocess"])
def test_what_a_guest_sends_is_not_copied_into_every_slot(environment: str) -> None:
    """A refusal quoted what the guest sent, and each slot carried its own copy: a
    megabyte model name over 400 prompts made 400 MB of errors in the engine, and a
    schema quoting 60 KB over 3,000 prompts 180 MB. The model name is capped, the
    quotes are cut, and every slot still says why."""
    from rlm_graph.protocol.subcalls import MAX_MODEL_CHARS

    code = (
        "long_model = llm_query_batched(['x'] * 400, model='m' * 1_000_000)\n"
        "bad_model = llm_query_batched(['x'] * 400, model='n' * 200)\n"
        "bad_schema = llm_query_batched(['x'] * 400, schema={'$schema': 's' * 60_000})\n"
        "bad_type = llm_query('x', schema={'type': 't' * 60_000})\n"
        "FINAL(repr([long_model, bad_model, bad_schema, [bad_type]]))"
    )
    rlm, result = _run(code, environment)
    long_model, bad_model, bad_schema, bad_type = eval(result.response)
    assert [len(long_model), len(bad_model), len(bad_schema), len(bad_type)] == [400, 400, 400, 1]
    assert long_model[0].startswith("[ERROR] ConfigError: llm_query_batched(..., model=...)")
    assert f"a model name has at most {MAX_MODEL_CHARS}" in long_model[0]
    assert "that model is not configured; allowed: 'scripted'" in bad_model[0]
    assert "$schema" in bad_schema[0] and "is not a JSON Schema dialect" in bad_schema[0]
    assert "is not a valid JSON Schema" in bad_type[0]
    for slots in (long_model, bad_model, bad_schema, bad_type):
        assert len(slots[0]) < 1_200
    assert len(scripted(rlm).requests) == 1  # the root turn only


def test_a_guest_looping_on_a_refused_call_stops_making_nodes() -> None:
    """Refused slots cost no tokens, so no limit stopped them: a guest looping on a
    model name that is not allowed made 220,000 failed nodes in 20 s. The first
    `MAX_REFUSED_NODES` of a completion are nodes; later ones only fail their slots."""
    from rlm_graph.protocol.subcalls import MAX_REFUSED_NODES

    code = (
        "slots = []\n"
        "for _ in range(30):\n"
        "    slots += llm_query_batched(['x'] * 100, model='no-such-model')\n"
        "slots.append(llm_query('x', model='no-such-model'))\n"
        "FINAL(f'{len(slots)} {len(set(slots))}')"
    )
    rlm, result = _run(code, "local")
    assert result.response == "3001 2"  # every slot failed, with its call's reason
    failed = [r for r in result.graph.records("llm_call") if r.status.value == "error"]
    assert len(failed) == MAX_REFUSED_NODES
    assert "no-such-model" in (failed[0].error or "")


def test_a_str_subclass_cannot_hide_its_length_from_the_cap() -> None:
    from rlm_graph.protocol.subcalls import MAX_PROMPT_CHARS

    code = (
        "class Short(str):\n"
        "    def __len__(self):\n"
        "        return 0\n"
        f"r = llm_query(['hi ', Short('x' * {MAX_PROMPT_CHARS + 1})])\n"
        "FINAL(r)"
    )
    rlm, result = _run(code, "local")
    assert result.response.startswith("[ERROR] ConfigError") and "16,777,216" in result.response
    assert len(scripted(rlm).requests) == 1


@pytest.mark.processes
async def test_an_image_over_20_mib_forged_past_the_guests_check_is_refused_by_the_engine() -> None:
    # The guest refuses such an image itself; model code that finds the guest's pipe
    # caller (gc) sends it anyway: the engine refuses it before decoding it.
    code = (
        "import base64, gc\n"
        "from rlm_graph.contracts import SubcallRequest\n"
        "caller = next(o for o in gc.get_objects() if type(o).__name__ == '_PipeCaller')\n"
        "png = b'\\x89PNG\\r\\n\\x1a\\n' + bytes(20 * 2**20)\n"
        "image = {'media_type': 'image/png', 'data': base64.b64encode(png).decode()}\n"
        "FINAL(caller.call(SubcallRequest(fn='llm_query', prompts=(['look', image],))))"
    )
    rlm = engine([repl(code)], environment_kwargs={"max_message_mb": 32})
    result = await rlm.acompletion("ctx")
    assert result.response.startswith("[ERROR] ValueError"), result.response[:300]
    assert "the image is over 20 MiB" in result.response
    assert len(scripted(rlm).requests) == 1  # the root turn only: nothing was sent on


async def test_a_call_or_answer_over_the_message_cap_is_the_blocks_error_not_a_dead_guest() -> None:
    """What fits every per-call cap can still be over max_message_mb as JSON (a control
    character takes 6 bytes): the guest measures what it sends; the call, or the block's
    answer, fails saying so, and the REPL keeps its variables."""
    blocks = [
        "x = 41\nr = llm_query_batched(['y' * 300_000] * 3)",
        "print(llm_query('\\x00' * 120_000)[:5])",
        "answer['content'] = '\\x01' * 120_000\nprint('set')",
        "answer['content'] = ''\nFINAL('z' * 700_000)",
        "FINAL(str(x + 1))",
    ]
    rlm = engine(
        [repl(b) for b in blocks],
        sub=lambda r: "sub",
        environment_kwargs={"max_message_mb": 0.5, "output_cap": 10_000},
    )
    result = await rlm.acompletion("ctx")
    assert result.response == "42"  # the same guest: x survived every refusal
    outputs = [r.messages[-1].content for r in scripted(rlm).requests[1:]]
    assert sum("MessageTooLarge" in out and "max_message_mb" in out for out in outputs) == 4
    assert not any("EnvironmentCrashed" in out or "restarted" in out for out in outputs)
    assert scripted(rlm).requests[0].model == "scripted"
    assert not any(r.messages[-1].content.startswith("y" * 100) for r in scripted(rlm).requests)


DEEP_SCHEMA = "schema = c = {}\nfor _ in range(5000):\n    c['items'] = {}\n    c = c['items']\n"
NAN_SCHEMA = "schema = {'type': 'number', 'maximum': float('nan')}\n"


@pytest.mark.parametrize("environment", ["local", "subprocess"])
@pytest.mark.parametrize(
    ("build", "says"),
    [(DEEP_SCHEMA, "nests deeper"), (NAN_SCHEMA, "JSON data only")],
    ids=["nested-past-the-stack", "holding-nan"],
)
async def test_a_schema_python_or_json_cannot_hold_is_refused_alike(
    environment: str, build: str, says: str
) -> None:
    """Not a RecursionError from json, and NaN refused in local as in subprocess."""
    code = build + (
        "try:\n    llm_query('x', schema=schema)\nexcept TypeError as exc:\n    FINAL(str(exc))"
    )
    rlm = RLM("scripted", {"respond": root_and_sub([repl(code)])}, environment=environment)
    result = await rlm.acompletion("ctx")
    assert says in result.response and "RecursionError" not in result.response


def test_a_line_weighs_its_bytes_and_its_values_not_what_its_strings_hold() -> None:
    from rlm_graph.contracts import SubcallRequest
    from rlm_graph.repl.crossing import VALUE_BYTES, pipe_line, pipe_weight
    from rlm_graph_subprocess.guest import Subcall

    cap = 16 * 2**20
    text = b'{"a":"[{,:\\"\\\\",  "b":[1,{}]}\n'  # what the string holds is not counted
    assert pipe_weight(text, cap) == len(text) + VALUE_BYTES * 10  # { "a" : "..." , "b" : [ , {
    lists = b"[" + b",".join([b"[]"] * 1_000_000) + b"]\n"
    assert pipe_weight(lists, cap) > cap  # 3 MB, and 40 times that once parsed
    assert pipe_weight(b'"' + b'\\"' * 4_000_000 + b'"\n', cap) == 8_000_003 + VALUE_BYTES
    # What a model sends keeps fitting: 10,000 prompts, or images beside text.
    image = {"media_type": "image/png", "data": "iVBORw0K" * 100_000}
    batched = SubcallRequest(fn="llm_query_batched", prompts=tuple(f"p{i}" for i in range(10_000)))
    for request in (batched, SubcallRequest(fn="llm_query", prompts=(["look", image, "here"],))):
        line = pipe_line(Subcall(id=1, request=request))
        assert pipe_weight(line, cap) < min(cap, 2 * len(line) + 2**20)


def _forging_values(lists: int) -> str:
    """A block that writes one line of ``lists`` empty lists, as a batched call's prompts,
    straight to the engine's pipe, then waits to be stopped."""
    return (
        "import os, stat, time\n"
        f"junk = b'[' + b','.join([b'[]'] * {lists}) + b']'\n"
        'line = b\'{"type":"subcall","id":7,"request":{"fn":"llm_query_batched",\'\n'
        "line += b'\"prompts\":[' + junk + b',\"x\"]}}\\n'\n"
        "for fd in map(int, os.listdir('/proc/self/fd')):\n"
        "    try:\n"
        "        if stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
        "            os.write(fd, line)\n"
        "    except OSError:\n"  # the read end of a pipe
        "        pass\n"
        "time.sleep(30)\n"
        "FINAL('the forged line was served')"
    )


@pytest.mark.processes
async def test_a_forged_line_of_json_values_is_refused_unparsed_and_the_run_goes_on() -> None:
    # Parsed, a 3 MB line of a million empty lists held 120 MB of the engine for each
    # call in flight and took its trio thread for half a second (15 MB: 600 MB, 1.8 s).
    blocks = [_forging_values(1_000_000), "FINAL(llm_query_batched(['a', 'b'] * 500)[-1])"]
    rlm = engine([repl(b) for b in blocks], sub=lambda r: f"answered {r.prompt}")
    result = await rlm.acompletion("ctx")
    assert result.response == "answered b"  # a fresh guest, and legitimate calls go on
    told = feedback(rlm, 1)
    assert "EnvironmentCrashed" in told and "weighing more than 16 MB" in told, told[:400]
    assert not any(r.prompt == "x" for r in scripted(rlm).requests)  # nothing was served


@pytest.mark.processes
async def test_a_call_of_too_many_values_is_the_blocks_error_not_a_dead_guest() -> None:
    blocks = [
        "x = 41\ntry:\n    echo([[]] * 300_000)\nexcept Exception as exc:\n    print(type(exc).__name__, exc)",
        "FINAL(str(echo([x + 1] * 1000)[-1]))",
    ]
    rlm = engine([repl(b) for b in blocks], custom_tools={"echo": lambda value: value})
    result = await rlm.acompletion("ctx")
    assert result.response == "42"  # the same guest: x survived the refusal
    told = feedback(rlm, 1)
    assert "MessageTooLarge" in told and "restarted" not in told
    assert "for each value in it" in told and "max_message_mb" in told, told[:400]


@pytest.mark.processes
@pytest.mark.parametrize("depth", [220, 300])
async def test_a_typed_answer_nested_past_what_crosses_fails_its_slot_only(depth: int) -> None:
    """A sub-model's typed answer nested 220 deep killed the guest's reader (the REPL was
    restarted, its variables lost); 300 deep, the engine could not write its reply and
    the whole run ended with pydantic's ValueError."""
    blocks = [
        "x = 41\ngot = llm_query_batched(['deep', 'flat'], schema={'type': 'array'})",
        "FINAL(repr([x + 1, got[0][:100], got[1]]))",
    ]

    def sub(request: Any) -> str:
        return "[" * depth + "]" * depth if request.prompt.startswith("deep") else "[1]"

    rlm = engine([repl(b) for b in blocks], sub=sub)
    result = await rlm.acompletion("ctx")
    kept, deep, flat = eval(result.response)
    assert kept == 42  # the same guest: x survived
    assert deep.startswith("[ERROR] SchemaMismatch: the answer nests lists or objects more")
    assert flat == [1]


@pytest.mark.processes
async def test_a_custom_tools_error_reaches_the_guest_without_the_engines_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tool runs in the engine's process, with its keys, so that only its result
    crosses (docs/environments.md); its error crossed too, the token in the URL an HTTP
    client's error quoted as it was."""
    token = "tok-live-9f8e7d6c5b4a3210"
    monkeypatch.setenv("SEARCH_API_TOKEN", token)

    def search(query: str) -> str:
        raise RuntimeError(f"GET https://search.example/v1?q={query}&token={token}: 401")

    def nested(depth: int) -> list[Any]:
        value: list[Any] = []
        for _ in range(depth):
            value = [value]
        return value

    code = (
        "said = []\n"
        "for call in (lambda: search('x'), lambda: deep(150), lambda: deep(195)):\n"
        "    try:\n        call()\n    except Exception as exc:\n        said.append(str(exc))\n"
        "FINAL(repr(said))"
    )
    rlm = engine([repl(code)], custom_tools={"search": search, "deep": nested})
    result = await rlm.acompletion("ctx")
    searched, deep = eval(result.response)  # deep(150) crossed: no error
    assert token not in result.response and "token=[REDACTED]" in searched
    assert "nests lists or dicts more than 190 levels deep" in deep
