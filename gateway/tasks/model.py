"""The neutral task: what a task is, whichever dialect created it, and how its status may
change. Statuses and transitions follow both task specs (2025-11-25 core tasks and the
2026-07-28 tasks extension), which share them:

    working -> input_required | completed | failed | cancelled
    input_required -> working | completed | failed | cancelled
    completed, failed, cancelled: terminal, never change again
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})
TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.WORKING: frozenset({Status.INPUT_REQUIRED, *TERMINAL}),
    Status.INPUT_REQUIRED: frozenset({Status.WORKING, *TERMINAL}),
    # spec: terminal states never change (a terminal state maps to nothing).
    Status.COMPLETED: frozenset(),
    Status.FAILED: frozenset(),
    Status.CANCELLED: frozenset(),
}


class InvalidTransition(Exception):
    """A status change the task specs do not allow (a bug in the caller, never user input)."""


def is_terminal(status: Status) -> bool:
    return status in TERMINAL


def iso(ts: float) -> str:
    """ISO 8601 UTC with milliseconds, as both task specs show timestamps."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


@dataclass(slots=True, eq=False)
class Task:
    id: str
    owner: str  # the auth context (or legacy session) it belongs to
    tool: str
    dialect: str  # the wire it was created through; it renders only there
    ttl_ms: int | None
    poll_interval_ms: int
    status: Status = Status.WORKING
    status_message: str | None = None
    created_at: float = field(default_factory=time.time)
    updated_at: float = 0.0
    result: Any = None  # exactly what the call returned, as stored JSON (engine)
    error: dict[str, Any] | None = None  # the JSON-RPC error that failed it
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> request
    size: int = 0  # bytes of result or error kept

    def __post_init__(self) -> None:
        self.updated_at = self.updated_at or self.created_at

    @property
    def terminal(self) -> bool:
        return is_terminal(self.status)

    @property
    def expires_at(self) -> float | None:
        return None if self.ttl_ms is None else self.created_at + self.ttl_ms / 1000

    def move(self, status: Status, message: str | None = None) -> None:
        if status not in TRANSITIONS[self.status]:
            raise InvalidTransition(f"task {self.id}: {self.status} -> {status}")
        self.status = status
        self.status_message = message
        self.touch()

    def touch(self) -> None:
        self.updated_at = max(time.time(), self.updated_at)
