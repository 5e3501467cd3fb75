"""The bounded in-memory task store: the embedded default, for one process.

Bounds (limits.*; the store's contract, __init__.py): tasks in all (`max_tasks`) and of
all results (`max_stored_bytes`); per principal (counted against `Task.counted_as`: a legacy
session's tasks count against its principal) its running tasks (`max_tasks_per_owner`), the
tasks it holds, running and finished (`max_finished_tasks_per_owner`), and its results'
bytes (`max_stored_bytes_per_principal`), those counts kept by its `OwnerShares`
(shares.py); bytes of one result (`max_result_bytes`). Where a bound is reached, the
principal's own finished tasks whose results it has read (`read`) make room, the first read
first; a store that cannot make room so refuses the new task, and never evicts a running
task nor a result nobody has read. Finished tasks past their ttl are swept (on every create,
and by the app's reaper); for a while after that their record is kept without its result
(it reads as it lapsed: failed, saying it expired), then "not found" (an evicted one: "not
found" at once). Coroutines only by signature: nothing here waits.

Memory: a store may hold 100,000 finished tasks, so what it keeps is compact (a few hundred
bytes a task): names shared by every task of a tool or owner are interned, an empty inputs
map is one shared object, and deadlines are kept per whole second (a list entry a task
rather than a heap tuple and a float).

Across a restart (store.snapshot_path, snapshot.py): `records` hands out what it holds, and
`load` takes a snapshot's records into an empty store, within its bounds.
"""

from __future__ import annotations

import heapq
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from cachetools import TTLCache

from gateway.tasks.model import EXPIRED_MEMORY_S, TRANSITIONS, Status, Task, failure
from gateway.tasks.store import KeyBound, ResultTooLarge, StoreBounds, StoreFull
from gateway.tasks.store.shares import OwnerShares

# The end of a task a snapshot held running: its call died with the process that ran it.
STOPPED = "the gateway stopped before this task ended"
_NO_INPUTS: dict[str, Any] = {}  # shared by kept records; never handed out (get returns copies)


def _kept(task: Task) -> Task:
    """The copy the store keeps: shares nothing mutable with `task`, and as little memory
    with other records as it can."""
    return task.but(owner=sys.intern(task.owner), quota=sys.intern(task.quota),
                    tool=sys.intern(task.tool),
                    upstream=sys.intern(task.upstream), replica=sys.intern(task.replica),
                    inputs=dict(task.inputs) if task.inputs else _NO_INPUTS)


class MemoryStore:
    def __init__(self, bounds: StoreBounds, clock: Callable[[], float] = time.time) -> None:
        # A principal's share of the result bytes (`max_bytes_per_owner`): one client's big
        # results fill its own share, never the whole store (docs/security.md, Isolation).
        self.bounds = bounds
        self.clock = clock
        self._tasks: dict[str, Task] = {}
        # Each principal's tasks held, running, read and result bytes (shares.py).
        self._shares = OwnerShares()
        self._bytes = 0
        # Tasks forgotten as expired, without their results: read as they lapsed (the
        # engine's `Task.lapsed`) a while longer, as Redis keeps an expired hash.
        self._expired: TTLCache[str, Task] = TTLCache(bounds.max_tasks, EXPIRED_MEMORY_S,
                                                      timer=clock)
        self._due_in: defaultdict[int, list[str]] = defaultdict(list)  # second -> task ids
        self._seconds: list[int] = []  # heap of the keys of _due_in
        self._keys: dict[str, str] = {}  # a keyed task's key -> its id (tasks/keys.py)
        self.requests = 0  # to another process: none

    def __len__(self) -> int:
        return len(self._tasks)

    def stored_bytes(self) -> int:
        return self._bytes

    async def create(self, task: Task) -> None:
        await self.sweep()
        if task.key and (named := self._named(task.key)) is not None:
            raise KeyBound(named)
        whose, bounds, shares = task.counted_as, self.bounds, self._shares
        if shares.running(whose) >= bounds.max_per_owner:
            raise StoreFull(bounds.said("running"))
        # Room for one more task, in all and the principal's, and a result share not full.
        over_all = len(self._tasks) - bounds.max_tasks
        over_held = shares.held(whose) - bounds.max_held_per_owner
        over_bytes = shares.bytes_of(whose) - bounds.max_bytes_per_owner
        victims, freed = shares.room(whose, max(over_all, over_held) + 1, over_bytes + 1,
                                     self._tasks)
        if len(victims) <= over_all:
            raise StoreFull(bounds.said("tasks"))
        if len(victims) <= over_held:
            raise StoreFull(bounds.said("held"))
        if freed <= over_bytes:
            raise StoreFull(bounds.said("share"))
        await self._evict(victims)
        self._put(task)

    def _named(self, key: str) -> str | None:
        """The task `key` names: one held whose ttl has not passed (a task past it that no
        sweep forgot yet names none: its key is free)."""
        held = self._tasks.get(self._keys.get(key, ""))
        return None if held is None or self._due(held) else held.id

    async def _evict(self, victims: list[str]) -> None:
        """Read tasks forgotten before their ttl: their ids are unknown from now on."""
        for task_id in victims:
            await self.delete(task_id)

    def _put(self, task: Task) -> None:
        """A record it lacks, kept and counted."""
        self._tasks[task.id] = _kept(task)
        self._shares.add(task)
        self._bytes += task.size
        if task.expires_at is not None:
            self._due_at(task.expires_at, task.id)
        if task.key and self._named(task.key) in (None, task.id):
            self._keys[task.key] = task.id

    def _due_at(self, when: float, task_id: str) -> None:
        second = math.ceil(when)  # a bucket is swept once all of its deadlines have passed
        if second not in self._due_in:
            heapq.heappush(self._seconds, second)
        self._due_in[second].append(task_id)

    async def get(self, task_id: str) -> Task | None:
        task = self._tasks.get(task_id) or self._expired.get(task_id)
        return None if task is None else task.copy()


    async def owned_by(self, owner: str) -> list[Task]:
        return [t.copy() for t in self._tasks.values() if t.owner == owner]

    async def save(self, task: Task, *, keep: bool = True) -> bool:
        held = self._tasks.get(task.id)
        if held is None or (held.status is not task.status
                            and task.status not in TRANSITIONS[held.status]):
            return False  # compare-and-set: a terminal record stays terminal
        await self._account(task, held.size)
        self._shares.changed(held, task)
        if task.expires_at is not None and task.expires_at != held.expires_at:
            self._due_at(task.expires_at, task.id)  # its ttl grew (a queue's wait)
        self._tasks[task.id] = _kept(task)
        return True

    async def read(self, task_id: str) -> None:
        self._mark_read(task_id)

    def _mark_read(self, task_id: str) -> None:
        if (task := self._tasks.get(task_id)) is not None:
            self._shares.read(task)  # a finished one; nothing for a running task

    async def restore(self, tasks: list[Task]) -> int:
        """Nothing is ever lost here; records it lacks are kept as they are all the same."""
        lacked = [t for t in tasks if t.id not in self._tasks and not self._due(t)]
        for task in lacked:
            self._put(task)
        return len(lacked)

    def kept(self) -> list[Task]:
        return []  # this is the store: nothing beside it

    # -- a snapshot across a restart (snapshot.py) -------------------------------------------
    def records(self) -> tuple[list[Task], list[str]]:
        """Copies of every record held, and the ids of read finished tasks in the order
        they were first read (what makes room first)."""
        return [t.copy() for t in self._tasks.values()], self._shares.read_order()

    def load(self, tasks: list[Task], read: list[str]) -> int:
        """Take `tasks` (a snapshot's) into this store, which must be empty, within its
        bounds: records past their ttl are left, and where a bound is reached the newest
        are kept (by `created_at`), the older left. A task that had not ended never will
        (its call died with the process that ran it): it is taken as failed (STOPPED).
        `read` (ids in the order first read) is restored for the tasks kept. How many it
        kept."""
        if self._tasks:
            raise ValueError("a snapshot is loaded into an empty store only")
        now = self.clock()
        fresh = {t.id: t for t in tasks if not t.due(now)}.values()
        oldest_first = sorted(fresh, key=lambda t: t.created_at)  # ties: in the given order
        kept = _within_bounds(self.bounds, oldest_first[::-1])
        for task in reversed(kept):  # the oldest first, as they were created
            self._put(task if task.terminal else
                      task.ended(Status.FAILED, STOPPED, failure(STOPPED), now=now))
        for task_id in read:
            self._mark_read(task_id)
        return len(kept)

    async def _account(self, task: Task, old: int) -> None:
        """`task`'s bytes, which were `old`, counted in all (its principal's share counts
        them as the record is replaced); its principal's read tasks make room where its
        share or the store is full; ResultTooLarge where they cannot."""
        whose, new, bounds = task.counted_as, task.size, self.bounds
        if new > bounds.max_result_bytes:
            raise ResultTooLarge(bounds.said("result", new))
        mine = self._shares.bytes_of(whose) - old + new - bounds.max_bytes_per_owner
        every = self._bytes - old + new - bounds.max_stored_bytes
        victims, freed = self._shares.room(whose, 0, max(mine, every), self._tasks,
                                           spare=task.id)
        if freed < mine:
            raise ResultTooLarge(bounds.said("share"))
        if freed < every:
            raise ResultTooLarge(bounds.said("stored"))
        await self._evict(victims)
        self._bytes += new - old

    async def delete(self, task_id: str) -> None:
        self._drop(task_id)

    def holds(self, task_id: str) -> bool:
        return task_id in self._tasks

    def _drop(self, task_id: str) -> Task | None:
        """Forget a record and give back what it took of every bound; the record."""
        task = self._tasks.pop(task_id, None)
        if task is None:
            return None
        self._bytes -= task.size
        if task.key and self._keys.get(task.key) == task_id:
            del self._keys[task.key]
        self._shares.remove(task)
        return task

    async def sweep(self) -> int:
        """Finished tasks past their ttl go; a running one stays for the engine to end (its
        timer is due at the same moment), and is looked at again a little later."""
        now, gone, later = self.clock(), 0, []
        while self._seconds and self._seconds[0] <= now:
            for task_id in self._due_in.pop(heapq.heappop(self._seconds)):
                task = self._tasks.get(task_id)
                if task is None:
                    continue
                if not self._due(task):
                    continue  # its ttl grew (Local: a queue's wait): due in a later bucket
                if task.terminal:  # remembered a while as it lapsed (`_expired`): small
                    self._expired[task_id] = task.lapsed()
                    self._drop(task_id)
                    gone += 1
                else:
                    later.append(task_id)
        for task_id in later:
            self._due_at(now + 1.0, task_id)
        return gone

    async def knows(self, task_id: str) -> bool:
        return task_id in self._tasks or task_id in self._expired

    def _due(self, task: Task) -> bool:
        return task.due(self.clock())

    # -- replicas: one process, whose tasks are all its own ----------------------------------
    async def close(self) -> None:
        pass


def _within_bounds(bounds: StoreBounds, newest_first: list[Task]) -> list[Task]:
    """Of `newest_first`, those an empty store of `bounds` takes, the newer before the
    older."""
    kept: list[Task] = []
    shares = OwnerShares()  # what the empty store would count, task by task
    stored = 0
    for task in newest_first:
        if len(kept) >= bounds.max_tasks:
            break
        whose = task.counted_as
        if (shares.held(whose) >= bounds.max_held_per_owner
                or task.size > bounds.max_result_bytes
                or shares.bytes_of(whose) + task.size > bounds.max_bytes_per_owner
                or stored + task.size > bounds.max_stored_bytes):
            continue
        kept.append(task)
        shares.add(task)
        stored += task.size
    return kept
