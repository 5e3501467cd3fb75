"""Finished tasks' kept answers (tasks/kept.py): the owner's alone, finished tasks only,
gone at the ttl, bounded in bytes."""

from __future__ import annotations

from gateway.tasks.kept import ENTRY_BYTES, KeptAnswers
from gateway.tasks.model import Status, Task


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def finished(task_id: str = "t1", owner: str = "alice", ttl_ms: int | None = 60_000) -> Task:
    task = Task(task_id, owner, "echo", "extension", ttl_ms, 1000, created_at=Clock.now)
    return task.ended(Status.COMPLETED, now=Clock.now)


def test_an_answer_is_its_owners_alone_and_of_its_dialect() -> None:
    kept = KeptAnswers(lambda _id: True, Clock())
    kept.keep("tasks/get", finished(), b'{"x":1}')
    assert kept.get("extension", "tasks/get", "t1", "alice").answer == b'{"x":1}'
    assert kept.get("extension", "tasks/get", "t1", "bob") is None
    assert kept.get("core", "tasks/get", "t1", "alice") is None
    assert kept.get("extension", "tasks/result", "t1", "alice") is None


def test_only_finished_tasks_and_small_answers_are_kept() -> None:
    kept = KeptAnswers(lambda _id: True, Clock())
    running = Task("t2", "alice", "echo", "extension", 60_000, 1000, created_at=Clock.now)
    kept.keep("tasks/get", running, b"{}")
    kept.keep("tasks/get", finished("t3"), b"x" * (ENTRY_BYTES + 1))
    assert len(kept) == 0


def test_an_answer_leaves_at_its_tasks_ttl() -> None:
    clock = Clock()
    kept = KeptAnswers(lambda _id: True, clock)
    kept.keep("tasks/get", finished(ttl_ms=500), b"{}")
    kept.keep("tasks/get", finished("forever", ttl_ms=None), b"{}")
    clock.now += 0.4
    assert kept.get("extension", "tasks/get", "t1", "alice") is not None
    clock.now += 0.2
    assert kept.get("extension", "tasks/get", "t1", "alice") is None
    assert kept.get("extension", "tasks/get", "forever", "alice") is not None


def test_the_least_recently_read_leave_first_at_the_bound() -> None:
    kept = KeptAnswers(lambda _id: True, Clock(), max_bytes=3 * (1000 + 200))
    for n in range(3):
        kept.keep("tasks/get", finished(f"t{n}"), b"x" * 1000)
    assert kept.get("extension", "tasks/get", "t0", "alice") is not None  # read: stays
    kept.keep("tasks/get", finished("t3"), b"x" * 1000)
    assert kept.get("extension", "tasks/get", "t1", "alice") is None
    assert kept.get("extension", "tasks/get", "t0", "alice") is not None
    assert len(kept) == 3


def test_an_answer_leaves_with_its_task_from_the_store() -> None:
    """A read task evicted to make room is "not found" from then on (docs/limits.md)."""
    held = {"t1"}
    kept = KeptAnswers(held.__contains__, Clock())
    kept.keep("tasks/get", finished(), b"{}")
    assert kept.get("extension", "tasks/get", "t1", "alice") is not None
    held.clear()
    assert kept.get("extension", "tasks/get", "t1", "alice") is None
    assert len(kept) == 0
