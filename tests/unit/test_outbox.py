"""The outbox alone, in front of a store that can be switched off (a memory store that
raises StoreUnavailable while down, and tells the order of the writes it took): what the
store does not take is kept, read back, written in order (ends first) once it answers,
restored where it was lost; a full outbox refuses new tasks, never an accepted task's end."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gateway.errors import StoreUnavailable
from gateway.tasks.model import Status, Task, new_id
from gateway.tasks.store import StoreBounds, StoreFull
from gateway.tasks.store.memory import MemoryStore
from gateway.tasks.store.outbox import Outbox
from gateway.tasks.store.shares import OwnerShares


class Switched(MemoryStore):
    """A memory store that answers nothing while `down`, and logs the saves it took."""

    def __init__(self) -> None:
        super().__init__(StoreBounds.given(100, 100, 1 << 20, 1 << 20))
        self.down = False
        self.saved: list[tuple[str, str]] = []  # (task id, status), in order

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable("ConnectionError")

    async def create(self, task: Task) -> None:
        self._check()
        await super().create(task)

    async def save(self, task: Task, *, keep: bool = True) -> bool:
        self._check()
        saved = await super().save(task)
        self.saved.append((task.id, str(task.status)))
        return saved

    async def get(self, task_id: str) -> Task | None:
        self._check()
        return await super().get(task_id)

    async def delete(self, task_id: str) -> None:
        self._check()
        await super().delete(task_id)

    async def restore(self, tasks: list[Task]) -> int:
        self._check()
        return await super().restore(tasks)

    def forget_everything(self) -> None:
        """As a store restarted without persistence."""
        self._tasks.clear()
        self._shares = OwnerShares()  # nothing counted either


async def made(outbox: Outbox, owner: str = "me") -> Task:
    task = Task(new_id(), owner, "tool", "extension", 60_000, 500)
    await outbox.create(task)
    return task


def ended(task: Task, text: str = "done") -> Task:
    final = task.ended(Status.COMPLETED, now=time.time())
    final.result = b'{"content":[{"type":"text","text":"%s"}]}' % text.encode()
    final.size = len(final.result)
    return final


@pytest.fixture
def store() -> Switched:
    return Switched()


async def test_what_the_store_misses_is_kept_read_back_and_written_in_order(store) -> None:
    outbox = Outbox(store, 100, 1 << 20)
    first, second, third = await made(outbox), await made(outbox), await made(outbox)
    store.down = True
    progress = second.copy()
    progress.status_message = "1/2"
    assert await outbox.save(progress)  # taken: kept, not lost
    assert await outbox.save(ended(first, "first"))
    assert len(outbox) == 2 and outbox.held_bytes() > 0
    got = await outbox.get(first.id)  # answered from what waits, the store being down
    assert got is not None and got.status is Status.COMPLETED and b"first" in got.result
    with pytest.raises(StoreUnavailable):
        await outbox.flush()  # still down: nothing is dropped
    assert len(outbox) == 2
    store.down = False
    assert await outbox.save(ended(third, "third"))  # while entries wait, changes join them
    assert store.saved == []
    assert await outbox.flush() == 3
    # Ends first, each kind in the order it came.
    assert store.saved == [(first.id, "completed"), (third.id, "completed"),
                           (second.id, "working")]
    assert len(outbox) == 0 and outbox.held_bytes() == 0
    stored = await store.get(second.id)
    assert stored is not None and stored.status_message == "1/2"
    assert await outbox.save(ended(stored))  # an empty outbox writes straight through
    assert store.saved[-1] == (second.id, "completed")


async def test_a_full_outbox_refuses_new_tasks_never_an_accepted_end(store) -> None:
    outbox = Outbox(store, 1, 1 << 20)
    a, b = await made(outbox), await made(outbox)
    store.down = True
    assert await outbox.save(ended(a))
    assert outbox.full()
    store.down = False
    with pytest.raises(StoreFull, match="has not taken 1 changes"):
        await made(outbox)  # answered inline, or refused, as for a full store
    assert await outbox.save(ended(b))  # beyond the bound: it was accepted
    assert len(outbox) == 2
    await outbox.flush()
    assert not outbox.full()
    await made(outbox)


async def test_a_terminal_entry_stays_terminal(store) -> None:
    outbox = Outbox(store, 10, 1 << 20)
    task = await made(outbox)
    store.down = True
    assert await outbox.save(ended(task))
    late = task.ended(Status.CANCELLED, "late", now=time.time())
    assert not await outbox.save(late)  # as the store would
    store.down = False
    await outbox.flush()
    got = await store.get(task.id)
    assert got is not None and got.status is Status.COMPLETED


async def test_a_store_back_empty_gets_the_records_again(store) -> None:
    outbox = Outbox(store, 10, 1 << 20)
    running, finishing = await made(outbox), await made(outbox)
    store.down = True
    assert await outbox.save(ended(finishing, "kept"))
    store.forget_everything()  # restarted without persistence
    store.down = False
    await outbox.flush()  # a save of a record the store lacks becomes a restore
    assert await outbox.rejoin([running.copy()]) == 1
    back = await store.get(finishing.id)
    assert back is not None and b"kept" in back.result
    assert (await store.get(running.id)) is not None
    assert await outbox.rejoin([running.copy()]) == 0  # held now: left alone


async def test_a_deletion_waits_its_turn(store) -> None:
    outbox = Outbox(store, 10, 1 << 20)
    task = await made(outbox)
    store.down = True
    assert await outbox.save(ended(task))
    await outbox.delete(task.id)
    assert await outbox.get(task.id) is None
    store.down = False
    await outbox.flush()
    assert await store.get(task.id) is None and not await store.owned_by("me")


async def test_reads_list_what_waits_over_the_store(store) -> None:
    outbox = Outbox(store, 10, 1 << 20)
    a, b = await made(outbox), await made(outbox)
    await made(outbox, owner="other")
    store.down = True
    assert await outbox.save(ended(a))
    store.down = False
    listed: list[Any] = await outbox.owned_by("me")
    assert [(t.id, t.status) for t in listed] == [(a.id, Status.COMPLETED),
                                                  (b.id, Status.WORKING)]
    assert await outbox.knows(a.id)


async def test_a_judgement_from_a_read_is_never_kept(store) -> None:
    """"Its replica is gone" is read off the store, perhaps a primary that was demoted
    meanwhile: written now, or not at all, never queued to win later over a real end."""
    outbox = Outbox(store, 10, 1 << 20)
    task = await made(outbox)
    store.down = True
    with pytest.raises(StoreUnavailable):
        await outbox.save(task.ended(Status.FAILED, "the replica stopped", now=time.time()),
                          keep=False)
    assert len(outbox) == 0


async def test_a_record_written_back_meanwhile_takes_the_end(store) -> None:
    """The store lost the record; the replica's write-back puts its running copy there just
    between the end's save (refused: no record) and its restore (refused: one is there):
    the end is saved again, not lost behind a stale "working"."""
    outbox = Outbox(store, 10, 1 << 20)
    task = await made(outbox)
    store.forget_everything()
    real_restore = store.restore

    async def written_back_first(tasks: list[Task]) -> int:
        await real_restore([task.copy()])  # the rejoin's running copy lands first
        return await real_restore(tasks)

    store.restore = written_back_first  # type: ignore[method-assign]
    assert await outbox.save(ended(task, "right"))
    got = await store.get(task.id)
    assert got is not None and got.status is Status.COMPLETED and b"right" in got.result
