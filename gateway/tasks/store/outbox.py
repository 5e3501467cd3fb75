"""What a shared store has not taken yet: task changes kept, in order, until it answers.

The promise (docs/replicas.md: nothing acknowledged is lost): a task whose handle
was returned keeps its end. A change the store does not take (it is down, or fewer store
replicas than `store.min_replicas_acked` took it) joins this outbox instead of being lost;
while anything waits here every later change joins it too, so that changes reach the store
in the order they were made (and a store that is down costs one timeout, not one per change). The
replica's heartbeat drains it (`flush`), ends first. Meanwhile the replica answers reads of
those tasks from what waits here.

Bounded in entries and bytes (`store.outbox_max_entries`, `outbox_max_bytes`): a full
outbox refuses new tasks (StoreFull: answered inline, or refused, as for a full store) and
never a change of a task already accepted. It keeps one entry a task, the newest, so it
never holds more than the live tasks, each within `limits.max_result_bytes`.

A store that lost what it held (restarted empty, failed over to a replica that lagged) gets
it back from each replica (`rejoin`): the records of the tasks running there and the
finished records it keeps beside the store (every replica keeps the ends it reads, writes
or hears announced, within a byte bound); what waits here is written again by `flush` (a
save the store cannot apply to a record it lacks becomes a restore).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from gateway.errors import StoreUnavailable
from gateway.observability import log
from gateway.protocol import jsonrpc
from gateway.tasks.model import Status, Task, failure
from gateway.tasks.store import ResultTooLarge, StoreFull, TaskStore


@dataclass(frozen=True, slots=True)
class _Forget:
    """A deletion waiting its turn."""


Entry = Task | _Forget


class Outbox:
    """A `TaskStore` in front of a shared one, keeping what that one does not take."""

    def __init__(self, store: TaskStore, max_entries: int, max_bytes: int) -> None:
        self.store = store
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._pending: dict[str, Entry] = {}  # in the order of each task's first change
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def requests(self) -> int:
        return self.store.requests

    def held_bytes(self) -> int:
        return self._bytes

    def full(self) -> bool:
        return len(self._pending) >= self.max_entries or self._bytes >= self.max_bytes

    # -- writes -------------------------------------------------------------------------------
    async def create(self, task: Task) -> None:
        """Never kept here: a task's handle goes out only once the store holds it."""
        if self.full():
            raise StoreFull(f"the task store has not taken {len(self._pending)} changes "
                            f"({self._bytes} bytes) yet")
        await self.store.create(task)

    async def save(self, task: Task, *, keep: bool = True) -> bool:
        if not keep:  # a judgement from a read that may be stale: now, or not at all
            return await self.store.save(task)
        if not self._pending:
            try:
                return await self._put(task)
            except StoreUnavailable as exc:
                log.warning("store.outbox_started", task=task.id, status=str(task.status),
                            error=exc.detail)
        held = self._pending.get(task.id)
        if isinstance(held, Task) and held.terminal:
            return False  # compare-and-set, as the store would: a terminal record stays
        self._keep(task.id, task.copy())
        return True

    async def _put(self, task: Task) -> bool:
        """Save; a record the store lacks is one it lost (restarted empty) before this
        replica wrote it back: the change writes it whole (restore never overwrites); and
        where the record came back meanwhile (written back by `rejoin`), save again."""
        return await self.store.save(task) or bool(await self.store.restore([task])) or \
            await self.store.save(task)

    async def delete(self, task_id: str) -> None:
        if not self._pending:
            try:
                return await self.store.delete(task_id)
            except StoreUnavailable:
                pass
        self._keep(task_id, _Forget())

    def _keep(self, task_id: str, entry: Entry) -> None:
        old = self._pending.get(task_id)
        self._bytes += _size(entry) - _size(old)
        self._pending[task_id] = entry  # a replaced entry keeps its place

    async def flush(self) -> int:
        """Write what waits, ends first, each kind in order, until the store stops taking
        writes (StoreUnavailable then propagates); how many were written."""
        written = 0
        while self._pending:
            for task_id, entry in _ends_first(self._pending):
                await self._write(task_id, entry)
                if self._pending.get(task_id) is entry:  # not changed again meanwhile
                    del self._pending[task_id]
                    self._bytes -= _size(entry)
                written += 1
        if written:
            log.info("store.outbox_drained", written=written)
        return written

    async def _write(self, task_id: str, entry: Entry) -> None:
        if isinstance(entry, _Forget):
            await self.store.delete(task_id)
            return
        try:
            saved = await self._put(entry)
        except ResultTooLarge as exc:  # the store filled up meanwhile: the end says so
            saved = await self._put(_too_large(entry, str(exc)))
        if not saved:
            log.info("store.outbox_superseded", task=task_id)  # another end was first

    async def rejoin(self, running: list[Task]) -> int:
        """The store lost what it held: write again the records of `running` (this
        replica's tasks) and the finished records kept here; how many it lacked."""
        return await self.store.restore([t for t in [*running, *self.store.kept()]
                                         if t.id not in self._pending])  # flush writes those

    # -- reads: what waits here is the newest state ------------------------------------------
    async def get(self, task_id: str) -> Task | None:
        held = self._pending.get(task_id)
        if held is None:
            return await self.store.get(task_id)
        return None if isinstance(held, _Forget) else held.copy()

    async def owned_by(self, owner: str) -> list[Task]:
        tasks = {t.id: t for t in await self.store.owned_by(owner)}
        for task_id, held in self._pending.items():
            if isinstance(held, _Forget):
                tasks.pop(task_id, None)
            elif held.owner == owner:
                tasks[task_id] = held.copy()
        return sorted(tasks.values(), key=lambda t: t.created_at)


    async def knows(self, task_id: str) -> bool:
        return task_id in self._pending or await self.store.knows(task_id)

    def holds(self, task_id: str) -> bool:
        held = self._pending.get(task_id)
        return not isinstance(held, _Forget) if held is not None else self.store.holds(task_id)

    async def read(self, task_id: str) -> None:
        """A mark the store does not take is let go: the task then stays until its ttl (and
        one whose end waits here is not finished there yet)."""
        if task_id not in self._pending:
            with contextlib.suppress(StoreUnavailable):
                await self.store.read(task_id)

    # -- the rest is the store's ------------------------------------------------------------
    async def restore(self, tasks: list[Task]) -> int:
        return await self.store.restore(tasks)

    def kept(self) -> list[Task]:
        return self.store.kept()

    async def sweep(self) -> int:
        return await self.store.sweep()

    def stored_bytes(self) -> int:
        return self.store.stored_bytes()

    async def close(self) -> None:
        await self.store.close()


def _size(entry: Entry | None) -> int:
    return entry.size if isinstance(entry, Task) else 0


def _ends_first(pending: dict[str, Entry]) -> list[tuple[str, Entry]]:
    """A snapshot: ends (the results clients were promised) first, then the rest, each in
    the order it came."""
    items = list(pending.items())
    return sorted(items, key=lambda item: not (isinstance(item[1], Task) and item[1].terminal))


def _too_large(task: Task, why: str) -> Task:
    """`task`'s end as a failure that says why its result could not be kept."""
    error = failure(why)
    return task.but(status=Status.FAILED, status_message=why, result=None, error=error,
                    size=len(jsonrpc.dumps(error)))
