from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio.testing


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Mock time that jumps ahead whenever every task is blocked: latency costs nothing."""
    return trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """One real local Ray cluster (2 CPUs) for the whole test session (batches, evaluations)."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'rlm-graph[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()
