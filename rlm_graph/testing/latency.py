"""Latencies for the fake servers: heavy-tailed and seeded, the way hosted models answer.

``FakeOpenAIServer(latency=Lognormal(median=1.0, p99=10.0, seed=7))`` waits a lognormal
time before every answer: half the answers within the median, one in a hundred past
``p99``. Seeded, so a test or a benchmark sees the same sequence of latencies every run
(in the order the server takes requests).
"""

from __future__ import annotations

import math
import random
import threading

__all__ = ["Lognormal"]

_Z99 = 2.3263478740408408  # the standard normal's 99th percentile


class Lognormal:
    """A seeded lognormal latency: ``median`` seconds, 1% of answers past ``p99``.

    Args:
        median: the median latency in seconds.
        p99: the 99th percentile in seconds (at least the median).
        seed: the random seed (the same seed, the same latencies).
    """

    def __init__(self, median: float, p99: float, seed: int = 0) -> None:
        if median <= 0 or p99 < median:
            raise ValueError(f"need 0 < median <= p99, not median={median} p99={p99}")
        self.median, self.p99, self.seed = median, p99, seed
        self._mu = math.log(median)
        self._sigma = math.log(p99 / median) / _Z99
        self._random = random.Random(seed)
        self._lock = threading.Lock()  # the server's threads draw from one sequence

    def __call__(self) -> float:
        with self._lock:
            return self._random.lognormvariate(self._mu, self._sigma)

    def __repr__(self) -> str:
        return f"Lognormal(median={self.median}, p99={self.p99}, seed={self.seed})"
