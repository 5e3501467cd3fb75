"""Who created each task an upstream runs itself: both dialects' creation answers, the first
creator keeps an id, live until the ttl or the end, bounded per principal."""

from __future__ import annotations

from gateway.upstream import task_owners
from gateway.upstream.task_owners import TaskOwners


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def core(task_id: str, ttl: int = 60_000) -> dict[str, object]:
    return {"task": {"taskId": task_id, "status": "working", "ttl": ttl}}


def test_both_dialects_creations_are_noted_and_nothing_else() -> None:
    owners: TaskOwners[str] = TaskOwners()
    owners.note(core("a"), "alice", "s1")
    owners.note({"resultType": "task", "taskId": "b", "ttlMs": 1000}, "alice", "s1")
    owners.note({"content": [], "task": "not one"}, "alice", "s1")
    owners.note(None, "alice", "s1")
    assert owners.owns("a", "alice") and owners.owns("b", "alice") and len(owners) == 2
    assert not owners.owns("a", "bob") and not owners.owns(["a"], "alice")


def test_the_first_creator_keeps_an_id_handed_out_twice() -> None:
    owners: TaskOwners[str] = TaskOwners()
    owners.note(core("same"), "alice", "s1")
    owners.note(core("same"), "bob", "s2")
    assert owners.owns("same", "alice") and not owners.owns("same", "bob")


def test_a_task_is_live_until_its_ttl_or_its_end() -> None:
    clock = Clock()
    owners: TaskOwners[str] = TaskOwners(clock)
    owners.note(core("a", ttl=5_000), "alice", "s1")
    owners.note(core("b", ttl=5_000), "alice", "s1")
    assert owners.others_live("bob") and not owners.others_live("alice")
    owners.ended("a")
    assert owners.live("a") is None and owners.live("b") is not None
    clock.now += 6
    assert owners.live("b") is None and not owners.others_live("bob")
    assert owners.owns("a", "alice") and owners.owns("b", "alice")  # still hers to ask about


def test_bounded_per_principal_and_in_all(monkeypatch) -> None:
    monkeypatch.setattr(task_owners, "PER_PRINCIPAL", 3)
    monkeypatch.setattr(task_owners, "TOTAL", 5)
    owners: TaskOwners[str] = TaskOwners()
    for i in range(4):
        owners.note(core(f"b{i}"), "bob", "s2")
    assert not owners.owns("b0", "bob") and owners.owns("b3", "bob")  # his oldest went
    owners.note(core("a0"), "alice", "s1")
    owners.note(core("a1"), "alice", "s1")
    owners.note(core("c0"), "carol", "s3")  # over the total: the biggest principal pays
    assert owners.owns("a0", "alice") and owners.owns("a1", "alice")
    assert owners.owns("c0", "carol") and len(owners) == 5
    assert not owners.owns("b1", "bob")
