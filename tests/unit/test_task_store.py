"""The task model, per-tool policy, and the `TaskStore` contract, held by both stores: the
memory store, and the Redis store against a real Redis-compatible server (each test under its
own key prefix)."""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable

import orjson
import pytest
from conftest import loaded_by

from gateway.settings.load import from_mapping
from gateway.tasks.engine import TaskEngine, TaskNotFound
from gateway.tasks.model import TRANSITIONS, InvalidTransition, Status, Task, iso, new_id
from gateway.tasks.policy import Policies, PollAdvisor
from gateway.tasks.store import ResultTooLarge, StoreBounds, StoreFull, TaskStore
from gateway.tasks.store.memory import MemoryStore
from gateway.tasks.store.redis import RedisStore
from gateway.tasks.store.redis_bus import RedisBus

SECRET = b"the replicas' shared secret, 32+"


class Clock:
    def __init__(self) -> None:
        self.now = time.time()  # near the Redis server's own clock, which expires keys

    def __call__(self) -> float:
        return self.now


def task(status: Status = Status.WORKING) -> Task:
    return Task("t", "owner", "tool", "extension", 1000, 500, status=status)


@pytest.mark.parametrize("start", list(Status))
@pytest.mark.parametrize("end", list(Status))
def test_only_the_spec_transitions_are_allowed(start: Status, end: Status) -> None:
    t = task(start)
    allowed = {Status.WORKING: {"input_required", "completed", "failed", "cancelled"},
               Status.INPUT_REQUIRED: {"working", "completed", "failed", "cancelled"}}
    if end in allowed.get(start, set()):
        t.move(end, "why", now=time.time())
        assert (t.status, t.status_message) == (end, "why")
    else:
        with pytest.raises(InvalidTransition):
            t.move(end, now=time.time())
    assert TRANSITIONS[Status.COMPLETED] == frozenset()


def test_timestamps_are_iso_utc() -> None:
    assert iso(0) == "1970-01-01T00:00:00.000Z"
    t = task()
    before = t.updated_at
    t.move(Status.INPUT_REQUIRED, now=time.time())
    assert t.updated_at >= before >= t.created_at


Maker = Callable[..., TaskStore]


@pytest.fixture(params=["memory", "redis"])
async def make_store(request, key_prefix) -> AsyncIterator[Maker]:
    made: list[TaskStore] = []

    def make(clock: Clock, **limits: int) -> TaskStore:
        bounds = {"max_tasks": 3, "max_per_owner": 2, "max_result_bytes": 100,
                  "max_stored_bytes": 150, **limits}
        if request.param == "memory":
            store: TaskStore = MemoryStore(StoreBounds.given(**bounds), clock=clock)
        else:
            url = request.getfixturevalue("redis_server").url
            store = RedisStore(url, key_prefix, StoreBounds.given(**bounds), clock=clock,
                               secret=SECRET)
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()


async def beaten(store: TaskStore) -> TaskStore:
    """`store` as a replica's first beat leaves it: a Redis store's keyed creates expect
    the generation a beat read (redis_scripts.py `settling`)."""
    if isinstance(store, RedisStore):
        await RedisBus(store).beat("unit", 10_000)
    return store


async def add(store: TaskStore, owner: str, ttl_ms: int | None = 10_000,
              status: Status = Status.COMPLETED) -> Task:
    """A task as the engine creates it, ended at once unless `status` says otherwise (the
    store forgets only finished tasks by itself)."""
    t = Task(new_id(), owner, "tool", "extension", ttl_ms, 500,
             created_at=store.clock())  # type: ignore[attr-defined]
    await store.create(t)
    if status is not Status.WORKING:
        t.move(status, now=time.time())
        assert await store.save(t)
    return t


def assert_lapsed(task: Task) -> None:
    """How a task past its ttl reads to its owner while remembered (Task.lapsed)."""
    assert task.status is Status.FAILED and task.result is None
    assert task.status_message is not None and task.status_message.startswith("expired")


async def test_store_bounds_refuse_and_never_evict_live_tasks(make_store) -> None:
    clock = Clock()
    store = make_store(clock)
    a1 = await add(store, "a")
    await add(store, "a")
    with pytest.raises(StoreFull, match="this client"):
        await add(store, "a")
    await add(store, "b")
    with pytest.raises(StoreFull, match="maximum of 3"):
        await add(store, "c")
    held = await store.get(a1.id)  # still there: nothing live was evicted
    assert held is not None and held.record() == a1.record() and held is not a1  # a copy
    clock.now += 11
    for owner in "cde":
        await add(store, owner)  # expired ones made room for three
    # The engine says so, whatever the store still holds: failed, its result gone.
    assert_lapsed(await TaskEngine(store, clock=clock).find(a1.id, "a"))


async def quota_task(store: TaskStore, owner: str, quota: str) -> Task:
    """A running task as a legacy session creates it: owned by the session, counted
    against its principal."""
    t = Task(new_id(), owner, "tool", "core", 10_000, 500, quota=quota,
             created_at=store.clock())  # type: ignore[attr-defined]
    await store.create(t)
    return t


async def test_tasks_count_against_their_principal_whichever_session_owns_them(
        make_store) -> None:
    """Issue 29: one token's many sessions share one share of the store; another principal
    still creates tasks, and each session still sees only its own."""
    clock = Clock()
    store = make_store(clock, max_tasks=4, max_per_owner=2)
    first = await quota_task(store, "bob-session-1", "bob")
    await quota_task(store, "bob-session-2", "bob")
    with pytest.raises(StoreFull, match="this client"):
        await quota_task(store, "bob-session-3", "bob")  # a new session is no new share
    await quota_task(store, "alice-session", "alice")  # Alice is untouched by Bob's
    assert [t.id for t in await store.owned_by("bob-session-1")] == [first.id]
    assert await store.owned_by("bob-session-3") == []
    held = await store.get(first.id)
    assert held is not None and held.quota == "bob"  # the record carries it
    await store.delete(first.id)  # a forgotten task gives its principal's slot back
    await quota_task(store, "bob-session-3", "bob")
    with pytest.raises(StoreFull, match="this client"):
        await quota_task(store, "bob-session-4", "bob")


async def test_a_restored_task_counts_against_its_principal(make_store) -> None:
    clock = Clock()
    store = make_store(clock, max_tasks=10, max_per_owner=1)
    lost = Task(new_id(), "bob-session-1", "tool", "core", 10_000, 500, quota="bob",
                created_at=clock())
    assert await store.restore([lost]) == 1
    with pytest.raises(StoreFull, match="this client"):
        await quota_task(store, "bob-session-2", "bob")
    await store.delete(lost.id)
    await quota_task(store, "bob-session-2", "bob")


async def test_a_running_task_is_never_dropped_by_the_store(make_store) -> None:
    clock = Clock()
    store = make_store(clock)
    running = await add(store, "a", 1000, Status.WORKING)
    clock.now += 2
    await store.sweep()
    assert await store.knows(running.id)  # the engine ends it, not the store
    # Yet nobody reads it running past its ttl: it reads failed.
    assert_lapsed(await TaskEngine(store, clock=clock).find(running.id, "a"))


async def test_ids_are_unguessable_and_foreign_ids_look_unknown(make_store) -> None:
    store = make_store(Clock(), max_tasks=100, max_per_owner=100)
    ids = {(await add(store, "a", None)).id for _ in range(50)}
    assert len(ids) == 50 and all(len(i) >= 22 for i in ids)  # >= 128 random bits
    assert await store.get("nope") is None


async def test_expired_tasks_say_so_for_a_while_then_are_unknown(make_store) -> None:
    clock = Clock()
    store = make_store(clock)
    t = await add(store, "a", 1000)
    engine = TaskEngine(store, clock=clock)
    clock.now += 2
    await store.sweep()
    assert_lapsed(await engine.find(t.id, "a"))  # a terminal status: a poll loop ends
    with pytest.raises(TaskNotFound):  # and to anyone else, unknown
        await engine.find(t.id, "b")
    clock.now += 3600
    with pytest.raises(TaskNotFound):
        await engine.find(t.id, "a")


async def test_terminal_stays_terminal_whoever_writes_last(make_store) -> None:
    store = make_store(Clock())
    t = await add(store, "a", status=Status.WORKING)
    late = t.copy()
    t.move(Status.CANCELLED, now=time.time())
    assert await store.save(t)
    late.status_message = "50%"  # a stale working copy written after the end
    assert not await store.save(late)
    late.move(Status.COMPLETED, now=time.time())
    assert not await store.save(late)
    stored = await store.get(t.id)
    assert stored is not None and stored.status is Status.CANCELLED


async def test_result_bytes_are_bounded_per_task_and_in_all(make_store) -> None:
    store = make_store(Clock())
    t1 = await add(store, "a", status=Status.WORKING)
    t2 = await add(store, "b", status=Status.WORKING)
    t1.size = 101
    with pytest.raises(ResultTooLarge, match="at most 100 bytes"):
        await store.save(t1)
    t1.size = 100
    assert await store.save(t1)
    t2.size = 60
    with pytest.raises(ResultTooLarge, match="storage"):
        await store.save(t2)
    t2.size = 50
    assert await store.save(t2)
    assert store.stored_bytes() == 150
    await store.delete(t1.id)
    assert store.stored_bytes() == 50  # a forgotten task's bytes are returned


def test_records_are_plain_json() -> None:
    t = Task(new_id(), "a", "tool", "core", 1000, 500, upstream="main",
             result=orjson.dumps({"content": [{"type": "text", "text": "hi"}]}))
    t.inputs["elicitation-1"] = {"method": "elicitation/create", "params": {}}
    back = Task.from_record(orjson.loads(orjson.dumps(t.record())))
    assert orjson.dumps(back.record()) == orjson.dumps(t.record())
    assert back.status is Status.WORKING and back.result == t.result


async def test_a_full_store_stays_bounded_in_memory() -> None:
    clock = Clock()
    store = MemoryStore(StoreBounds.given(1000, 1000, 10, 10_000), clock=clock)
    tracemalloc.start()
    for round_ in range(20):
        for _ in range(1000):
            await add(store, f"o{round_}", 1000)
        clock.now += 2  # all expire; the next round replaces them
        if round_ == 1:
            baseline = tracemalloc.get_traced_memory()[0]
    grown = tracemalloc.get_traced_memory()[0] - baseline
    tracemalloc.stop()
    assert len(store) == 1000
    assert grown < 2 * 1024 * 1024  # 18 more rounds of 1000 tasks did not pile up


def test_policy_by_name_glob_and_upstream() -> None:
    conf = from_mapping({"upstreams": {"main": {"command": "x", "tasks": {
        "defaults": {"sync_budget_ms": 10}, "tools": {"longest": {"mode": "required"}}}}},
        "tasks": {
        "defaults": {"mode": "auto", "sync_budget_ms": 1000, "max_ttl_ms": 60_000},
        "tools": {"echo": {"mode": "never"}, "long*": {"mode": "always",
                                                       "poll_interval_ms": 2000}}}})
    policies = Policies(conf.tasks, {"main": conf.upstreams["main"].tasks, "other": None})
    assert policies.for_tool("other", "echo").mode == "never"
    long_op = policies.for_tool("other", "longRunning")
    assert (long_op.mode, long_op.poll_interval_ms) == ("always", 2000)
    assert policies.for_tool("other", "x").sync_budget_ms == 1000
    assert policies.for_tool("main", "x").sync_budget_ms == 10
    assert policies.for_tool("main", "longest").mode == "required"
    assert policies.for_tool("main", "longer").mode == "always"
    # No time bound (no timeout_ms, no request_timeout_ms given here): the cap.
    assert long_op.ttl(None) == 60_000 and long_op.ttl(10) == 60_000


def test_a_task_lives_its_time_bound_plus_the_ttl_asked() -> None:
    """Issue 40: the ttl a client asks is its result's retention after the latest its run
    can end (the tool's timeout_ms, else the upstream's request_timeout_ms), within the
    operator's max_ttl_ms; never a running task expired on the client's guess."""
    conf = from_mapping({"upstreams": {"main": {"command": "x", "request_timeout_ms": 90_000}},
                         "tasks": {"defaults": {"ttl_ms": 30_000, "max_ttl_ms": 3_600_000},
                                   "tools": {"quick": {"timeout_ms": 5000},
                                             "capped": {"max_ttl_ms": 50_000}}}})
    policies = Policies(conf.tasks, {"main": None}, {"main": 90_000})
    assert policies.for_tool("main", "quick").ttl(1000) == 6000
    assert policies.for_tool("main", "slow").timeout_ms == 90_000  # the upstream's bound
    assert policies.for_tool("main", "slow").ttl(60_000) == 150_000
    assert policies.for_tool("main", "slow").ttl(None) == 120_000  # + ttl_ms
    assert policies.for_tool("main", "capped").ttl(60_000) == 50_000  # the hard cap


def test_poll_interval_learns_from_durations() -> None:
    poll = PollAdvisor()
    assert poll.suggest("t", 1000) == 1000  # no history: the policy's value
    poll.record("t", 0.1)
    poll.record("t", 0.1)
    assert poll.suggest("t", 1000) == 1000  # too little history still
    poll.record("t", 0.1)
    assert poll.suggest("t", 1000) == 250  # quick tool: the floor, never below
    for seconds in (8.0, 12.0, 10.0):
        poll.record("slow", seconds)
    assert poll.suggest("slow", 1000) == 2500  # a quarter of the median
    for _ in range(3):
        poll.record("slower", 600.0)
    assert poll.suggest("slower", 1000) == 30_000  # capped


async def test_a_lost_record_is_restored_as_it_was_and_a_held_one_is_left(make_store) -> None:
    """What a replica writes back where a shared store lost its data: put if absent,
    whatever the bounds (the task was accepted already); never over a record it holds."""
    clock = Clock()
    store = make_store(clock, max_tasks=1)
    held = await add(store, "a")
    assert await store.restore([held]) == 0  # held: left as it is
    lost = Task(new_id(), "a", "tool", "extension", 10_000, 500, created_at=clock.now,
                status=Status.COMPLETED, result=b'{"content":[]}', size=14)
    assert await store.restore([lost]) == 1  # over max_tasks: it was accepted before
    got = await store.get(lost.id)
    assert got is not None and orjson.dumps(got.record()) == orjson.dumps(lost.record())
    assert {t.id for t in await store.owned_by("a")} == {held.id, lost.id}
    gone = Task(new_id(), "a", "tool", "extension", 1000, 500, created_at=clock.now - 2)
    assert await store.restore([gone]) == 0  # its ttl passed: nothing to keep


async def test_a_beat_tells_whether_the_lease_was_held(redis_server, key_prefix) -> None:
    """How a replica learns that the store lost what it held (restarted empty, say)."""
    store = RedisStore(redis_server.url, key_prefix, StoreBounds.given(10, 10, 100, 1000))
    try:
        bus = RedisBus(store)
        assert not (await bus.beat("r", 10_000)).held  # a first beat
        assert (await bus.beat("r", 10_000)).held
        await store.redis.delete(store.key("lease", "r"))  # as an empty restart leaves it
        assert not (await bus.beat("r", 10_000)).held
    finally:
        await store.close()


async def test_an_unacknowledged_creation_leaves_no_task(redis_server, key_prefix,
                                                        tmp_path) -> None:
    """store.min_replicas_acked: a creation no store replica took is not durable, so no
    handle may go out for it, and no record stays; with a replica attached it goes."""
    from conftest import RedisServer

    from gateway.errors import StoreUnavailable

    store = RedisStore(redis_server.url, key_prefix, StoreBounds.given(10, 10, 100, 1000),
                       min_acked=1,
                       ack_timeout_ms=100)
    follower = RedisServer()
    try:
        lone = Task(new_id(), "a", "tool", "extension", 10_000, 500)
        with pytest.raises(StoreUnavailable) as refused:
            await store.create(lone)
        assert "0 of 1 store replicas" in refused.value.detail  # the operator's log reads it
        assert await store.get(lone.id) is None and not await store.knows(lone.id)
        follower.start(["--replicaof", "127.0.0.1", str(redis_server.port)])
        store.ack_timeout_ms = 2000
        acked = Task(new_id(), "a", "tool", "extension", 10_000, 500)
        for _ in range(50):  # until the follower has synced
            try:
                await store.create(acked)
                break
            except StoreUnavailable:
                await asyncio.sleep(0.1)
        assert await store.get(acked.id) is not None
        acked.move(Status.COMPLETED, now=time.time())
        assert await store.save(acked)  # an end waits for the replica too
    finally:
        follower.stop()
        await store.close()


def test_only_a_shared_store_loads_redis() -> None:
    """redis-py and what it pulls in (hiredis, cryptography, OpenTelemetry where installed)
    cost ~20 MiB resident: a one-process gateway never imports them (issue 22)."""
    code = ("from gateway.app import create_app; from gateway.settings.load import from_mapping; "
            "create_app(from_mapping({'upstreams': {'m': {'command': 'x'}}%s}))")
    assert loaded_by(code % "", ("redis", "cryptography")) == []
    shared = (", 'store': {'backend': 'redis', 'url': 'redis://127.0.0.1:9/0'}, "
              "'replica': {'secret': 's' * 32}")
    assert loaded_by(code % shared, ("redis",)) == ["redis"]


async def test_one_principals_results_fill_its_own_share_only(make_store) -> None:
    """Bob's big results fill his share of the result bytes, and Alice's result still fits
    (before, Bob filled the whole store and her task failed); Redis as the memory store
    (before, it held the global bound only)."""
    store = make_store(Clock(), max_tasks=100, max_per_owner=100, max_stored_bytes=300,
                       max_bytes_per_owner=150)
    bobs = [await add(store, "bob", status=Status.WORKING) for _ in range(3)]
    for t in bobs[:2]:
        t.size = 75
        assert await store.save(t)
    bobs[2].size = 10
    with pytest.raises(ResultTooLarge, match="this client's share"):
        await store.save(bobs[2])
    alice = await add(store, "alice", status=Status.WORKING)
    alice.size = 100
    assert await store.save(alice)
    with pytest.raises(StoreFull, match="this client's share"):  # full: no new task
        await add(store, "bob", status=Status.WORKING)
    assert await add(store, "alice", status=Status.WORKING)  # hers is not
    await store.delete(bobs[0].id)  # his bytes come back to him
    assert await store.save(bobs[2])


async def done(store: TaskStore, owner: str, size: int = 0) -> Task:
    """A task ended with a result of `size` bytes."""
    t = await add(store, owner, status=Status.WORKING)
    t.size = size
    t.move(Status.COMPLETED, now=time.time())
    assert await store.save(t)
    return t


async def test_read_results_make_room_for_their_principal_the_first_read_first(
        make_store) -> None:
    """Issue 40: a principal holds at most max_held tasks, running and finished; its
    finished tasks whose results it read make room, the first read first; an unread one
    never does, and an evicted id is unknown (not "expired")."""
    clock = Clock()
    store = make_store(clock, max_tasks=100, max_per_owner=2, max_held_per_owner=4)
    engine = TaskEngine(store, clock=clock)
    t1, t2, t3 = [await done(store, "a") for _ in range(3)]
    running = await add(store, "a", status=Status.WORKING)
    with pytest.raises(StoreFull, match="holds its maximum of 4 tasks, none of them"):
        await add(store, "a")
    await store.read(running.id)  # a running task has no result to read: no mark
    await store.read(t3.id)
    await store.read(t1.id)
    await store.read(t3.id)  # a second read keeps its place
    fourth = await done(store, "a")  # t3, read first, made room
    assert await store.get(t3.id) is None and not await store.knows(t3.id)
    with pytest.raises(TaskNotFound):
        await engine.find(t3.id, "a")
    fifth = await done(store, "a")  # then t1
    assert await store.get(t1.id) is None
    assert {t.id for t in await store.owned_by("a")} == {t2.id, running.id, fourth.id,
                                                         fifth.id}
    with pytest.raises(StoreFull, match="none of them finished with its result read"):
        await add(store, "a")  # nothing read is left: t2 and the others stay
    await add(store, "b")  # another principal is untouched by a's bound
    running.move(Status.COMPLETED, now=time.time())
    assert await store.save(running)
    await store.read(running.id)  # read once finished: now it makes room
    await add(store, "a")
    assert await store.get(running.id) is None and await store.get(t2.id) is not None


async def test_running_tasks_are_bounded_apart_from_finished_ones(make_store) -> None:
    """max_tasks_per_owner counts a principal's running tasks; an end gives the slot back
    while the finished task stays, counted among those it holds."""
    store = make_store(Clock(), max_tasks=100, max_per_owner=2, max_held_per_owner=10)
    first = await add(store, "a", status=Status.WORKING)
    await add(store, "a", status=Status.WORKING)
    with pytest.raises(StoreFull, match="maximum of 2 tasks running"):
        await add(store, "a", status=Status.WORKING)
    first.move(Status.COMPLETED, now=time.time())
    assert await store.save(first)
    await add(store, "a", status=Status.WORKING)
    assert len(await store.owned_by("a")) == 3


async def test_a_result_over_the_share_evicts_read_ones_of_its_principal_only(
        make_store) -> None:
    """A result that passes its principal's share makes room among that principal's read
    results, the first read first: never Alice's, never an unread one; when they cannot
    free enough, nothing is evicted and the result is refused."""
    store = make_store(Clock(), max_tasks=100, max_per_owner=100, max_result_bytes=200,
                       max_stored_bytes=400, max_bytes_per_owner=200)
    alice = await done(store, "alice", 100)
    await store.read(alice.id)
    older, old, unread = [await done(store, "bob", n) for n in (60, 60, 50)]
    await store.read(older.id)
    await store.read(old.id)
    new = await add(store, "bob", status=Status.WORKING)
    new.size = 80  # 170 + 80 > 200: 50 bytes to free
    new.move(Status.COMPLETED, now=time.time())
    assert await store.save(new)
    assert await store.get(older.id) is None  # read first: it alone went
    assert all([await store.get(t.id) for t in (old, unread, alice)])
    big = await add(store, "bob", status=Status.WORKING)
    big.size = 190  # 190 + 190 - 200: more than `old`, his only read one, frees
    with pytest.raises(ResultTooLarge, match="this client's share"):
        await store.save(big)
    assert await store.get(old.id) is not None  # refused: nothing was evicted
    assert store.stored_bytes() == 100 + 60 + 50 + 80


async def test_results_past_their_ttl_give_their_principals_share_back(make_store) -> None:
    clock = Clock()
    store = make_store(clock, max_tasks=100, max_per_owner=100, max_held_per_owner=2,
                       max_bytes_per_owner=100)
    await done(store, "bob", 100)
    with pytest.raises(StoreFull, match="share"):
        await add(store, "bob")
    clock.now += 11
    await store.sweep()
    await done(store, "bob", 100)  # the expired one's bytes and place came back
    with pytest.raises(StoreFull, match="share"):
        await add(store, "bob")


@pytest.fixture
async def guarded_store(key_prefix) -> AsyncIterator[RedisStore]:
    """A sealed store on a Redis server with a password (an ACL user of its own, as
    deploy/ runs it): what follows is what anyone with that password can do."""
    from conftest import RedisServer

    server = RedisServer()
    server.start(["--user", "default", "off", "--user", "gateway", "on", ">store password",
                  f"~{key_prefix}*", f"&{key_prefix}*", "+@all", "-@dangerous"])
    url = f"redis://gateway:store%20password@127.0.0.1:{server.port}/0"
    store = RedisStore(url, key_prefix, StoreBounds.given(10, 10, 1000, 10_000), secret=SECRET)
    try:
        yield store
    finally:
        await store.close()
        server.stop()


async def ended(store: RedisStore, owner: str, text: str) -> Task:
    done = Task(new_id(), owner, "secret-tool", "extension", 60_000, 500)
    await store.create(done)
    done.result = orjson.dumps({"content": [{"type": "text", "text": text}]})
    done.size = len(done.result)
    done.move(Status.COMPLETED, "finished well", now=time.time())
    assert await store.save(done)
    return done


async def test_a_record_rewritten_by_hand_in_the_store_is_refused(guarded_store) -> None:
    """Issue 30: with the store's password alone, rewriting a record's owner gave Bob
    Alice's task with a forged result. Now the record fails its seal: not found for
    either of them, and an audit event says so (the id and why, never the data)."""
    from structlog.testing import capture_logs

    store = guarded_store
    alice = await ended(store, "alice-digest", "alice's secret result")
    bob = await ended(store, "bob-digest", "bob's")
    raw = store.redis
    key = store.key("t", alice.id)
    forged = orjson.dumps({"content": [{"type": "text", "text": "forged"}]})
    await raw.hset(key, mapping={"owner": "bob-digest", "res": forged})
    await raw.zadd(store.key("o", "bob-digest"), {alice.id: 1})
    store._finished.clear()  # as a replica that never read it: the store is asked
    with capture_logs() as logs:
        assert await store.get(alice.id) is None
        assert [t.id for t in await store.owned_by("bob-digest")] == [bob.id]
        assert await store.owned_by("alice-digest") == []
    refused = [e for e in logs if e["event"] == "task.record_refused"]
    assert refused and all(e["task"] == alice.id and e["why"] == "seal" and e["audit"]
                           for e in refused)
    assert "forged" not in repr(logs) and "bob-digest" not in repr(logs)
    # Its own owner back, the result alone replaced: still refused.
    await raw.hset(key, mapping={"owner": "alice-digest"})
    assert await store.get(alice.id) is None
    # A genuine record moved under another id: refused too.
    held = await raw.hgetall(store.key("t", bob.id))
    await raw.hset(key, mapping=held)
    assert await store.get(alice.id) is None
    assert (await store.get(bob.id)) is not None


async def test_results_and_records_are_encrypted_at_rest(guarded_store) -> None:
    """What the store's operator reads of a task: its status, owner digest and replica,
    never its result, tool, message or error."""
    store = guarded_store
    done = await ended(store, "alice-digest", "alice's secret result")
    held = await store.redis.hgetall(store.key("t", done.id))
    assert held[b"status"] == b"completed" and held[b"owner"] == b"alice-digest"
    assert held[b"res"] != done.result and b"secret result" not in held[b"res"]
    for plain in (b"secret-tool", b"finished well", b"alice's"):
        assert plain not in held[b"rec"] and plain not in held[b"res"], plain
    store._finished.clear()
    got = await store.get(done.id)  # read back whole
    assert got is not None and got.result == done.result
    assert got.status_message == "finished well"
