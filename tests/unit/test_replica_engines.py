"""Replicas sharing one Redis store, as engines in one process over a real Redis-compatible
server, with fake upstream calls: any replica reads a task, a cancel written elsewhere wins,
a replica whose lease lapsed has its running tasks failed (when read, by the sweeper, and by
its own next life), and the bounds hold whichever replica creates."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import orjson
import pytest
from test_engine import attach_fake, intent, running

from gateway.protocol import jsonrpc
from gateway.tasks.engine import TaskEngine, TaskNotFound
from gateway.tasks.model import Status, Task
from gateway.tasks.replicas import STRANDED
from gateway.tasks.store import StoreBounds, StoreFull, TaskStore
from gateway.tasks.store.redis import RedisStore
from gateway.tasks.store.redis_bus import RedisBus
from gateway.tasks.store.redis_link import Seal

Replica = Callable[..., TaskEngine]
SECRET = b"the replicas' shared channel key"


async def read(engine: TaskEngine, task_id: str, until: Callable[[Task], bool]) -> Task:
    """The task as `engine` reads it, once `until` holds (writes go behind, over a socket)."""
    for _ in range(200):
        task = await engine.find(task_id, "me")
        if until(task):
            return task
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {task}")


@pytest.fixture
async def replica(redis_server, key_prefix) -> AsyncIterator[Replica]:
    stores: list[RedisStore] = []

    def make(name: str, max_tasks: int = 100, max_per_owner: int = 100) -> TaskEngine:
        store = RedisStore(redis_server.url, key_prefix,
                           StoreBounds.given(max_tasks, max_per_owner, 1000, 10_000),
                           replica=name, secret=SECRET)
        stores.append(store)
        return TaskEngine(store, replica=name, bus=RedisBus(store))

    yield make
    for store in stores:
        await store.close()


async def test_a_task_made_on_one_replica_is_read_on_another(replica) -> None:
    a, b = replica("a"), replica("b")
    await a.replicas.beat(10_000)
    task, call, _ = await running(a)
    seen = await b.find(task.id, "me")
    assert (seen.status, seen.replica, seen.tool) == (Status.WORKING, "a", "slow")
    call.sink.on_message(jsonrpc.request(7, "elicitation/create", {"message": "name?"}))
    asked = await read(b, task.id, lambda t: t.status is Status.INPUT_REQUIRED)
    assert list(asked.inputs) == ["elicitation-1"]
    call.sink.on_response(jsonrpc.result(1, {"content": [{"type": "text", "text": "hi"}]}))
    done = await read(b, task.id, lambda t: t.terminal)
    assert done.status is Status.COMPLETED and b"hi" in (done.result or b"")
    assert [t.id for t in await b.owned("me", "extension")] == [task.id]


async def until(check: Callable[[], bool]) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


async def subscribed(store: TaskStore, listeners: dict[str, int]) -> None:
    """Until each channel has that many listeners."""
    assert isinstance(store, RedisStore)
    want = {store.key(c): n for c, n in listeners.items()}
    for _ in range(500):
        counts = dict(await store.redis.pubsub_numsub(*want))
        if all(counts.get(k.encode(), 0) >= n for k, n in want.items()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the listeners never subscribed")


@pytest.fixture
async def listening() -> AsyncIterator[Callable[[TaskEngine], None]]:
    """Run engines' channel listeners for the test."""
    jobs: list[asyncio.Task[None]] = []
    yield lambda engine: jobs.append(asyncio.create_task(engine.replicas.listen()))
    for job in jobs:
        job.cancel()
    await asyncio.gather(*jobs, return_exceptions=True)


async def test_requests_on_another_replica_reach_the_call(replica, listening) -> None:
    a, b = replica("a"), replica("b")
    listening(a)
    listening(b)
    await a.replicas.beat(10_000)
    await subscribed(a.replicas.store, {"ctl:a": 1, "events": 2})  # both engines hear events
    task, call, _ = await running(a)
    heard: list[Task] = []
    b.watch(task.id, heard.append)  # a listen stream on b, say
    call.sink.on_message(jsonrpc.request(7, "elicitation/create", {"message": "name?"}))
    await until(lambda: any(t.status is Status.INPUT_REQUIRED for t in heard))
    await b.answer(await b.find(task.id, "me"), {"elicitation-1": {"action": "accept"}})
    await until(lambda: bool(call.replies))  # the answer reached a's upstream call
    assert call.replies == [(7, jsonrpc.result(7, {"action": "accept"}))]
    await b.cancel(await b.find(task.id, "me"), "enough")
    await until(lambda: bool(call.cancelled))  # so did the cancel
    assert call.cancelled == ["enough"]
    await until(lambda: bool(heard) and heard[-1].status is Status.CANCELLED)


async def test_a_cancel_on_another_replica_wins_over_the_late_result(replica) -> None:
    a, b = replica("a"), replica("b")
    await a.replicas.beat(10_000)
    task, call, told = await running(a)
    cancelled = await b.cancel(await b.find(task.id, "me"))
    assert cancelled.status is Status.CANCELLED
    call.sink.on_response(jsonrpc.result(1, {"content": []}))  # the call answers anyway
    for _ in range(200):
        if told and told[-1].terminal:
            break
        await asyncio.sleep(0.01)
    assert told[-1].status is Status.CANCELLED  # a's own watchers hear the stored end
    assert (await a.find(task.id, "me")).status is Status.CANCELLED


async def test_a_lapsed_replica_has_its_running_tasks_failed(replica) -> None:
    a, b = replica("a"), replica("b")
    await a.replicas.beat(300)
    read, _, _ = await running(a)
    swept, _, _ = await running(a)
    assert (await b.find(read.id, "me")).status is Status.WORKING  # a holds its lease
    await asyncio.sleep(1.2)  # a's lease lapses (and b's cache of it, a second)
    await b.replicas.beat(10_000)  # b's own beats get through: it may judge
    failed = await b.find(read.id, "me")  # failed when read...
    assert failed.status is Status.FAILED and failed.status_message == STRANDED
    assert failed.error == {"code": jsonrpc.INTERNAL_ERROR, "message": STRANDED}
    await b.sweep()  # ...or by the sweeper
    assert (await replica("c").find(swept.id, "me")).status is Status.FAILED


async def test_a_task_listed_by_hand_among_a_gone_replicas_is_not_failed(replica) -> None:
    """The run sets are the store's, writable with its password: a live replica's running
    task added to a gone replica's set stays working (its sealed record names its replica)."""
    a, b = replica("a"), replica("b")
    await a.replicas.beat(10_000)
    task, _, _ = await running(a)
    store = b.replicas.store
    assert isinstance(store, RedisStore)
    await store.redis.sadd(store.key("run", "gone"), task.id)
    await store.redis.sadd(store.key("replicas"), "gone")
    await b.replicas.beat(10_000)
    assert await b.replicas.fail_stranded() == 0
    assert (await b.find(task.id, "me")).status is Status.WORKING
    assert await replica("gone").replicas.recover() == 0


async def test_after_a_store_incident_no_replica_is_judged_gone_for_a_lease(replica) -> None:
    """The store was away (or lost the leases): a live replica whose lease lapsed meanwhile
    gets a full lease to beat again before its tasks are taken for stranded, so its result
    does not lose to "the replica stopped"."""
    a, b = replica("a"), replica("b")
    await a.replicas.beat(300)
    await b.replicas.beat(300)
    task, _, _ = await running(a)
    await asyncio.sleep(1.2)  # a's lease lapsed, and b's: as in a store outage
    assert not await b.replicas.beat(10_000)  # b finds its own lease gone: it waits
    assert (await b.find(task.id, "me")).status is Status.WORKING
    assert await b.sweep() == 0 and (await b.find(task.id, "me")).status is Status.WORKING
    b.replicas.defer_judgement(0)  # the lease has passed: a never came back
    assert (await b.find(task.id, "me")).status is Status.FAILED
    c = replica("c")  # a replica whose own beats do not get through judges nobody
    assert (await c.find(task.id, "me")).status is Status.FAILED  # already written
    other, _, _ = await running(a)
    await asyncio.sleep(1.2)
    assert (await c.find(other.id, "me")).status is Status.WORKING


async def test_a_replica_fails_what_its_previous_life_left_running(replica) -> None:
    first = replica("a")
    await first.replicas.beat(10_000)  # its lease still holds when it comes back
    task, _, _ = await running(first)
    again = replica("a")
    assert await again.replicas.recover() == 1
    assert (await again.find(task.id, "me")).status is Status.FAILED


async def test_bounds_hold_under_concurrent_creation_on_three_replicas(replica) -> None:
    engines = [replica(n, max_tasks=30, max_per_owner=30) for n in "abc"]

    async def create(engine: TaskEngine) -> bool:
        try:
            await engine.adopt(intent(), attach_fake)
            return True
        except StoreFull:
            return False

    made = await asyncio.gather(*(create(engines[i % 3]) for i in range(90)))
    assert sum(made) == 30


async def test_a_foreign_owner_finds_nothing_on_any_replica(replica) -> None:
    a, b = replica("a"), replica("b")
    task, _, _ = await running(a)
    for engine in (a, b):
        with pytest.raises(KeyError):
            await engine.find(task.id, "someone else")


async def test_a_lost_announcement_is_made_up_for_by_the_heartbeat_poll(replica) -> None:
    a, b = replica("a"), replica("b")  # nobody listens: every announcement is lost
    await a.replicas.beat(10_000)
    task, call, _ = await running(a)
    heard: list[Task] = []
    b.watch(task.id, heard.append)
    call.sink.on_response(jsonrpc.result(1, {"content": []}))
    await read(b, task.id, lambda t: t.terminal)
    await b.replicas.poll()
    await b.replicas.poll()  # nothing new: told once
    assert [t.status for t in heard] == [Status.COMPLETED]


async def test_a_message_that_fails_does_not_stop_the_channel(redis_server, key_prefix) -> None:
    store = RedisStore(redis_server.url, key_prefix, StoreBounds.given(10, 10, 1000, 10_000))
    heard: list[dict] = []

    async def handler(channel: str, msg: dict) -> None:
        if msg.get("bad"):
            raise RuntimeError("a bug in one handler")
        heard.append(msg)

    bus = RedisBus(store)
    job = asyncio.create_task(bus.listen(["events"], handler))
    try:
        await subscribed(store, {"events": 1})
        await bus.publish("events", {"bad": True})
        await bus.publish("events", {"task": "after"})
        await until(lambda: heard == [{"task": "after"}])
    finally:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
        await store.close()


async def test_a_message_without_the_replicas_seal_steers_nothing(replica, listening,
                                                                  redis_server) -> None:
    """Issue 19 (the store as a trust boundary): a process that can publish on the store's
    channels, without the replicas' secret, can neither cancel a task where it runs nor
    plant a forged end in what replicas keep; each such message is logged and dropped."""
    from structlog.testing import capture_logs

    a, b = replica("a"), replica("b")
    listening(a)
    listening(b)
    await a.replicas.beat(10_000)
    await subscribed(a.replicas.store, {"ctl:a": 1, "events": 2})
    task, call, _ = await running(a)
    store = a.replicas.store
    assert isinstance(store, RedisStore)
    forged_end = {**task.ended(Status.COMPLETED, now=time.time()).record(),
                  "result": {"content": ["forged"]}}
    with capture_logs() as logs:
        await store.redis.publish(store.key("ctl:a"),
                                  orjson.dumps({"op": "cancel", "task": task.id}))
        await store.redis.publish(store.key("events"), orjson.dumps(
            {"task": task.id, "from": "x", "end": forged_end}))
        wrong = b"1." + b"A" * 43 + b"." + orjson.dumps({"op": "cancel", "task": task.id})
        await store.redis.publish(store.key("ctl:a"), wrong)
        await until(lambda: sum(e["event"] == "replica.message_refused" for e in logs) >= 4)
    assert call.cancelled == []
    assert (await b.find(task.id, "me")).status is Status.WORKING  # nothing forged kept
    call.sink.on_response(jsonrpc.result(1, {"content": [{"type": "text", "text": "real"}]}))
    done = await read(b, task.id, lambda t: t.terminal)
    assert b"real" in (done.result or b"")  # sealed announcements still heard and kept


def test_a_seal_opens_only_its_own_timely_messages() -> None:
    now = [1000.0]
    seal = Seal(SECRET, clock=lambda: now[0])
    sealed = seal.close(b'{"op":"cancel"}')
    assert seal.open(sealed) == b'{"op":"cancel"}'
    assert b"cancel" not in sealed  # whoever subscribes on the store reads nothing of it
    assert Seal(b"another key".ljust(32)).open(sealed) is None
    assert seal.open(sealed[:-1] + bytes([sealed[-1] ^ 1])) is None
    assert seal.open(b'{"op":"cancel"}') is None
    now[0] += 61  # replayed past the window
    assert seal.open(sealed) is None
    assert Seal(None).open(b'{"op":"cancel"}') == b'{"op":"cancel"}'  # unsealed replicas


async def quietly(engine: TaskEngine, task_id: str, until: Callable[[Task], bool]) -> Task:
    """The task as `engine` reads it with no round trip to the store, once `until` holds."""
    store = engine.replicas.store
    for _ in range(200):
        before = store.requests
        task = await engine.find(task_id, "me")
        if store.requests == before and until(task):
            return task
        await asyncio.sleep(0.01)
    raise AssertionError(f"never read quietly: {task}")


async def test_a_running_task_is_read_on_another_replica_from_its_announcements(
        replica, listening) -> None:
    """Issue 22: each write announces the record, so another replica answers a poll of a
    running task with no round trip while its bus is heard; a subscription made again
    (announcements may have been missed meanwhile) or a bus not heard lately sends reads
    back to the store."""
    a, b = replica("a"), replica("b")
    listening(b)
    await a.replicas.beat(10_000)
    await subscribed(a.replicas.store, {"events": 1})
    task, call, _ = await running(a)
    seen = await quietly(b, task.id, lambda t: True)
    assert (seen.status, seen.replica, seen.tool) == (Status.WORKING, "a", "slow")
    with pytest.raises(TaskNotFound):  # what b heard is its owner's alone
        await b.find(task.id, "someone else")
    call.sink.on_message(jsonrpc.request(7, "elicitation/create", {"message": "name?"}))
    asked = await quietly(b, task.id, lambda t: t.status is Status.INPUT_REQUIRED)
    assert list(asked.inputs) == ["elicitation-1"]

    store, bus = b.replicas.store, b.replicas.bus
    assert isinstance(store, RedisStore) and isinstance(bus, RedisBus)
    bus._heard_through -= 5  # no pong for 5 s: the bus may have stalled
    before = store.requests
    assert (await b.find(task.id, "me")).status is Status.INPUT_REQUIRED
    assert store.requests > before  # read from the store
    await quietly(b, task.id, lambda t: True)  # heard again: quiet again

    epoch = bus.epoch
    await a.replicas.store.redis.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    await until(lambda: bus.epoch > epoch)  # b saw its subscription go
    before = store.requests
    assert (await b.find(task.id, "me")).status is Status.INPUT_REQUIRED
    assert store.requests > before  # what b heard before its new subscription is not used
    await subscribed(store, {"events": 1})  # b listens again
    call.sink.on_message(jsonrpc.request(8, "elicitation/create", {"message": "age?"}))
    again = await quietly(b, task.id, lambda t: len(t.inputs) == 2)
    assert sorted(again.inputs) == ["elicitation-1", "elicitation-2"]
    call.sink.on_response(jsonrpc.result(1, {"content": [{"type": "text", "text": "hi"}]}))
    done = await quietly(b, task.id, lambda t: t.terminal)  # the end came whole
    assert done.status is Status.COMPLETED and b"hi" in (done.result or b"")


async def _wiped(store: RedisStore) -> None:
    """Every key under the test's prefix deleted: what a store restarted empty holds."""
    keys = [k async for k in store.redis.scan_iter(match=store.key("*"))]
    await store.redis.delete(*keys)


async def test_ids_not_found_answer_retry_until_a_store_that_lost_them_is_written_back(
        redis_server, key_prefix) -> None:
    """Issue 33: the store loses everything while a task runs on a; b, asked for it before
    a has written it back, answers "retry" (StoreSettling), never "not found"; so does an
    unknown id, and so does another owner's id; once every replica has written back and
    said so, the task is found on b and an unknown id is "not found" again."""
    from gateway.errors import StoreSettling
    from gateway.tasks.lease import Lease
    from gateway.tasks.store.outbox import Outbox

    engines = []
    for name in ("a", "b"):
        shared = RedisStore(redis_server.url, key_prefix, StoreBounds.given(100, 100, 1000, 10_000),
                            replica=name, secret=SECRET)
        engines.append(TaskEngine(Outbox(shared, 100, 1 << 20), replica=name,
                                  bus=RedisBus(shared)))
    a, b = engines
    assert a.replicas is not None and b.replicas is not None
    # a keeps its lease (and writes back) as a gateway does, beating every 20 s; b beats
    # by hand, with a lease of 2 s (so it settles within 1 to 4 s), and does not listen (it
    # would read the task from what it heard announced).
    lease = Lease(a, a.replicas, "redis", 60_000, a._store)  # type: ignore[arg-type]
    try:
        await lease.start()
        await b.replicas.beat(2000)
        task, _, _ = await running(a)
        assert (await b.find(task.id, "me")).status is Status.WORKING
        await _wiped(b.replicas.store.store)  # type: ignore[attr-defined]
        for owner in ("me", "bob"):  # before b beats again: the generation read says so
            with pytest.raises(StoreSettling) as caught:
                await b.find(task.id, owner)
            assert caught.value.data["reason"] == "store_settling"
            assert caught.value.http_status == 503 and caught.value.retry_after_s
        with pytest.raises(StoreSettling):
            await b.find("never-a-task", "bob")
        assert not await b.replicas.beat(2000)  # b sees the new generation
        lease._wake.set()  # a beats now, as a connection made again would have it
        for _ in range(300):  # "retry" until a has written it back: then the task
            with contextlib.suppress(StoreSettling):
                assert (await b.find(task.id, "me")).status is Status.WORKING
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("a never wrote its task back")
        with pytest.raises(StoreSettling):  # b has not written its own back yet
            await b.find("never-a-task", "bob")
        await b.replicas.rejoined(b.replicas.generation.known or "")
        for _ in range(500):  # b hears at a beat that a wrote back, and a beat and a half
            # has passed (a replica it did not know of may yet have come)
            await b.replicas.beat(2000)
            if not b.replicas.generation.settling():
                break
            await asyncio.sleep(0.01)
        with pytest.raises(TaskNotFound):
            await b.find("never-a-task", "bob")
        with pytest.raises(TaskNotFound):
            await b.find(task.id, "bob")
    finally:
        await lease.stop()
        await b.replicas.leave()
