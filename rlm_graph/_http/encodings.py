"""An answer's body decoded as its ``Content-Encoding`` says, never past a limit. Pure:
no I/O.

httpx decodes a body one network read at a time, each read in one call per coding: a
few kilobytes of gzip, or of gzip inside gzip, inflate to gigabytes in a single call,
before any check could stop them. Here each coding gives at most `PIECE` bytes per call
(zlib's ``max_length``), coding after coding, and the total is counted as it grows: a
body that inflates past its limit is refused with at most a few `PIECE`s in memory.

Codings, as httpx reads them: ``gzip`` (and ``x-gzip``), ``deflate`` (zlib-wrapped, or
raw when that fails at the first byte), ``identity``; several are undone last first.
Any other is left as it is, as httpx does without the library for it (the engine asks
for gzip and deflate only).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator

import httpx

__all__ = ["PIECE", "Inflater", "codings_of"]

PIECE = 64 * 1024
"""The most bytes one coding gives per call."""

MAX_CODINGS = 8
"""The most codings one body may name (a server applies one, now and then two)."""

_WBITS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}


def codings_of(headers: httpx.Headers) -> list[str]:
    """The codings this module undoes, in the order the server applied them."""
    if "content-encoding" not in headers:  # most answers: one lookup, nothing to undo
        return []
    values = headers.get_list("content-encoding", split_commas=True)
    return [c for c in (v.strip().lower() for v in values) if c in _WBITS]


_GZIP = b"\x1f\x8b"  # a gzip member's first bytes


class _Layer:
    """One coding, undone a `PIECE` at a time."""

    __slots__ = ("_first", "_gzip", "_raw_deflate", "_z")

    def __init__(self, coding: str) -> None:
        self._z = zlib.decompressobj(_WBITS[coding])
        self._raw_deflate = coding == "deflate"  # may fall back to raw deflate, once
        self._gzip = coding == "gzip"  # may hold several members, one after the other
        self._first = True

    def feed(self, data: bytes) -> Iterator[bytes]:
        pending = data
        while True:
            if self._z.eof and self._gzip and (self._z.unused_data + pending)[:2] == _GZIP:
                pending = self._z.unused_data + pending  # the next member (RFC 1952, 2.2)
                self._z = zlib.decompressobj(_WBITS["gzip"])
            try:
                out = self._z.decompress(pending, PIECE)
            except zlib.error as exc:
                if self._first and self._raw_deflate:  # deflate without zlib's header
                    self._z, self._raw_deflate = zlib.decompressobj(-zlib.MAX_WBITS), False
                    continue
                raise httpx.DecodingError(
                    f"the body is not what its encoding says ({exc})"
                ) from None
            self._first = False
            # At its end, what follows is unused_data (which the next member starts).
            pending = self._z.unconsumed_tail if not self._z.eof else b""
            if out:
                yield out
            # Done with this input: all of it taken, and no full piece left behind it
            # (or the stream's end, unless another gzip member follows it).
            if self._z.eof:
                if not (self._gzip and self._z.unused_data[:2] == _GZIP):
                    return
            elif not pending and len(out) < PIECE:
                return


class Inflater:
    """Undoes ``codings`` (`codings_of`) on a body fed in parts, in pieces of at most
    `PIECE` bytes; ``too_large()`` is raised once the decoded bytes pass ``limit``."""

    __slots__ = ("_layers", "_limit", "_too_large", "size")

    def __init__(self, codings: list[str], limit: int, too_large: Callable[[], Exception]) -> None:
        if len(codings) > MAX_CODINGS:  # each is a layer of the decoder, and a frame
            raise httpx.DecodingError(
                f"the body names {len(codings)} content codings, more than the {MAX_CODINGS} "
                "the engine undoes"
            )
        self._layers = [_Layer(c) for c in reversed(codings)]  # the last applied first
        self._limit = limit
        self._too_large = too_large
        self.size = 0  # decoded bytes so far

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The decoded pieces of the next part of the body.

        Raises:
            httpx.DecodingError: the body is not what its encoding says.
            Exception: ``too_large()``, past the limit.
        """
        return self._through(0, data)

    def _through(self, depth: int, data: bytes) -> Iterator[bytes]:
        if depth == len(self._layers):
            self.size += len(data)
            if self.size > self._limit:
                raise self._too_large()
            yield data
            return
        for piece in self._layers[depth].feed(data):
            yield from self._through(depth + 1, piece)
