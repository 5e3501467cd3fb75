"""Token buckets per owner (an auth context or a session): `per_s` requests a second on
average, bursts of `burst`. Pure: no I/O, the clock is injectable. At most `max_owners`
buckets are kept (least recently used dropped: such an owner starts again with a full
bucket), so memory stays bounded whatever the number of callers."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from cachetools import LRUCache

from gateway.errors import TooManyRequests


class RateLimiter:
    def __init__(self, per_s: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 max_owners: int = 10_000) -> None:
        self.per_s = per_s  # 0: no limit
        self.burst = max(burst, 1)
        self.clock = clock
        self._buckets: LRUCache[str, tuple[float, float]] = LRUCache(max_owners)

    def wait_s(self, owner: str) -> float:
        """0 when `owner` may go now (a token is taken), else how long until it may."""
        if self.per_s <= 0:
            return 0.0
        now = self.clock()
        tokens, then = self._buckets.get(owner, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.per_s)
        if tokens >= 1:
            self._buckets[owner] = (tokens - 1, now)
            return 0.0
        self._buckets[owner] = (tokens, now)
        return (1 - tokens) / self.per_s


class Admission:
    """The per-owner rate limits on tasks: requests of tasks/* and creations."""

    def __init__(self, requests: RateLimiter, creations: RateLimiter,
                 counters: Counter[str]) -> None:
        self.requests = requests
        self.creations = creations
        self.counters = counters

    def request(self, owner: str) -> None:
        """A tasks/* request of `owner`, or TooManyRequests."""
        self._admit(self.requests, owner, "task requests")

    def creation(self, owner: str) -> None:
        """A new task of `owner`, or TooManyRequests."""
        self._admit(self.creations, owner, "tasks created")

    def _admit(self, limiter: RateLimiter, owner: str, what: str) -> None:
        wait = limiter.wait_s(owner)
        if wait:
            self.counters["rejections.rate_limit"] += 1
            raise TooManyRequests.after(what, limiter.per_s, wait)


UNLIMITED = RateLimiter(0, 1)
