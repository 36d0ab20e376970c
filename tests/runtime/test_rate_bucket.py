"""`RateBucket`: the rate arithmetic the trio limiter and the Ray limits actor share."""

from __future__ import annotations

import pytest

from rlm_graph.limits import RateBucket


def test_a_minute_of_requests_passes_at_once_then_one_every_60_over_rpm() -> None:
    bucket = RateBucket(rpm=3)
    assert [bucket.take_or_wait(0, now=0.0) for _ in range(3)] == [0, 0, 0]
    assert bucket.take_or_wait(0, now=0.0) == pytest.approx(20.0)
    assert bucket.take_or_wait(0, now=10.0) == pytest.approx(10.0)  # half refilled: wait the rest
    assert bucket.take_or_wait(0, now=20.0) == 0


def test_tokens_wait_for_the_bucket_and_a_huge_request_counts_as_one_minute() -> None:
    bucket = RateBucket(tpm=600)
    assert bucket.take_or_wait(500, now=0.0) == 0
    assert bucket.take_or_wait(200, now=0.0) == pytest.approx(10.0)  # 100 missing at 10/s
    assert bucket.take_or_wait(10**6, now=60.0) == 0  # clamped to 600, the bucket is full
    bucket.settle(estimated=600, actual=300)  # it used less: 300 come back
    assert bucket.take_or_wait(300, now=60.0) == 0


def test_an_unlimited_bucket_never_waits() -> None:
    bucket = RateBucket()
    assert not bucket.limited
    assert all(bucket.take_or_wait(10**9, now=0.0) == 0 for _ in range(1000))
