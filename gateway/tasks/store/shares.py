"""Principals' shares of the memory store: what each principal holds, counted.

`OwnerShares` owns, for each principal a task counts against (`Task.counted_as`: a legacy
session's tasks count against its principal), the counts its bounds are checked against:
the tasks it holds, running and finished (`max_finished_tasks_per_owner`), of them those
running (`max_tasks_per_owner`), the bytes of their results (`max_stored_bytes_per_principal`);
and its finished tasks whose results were read, in the order first read: those make room for
its newer tasks (`room`), the first read first. The records are the store's; so are the
bounds, the choice to refuse or to evict, and what a refusal says (StoreBounds.said): a
share counts, and names the read tasks that would make room.

Only the memory store has one. The Redis store keeps the same counts in Redis (its w:, k:,
r:, z: and b: keys, redis.py) and counts and checks them in its Lua scripts, atomic across
replicas (redis_scripts.py); its Python side counts nothing per principal (it words the
bound a script names), so it has nothing here to share.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from gateway.tasks.model import Task


class OwnerShares:
    """The per-principal counts of a store's records, kept as the store adds, changes,
    marks read and forgets them. A principal that holds nothing has no entry: counts do
    not outlive the tasks they count."""

    __slots__ = ("_bytes", "_held", "_read", "_running")

    def __init__(self) -> None:
        self._held: Counter[str] = Counter()  # tasks held, by whom they count
        self._running: Counter[str] = Counter()  # of them, those not finished
        self._bytes: Counter[str] = Counter()  # their results' bytes
        # Finished tasks whose results were read, the first read first (a dict keeps the
        # order it was given): what makes room for that principal's newer tasks.
        self._read: dict[str, dict[str, None]] = {}

    def held(self, whose: str) -> int:
        """Tasks `whose` holds, running and finished."""
        return self._held[whose]

    def running(self, whose: str) -> int:
        """Tasks of `whose` not finished."""
        return self._running[whose]

    def bytes_of(self, whose: str) -> int:
        """Bytes of the results `whose` holds."""
        return self._bytes[whose]

    def add(self, task: Task) -> None:
        """A record the store now holds, counted."""
        whose = task.counted_as
        self._held[whose] += 1
        if not task.terminal:
            self._running[whose] += 1
        self._bytes[whose] += task.size

    def changed(self, held: Task, task: Task) -> None:
        """The record `held` replaced by `task` (the same task, saved): its bytes, and
        its running place given back where it finished."""
        whose = task.counted_as
        self._bytes[whose] += task.size - held.size
        if task.terminal and not held.terminal:
            self._running[whose] -= 1

    def read(self, task: Task) -> None:
        """`task`'s owner has had its result: a finished one may now make room, after the
        tasks of its principal read before it. Nothing for a running task (it is never
        evicted)."""
        if task.terminal:
            self._read.setdefault(task.counted_as, {}).setdefault(task.id)

    def remove(self, task: Task) -> None:
        """A record the store forgot: what it took of each count given back."""
        whose = task.counted_as
        self._held[whose] -= 1
        if not task.terminal:
            self._running[whose] -= 1
        self._bytes[whose] -= task.size
        read = self._read.get(whose)
        if read is not None:
            read.pop(task.id, None)
        if self._held[whose] <= 0:  # it holds nothing: no entry left behind
            del self._held[whose]
            self._bytes.pop(whose, None)
            self._running.pop(whose, None)
            self._read.pop(whose, None)

    def room(self, whose: str, tasks: int, size: int, records: Mapping[str, Task],
             spare: str = "") -> tuple[list[str], int]:
        """The read tasks of `whose` (`spare` aside) that make room for `tasks` more tasks
        and `size` more bytes, the first read first, and the bytes they free (their sizes
        as `records`, the store's, hold them); all of them where they do not make room
        enough (the store then refuses, evicting nothing)."""
        victims: list[str] = []
        freed = 0
        for task_id in self._read.get(whose, ()):
            if len(victims) >= tasks and freed >= size:
                break
            if task_id != spare:
                victims.append(task_id)
                freed += records[task_id].size
        return victims, freed

    def read_order(self) -> list[str]:
        """The ids of every read task, each principal's in the order first read (what a
        snapshot keeps of the order that makes room: snapshot.py)."""
        return [task_id for ids in self._read.values() for task_id in ids]


__all__ = ["OwnerShares"]
