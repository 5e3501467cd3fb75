"""Token buckets per owner (an auth context or a session): `per_s` requests a second on
average, bursts of `burst`. Pure: no I/O, the clock is injectable. At most `max_owners`
buckets are kept (least recently used dropped: such an owner starts again with a full
bucket), so memory stays bounded whatever the number of callers."""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable

from gateway.answer_bytes import AnswerBytes
from gateway.errors import TooManyRequests
from gateway.observability.counters import Counters


class RateLimiter:
    def __init__(self, per_s: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 max_owners: int = 10_000) -> None:
        self.per_s = per_s  # 0: no limit
        self.burst = max(burst, 1)
        self.clock = clock
        self.max_owners = max_owners
        # Least recently used first: an OrderedDict's C methods (cachetools' LRUCache cost
        # four Python calls a request here; bench/calls.py).
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def wait_s(self, owner: str) -> float:
        """0 when `owner` may go now (a token is taken), else how long until it may."""
        if self.per_s <= 0:
            return 0.0
        now = self.clock()
        tokens = self._tokens(owner, now)
        self._keep(owner, (tokens - 1 if tokens >= 1 else tokens, now))
        return 0.0 if tokens >= 1 else (1 - tokens) / self.per_s

    def _keep(self, owner: str, bucket: tuple[float, float]) -> None:
        buckets = self._buckets
        buckets[owner] = bucket
        buckets.move_to_end(owner)
        if len(buckets) > self.max_owners:
            buckets.popitem(last=False)

    def peek_s(self, owner: str) -> float:
        """What `wait_s` would say, taking nothing (and keeping no bucket for a stranger)."""
        if self.per_s <= 0 or owner not in self._buckets:
            return 0.0
        tokens = self._tokens(owner, self.clock())
        return 0.0 if tokens >= 1 else (1 - tokens) / self.per_s

    def _tokens(self, owner: str, now: float) -> float:
        tokens, then = self._buckets.get(owner, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - then) * self.per_s)


class Admission:
    """The per-owner rate limits on tasks: requests of tasks/* and creations."""

    def __init__(self, requests: RateLimiter, creations: RateLimiter,
                 counters: Counters) -> None:
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
            self.counters.reject("rate_limit")
            raise TooManyRequests.after(what, limiter.per_s, wait)


UNLIMITED = RateLimiter(0, 1)


class InFlight:
    """Calls in flight per owner (auth context), at most `limit` each: one client cannot
    take every process and every slot of an upstream. Owners with none are forgotten.
    `answers`: the bytes their answers hold until written (answer_bytes.py)."""

    def __init__(self, limit: int, counters: Counters, answers: AnswerBytes | None = None
                 ) -> None:
        self.limit = limit
        self.counters = counters
        self.answers = answers or AnswerBytes(1 << 62, 1 << 62, counters)
        self._calls: Counter[str] = Counter()

    def take(self, owner: str) -> None:
        """One more call of `owner`, or TooManyRequests."""
        held = self._calls.get(owner, 0)  # dict's get: Counter's miss and delete are Python
        if held >= self.limit:
            self.counters.reject("calls_in_flight")
            raise TooManyRequests(f"Too many calls in flight: at most {self.limit} per client; "
                                  "wait for one to finish", {"maxInFlight": self.limit})
        self._calls[owner] = held + 1

    def release(self, owner: str) -> None:
        left = self._calls.get(owner, 0) - 1
        if left > 0:
            self._calls[owner] = left
        else:
            self._calls.pop(owner, None)
