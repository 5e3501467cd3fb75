"""The bounded in-memory task store: the embedded default, for one process.

Bounds (limits.*): live tasks in all (`max_tasks`), per owner (`max_tasks_per_owner`), bytes
of one result (`max_result_bytes`) and of all results (`max_stored_bytes`). A full store
refuses new tasks and never evicts a task that has not expired. Finished tasks past their
ttl are swept (on every create, and by the app's reaper); for a while after that their id
answers "expired", then "not found". Coroutines only by signature: nothing here waits.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable

from cachetools import TTLCache

from gateway.tasks.model import TRANSITIONS, Task
from gateway.tasks.store import ResultTooLarge, StoreFull

EXPIRED_MEMORY_S = 600.0  # how long an expired id still answers "expired"


class MemoryStore:
    def __init__(self, max_tasks: int, max_per_owner: int, max_result_bytes: int,
                 max_stored_bytes: int, clock: Callable[[], float] = time.time) -> None:
        self.max_tasks = max_tasks
        self.max_per_owner = max_per_owner
        self.max_result_bytes = max_result_bytes
        self.max_stored_bytes = max_stored_bytes
        self.clock = clock
        self._tasks: dict[str, Task] = {}
        self._per_owner: Counter[str] = Counter()
        self._bytes = 0
        self._expired: TTLCache[str, str] = TTLCache(max_tasks, EXPIRED_MEMORY_S, timer=clock)
        self._deadlines: list[tuple[float, str]] = []  # heap: sweeping is O(log n) a task

    def __len__(self) -> int:
        return len(self._tasks)

    def stored_bytes(self) -> int:
        return self._bytes

    async def create(self, task: Task) -> None:
        await self.sweep()
        if len(self._tasks) >= self.max_tasks:
            raise StoreFull(f"the gateway holds its maximum of {self.max_tasks} tasks")
        if self._per_owner[task.owner] >= self.max_per_owner:
            raise StoreFull(f"this client holds its maximum of {self.max_per_owner} tasks")
        self._tasks[task.id] = task.copy()
        self._per_owner[task.owner] += 1
        if task.expires_at is not None:
            heapq.heappush(self._deadlines, (task.expires_at, task.id))

    async def get(self, task_id: str) -> Task | None:
        task = self._tasks.get(task_id)
        return None if task is None or self._due(task) else task.copy()

    async def expired_owner(self, task_id: str) -> str | None:
        task = self._tasks.get(task_id)
        if task is not None and self._due(task):
            return task.owner
        return self._expired.get(task_id)

    async def owned_by(self, owner: str) -> list[Task]:
        return [t.copy() for t in self._tasks.values() if t.owner == owner and not self._due(t)]

    async def save(self, task: Task) -> bool:
        held = self._tasks.get(task.id)
        if held is None or (held.status is not task.status
                            and task.status not in TRANSITIONS[held.status]):
            return False  # compare-and-set: a terminal record stays terminal
        self._account(held.size, task.size)
        self._tasks[task.id] = task.copy()
        return True

    def _account(self, old: int, new: int) -> None:
        if new > self.max_result_bytes:
            raise ResultTooLarge(f"the result is {new} bytes; the gateway keeps at most "
                                 f"{self.max_result_bytes} bytes per task")
        if self._bytes - old + new > self.max_stored_bytes:
            raise ResultTooLarge(f"the gateway's result storage ({self.max_stored_bytes} "
                                 "bytes) is full")
        self._bytes += new - old

    async def delete(self, task_id: str, *, expired: bool = False) -> None:
        task = self._tasks.pop(task_id, None)
        if task is None:
            return
        self._bytes -= task.size
        self._per_owner[task.owner] -= 1
        if self._per_owner[task.owner] <= 0:
            del self._per_owner[task.owner]
        if expired:
            self._expired[task_id] = task.owner

    async def sweep(self) -> int:
        """Finished tasks past their ttl go; a running one stays for the engine to end (its
        timer is due at the same moment), and is looked at again a little later."""
        now, gone, later = self.clock(), 0, []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, task_id = heapq.heappop(self._deadlines)
            task = self._tasks.get(task_id)
            if task is None:
                continue
            if task.terminal:
                await self.delete(task_id, expired=True)
                gone += 1
            else:
                later.append((now + 1.0, task_id))
        for entry in later:
            heapq.heappush(self._deadlines, entry)
        return gone

    async def knows(self, task_id: str) -> bool:
        return task_id in self._tasks or task_id in self._expired

    def _due(self, task: Task) -> bool:
        return task.expires_at is not None and task.expires_at <= self.clock()
