"""Public helpers for testing provider plugins and code built on rlm-graph.

- `FakeOpenAIServer`, `FakeAnthropicServer`: real HTTP servers on 127.0.0.1 that speak
  each API's wire format, answer from a script, fail on demand (429 with ``Retry-After``,
  500, a dropped connection) and record every request and the peak in flight.
- `Reply`, `RecordedRequest`, `last_user_message`: the pieces of a script.

See docs/writing-a-provider.md for a walk-through.
"""

from __future__ import annotations

from .apis import FakeAnthropicServer as FakeAnthropicServer, FakeOpenAIServer as FakeOpenAIServer
from .servers import (
    FakeServer as FakeServer,
    RecordedRequest as RecordedRequest,
    Reply as Reply,
    last_user_message as last_user_message,
)

__all__ = [
    "FakeAnthropicServer",
    "FakeOpenAIServer",
    "FakeServer",
    "RecordedRequest",
    "Reply",
    "last_user_message",
]
