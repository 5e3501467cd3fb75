"""The gateway's own event counts: one `Counters` per app, handed to the parts that count.

Each event is a field or a verb, so a misspelt event is a type error rather than a new key.
They are shown as they always were: under `counters` in `/readyz?detail` (the keys
`sessions.created`, `tasks.completed`, `rejections.auth:expired`, ...; only those that
happened), and the rejections as `mcp_gateway_rejections_total{reason, cause}`
(docs/operations.md, Metrics).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gateway.errors import AuthCause, AuthRefusal, GatewayError, Rejection
from gateway.protocol.mcp import TaskStatus


@dataclass
class Counters:
    sessions_created: int = 0
    sessions_adopted: int = 0  # a session made on another replica, taken up here
    tasks_created: int = 0
    tasks_inline_store_full: int = 0  # a call ran inline: the store had no room for its task
    tasks_inline_store_unavailable: int = 0  # ... or the store did not answer
    upstream_exits: int = 0  # a server's process exited or its session ended
    upstream_unroutable_notifications: int = 0
    tasks_ended: Counter[TaskStatus] = field(default_factory=Counter)  # by end status
    rejections: Counter[tuple[Rejection, AuthCause | None]] = field(default_factory=Counter)

    def reject(self, reason: Rejection, cause: AuthCause | None = None) -> None:
        self.rejections[reason, cause] += 1

    def refused(self, exc: GatewayError) -> None:
        """Count a refusal that protects the gateway (see `GatewayError.reason`); auth
        refusals also by their `cause`, one of a fixed few words."""
        if exc.reason is not None:
            self.reject(exc.reason, exc.cause if isinstance(exc, AuthRefusal) else None)

    def shown(self) -> dict[str, int]:
        """The counts that happened, by their dotted names (`/readyz?detail`)."""
        events = {
            "sessions.created": self.sessions_created,
            "sessions.adopted": self.sessions_adopted,
            "tasks.created": self.tasks_created,
            "tasks.inline_store_full": self.tasks_inline_store_full,
            "tasks.inline_store_unavailable": self.tasks_inline_store_unavailable,
            "upstream.exits": self.upstream_exits,
            "upstream.unroutable_notifications": self.upstream_unroutable_notifications,
        }
        events |= {f"tasks.{status}": n for status, n in self.tasks_ended.items()}
        events |= {f"rejections.{reason}:{cause}" if cause else f"rejections.{reason}": n
                   for (reason, cause), n in self.rejections.items()}
        return {name: n for name, n in events.items() if n}
