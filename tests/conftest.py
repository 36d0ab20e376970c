from __future__ import annotations

import pytest
import trio.testing


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Mock time that jumps ahead whenever every task is blocked: latency costs nothing."""
    return trio.testing.MockClock(autojump_threshold=0)
