"""The bounded in-memory task store: pure storage, no asyncio, no execution.

Bounds (limits.*): live tasks in all (`max_tasks`), per owner (`max_tasks_per_owner`), bytes
of one result (`max_result_bytes`) and of all results (`max_stored_bytes`). A full store
refuses new tasks (`StoreFull`, the caller degrades or errs) and never evicts a task that has
not expired. A task expires `ttl_ms` after its creation (clamped to `max_ttl_ms` by policy);
for a while after that it answers "Task has expired", then "not found". Another owner's task
answers exactly as an unknown one.
"""

from __future__ import annotations

import heapq
import secrets
import time
from collections import Counter
from collections.abc import Callable

from cachetools import TTLCache

from gateway.tasks.model import Task

EXPIRED_MEMORY_S = 600.0  # how long an expired id still answers "expired"


class StoreFull(Exception):
    """No room for another task; the message says which bound was hit."""


class TaskNotFound(KeyError):
    pass


class TaskExpired(KeyError):
    pass


class ResultTooLarge(Exception):
    pass


class TaskStore:
    def __init__(self, max_tasks: int, max_per_owner: int, max_result_bytes: int,
                 max_stored_bytes: int, clock: Callable[[], float] = time.time) -> None:
        self.max_tasks = max_tasks
        self.max_per_owner = max_per_owner
        self.max_result_bytes = max_result_bytes
        self.max_stored_bytes = max_stored_bytes
        self.clock = clock
        self._tasks: dict[str, Task] = {}
        self._per_owner: Counter[str] = Counter()
        self.stored_bytes = 0
        self._expired: TTLCache[str, str] = TTLCache(max_tasks, EXPIRED_MEMORY_S, timer=clock)
        self._deadlines: list[tuple[float, str]] = []  # heap: sweeping is O(log n) a task

    def __len__(self) -> int:
        return len(self._tasks)

    def add(self, owner: str, tool: str, dialect: str, ttl_ms: int | None,
            poll_interval_ms: int) -> Task:
        """A new working task, in the store before anyone hears of it."""
        self.sweep()
        if len(self._tasks) >= self.max_tasks:
            raise StoreFull(f"the gateway holds its maximum of {self.max_tasks} tasks")
        if self._per_owner[owner] >= self.max_per_owner:
            raise StoreFull(f"this client holds its maximum of {self.max_per_owner} tasks")
        task = Task(secrets.token_urlsafe(16), owner, tool, dialect, ttl_ms, poll_interval_ms,
                    created_at=self.clock())  # 128 random bits: unguessable ids
        self._tasks[task.id] = task
        self._per_owner[owner] += 1
        if task.expires_at is not None:
            heapq.heappush(self._deadlines, (task.expires_at, task.id))
        return task

    def get(self, task_id: object, owner: str) -> Task:
        """The caller's task; TaskExpired / TaskNotFound otherwise (foreign ids included)."""
        self.sweep()
        task = self._tasks.get(task_id) if isinstance(task_id, str) else None
        if task is not None and task.owner == owner:
            return task
        if isinstance(task_id, str) and self._expired.get(task_id) == owner:
            raise TaskExpired(task_id)
        raise TaskNotFound(task_id)

    def knows(self, task_id: object) -> bool:
        """Whether `task_id` is (or lately was) a task of this store, whoever owns it."""
        return isinstance(task_id, str) and (task_id in self._tasks or task_id in self._expired)

    def keep(self, task: Task, size: int) -> None:
        """Account for `size` bytes of result or error, or refuse to keep them."""
        if size > self.max_result_bytes:
            raise ResultTooLarge(f"the result is {size} bytes; the gateway keeps at most "
                                 f"{self.max_result_bytes} bytes per task")
        if self.stored_bytes - task.size + size > self.max_stored_bytes:
            raise ResultTooLarge(f"the gateway's result storage ({self.max_stored_bytes} "
                                 "bytes) is full")
        self.stored_bytes += size - task.size
        task.size = size

    def owned_by(self, owner: str) -> list[Task]:
        """The owner's tasks, oldest first."""
        self.sweep()
        return [t for t in self._tasks.values() if t.owner == owner]

    def sweep(self) -> list[Task]:
        """Drop expired tasks (remembered for a while as expired); returns them."""
        now = self.clock()
        gone = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, task_id = heapq.heappop(self._deadlines)
            task = self._tasks.get(task_id)
            if task is not None:
                self._drop(task)
                self._expired[task.id] = task.owner
                gone.append(task)
        return gone

    def discard(self, task: Task) -> None:
        """Forget a task that never started (its call could not be sent)."""
        if self._tasks.get(task.id) is task:
            self._drop(task)

    def _drop(self, task: Task) -> None:
        del self._tasks[task.id]
        self.stored_bytes -= task.size
        self._per_owner[task.owner] -= 1
        if self._per_owner[task.owner] <= 0:
            del self._per_owner[task.owner]
