"""A server that listens for what should never be sent: a schema reference the engine
must not fetch."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["listening"]


class _Listening(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.seen.append(self.path)  # type: ignore[attr-defined]
        body = json.dumps({"type": "string"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/schema+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def listening() -> Iterator[tuple[str, list[str]]]:
    """A server on 127.0.0.1 that serves a schema to anyone who asks, and counts who did."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Listening)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.seen  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
