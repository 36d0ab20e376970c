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
