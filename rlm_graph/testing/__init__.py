"""Public helpers for testing provider plugins and code built on rlm-graph.

- `FakeOpenAIServer`, `FakeAnthropicServer`: real HTTP servers on 127.0.0.1 that speak
  each API's wire format, answer from a script, fail on demand (429 with ``Retry-After``,
  500, a dropped connection), refuse past a concurrency ceiling (``max_in_flight``), wait
  a seeded heavy-tailed latency (`Lognormal`), and record every request, the peak in
  flight, the refusals and the requests a client gave up on (``cancelled``).
- `Reply`, `RecordedRequest`, `last_user_message`: the pieces of a script.

See docs/writing-a-provider.md for a walk-through.
"""

from __future__ import annotations

from .apis import FakeAnthropicServer as FakeAnthropicServer, FakeOpenAIServer as FakeOpenAIServer
from .latency import Lognormal as Lognormal
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
    "Lognormal",
    "RecordedRequest",
    "Reply",
    "last_user_message",
]
