"""Deliveries not made yet, by lane (an operator's endpoint, or the clients' lane): kept
until done, each claimed by one worker at a time (docs/push.md).

`MemoryPending` keeps them in this process (a stop loses them); pending_redis.py's
`RedisPending` in the shared store. Both bound what they hold, in all (`max_pending`) and
of one principal's tasks (`max_per_owner`): `put` is False past them.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from gateway.push.endpoint import Delivery


class Pending(Protocol):
    async def put(self, lane: str, delivery: Delivery) -> bool:
        """Keep `delivery` (due at its `due`); False when a bound refuses it."""

    async def claim(self, lane: str, n: int) -> list[Delivery]:
        """At most `n` of the lane's deliveries that are due, now held by the caller."""

    async def done(self, lane: str, delivery: Delivery) -> None:
        """Delivered, or given up: forgotten."""

    async def again(self, lane: str, delivery: Delivery) -> None:
        """To be tried again at its `due` (its `attempt` counted)."""

    async def forget(self, lane: str) -> None:
        """Every delivery of the lane, given up (its endpoint is disabled)."""

    def wait_s(self, lane: str) -> float:
        """How long a lane with nothing due may wait before it asks again."""

    async def count(self, lane: str | None = None) -> int:
        """Deliveries held, in all or of one lane (those being tried included)."""


class MemoryPending:
    def __init__(self, max_pending: int, max_per_owner: int,
                 clock: Callable[[], float] = time.time) -> None:
        self.max_pending, self.max_per_owner = max_pending, max_per_owner
        self._clock = clock
        self._lanes: dict[str, list[Delivery]] = {}
        self._owners: Counter[str] = Counter()
        self._by_lane: Counter[str] = Counter()
        self._held = 0
        self._seq = itertools.count()

    async def put(self, lane: str, delivery: Delivery) -> bool:
        if self._held >= self.max_pending or \
                self._owners[delivery.owner] >= self.max_per_owner:
            return False
        self._held += 1
        self._owners[delivery.owner] += 1
        self._by_lane[lane] += 1
        self._push(lane, delivery)
        return True

    async def claim(self, lane: str, n: int) -> list[Delivery]:
        queue, now = self._lanes.get(lane, []), self._clock()
        out: list[Delivery] = []
        while queue and len(out) < n and queue[0].due <= now:
            out.append(heapq.heappop(queue))
        return out

    async def done(self, lane: str, delivery: Delivery) -> None:
        self._held -= 1
        self._by_lane[lane] -= 1
        self._owners[delivery.owner] -= 1
        if self._owners[delivery.owner] <= 0:
            del self._owners[delivery.owner]

    async def again(self, lane: str, delivery: Delivery) -> None:
        self._push(lane, delivery)

    async def forget(self, lane: str) -> None:
        for delivery in self._lanes.pop(lane, []):
            await self.done(lane, delivery)

    def wait_s(self, lane: str) -> float:
        queue = self._lanes.get(lane)
        return 3600.0 if not queue else max(0.0, queue[0].due - self._clock())

    async def count(self, lane: str | None = None) -> int:
        return self._held if lane is None else self._by_lane[lane]

    def _push(self, lane: str, delivery: Delivery) -> None:
        delivery.seq = next(self._seq)
        heapq.heappush(self._lanes.setdefault(lane, []), delivery)
