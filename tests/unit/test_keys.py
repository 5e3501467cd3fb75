"""Idempotency keys (tasks/keys.py): the header's shapes, a key scoped to its owner, the
digest of the call it names; and both stores binding a key to its task while the task is
kept (memory and Redis, the same contract)."""

from __future__ import annotations

import time

import pytest
from test_task_store import Clock, make_store  # noqa: F401 (a fixture)

from gateway.errors import BadIdempotencyKey
from gateway.tasks import keys
from gateway.tasks.keys import CallKey
from gateway.tasks.model import Status, Task, new_id
from gateway.tasks.store import KeyBound

CALL = {"name": "deploy", "arguments": {"env": "prod", "n": 1}}


@pytest.mark.parametrize(("sent", "key"), [
    ([], None), (["abc-1"], "abc-1"), (['"abc 1"'], "abc 1"), (['"a\\"b"'], 'a"b'),
    (["x" * 255], "x" * 255)])
def test_a_key_is_read_bare_or_quoted(sent: list[str], key: str | None) -> None:
    assert keys.parse(sent) == key


@pytest.mark.parametrize("sent", [[""], ['""'], ["x" * 256], ["a b"], ["caf\u00e9"],
                                  ["tab\there"], ["a", "b"], ['"new\nline"']])
def test_a_key_that_cannot_be_kept_is_refused(sent: list[str]) -> None:
    with pytest.raises(BadIdempotencyKey, match="Idempotency-Key"):
        keys.parse(sent)


def test_a_key_is_its_owners_and_names_its_call() -> None:
    alice = CallKey.of("alice", "k", "main", "core", CALL)
    assert CallKey.of("bob", "k", "main", "core", CALL).slot != alice.slot
    retry = {**CALL, "arguments": {"n": 1, "env": "prod"}, "_meta": {"progressToken": 7},
             "task": {"ttl": 5}}
    assert CallKey.of("alice", "k", "main", "core", retry) == alice  # key order, _meta, task
    for other in (CallKey.of("alice", "k", "main", "core", {**CALL, "arguments": {}}),
                  CallKey.of("alice", "k", "main", "core", {**CALL, "name": "undo"}),
                  CallKey.of("alice", "k", "other", "core", CALL),
                  CallKey.of("alice", "k", "main", "extension", CALL)):
        assert other.slot == alice.slot and other.digest != alice.digest
    assert "k" not in alice.slot and "alice" not in alice.slot  # hashed


def keyed(clock: Clock, owner: str = "alice", key: str = "slot-1", ttl_ms: int = 10_000
          ) -> Task:
    return Task(new_id(), owner, "deploy", "core", ttl_ms, 500, created_at=clock(),
                key=key, asked="digest")


async def test_a_key_names_its_task_while_the_task_is_kept(make_store) -> None:  # noqa: F811
    clock = Clock()
    store = make_store(clock, max_tasks=10, max_per_owner=5)
    first = keyed(clock)
    await store.create(first)
    with pytest.raises(KeyBound) as bound:
        await store.create(keyed(clock))
    assert bound.value.task_id == first.id
    assert len(await store.owned_by("alice")) == 1  # no record made for the retry
    await store.create(keyed(clock, key="slot-2"))  # another key: another task
    await store.delete(first.id)  # forgotten: its key with it
    again = keyed(clock)
    await store.create(again)
    with pytest.raises(KeyBound) as bound:
        await store.create(keyed(clock))
    assert bound.value.task_id == again.id


async def test_a_key_is_forgotten_with_its_task_at_its_ttl(make_store) -> None:  # noqa: F811
    clock = Clock()
    store = make_store(clock, max_tasks=10, max_per_owner=5)
    first = keyed(clock, ttl_ms=1000)
    await store.create(first)
    first.move(Status.COMPLETED, now=time.time())
    assert await store.save(first)
    clock.now += 2.5  # past its ttl (and the memory store's whole second)
    await store.sweep()
    later = keyed(clock)
    await store.create(later)  # the key is free again: a new run
    with pytest.raises(KeyBound) as bound:
        await store.create(keyed(clock))
    assert bound.value.task_id == later.id


async def test_a_record_written_back_binds_its_key_where_it_is_free(make_store  # noqa: F811
                                                                   ) -> None:
    clock = Clock()
    store = make_store(clock, max_tasks=10, max_per_owner=5)
    lost = keyed(clock)
    assert await store.restore([lost]) == 1
    with pytest.raises(KeyBound) as bound:
        await store.create(keyed(clock))
    assert bound.value.task_id == lost.id
    taken = keyed(clock, key="slot-3")
    await store.create(taken)
    other = keyed(clock, key="slot-3")  # a write-back never takes a key from a live task
    await store.restore([other])
    with pytest.raises(KeyBound) as bound:
        await store.create(keyed(clock, key="slot-3"))
    assert bound.value.task_id == taken.id
