"""The pieces under a streamed reply: server-sent events split from any chunking, and the
text a sink is given across retried attempts (each once; a rewind where they differ)."""

from __future__ import annotations

import pytest

from rlm_graph._http.streaming import MAX_EVENT, DeltaTracker, Oversized, SSEDecoder

BODY = (
    b'data: {"a": 1}\n\n'
    b'event: content_block_delta\ndata: {"b": 2}\n\n'
    b": a comment\n\n"
    b"data: line one\ndata: line two\n\n"
    b"data: [DONE]\n\n"
)
EVENTS = [
    ("message", '{"a": 1}'),
    ("content_block_delta", '{"b": 2}'),
    ("message", "line one\nline two"),
    ("message", "[DONE]"),
]


def test_events_come_out_the_same_whatever_the_chunks() -> None:
    for size in (1, 2, 3, 7, 16, len(BODY)):
        decoder = SSEDecoder()
        events = []
        for start in range(0, len(BODY), size):
            events += decoder.feed(BODY[start : start + size])
        assert events == EVENTS, size
    # Line ends as "\r\n" or a lone "\r" (each may be cut between two chunks), and a
    # mix of all three, read the same.
    lines = BODY.split(b"\n")
    mixed = lines[0] + b"".join(
        (b"\r\n", b"\n", b"\r")[i % 3] + line for i, line in enumerate(lines[1:])
    )
    for body in (BODY.replace(b"\n", b"\r\n"), BODY.replace(b"\n", b"\r"), mixed):
        for size in (1, 2, 3, 5, 16, len(body)):
            decoder, events = SSEDecoder(), []
            for start in range(0, len(body), size):
                events += decoder.feed(body[start : start + size])
            assert events == EVENTS, (body, size)


def test_an_empty_chunk_between_cr_and_lf_is_nothing() -> None:
    decoder = SSEDecoder()
    events = [e for c in (b"data: a\r", b"", b"\ndata: b\n\n") for e in decoder.feed(c)]
    assert events == [("message", "a\nb")]


def test_an_event_in_many_chunks_is_joined_once_and_cut_off_past_its_limit() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: ") == []
    for _ in range(100):
        assert decoder.feed(b"y" * 1000) == []
    assert decoder.feed(b"\n") == []
    assert decoder.feed(b"\ndata: next\n\n") == [("message", "y" * 100_000), ("message", "next")]
    decoder.feed(b"data: ")
    with pytest.raises(Oversized, match="an event over 4 MiB"):
        for _ in range(MAX_EVENT // 65536 + 1):
            decoder.feed(b"z" * 65536)


def _tracked() -> tuple[DeltaTracker, list[tuple[int, str]]]:
    given: list[tuple[int, str]] = []
    return DeltaTracker(lambda offset, text: given.append((offset, text))), given


def _text(given: list[tuple[int, str]]) -> str:
    text = ""
    for offset, piece in given:
        text = text[:offset] + piece
    return text


def test_a_retried_attempt_that_agrees_adds_only_what_is_new() -> None:
    tracker, given = _tracked()
    tracker.begin()
    tracker.feed("Hello, ")
    tracker.feed("wor")
    tracker.begin()  # the attempt broke off; the retry says the same, and more
    for piece in ("Hel", "lo, w", "orld", "!"):
        tracker.feed(piece)
    tracker.finish()
    assert given == [(0, "Hello, "), (7, "wor"), (10, "ld"), (12, "!")]
    assert _text(given) == "Hello, world!"


def test_a_retried_attempt_that_differs_rewinds_from_where_it_does() -> None:
    tracker, given = _tracked()
    tracker.begin()
    tracker.feed("Hello, world")
    tracker.begin()
    tracker.feed("Hello, there")
    tracker.finish()
    assert given[-1] == (7, "there") and _text(given) == "Hello, there"


def test_a_shorter_retried_attempt_takes_the_rest_back() -> None:
    tracker, given = _tracked()
    tracker.begin()
    tracker.feed("Hello, world")
    tracker.begin()
    tracker.feed("Hello")
    tracker.finish()
    assert given[-1] == (5, "") and _text(given) == "Hello"


def test_a_byte_order_mark_first_in_the_stream_is_dropped_even_cut_in_two() -> None:
    """The event-stream format drops one leading BOM; kept, it made the first line's
    field name "\ufeffdata", and the first event's text was lost."""
    for cut in range(0, 5):
        body = b"\xef\xbb\xbfdata: Hel\n\ndata: lo\n\n"
        decoder = SSEDecoder()
        events = decoder.feed(body[:cut]) + decoder.feed(body[cut:])
        assert events == [("message", "Hel"), ("message", "lo")], cut
    assert SSEDecoder().feed(b"data: \xef\xbb\xbfx\n\n") == [("message", "\ufeffx")]  # later: text


def test_events_with_no_data_and_a_done_with_spaces_are_read_not_refused() -> None:
    """An event whose data is empty, and ``data: [DONE] ``, failed the attempt as "not a
    JSON object": every retry a completion billed again."""
    from rlm_graph.contracts import ChatRequest, Message
    from rlm_graph_openai.provider import _ChunkStream

    stream = _ChunkStream("openai", "http://127.0.0.1:9/v1", ChatRequest(
        messages=(Message(role="user", content="q"),), model="m"))  # fmt: skip
    chunk = '{"choices": [{"delta": {"content": "Hi"}, "finish_reason": "stop"}]}'
    said = [stream.feed("message", data) for data in ("", " ", chunk, "[DONE] ")]
    assert said == ["", "", "Hi", ""] and stream.finished


def test_anthropic_usage_given_as_null_later_keeps_the_counts_given_first() -> None:
    """``message_delta``'s usage may hold ``null`` counts (the API types them optional):
    they wiped the input and cache counts ``message_start`` gave (and so cost and
    max_budget), without marking the usage estimated."""
    import json

    from rlm_graph.contracts import ChatRequest, Message
    from rlm_graph_anthropic.provider import _MessageStream

    stream = _MessageStream("http://127.0.0.1:9/v1/messages", ChatRequest(
        messages=(Message(role="user", content="q"),), model="m"))  # fmt: skip
    start = {"input_tokens": 100, "cache_read_input_tokens": 1000,
             "cache_creation_input_tokens": 50, "output_tokens": 1}  # fmt: skip
    nulls = {"input_tokens": None, "cache_read_input_tokens": None,
             "cache_creation_input_tokens": None, "output_tokens": 7}  # fmt: skip
    events = [
        {"type": "message_start", "message": {"model": "m", "usage": start}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": nulls},
        {"type": "message_stop"},
    ]
    for event in events:
        stream.feed(event["type"], json.dumps(event))
    usage = stream.result().usage
    assert (usage.input_tokens, usage.output_tokens) == (1150, 7)
    assert (usage.cached_tokens, usage.cache_write_tokens) == (1000, 50)
