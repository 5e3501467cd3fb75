"""Per-owner token buckets: bursts, refill, the wait they tell, and bounded memory."""

from __future__ import annotations

import pytest

from gateway import errors
from gateway.observability.counters import Counters
from gateway.ratelimit import Admission, RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_the_rate_then_a_full_bucket_again() -> None:
    clock = Clock()
    limiter = RateLimiter(per_s=2, burst=3, clock=clock)
    assert [limiter.wait_s("a") for _ in range(3)] == [0, 0, 0]
    assert limiter.wait_s("a") == pytest.approx(0.5)  # the fourth waits for a token
    assert limiter.wait_s("b") == 0  # another owner has a bucket of its own
    clock.now += 0.5
    assert limiter.wait_s("a") == 0
    clock.now += 3600
    assert [limiter.wait_s("a") for _ in range(4)] == [0, 0, 0, pytest.approx(0.5)]
    assert limiter.peek_s("a") == pytest.approx(0.5)  # peeking takes nothing
    assert limiter.peek_s("a") == pytest.approx(0.5)
    assert limiter.peek_s("stranger") == 0


def test_no_rate_means_no_limit_and_owners_are_bounded() -> None:
    assert all(RateLimiter(0, 1).wait_s("a") == 0 for _ in range(1000))
    limiter = RateLimiter(1, 1, clock=Clock(), max_owners=10)
    for i in range(1000):
        limiter.wait_s(f"owner-{i}")
    assert len(limiter._buckets) == 10
    # The least recently used goes: an owner that keeps calling keeps its empty bucket.
    lru = RateLimiter(1, 1, clock=Clock(), max_owners=2)
    lru.wait_s("busy")
    lru.wait_s("other")
    assert lru.wait_s("busy") > 0  # used again: now the most recent
    lru.wait_s("newcomer")  # "other" makes room
    assert lru.peek_s("busy") > 0 and "other" not in lru._buckets


def test_admission_refuses_with_a_clear_error_and_counts() -> None:
    counters = Counters()
    admission = Admission(RateLimiter(1, 1, clock=Clock()), RateLimiter(0, 1), counters)
    admission.request("a")
    with pytest.raises(errors.TooManyRequests) as refused:
        admission.request("a")
    error = refused.value.to_message(7)["error"]
    assert error["code"] == -32000 and error["data"] == {"retryAfterMs": 1000}
    assert "at most 1 a second; slow down" in error["message"]
    assert refused.value.http_status == 429 and counters.shown()["rejections.rate_limit"] == 1
    admission.creation("a")  # no limit on creations here
