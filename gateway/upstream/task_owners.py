"""Who created each task an upstream runs itself, on one connection (docs/architecture.md,
Tenancy).

The upstream sees one client, the gateway: it would serve any caller's tasks/* for any of
its task ids, and its requests for a task's input name no caller. So the gateway keeps,
per connection (a process: ids from two processes may be equal), the principal that
created each task and the owner (session or caller) to ask on its behalf; a caller's
tasks/* reach the upstream only for its own ids, and a request of no call goes where its
task's owner is, or nowhere. Pure: no I/O; the clock is injectable.

A task is live (its work may still ask or say things) from its creation until its ttl, or
until its result, its cancellation or a terminal status has passed through. The first
creator of an id keeps it: a server that hands the same id to two callers does not give
the second the first's task.
Bounded per principal and in all: the oldest ids go first (their owners then get "not
found" from the gateway, as for an expired task).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Generic, TypeVar

from gateway.observability import log

OwnerT = TypeVar("OwnerT")
PER_PRINCIPAL = 1_000
TOTAL = 100_000
DEFAULT_TTL_S = 3_600.0  # a task whose ttl the server did not say is live this long at most


@dataclass(slots=True)
class Record(Generic[OwnerT]):
    principal: str
    owner: OwnerT
    live_until: float  # the clock's time; 0 once it ended


class TaskOwners(Generic[OwnerT]):
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._by_id: dict[str, Record[OwnerT]] = {}
        self._live: dict[str, Record[OwnerT]] = {}  # those whose work may still go on
        self._of: dict[str, OrderedDict[str, None]] = {}  # principal -> its ids, oldest first

    def __len__(self) -> int:
        return len(self._by_id)

    def note(self, result: object, principal: str, owner: OwnerT) -> None:
        """Remember `principal` (and `owner`) as the creator if `result` creates a task of
        the upstream's own: a CreateTaskResult (2025-11-25: `{"task": Task}`) or the tasks
        extension's (2026-07-28: `resultType: "task"`)."""
        created = created_task(result)
        if created is None:
            return
        task_id, ttl_s = created
        known = self._by_id.get(task_id)
        if known is not None and known.principal != principal:
            log.warning("upstream.task_id_reused", task=task_id[:16])
            return
        self._by_id[task_id] = self._live[task_id] = Record(principal, owner,
                                                            self.clock() + ttl_s)
        ids = self._of.setdefault(principal, OrderedDict())
        ids[task_id] = None
        ids.move_to_end(task_id)
        if len(ids) > PER_PRINCIPAL:
            self._forget(principal, next(iter(ids)))
        if len(self._by_id) > TOTAL:
            biggest = max(self._of, key=lambda p: len(self._of[p]))
            self._forget(biggest, next(iter(self._of[biggest])))

    def clear(self) -> None:
        """The server process (or HTTP session) is gone, and its tasks with it: a new one
        may hand out the same ids to others."""
        self._by_id.clear()
        self._live.clear()
        self._of.clear()

    def held_by(self, owner: OwnerT) -> Container[str]:
        """The ids of the tasks `owner` itself (that session) created."""
        return _Held(self._by_id, owner)

    def owns(self, task_id: object, principal: str) -> bool:
        """Whether `principal` created `task_id`: any value a client sent, of which only a
        string can name a task."""
        record = self._by_id.get(task_id) if isinstance(task_id, str) else None
        return record is not None and record.principal == principal

    def record(self, task_id: str) -> Record[OwnerT] | None:
        """Who created `task_id`, live or not (a request that names it goes there)."""
        return self._by_id.get(task_id)

    def live(self, task_id: str) -> Record[OwnerT] | None:
        """The record of a task whose work may still be going on."""
        record = self._by_id.get(task_id)
        return record if record is not None and record.live_until > self.clock() else None

    def ended(self, task_id: object) -> None:
        """Its result, its cancellation or a terminal status came back: it asks and says
        nothing more."""
        record = self._live.pop(task_id, None) if isinstance(task_id, str) else None
        if record is not None:
            record.live_until = 0.0

    def others_live(self, principal: str) -> bool:
        """Whether a task of another principal may still be at work (so a request or a
        message of no call may be its)."""
        now = self.clock()
        for task_id in [t for t, r in self._live.items() if r.live_until <= now]:
            del self._live[task_id]
        return any(r.principal != principal for r in self._live.values())

    def _forget(self, principal: str, task_id: str) -> None:
        self._by_id.pop(task_id, None)
        self._live.pop(task_id, None)
        ids = self._of.get(principal)
        if ids is not None:
            ids.pop(task_id, None)
            if not ids:
                del self._of[principal]


class _Held(Generic[OwnerT]):
    """`task_id in held`: whether that owner created it (a view: no copy)."""

    __slots__ = ("_by_id", "_owner")

    def __init__(self, by_id: dict[str, Record[OwnerT]], owner: OwnerT) -> None:
        self._by_id, self._owner = by_id, owner

    def __contains__(self, task_id: object) -> bool:
        record = self._by_id.get(task_id) if isinstance(task_id, str) else None
        return record is not None and record.owner is self._owner


def created_task(result: object) -> tuple[str, float] | None:
    """The task id and ttl (seconds) a call's `result` creates, if it creates a task of the
    upstream's own: a CreateTaskResult (2025-11-25) or the tasks extension's."""
    if not isinstance(result, dict):
        return None
    task, ttl_key = result.get("task"), "ttl"
    if result.get("resultType") == "task":
        task, ttl_key = result, "ttlMs"
    task_id = task.get("taskId") if isinstance(task, dict) else None
    if not isinstance(task_id, str) or not isinstance(task, dict):
        return None
    ttl = task.get(ttl_key)
    ttl_s = ttl / 1000 if isinstance(ttl, int | float) and ttl > 0 else DEFAULT_TTL_S
    return task_id, min(ttl_s, DEFAULT_TTL_S)
