"""One webhook endpoint: where its events go, how they are signed, which task statuses fire
it, its pending deliveries (due first), and what /status shows of it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from standardwebhooks import Webhook as Signer

from gateway.settings.schema import Webhook
from gateway.tasks.model import Task


@dataclass(order=True, slots=True)
class Delivery:
    """One event for one endpoint: tried until a 2xx (or given up), with the same id and
    body each time (only its signature and timestamp are made afresh)."""

    due: float  # when it is tried next (unix time)
    seq: int  # ties: the first queued first
    id: str = field(compare=False)  # webhook-id
    body: bytes = field(compare=False)
    owner: str = field(compare=False)  # whose task: its bound (Pusher)
    since: float = field(compare=False)  # when the status was written: latency
    attempt: int = field(default=0, compare=False)  # attempts made


class Endpoint:
    """An operator's webhook (settings `webhooks:`)."""

    def __init__(self, conf: Webhook) -> None:
        self.url = conf.url
        parts = urlsplit(conf.url)
        # What logs, metrics and /status name it by: never its query or credentials.
        self.label = f"{parts.hostname}{':' + str(parts.port) if parts.port else ''}" \
                     f"{parts.path or '/'}"
        self._signer = Signer(conf.secret.get_secret_value())
        self.events = frozenset(conf.events)
        self.tools, self.upstreams = tuple(conf.tools), tuple(conf.upstreams)
        self.disabled = False  # it answered 410 Gone: until the gateway restarts
        self.delivered = 0
        self.failures = 0  # attempts that failed
        self.last: tuple[float, str] | None = None  # (when, outcome) of the last attempt
        self._pending: list[Delivery] = []
        self._seq = itertools.count()
        self._woken = asyncio.Event()

    def wants(self, task: Task) -> bool:
        """Whether `task`'s status, tool and upstream fire this endpoint."""
        return not self.disabled and str(task.status) in self.events and \
            any(fnmatchcase(task.tool, p) for p in self.tools) and \
            any(fnmatchcase(task.upstream, p) for p in self.upstreams)

    def headers(self, delivery: Delivery, now: float) -> dict[str, str]:
        """Standard Webhooks' headers, signed afresh for this attempt (`now`)."""
        stamp = datetime.fromtimestamp(now, UTC)
        return {"content-type": "application/json", "webhook-id": delivery.id,
                "webhook-timestamp": str(int(now)),
                "webhook-signature": self._signer.sign(delivery.id, stamp,
                                                       delivery.body.decode())}

    # -- its pending deliveries ---------------------------------------------------------------
    def queue(self, delivery: Delivery) -> None:
        delivery.seq = next(self._seq)
        heapq.heappush(self._pending, delivery)
        self._woken.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def drop_all(self) -> list[Delivery]:
        """Its pending deliveries, given up (it was disabled)."""
        dropped, self._pending = self._pending, []
        return dropped

    async def next_due(self, clock: Callable[[], float]) -> Delivery:
        """The first delivery due, once it is (`clock`: unix time)."""
        while True:
            self._woken.clear()
            if not self._pending:
                await self._woken.wait()
                continue
            wait = self._pending[0].due - clock()
            if wait <= 0:
                return heapq.heappop(self._pending)
            try:  # a new delivery due sooner wakes it
                await asyncio.wait_for(self._woken.wait(), wait)
            except TimeoutError:
                return heapq.heappop(self._pending)
