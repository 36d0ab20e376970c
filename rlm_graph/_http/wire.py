"""HTTP/1.1 on the wire, the client's side: a request's bytes, and a response read from
bytes as they come (the status line and headers, then the body, framed by
``Content-Length``, chunked, or the connection's close). Pure: no I/O.

The lean transport (`rlm_graph._http.transport`) used h11 for this. h11 is a general
state machine for both sides of a connection, and on the 2-core machines this engine is
measured on it cost about 90 us of CPU per request and answer, and about 11 us per
chunk of a streamed reply, where a token is a chunk: more than the rest of the engine's
work on a streamed reply (docs/benchmarks.md). Here one response is one `Response`, and
a read of the socket is parsed in one pass, however many chunks it holds.

The server's bytes are untrusted. What RFC 9112 does not allow in a response is a
`ProtocolError` naming what was wrong, and the connection is not reused after it:
    - a status line that is not ``HTTP/1.x NNN reason`` with NNN from 100 to 599; a
      header that is not ``token: value`` (a folded header line included), or with a
      control character; a 101 (protocol switch); more than `MAX_INTERIM` 1xx
      answers;
    - a head (status line and headers, or a chunked body's trailers) over `MAX_HEAD`
      bytes, a chunk-size line over `MAX_CHUNK_LINE`; a chunk size that is not 1 to 16
      hex digits (no sign, no ``0x``, no ``_``); a chunk not ended by CRLF;
    - where it frames the body (RFC 9112, section 6.3: not for a 204, a 304, the
      answer to HEAD, nor beside ``Transfer-Encoding``): a ``Content-Length`` that is
      not digits, or two that disagree; a ``Transfer-Encoding`` other than exactly
      ``chunked``;
    - a connection closed before the body's end (where the body has a length or is
      chunked).

Invariants:
    - A response is reusable (its connection may carry the next request) only when it
      was read to its end, the server keeps the connection alive (HTTP/1.1, no
      ``Connection: close``, a framed body, no ``Transfer-Encoding`` beside a
      ``Content-Length``), and nothing came after it.
    - Informational (1xx) answers before the final one are skipped.
    - `request_bytes` refuses a header name that is not a token and a value, method or
      target with a CR, LF or NUL: nothing a caller passes can add a header or a
      request. It frames the body itself (``Content-Length``): a caller's framing
      header cannot make the server read the body differently.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "MAX_CHUNK_LINE",
    "MAX_HEAD",
    "MAX_INTERIM",
    "ProtocolError",
    "Response",
    "is_token",
    "request_bytes",
]

MAX_HEAD = 64 * 1024
"""The most bytes a response's status line and headers (or a chunked body's trailers)
may take."""

MAX_CHUNK_LINE = 4 * 1024
"""The most bytes a chunk-size line (the size and its extensions) may take."""

MAX_INTERIM = 16
"""The most informational (1xx) answers before the final one: a server sending them
forever would hold a request whose timeout is per read."""

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_NAME = re.compile(_TOKEN)
_STATUS = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9]{2})(?: ([\t\x20-\x7e\x80-\xff]*))?")
# Possessive quantifiers (*+): a hostile value fails in one pass, never by backtracking.
_HEADER = re.compile(rb"(" + _TOKEN + rb"):[ \t]*+([\t\x20-\x7e\x80-\xff]*+)")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*+(?:;[^\r\n]*+)?")
_BREAKS = re.compile(rb"[\r\n\x00]")

_HEAD, _LENGTH, _CHUNK_SIZE_LINE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE, _DONE = range(8)


class ProtocolError(Exception):
    """The server's bytes are not an HTTP/1.1 response (the message says where)."""


def is_token(name: bytes) -> bool:
    """Whether ``name`` may be a header's name (or a method): an RFC 9110 token."""
    return _NAME.fullmatch(name) is not None


def is_value(value: bytes) -> bool:
    """Whether ``value`` may be a header's value: no CR, LF or NUL (nothing that could
    end the header, or the request, early)."""
    return _BREAKS.search(value) is None


def request_bytes(
    method: bytes, target: bytes, headers: Iterable[tuple[bytes, bytes]], body: bytes
) -> bytes:
    """A request as it goes on the wire, its body framed by ``Content-Length``: any
    ``Content-Length`` or ``Transfer-Encoding`` in ``headers`` is left out (the body is
    sent whole), the other ``headers`` are sent as given.

    Raises:
        ValueError: a header name that is not a token, or a CR, LF or NUL in the
            method, the target or a header value.
    """
    if not _NAME.fullmatch(method) or _BREAKS.search(target) or b" " in target or not target:
        raise ValueError(f"not a valid request line: {method!r} {target!r}")
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    lines = _LINES
    for name, value in headers:
        try:
            line = lines.get((name, value))
        except TypeError:  # not hashable (a bytearray): not remembered, checked below
            line = None
        if line is None:
            line = _header_line(name, value)
        parts.append(line)
    if body or method not in _NO_BODY:
        parts += (b"Content-Length: ", str(len(body)).encode(), b"\r\n")
    parts += (b"\r\n", body)
    return b"".join(parts)


_NO_BODY = frozenset((b"GET", b"HEAD", b"DELETE", b"OPTIONS"))
"""Methods whose request says nothing of a body when it has none."""

_FRAMING = frozenset((b"content-length", b"transfer-encoding"))

_LINES: dict[tuple[bytes, bytes], bytes] = {}
"""Header lines already checked, by (name, value): a provider sends the same few on
every request, and a check costs more than the lookup. Bounded: at most `_MAX_LINES`
lines of at most `_MAX_KEPT` bytes each (a long value, or one new on every request,
such as a trace id, is checked each time)."""

_MAX_LINES = 512
_MAX_KEPT = 256


def _header_line(name: bytes, value: bytes) -> bytes:
    """``name: value`` and its CRLF (empty for a framing header: `request_bytes` frames
    the body), checked, and remembered when short."""
    if not isinstance(name, bytes | bytearray | memoryview) or not isinstance(
        value, bytes | bytearray | memoryview
    ):
        raise ValueError(
            f"a header's name and value must be bytes, not {type(name).__name__} and "
            f"{type(value).__name__}"
        )
    name, value = bytes(name), bytes(value)
    if not _NAME.fullmatch(name):
        raise ValueError(f"not a valid header name: {name!r}")
    if not is_value(value):
        raise ValueError(f"header {name.decode()!r} has a CR, LF or NUL in its value")
    line = b"" if name.lower() in _FRAMING else b"".join((name, b": ", value, b"\r\n"))
    if len(line) <= _MAX_KEPT:
        if len(_LINES) >= _MAX_LINES:  # values new on every request: start over
            _LINES.clear()
        _LINES[(name, value)] = line
    return line


class Response:
    """One response, read from the bytes of its connection as they come.

    `feed` what the socket brought, then `head` (False until the whole head came), then
    `body` for the body's bytes so far; `closed` when the socket reads nothing more.
    ``done`` once the body has ended; ``reusable`` says whether the connection may
    carry another request (see the module's invariants).

    Args:
        head_request: the request was ``HEAD`` (its answer has no body, whatever its
            headers say).
    """

    __slots__ = (
        "_buf",
        "_head_request",
        "_interim",
        "_left",
        "_pos",
        "_scan",
        "_state",
        "done",
        "headers",
        "keep_alive",
        "reason",
        "status",
    )

    def __init__(self, head_request: bool = False) -> None:
        self._buf = b""
        self._pos = 0
        self._scan = 0  # where the search for the head's (or trailers') end goes on
        self._state = _HEAD
        self._left = 0
        self._head_request = head_request
        self._interim = 0
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False
        self.done = False

    @property
    def reusable(self) -> bool:
        """Whether the connection may carry the next request (the module's invariants)."""
        return self.done and self.keep_alive and self._pos >= len(self._buf)

    def feed(self, data: bytes) -> None:
        """Bytes the connection brought, in order."""
        pos = self._pos
        if pos >= len(self._buf):
            self._buf, self._pos, self._scan = data, 0, 0
        else:
            self._buf, self._pos = self._buf[pos:] + data, 0
            self._scan = max(0, self._scan - pos)

    def head(self) -> bool:
        """Whether the final (non-1xx) head has come; its ``status``, ``reason`` and
        ``headers`` are then set.

        Raises:
            ProtocolError: the head is not an HTTP/1.1 response's, or too long.
        """
        while self._state == _HEAD:
            buf, pos = self._buf, self._pos
            end = self._find_end(buf, pos)
            if end - pos > MAX_HEAD or (end < 0 and len(buf) - pos > MAX_HEAD):
                raise ProtocolError(f"the response's head is over {MAX_HEAD} bytes")
            if end < 0:
                return False
            self._pos = self._scan = end + 4
            self._read_head(buf[pos:end])
        return True

    def _read_head(self, block: bytes) -> None:
        lines = block.split(b"\r\n")
        status = _STATUS.fullmatch(lines[0])
        if status is None:
            raise ProtocolError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
        code = int(status[2])
        headers = [_header(line) for line in lines[1:]]
        if code < 200:
            if code == 101:
                raise ProtocolError("the server switched protocols (101): not supported")
            self._interim += 1
            if self._interim > MAX_INTERIM:
                raise ProtocolError(f"more than {MAX_INTERIM} informational (1xx) answers")
            return  # informational: the final answer comes next
        self.status, self.reason, self.headers = code, status[3] or b"", headers
        self._frame(status[1] == b"1", code)

    def _frame(self, http11: bool, code: int) -> None:
        """The body's framing (RFC 9112, section 6.3) and whether the connection lives on."""
        encodings: list[bytes] = []
        lengths: list[bytes] = []
        close = not http11
        for name, value in self.headers:
            lower = name.lower()
            if lower == b"transfer-encoding":
                encodings += (v.strip().lower() for v in value.split(b","))
            elif lower == b"content-length":
                lengths += (v.strip() for v in value.split(b","))
            elif lower == b"connection":
                close = close or b"close" in (v.strip().lower() for v in value.split(b","))
        if self._head_request or code in (204, 304):
            self._state = _DONE
        elif encodings:
            if encodings != [b"chunked"]:
                shown = b", ".join(encodings).decode("latin-1")
                raise ProtocolError(f"unsupported Transfer-Encoding {shown!r} (only chunked)")
            close = close or bool(lengths)  # both framings: a smuggling attempt, or a bug
            self._state = _CHUNK_SIZE_LINE
        elif lengths:
            if any(not v.isdigit() or len(v) > 18 for v in lengths) or len(set(lengths)) > 1:
                shown = b", ".join(lengths).decode("latin-1")
                raise ProtocolError(f"not a valid Content-Length: {shown!r}")
            self._left = int(lengths[0])
            self._state = _LENGTH if self._left else _DONE
        else:
            close = True
            self._state = _UNTIL_CLOSE
        self.keep_alive = not close
        self.done = self._state == _DONE

    def _find_end(self, buf: bytes, pos: int) -> int:
        """Where the blank line that ends a head (or trailers) starts in ``buf``, -1 if
        it has not come; bytes already searched are not searched again."""
        end = buf.find(b"\r\n\r\n", max(pos, self._scan))
        if end < 0:
            self._scan = max(pos, len(buf) - 3)
        return end

    def body(self) -> list[bytes]:
        """The body's bytes that came since the last call (in pieces, possibly none);
        ``done`` once it has ended.

        Raises:
            ProtocolError: the chunked framing is broken.
        """
        state = self._state
        if state == _LENGTH:
            return self._take_length()
        if state == _UNTIL_CLOSE:
            buf, pos = self._buf, self._pos
            self._buf, self._pos = b"", 0
            return [buf[pos:]] if pos < len(buf) else []
        if state == _DONE or state == _HEAD:
            return []
        return self._take_chunks()

    def _take_length(self) -> list[bytes]:
        buf, pos, left = self._buf, self._pos, self._left
        end = min(len(buf), pos + left)
        if end == pos:
            return []
        piece = buf if pos == 0 and end == len(buf) else buf[pos:end]
        self._pos, self._left = end, left - (end - pos)
        if not self._left:
            self._state, self.done = _DONE, True
        return [piece]

    def _take_chunks(self) -> list[bytes]:
        buf, pos, size = self._buf, self._pos, len(self._buf)
        state, left = self._state, self._left
        out: list[bytes] = []
        while pos < size:
            if state == _CHUNK_DATA:
                end = min(size, pos + left)
                out.append(buf[pos:end])
                left -= end - pos
                pos = end
                if left:
                    break
                state = _CHUNK_END
            elif state == _CHUNK_SIZE_LINE:
                eol = buf.find(b"\r\n", pos, pos + MAX_CHUNK_LINE + 2)
                if eol < 0:
                    if size - pos > MAX_CHUNK_LINE:
                        raise ProtocolError(f"a chunk-size line is over {MAX_CHUNK_LINE} bytes")
                    break
                found = _CHUNK_SIZE.fullmatch(buf, pos, eol)
                if found is None:
                    raise ProtocolError(f"not a valid chunk-size line: {buf[pos:eol][:80]!r}")
                left, pos = int(found[1], 16), eol + 2
                state = _CHUNK_DATA if left else _TRAILERS
            elif state == _CHUNK_END:
                if size - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise ProtocolError("a chunk's data is not followed by CRLF")
                pos += 2
                state = _CHUNK_SIZE_LINE
            else:  # _TRAILERS: header lines up to an empty one, ignored
                if buf.startswith(b"\r\n", pos):
                    pos += 2
                    state, self.done = _DONE, True
                    break
                end = self._find_end(buf, pos)
                if end - pos > MAX_HEAD or (end < 0 and size - pos > MAX_HEAD):
                    raise ProtocolError(f"the body's trailers are over {MAX_HEAD} bytes")
                if end < 0:
                    break
                for line in buf[pos:end].split(b"\r\n"):
                    _header(line)
                pos = end + 4
                state, self.done = _DONE, True
                break
        self._pos, self._state, self._left = pos, state, left
        return out

    def closed(self) -> None:
        """The connection reads nothing more: the end of a body read until close.

        Raises:
            ProtocolError: the body had a length or was chunked, and had not ended.
        """
        if self._state == _UNTIL_CLOSE:
            self._state, self.done = _DONE, True
        elif self._state != _DONE:
            raise ProtocolError("the server closed the connection mid-response")


def _header(line: bytes) -> tuple[bytes, bytes]:
    found = _HEADER.fullmatch(line)
    if found is None:
        if line[:1] in (b" ", b"\t"):
            raise ProtocolError(f"a folded header line (obsolete, refused): {line[:80]!r}")
        raise ProtocolError(f"not a valid header line: {line[:80]!r}")
    return found[1], found[2].rstrip(b" \t")
