"""Where deliveries go: a `Target` (a URL and the secret its events are signed with); a
`Delivery` (one event for one lane, tried until done); and an `Endpoint`, a lane with what
/status shows of it: an operator's webhook (its target, and which task statuses fire it),
or the one lane every client's own webhooks share (each delivery carries its target).
Pending deliveries are pending.py's.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any
from urllib.parse import urlsplit

from standardwebhooks import Webhook as Signer

from gateway.settings.schema import Webhook
from gateway.tasks.model import Task


class Target:
    """A URL and its signer. `guarded`: a client's, whose host must not resolve to a
    loopback, private or link-local address (sender.py)."""

    __slots__ = ("_secret", "_signer", "guarded", "label", "url")

    def __init__(self, url: str, secret: str, guarded: bool = False) -> None:
        self.url = url
        self._secret = secret
        self.guarded = guarded
        parts = urlsplit(url)
        # What logs, metrics and /status name it by: its host and a digest of its path (a
        # path may be the secret: Slack's, Discord's webhook URLs), never its query or
        # credentials.
        path = hashlib.sha256((parts.path or "/").encode()).hexdigest()[:8]
        self.label = f"{parts.hostname}{':' + str(parts.port) if parts.port else ''}/{path}"
        self._signer = Signer(secret)

    def record(self) -> dict[str, Any]:
        """As a shared store keeps it (sealed: pending.py)."""
        return {"url": self.url, "secret": self._secret, "guarded": self.guarded}

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
    seq: int  # ties: the first queued first (pending.py's)
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
        # Its pending deliveries' name in a shared store: the same on every replica.
        self.lane = "clients" if conf is None else \
            hashlib.sha256(conf.url.encode()).hexdigest()[:16]
        self.events = frozenset(conf.events) if conf is not None else frozenset()
        self.tools = tuple(conf.tools) if conf is not None else ()
        self.upstreams = tuple(conf.upstreams) if conf is not None else ()
        self.disabled = False  # it answered 410 Gone: until the gateway restarts
        self.delivered = 0
        self.failures = 0  # attempts that failed
        self.last: tuple[float, str] | None = None  # (when, outcome) of the last attempt
        self.woken = asyncio.Event()  # a delivery was queued for it here

    def wants(self, task: Task) -> bool:
        """Whether `task`'s status, tool and upstream fire this (operator's) endpoint."""
        return not self.disabled and str(task.status) in self.events and \
            any(fnmatchcase(task.tool, p) for p in self.tools) and \
            any(fnmatchcase(task.upstream, p) for p in self.upstreams)
