"""Idempotency keys (tasks/keys.py): the header's shapes, a key scoped to its owner, the
digest of the call it names; both stores binding a key to its task while the task is kept
(memory and Redis, the same contract); and a Redis store that lost its records holding
keyed creates back until the replicas have written theirs back."""

from __future__ import annotations

import asyncio
import time

import pytest
from test_task_store import SECRET, Clock, beaten, make_store  # noqa: F401 (a fixture)

from gateway.errors import BadIdempotencyKey, StoreSettling
from gateway.tasks import keys
from gateway.tasks.keys import CallKey
from gateway.tasks.model import Status, Task, new_id
from gateway.tasks.store import KeyBound, StoreBounds
from gateway.tasks.store.redis import RedisStore
from gateway.tasks.store.redis_bus import RedisBus

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
    store = await beaten(make_store(clock, max_tasks=10, max_per_owner=5))
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
    store = await beaten(make_store(clock, max_tasks=10, max_per_owner=5))
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
    store = await beaten(make_store(clock, max_tasks=10, max_per_owner=5))
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


async def test_a_restarted_store_takes_keyed_calls_once_the_replicas_wrote_back(
        redis_server, key_prefix) -> None:
    """A store that came back empty may soon get back, from the replica running it, a task
    a key names: a keyed create waits (StoreSettling) until a lease has passed since a
    replica saw the loss and every replica beating has written back; unkeyed creates go on
    (a key's task is never made twice, whatever each replica's own view of the store)."""
    clock = Clock()
    store = RedisStore(redis_server.url, key_prefix, StoreBounds.given(10, 10, 100, 1000),
                       clock=clock, secret=SECRET)
    bus = RedisBus(store)
    try:
        old = (await bus.beat("a", 1000)).generation
        await bus.beat("b", 1000)
        await store.create(keyed(clock))
        lost = [k async for k in store.redis.scan_iter(f"{key_prefix}*")]
        await store.redis.delete(*lost)  # restarted empty
        with pytest.raises(StoreSettling):  # no beat since: it has no generation
            await store.create(keyed(clock, key="slot-2"))
        await store.create(keyed(clock, key=""))
        new = (await bus.beat("a", 1000, known=old)).generation
        assert new != old
        with pytest.raises(StoreSettling):  # a lease from when a replica saw the loss
            await store.create(keyed(clock, key="slot-2"))
        await asyncio.sleep(1.05)
        for replica in ("a", "b"):
            await bus.beat(replica, 1000, known=old if replica == "b" else new)
        await bus.rejoined("a", new, 1000)
        with pytest.raises(StoreSettling):  # b beats in it and has not written back
            await store.create(keyed(clock, key="slot-2"))
        await bus.rejoined("b", new, 1000)
        await store.create(keyed(clock, key="slot-2"))
        store.generation = old  # a replica whose last beat read another generation
        with pytest.raises(StoreSettling):
            await store.create(keyed(clock, key="slot-3"))
    finally:
        await store.close()
