"""The guest program as a module: its wire, and the program itself spoken to by hand."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import TypeAdapter, ValidationError

from rlm_graph.contracts import SubcallRequest
from rlm_graph_subprocess.boundaries import guest_environ
from rlm_graph_subprocess.guest import (
    Execute,
    GuestMessage,
    HostMessage,
    Init,
    Reply,
    SetVariable,
    Subcall,
)
from rlm_graph_subprocess.process import GUEST_PROGRAM
from rlm_graph_subprocess.tools import defines_name, split_tools

HOST: TypeAdapter[object] = TypeAdapter(HostMessage)
GUEST: TypeAdapter[object] = TypeAdapter(GuestMessage)


def test_wire_messages_round_trip_and_refuse_unknown_fields() -> None:
    for message in (
        Execute(code="1 + 1"),
        SetVariable(name="x", value=[1, {"a": 2}]),
        Reply(id=3, value="v"),
    ):
        assert HOST.validate_json(message.model_dump_json()) == message
    call = Subcall(id=1, request=SubcallRequest(fn="llm_query_batched", prompts=("a", "b")))
    assert GUEST.validate_json(call.model_dump_json()) == call
    with pytest.raises(ValidationError):
        HOST.validate_json(json.dumps({"op": "execute", "code": "1", "cwd": "/"}))


def test_tool_sources_are_recognised_by_the_name_they_define() -> None:
    assert defines_name("def double(x):\n    return 2 * x", "double")
    assert defines_name("import math\nscale: float = math.pi", "scale")
    assert not defines_name("hello there", "greeting")
    assert not defines_name("def other(): pass", "double")
    split = split_tools(
        {"f": (len, "length"), "g": ("def g(): return 1", None), "d": ({"k": 1}, None)}
    )
    assert split.proxies == {"f": "length"} and split.code == {"g": "def g(): return 1"}
    assert split.data == {"d": {"k": 1}}


def converse(
    tmp_path: object, *requests: object, expect: int, limits: dict[str, object] | None = None
) -> list[dict[str, object]]:
    """Run the guest program, send ``requests``, read ``expect`` messages, close its input."""
    guest = subprocess.Popen(
        [sys.executable, "-P", GUEST_PROGRAM, json.dumps(limits or {})],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=str(tmp_path),
        env=guest_environ(str(tmp_path)),
    )
    assert guest.stdin is not None and guest.stdout is not None
    try:
        for request in requests:
            guest.stdin.write(request.model_dump_json().encode() + b"\n")  # type: ignore[attr-defined]
        guest.stdin.flush()
        out = [json.loads(guest.stdout.readline()) for _ in range(expect)]
        guest.stdin.close()  # end of input: the guest exits at once
        assert guest.wait(timeout=10) == 0
    finally:
        guest.kill()
        guest.wait()
        guest.stdout.close()
    return out


def test_the_guest_program_answers_each_request_in_order(tmp_path: object) -> None:
    out = converse(
        tmp_path,
        Init(
            scratch_dir=str(tmp_path),
            data_tools={"base": 40},
            code_tools={"inc": "def inc(x): return x + 1"},
        ),
        SetVariable(name="extra", value=1),
        Execute(
            code="import os\nos.write(1, b'stray\\n')\nprint(inc(base) + extra)\nFINAL('done')"
        ),
        expect=3,
        limits={"memory_limit_mb": 1024, "max_open_files": 64},
    )
    assert [m["type"] for m in out] == ["ready", "ok", "done"]
    assert out[0]["cwd"] == str(tmp_path)
    result = out[2]["result"]
    assert result["stdout"] == "42\ndone\n" and result["final_answer"] == "done"


def test_a_sub_call_goes_up_the_pipe_with_an_id(tmp_path: object) -> None:
    # Nobody answers: the guest has asked, and exits at end of input though it waits.
    out = converse(
        tmp_path,
        Init(scratch_dir=str(tmp_path)),
        Execute(code="llm_query('what is up?')"),
        expect=2,
    )
    assert out[1] == {
        "type": "subcall",
        "id": 1,
        "request": {
            "fn": "llm_query",
            "prompts": ["what is up?"],
            "model": None,
            "json_schema": None,
        },
    }
