"""What a request's hash tells apart: a changed request must never replay an old reply."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib

from rlm_graph.contracts import ChatRequest, Image, Message, ResponseSchema
from rlm_graph.journal.keys import call_hash, request_hash, run_key


def _png(width: int, height: int) -> Image:
    """A real PNG of ``width`` x ``height`` (same byte count for the same area)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    raw = b"".join(b"\x00" + b"\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    data = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )
    return Image.from_bytes(data)


def _ask(*messages: Message, **params: object) -> ChatRequest:
    return ChatRequest(model="m", messages=messages, **params)  # type: ignore[arg-type]


def test_two_images_of_one_size_and_type_hash_apart() -> None:
    wide, tall = _png(8, 2), _png(2, 8)
    assert str(wide) == str(tall)  # the text a model's content carries is the same
    assert len(wide.data) == len(tall.data)
    one = _ask(Message.of_parts("user", ["what is this?", wide]))
    two = _ask(Message.of_parts("user", ["what is this?", tall]))
    assert one.messages[0].content == two.messages[0].content
    assert request_hash(one) != request_hash(two)


def test_parameters_and_the_answer_schema_are_part_of_the_request() -> None:
    plain = _ask(Message(role="user", content="q"))
    hashes = {
        request_hash(plain),
        request_hash(_ask(Message(role="user", content="q"), temperature=0.5)),
        request_hash(_ask(Message(role="user", content="q"), extra={"reasoning_effort": "low"})),
        request_hash(
            _ask(
                Message(role="user", content="q"),
                response_schema=ResponseSchema(json_schema={"type": "integer"}),
            )
        ),
        request_hash(
            _ask(
                Message(role="user", content="q"),
                response_schema=ResponseSchema(json_schema={"type": "string"}),
            )
        ),
        request_hash(ChatRequest(model="other", messages=plain.messages)),
        request_hash(_ask(Message(role="system", content="q"))),
    }
    assert len(hashes) == 7
    # Where a call is (its node and depth) is the journal's key, not the request's.
    assert request_hash(plain) == request_hash(
        plain.model_copy(update={"node_id": "x", "depth": 3})
    )


def test_text_holding_the_separator_cannot_pass_for_other_messages() -> None:
    one_message = _ask(Message(role="user", content="a\x00user\x00b"))
    two_messages = _ask(Message(role="user", content="a"), Message(role="user", content="b"))
    assert request_hash(one_message) != request_hash(two_messages)


def test_the_model_call_path_hashes_as_the_request_does() -> None:
    for request in (
        _ask(Message(role="user", content="sq 7")),
        _ask(Message(role="user", content="lone \ud800 surrogate")),
        _ask(Message(role="user", content="nul \x00 inside")),
        _ask(Message(role="system", content="s"), Message(role="user", content="u")),
        _ask(Message(role="user", content="q"), max_tokens=5, stop=("x",)),
        _ask(Message.of_parts("user", ["see", _png(3, 3)])),
    ):
        settled = request if request.max_tokens is not None else None
        assert call_hash(request.model, request.messages, settled) == request_hash(request)


def test_a_context_holding_a_set_keys_the_same_run_in_every_process() -> None:
    """A set's own order is its members' hash order, which differs between processes:
    a journaled run over a context holding one never resumed (a new key each time)."""
    code = (
        "from rlm_graph.journal.keys import run_key\n"
        "print(run_key('rlm', {'context': {'tags': {'alpha', 'beta', 'gamma', 'delta'}}}, []))"
    )
    keys = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(keys) == 1


def test_a_dict_with_keys_of_several_types_has_a_key_and_keeps_them_apart() -> None:
    """``{1: ..., "a": ...}`` as a journaled run's context crashed the run (sorting its
    keys); ``1`` and ``"1"`` are different keys."""
    assert run_key("rlm", {"context": {1: "x", "a": "y"}}, []) == run_key(
        "rlm", {"context": {"a": "y", 1: "x"}}, []
    )
    assert run_key("rlm", {"context": {1: "x", "a": "y"}}, []) != run_key(
        "rlm", {"context": {"1": "x", "a": "y"}}, []
    )
