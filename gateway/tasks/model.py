"""The neutral task: what a task is, whichever dialect created it, and how its status may
change. Statuses and transitions follow both task specs (2025-11-25 core tasks and the
2026-07-28 tasks extension), which share them:

    working -> input_required | completed | failed | cancelled
    input_required -> working | completed | failed | cancelled
    completed, failed, cancelled: terminal, never change again

A `Task` is a record: plain data that a store keeps a copy of (`copy`) or serializes
(`record` / `from_record`, JSON through orjson, the result embedded as the raw JSON it is).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from gateway.protocol import jsonrpc
from gateway.protocol.mcp import TaskStatus

EXPIRED_MEMORY_S = 600.0  # how long an expired id still answers "expired", then "unknown"

# The status message of a task its client cancelled, in either dialect (core tasks/cancel,
# the extension's tasks/cancel, forwarded to the replica running it): one wording, so a
# client reads the same whichever era it speaks.
CANCELLED_BY_CLIENT = "cancelled by the client"


Status = TaskStatus  # the protocol's statuses (protocol/mcp.py), by the model's short name


TERMINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})
# The statuses of a task that has not ended (the mcp_gateway_tasks_live gauge, the shared
# store's stranded tasks): whatever is not terminal, so a new status is counted at once.
LIVE = tuple(s for s in Status if s not in TERMINAL)
TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.WORKING: frozenset({Status.INPUT_REQUIRED, *TERMINAL}),
    Status.INPUT_REQUIRED: frozenset({Status.WORKING, *TERMINAL}),
    # spec: terminal states never change (a terminal state maps to nothing).
    Status.COMPLETED: frozenset(),
    Status.FAILED: frozenset(),
    Status.CANCELLED: frozenset(),
}


# The wire a task was created through (tasks/dialects/core.py, extension.py); it renders
# only there.
Dialect = Literal["core", "extension"]
# A record's dialect as read back (a store's JSON): one of these, and kept once.
_DIALECTS: dict[str, Dialect] = {"core": "core", "extension": "extension"}


class InvalidTransition(Exception):
    """A status change the task specs do not allow (a bug in the caller, never user input)."""


def is_terminal(status: Status) -> bool:
    return status in TERMINAL


def iso(ts: float) -> str:
    """ISO 8601 UTC with milliseconds, as both task specs show timestamps."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def failure(text: str) -> dict[str, Any]:
    """The JSON-RPC error of a task the gateway itself failed (timeout, expiry, a lost
    replica, a result too big to keep)."""
    return {"code": jsonrpc.INTERNAL_ERROR, "message": text}


def new_id() -> str:
    """128 random bits, URL-safe: unguessable (spec: cryptographically secure task ids)."""
    return secrets.token_urlsafe(16)


@dataclass(slots=True, eq=False)
class Task:
    id: str
    owner: str  # the auth context (or legacy session) it belongs to: who sees it
    tool: str
    dialect: Dialect  # the wire it was created through; it renders only there
    ttl_ms: int | None
    poll_interval_ms: int
    upstream: str = ""
    replica: str = ""  # the gateway process that runs its call (a shared store's replicas)
    status: Status = Status.WORKING
    status_message: str | None = None
    created_at: float = field(default_factory=time.time)
    updated_at: float = 0.0
    # Exactly what the call returned, kept serialized: an exact-size bytes object is ~100
    # bytes where the parsed dicts are ~450, and tasks/get embeds it without serializing it
    # again.
    result: bytes | None = None
    error: dict[str, Any] | None = None  # the JSON-RPC error that failed it
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> request
    size: int = 0  # bytes of result or error kept
    # What its bounds count it against (max_tasks_per_owner): the principal (auth context)
    # of the legacy session that owns it; empty: its owner. Ownership stays the session's
    # (visibility), so one token cannot take every task slot by opening many sessions.
    quota: str = ""
    # A keyed call's (tasks/keys.py): its owner's key, hashed (the store binds it to this
    # task while the task is kept), and the digest of the call it names.
    key: str = ""
    asked: str = ""
    # A webhook its client asked its end pushed to (gateway/push/client.py: url, secret,
    # exempt); kept with the record, which a shared store keeps encrypted (vault.py).
    push: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.updated_at = self.updated_at or self.created_at
        self.status = Status(self.status)
        self.dialect = _DIALECTS[self.dialect]

    def copy(self) -> Task:
        """A copy that shares nothing mutable with this one (the result bytes are
        immutable)."""
        return self.but(inputs=dict(self.inputs))

    def but(self, **changes: Any) -> Task:
        """A copy with `changes`, which must be of their fields' types. Made without
        __init__: a record's fields were checked when it was made, and
        `dataclasses.replace` checks them again (its __post_init__ converts two enums), at
        ten times the cost, on each of a task's three or four copies (docs/performance.md)."""
        new = _blank(Task)
        for name in _FIELDS:
            setattr(new, name, changes[name] if name in changes else getattr(self, name))
        return new

    def record(self) -> dict[str, Any]:
        """The record as JSON-serializable data (orjson: the result embeds as raw JSON)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["status"] = str(self.status)
        if self.result is not None:
            out["result"] = orjson.Fragment(self.result)
        return out

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Task:
        result = data.get("result")
        # An exact-size copy: orjson's own buffer keeps 4 KiB even for a small result.
        raw = None if result is None else bytes(memoryview(orjson.dumps(result)))
        return cls(**{**data, "result": raw})

    @property
    def counted_as(self) -> str:
        """Whose share of `max_tasks_per_owner` it takes."""
        return self.quota or self.owner

    @property
    def terminal(self) -> bool:
        return is_terminal(self.status)

    @property
    def expires_at(self) -> float | None:
        return None if self.ttl_ms is None else self.created_at + self.ttl_ms / 1000

    def due(self, now: float) -> bool:
        """Whether its ttl has passed at `now` (spec: a task MAY be deleted after its ttl,
        whatever its status)."""
        end = self.expires_at
        return end is not None and end <= now

    def remembered(self, now: float) -> bool:
        """Past its ttl, whether its id still answers "expired" (EXPIRED_MEMORY_S)."""
        end = self.expires_at
        return end is not None and now < end + EXPIRED_MEMORY_S

    def lapsed(self) -> Task:
        """How the task reads once its ttl has passed, while its id is remembered: a
        terminal status, so a client's poll loop ends rather than erring (issue 40):
        `failed`, saying it expired, whatever it was (its result or error is gone: spec, a
        task MAY be deleted after its ttl)."""
        why = f"expired: its ttl of {self.ttl_ms} ms passed"
        return self.but(status=Status.FAILED, status_message=why, inputs={}, result=None,
                        size=0, error=failure(f"Task {why}"))

    def ended(self, status: Status, message: str | None = None,
              error: dict[str, Any] | None = None, *, now: float) -> Task:
        """A copy of this task at its end (at `now`): no input outstanding, and `error` (the
        JSON-RPC error that failed it) kept."""
        final = self.but(inputs={}, error=error if error is not None else self.error)
        final.move(status, message, now=now)
        return final

    def move(self, status: Status, message: str | None = None, *, now: float) -> None:
        if status not in TRANSITIONS[self.status]:
            raise InvalidTransition(f"task {self.id}: {self.status} -> {status}")
        self.status = status
        self.status_message = message
        self.touch(now)

    def touch(self, now: float) -> None:
        """Changed at `now`, by the engine's clock (its `clock`, injectable like the
        store's); never earlier than a change already recorded."""
        self.updated_at = max(now, self.updated_at)


_FIELDS = tuple(f.name for f in fields(Task))
_blank = object.__new__
