"""Where deliveries go: a `Target` (a URL and the secret its events are signed with), and
an `Endpoint`, a lane of pending deliveries (due first) with what /status shows of it: an
operator's webhook (its target, and which task statuses fire it), or the one lane every
client's own webhooks share (each delivery carries its target).
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


class Target:
    """A URL and its signer. `guarded`: a client's, whose host must not resolve to a
    loopback, private or link-local address (sender.py)."""

    __slots__ = ("_signer", "guarded", "label", "url")

    def __init__(self, url: str, secret: str, guarded: bool = False) -> None:
        self.url = url
        self.guarded = guarded
        parts = urlsplit(url)
        # What logs, metrics and /status name it by: never its query or credentials.
        self.label = f"{parts.hostname}{':' + str(parts.port) if parts.port else ''}" \
                     f"{parts.path or '/'}"
        self._signer = Signer(secret)

    def headers(self, delivery: Delivery, now: float) -> dict[str, str]:
        """Standard Webhooks' headers, signed afresh for this attempt (`now`)."""
        stamp = datetime.fromtimestamp(now, UTC)
        return {"content-type": "application/json", "webhook-id": delivery.id,
                "webhook-timestamp": str(int(now)),
                "webhook-signature": self._signer.sign(delivery.id, stamp,
                                                       delivery.body.decode())}


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
    target: Target | None = field(default=None, compare=False)  # a client's (else its lane's)


class Endpoint:
    """A lane of deliveries: an operator's webhook (settings `webhooks:`: `conf`), or,
    without one, the lane of clients' own webhooks."""

    def __init__(self, conf: Webhook | None = None) -> None:
        self.target = None if conf is None else Target(conf.url, conf.secret.get_secret_value())
        self.label = "clients" if self.target is None else self.target.label
        self.events = frozenset(conf.events) if conf is not None else frozenset()
        self.tools = tuple(conf.tools) if conf is not None else ()
        self.upstreams = tuple(conf.upstreams) if conf is not None else ()
        self.disabled = False  # it answered 410 Gone: until the gateway restarts
        self.delivered = 0
        self.failures = 0  # attempts that failed
        self.last: tuple[float, str] | None = None  # (when, outcome) of the last attempt
        self._pending: list[Delivery] = []
        self._seq = itertools.count()
        self._woken = asyncio.Event()

    def wants(self, task: Task) -> bool:
        """Whether `task`'s status, tool and upstream fire this (operator's) endpoint."""
        return not self.disabled and str(task.status) in self.events and \
            any(fnmatchcase(task.tool, p) for p in self.tools) and \
            any(fnmatchcase(task.upstream, p) for p in self.upstreams)

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
