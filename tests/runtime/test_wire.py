"""HTTP/1.1 on the wire (`rlm_graph._http.wire`): responses read from bytes as they come,
however the socket splits them, and every malformed response refused with a message that
says what was wrong. The server is untrusted: nothing it sends may stall the parser or
grow its buffer without bound."""

from __future__ import annotations

import pytest

from rlm_graph._http import wire
from rlm_graph._http.wire import (
    MAX_CHUNK_LINE,
    MAX_HEAD,
    MAX_INTERIM,
    ProtocolError,
    Response,
    request_bytes,
)

CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"6;name=value\r\nhello \r\n"
    b"5\r\nworld\r\n"
    b"0\r\nX-Trailer: yes\r\n\r\n"
)
LENGTH = b"HTTP/1.1 201 Created\r\nContent-Length: 11\r\nX-Id:  abc \r\n\r\nhello world"


def _read(data: bytes, *, step: int | None = None) -> tuple[Response, bytes]:
    """``data`` fed ``step`` bytes at a time (whole: None); the response and its body."""
    response = Response()
    body: list[bytes] = []
    pieces = [data] if step is None else [data[i : i + step] for i in range(0, len(data), step)]
    for piece in pieces:
        response.feed(piece)
        if response.head():
            body += response.body()
    return response, b"".join(body)


@pytest.mark.parametrize("message", [CHUNKED, LENGTH], ids=["chunked", "length"])
def test_a_response_split_anywhere_reads_the_same(message: bytes) -> None:
    whole, expected = _read(message)
    assert expected == b"hello world" and whole.done and whole.reusable
    for step in range(1, 12):
        response, body = _read(message, step=step)
        assert body == expected, step
        assert (response.status, response.headers) == (whole.status, whole.headers)
        assert response.done and response.reusable
    for cut in range(len(message)):  # and split in two at every byte
        response = Response()
        body = []
        for piece in (message[:cut], message[cut:]):
            response.feed(piece)
            if response.head():
                body += response.body()
        assert b"".join(body) == expected, cut


def test_head_fields() -> None:
    response, _ = _read(LENGTH)
    assert response.status == 201 and response.reason == b"Created"
    assert response.headers == [(b"Content-Length", b"11"), (b"X-Id", b"abc")]


def test_informational_answers_are_skipped() -> None:
    response, body = _read(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early\r\nLink: x\r\n\r\n" + LENGTH
    )
    assert response.status == 201 and body == b"hello world"


@pytest.mark.parametrize(
    ("head", "reusable"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", True),
        (b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 2\r\n\r\nok", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", False),
        # both framings: the chunked one is read, and the connection is not trusted again
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\nok\r\n0\r\n\r\n",
            False,
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK", False),  # bytes after it
    ],
)
def test_which_connections_are_reused(head: bytes, reusable: bool) -> None:
    response, body = _read(head)
    assert body == b"ok" and response.done
    assert response.reusable is reusable


def test_a_body_until_close_ends_when_the_connection_does() -> None:
    response, body = _read(b"HTTP/1.1 200 OK\r\n\r\nall of it")
    assert body == b"all of it" and not response.done
    response.closed()
    assert response.done and not response.reusable


@pytest.mark.parametrize("status", [204, 304])
def test_answers_without_a_body(status: int) -> None:
    response, body = _read(b"HTTP/1.1 %d X\r\nContent-Length: 5\r\n\r\n" % status)
    assert body == b"" and response.done and response.reusable


def test_the_answer_to_head_has_no_body() -> None:
    response = Response(head_request=True)
    response.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n")
    assert response.head() and response.done and response.body() == []


@pytest.mark.parametrize(
    "message",
    [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf", CHUNKED[: CHUNKED.index(b"world")]],
    ids=["length", "chunked"],
)
def test_a_connection_closed_mid_body_is_an_error(message: bytes) -> None:
    response, _ = _read(message)
    with pytest.raises(ProtocolError, match="closed the connection mid-response"):
        response.closed()


OK_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("message", "says"),
    [
        (b"HTTP/2 200 OK\r\n\r\n", "not an HTTP/1.1 status line"),
        (b"ICY 200 OK\r\n\r\n", "not an HTTP/1.1 status line"),
        (b"HTTP/1.1 20 OK\r\n\r\n", "not an HTTP/1.1 status line"),
        (b"HTTP/1.1 000 Zero\r\n\r\n", "not an HTTP/1.1 status line"),
        (b"HTTP/1.1 099 Low\r\n\r\n", "not an HTTP/1.1 status line"),
        (b"HTTP/1.1 600 High\r\n\r\n", "not an HTTP/1.1 status line"),
        (b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", "folded header"),
        (b"HTTP/1.1 200 OK\r\nX a: b\r\n\r\n", "not a valid header line"),
        (b"HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n", "not a valid header line"),
        (b"HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n", "not a valid header line"),
        (b"HTTP/1.1 200 OK\r\nNo colon\r\n\r\n", "not a valid header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "not a valid Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n", "not a valid Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n", "not a valid Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", "Transfer-Encoding"),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", "switched protocols"),
        (OK_HEAD + b"0x5\r\nhello\r\n0\r\n\r\n", "chunk-size line"),
        (OK_HEAD + b"+5\r\nhello\r\n0\r\n\r\n", "chunk-size line"),
        (OK_HEAD + b"1_0\r\nhello\r\n0\r\n\r\n", "chunk-size line"),
        (OK_HEAD + b" 5\r\nhello\r\n0\r\n\r\n", "chunk-size line"),
        (OK_HEAD + b"\r\n", "chunk-size line"),
        (OK_HEAD + b"5\nhello\r\n0\r\n\r\n", "chunk-size line"),
        (OK_HEAD + b"1" * 17 + b"\r\n", "chunk-size line"),
        (OK_HEAD + b"5\r\nhello!\r\n0\r\n\r\n", "not followed by CRLF"),
        (OK_HEAD + b"0\r\nBad trailer\r\n\r\n", "not a valid header line"),
    ],
)
def test_malformed_responses_are_refused_with_what_was_wrong(message: bytes, says: str) -> None:
    with pytest.raises(ProtocolError, match=says):
        _read(message)


def test_informational_answers_without_end_are_cut_off() -> None:
    """A server sending 1xx answers forever would hold a request whose timeout is per
    read: after `MAX_INTERIM` of them, the answer is refused."""
    interim = b"HTTP/1.1 102 Processing\r\n\r\n"
    _read(interim * MAX_INTERIM + LENGTH)  # up to the limit: read as usual
    with pytest.raises(ProtocolError, match="informational"):
        _read(interim * (MAX_INTERIM + 1) + LENGTH)


def test_chunk_extensions_and_hex_sizes_in_either_case() -> None:
    _, body = _read(OK_HEAD + b"A ; ext\r\n0123456789\r\na\r\nabcdefghij\r\n0\r\n\r\n")
    assert body == b"0123456789abcdefghij"


@pytest.mark.parametrize(
    ("message", "says"),
    [
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * MAX_HEAD, "head is over"),
        (OK_HEAD + b"5;" + b"x" * MAX_CHUNK_LINE, "chunk-size line is over"),
        (OK_HEAD + b"0\r\nX: " + b"a" * MAX_HEAD, "trailers are over"),
    ],
)
def test_a_server_that_never_ends_a_line_is_cut_off(message: bytes, says: str) -> None:
    """Fed 4 KiB at a time, the way a socket brings it: the error comes as soon as the
    limit is passed, whatever more the server would send."""
    with pytest.raises(ProtocolError, match=says):
        _read(message + b"a" * (4 * MAX_HEAD), step=4096)


def test_a_hostile_header_value_fails_without_backtracking() -> None:
    """Long runs of spaces with a control character at the end: a regular expression
    that backtracks would take minutes on this; the parser refuses it in one pass."""
    line = b"X:" + b" " * 30_000 + b"a" + b" " * 30_000 + b"\x01"
    with pytest.raises(ProtocolError, match="not a valid header line"):
        _read(b"HTTP/1.1 200 OK\r\n" + line + b"\r\n\r\n")


def test_request_bytes() -> None:
    sent = request_bytes(b"POST", b"/v1/x?y=1", [(b"Host", b"h")], b"{}")
    assert sent == b"POST /v1/x?y=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}"
    assert (
        request_bytes(b"GET", b"/", [(b"Host", b"h")], b"") == b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"
    )
    assert request_bytes(b"POST", b"/", [], b"").endswith(b"\r\nContent-Length: 0\r\n\r\n")


@pytest.mark.parametrize(
    "framing",
    [(b"Content-Length", b"1"), (b"content-length", b"99"), (b"Transfer-Encoding", b"chunked")],
)
def test_the_body_is_framed_by_its_length_whatever_the_caller_says(
    framing: tuple[bytes, bytes],
) -> None:
    """A framing header the caller passes (a plugin's, a user's) could make the server
    read the body as something else, or the next request as part of it."""
    for _ in range(2):  # the second time from the checked lines
        sent = request_bytes(b"POST", b"/", [framing, (b"Host", b"h")], b"{}")
        assert sent == b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}"


def test_a_bad_header_is_refused_every_time_and_the_checked_lines_stay_bounded() -> None:
    good = [(b"Host", b"h"), (b"X-Trace", b"1")]
    for _ in range(2):
        with pytest.raises(ValueError, match="CR, LF or NUL"):
            request_bytes(b"POST", b"/", [*good, (b"X-Key", b"a\r\nX-Injected: 1")], b"")
        with pytest.raises(ValueError, match="not a valid header name"):
            request_bytes(b"POST", b"/", [*good, (b"X Key", b"a")], b"")
    for n in range(2000):  # a value new on every request, as a trace id is
        sent = request_bytes(b"POST", b"/", [(b"traceparent", str(n).encode())], b"")
        assert f"traceparent: {n}\r\n".encode() in sent
    assert len(wire._LINES) <= wire._MAX_LINES


@pytest.mark.parametrize(
    ("method", "target", "headers"),
    [
        (b"POST", b"/", [(b"X-Key", b"a\r\nX-Injected: 1")]),
        (b"POST", b"/", [(b"X-Key", b"a\nb")]),
        (b"POST", b"/", [(b"X-Key", b"a\x00b")]),
        (b"POST", b"/", [(b"X Key", b"a")]),
        (b"POST", b"/", [(b"", b"a")]),
        (b"POST", b"/ HTTP/1.1\r\nX: y", []),
        (b"POST", b"/a b", []),
        (b"PO ST", b"/", []),
    ],
)
def test_a_request_cannot_be_split_by_what_it_carries(
    method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    with pytest.raises(ValueError, match="not a valid|CR, LF or NUL"):
        request_bytes(method, target, headers, b"")


@pytest.mark.parametrize(
    "header",
    [[b"X-A", b"1"], (bytearray(b"X-A"), b"1"), (b"X-A", bytearray(b"a\r\nX-B: 2")), ("X-A", "1")],
)
def test_a_header_of_another_shape_is_sent_or_refused_plainly(header: object) -> None:
    """A list for a pair, or a bytearray, works as a tuple of bytes does (or is refused
    with the same reason); a str is refused naming the types, not with a TypeError."""
    try:
        sent = request_bytes(b"POST", b"/", [header], b"")  # type: ignore[list-item]
    except ValueError as exc:
        assert "CR, LF or NUL" in str(exc) or "must be bytes" in str(exc)
    else:
        assert sent.startswith(b"POST / HTTP/1.1\r\nX-A: 1\r\n")


def test_a_long_header_value_is_checked_each_time_not_kept() -> None:
    long = (b"X-Baggage", b"k=" + b"v" * 8000)
    for _ in range(2):
        assert b"v" * 8000 in request_bytes(b"POST", b"/", [long], b"")
    assert long not in wire._LINES
