"""Principals' shares of the memory store (tasks/store/shares.py): what each principal holds,
counted as records come, change and go; its read tasks make room, the first read first. The
bounds themselves are held by both stores in test_task_store.py."""

from __future__ import annotations

import time

from gateway.tasks.model import Status, Task
from gateway.tasks.store.shares import OwnerShares


def running(task_id: str, owner: str = "alice", quota: str = "") -> Task:
    return Task(task_id, owner, "echo", "extension", 60_000, 500, quota=quota)


def finished(task: Task, size: int = 10) -> Task:
    end = task.ended(Status.COMPLETED, now=time.time())
    end.size = size
    return end


def held(*tasks: Task) -> tuple[OwnerShares, dict[str, Task]]:
    """A share counting `tasks`, and the records, as the store keeps them."""
    shares = OwnerShares()
    for task in tasks:
        shares.add(task)
    return shares, {t.id: t for t in tasks}


def test_a_task_counts_held_and_running_until_it_finishes() -> None:
    task = running("t1")
    shares, _ = held(task)
    assert (shares.held("alice"), shares.running("alice"), shares.bytes_of("alice")) == (1, 1, 0)
    shares.changed(task, end := finished(task, 40))
    assert (shares.held("alice"), shares.running("alice"), shares.bytes_of("alice")) == (1, 0, 40)
    shares.changed(end, finished(task, 25))  # saved again, finished: its bytes only
    assert (shares.running("alice"), shares.bytes_of("alice")) == (0, 25)


def test_a_task_counts_against_its_quota_not_its_session() -> None:
    shares, _ = held(running("t1", owner="session-1", quota="alice"),
                     running("t2", owner="session-2", quota="alice"))
    assert shares.running("alice") == 2 and shares.held("session-1") == 0


def test_a_principal_that_holds_nothing_leaves_nothing_behind() -> None:
    end = finished(running("t1"))
    shares, _ = held(end)
    shares.read(end)
    shares.remove(end)
    assert (shares.held("alice"), shares.running("alice"), shares.bytes_of("alice")) == (0, 0, 0)
    assert shares.read_order() == []
    shares.add(again := finished(running("t2")))  # counted afresh
    assert (shares.held("alice"), shares.bytes_of("alice")) == (1, 10)
    assert shares.room("alice", 1, 0, {again.id: again}) == ([], 0)  # t1's mark went too


def test_read_tasks_make_room_the_first_read_first() -> None:
    ends = [finished(running(f"t{i}"), size=10 * i) for i in range(1, 5)]
    shares, records = held(*ends, finished(running("bob's", owner="bob"), size=99))
    shares.read(running("live"))  # a running task never makes room
    for i in (3, 1, 2, 1):  # a second read keeps the place of the first
        shares.read(ends[i - 1])
    shares.read(records["bob's"])
    assert shares.room("alice", 1, 0, records) == (["t3"], 30)
    assert shares.room("alice", 0, 35, records) == (["t3", "t1"], 40)
    assert shares.room("alice", 1, 0, records, spare="t3") == (["t1"], 10)
    # Not enough: all of them (the store then refuses and evicts none).
    assert shares.room("alice", 5, 0, records) == (["t3", "t1", "t2"], 60)
    assert shares.room("carol", 1, 0, records) == ([], 0)
    assert shares.read_order() == ["t3", "t1", "t2", "bob's"]
    shares.remove(ends[0])  # t1 forgotten: no longer makes room
    assert shares.room("alice", 2, 0, records) == (["t3", "t2"], 50)
