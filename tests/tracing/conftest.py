"""Tracing fixtures: an SDK tracer provider whose spans land in memory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.tracing import Memory


@pytest.fixture
def memory() -> Iterator[Memory]:
    found = Memory()
    yield found
    found.provider.shutdown()
