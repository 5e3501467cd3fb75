"""The task engine's lifecycle over the memory store, with a fake upstream call: create,
input, answer, cancel, timeout, expiry while running, store full, results too large."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway import errors
from gateway.protocol import jsonrpc
from gateway.queues import Limit, Queues, Ticket
from gateway.tasks.engine import Handover, Intent, TaskEngine, TaskNotFound
from gateway.tasks.model import Status, Task
from gateway.tasks.policy import Policy
from gateway.tasks.store import StoreBounds, StoreFull
from gateway.tasks.store.memory import MemoryStore


class FakeCall:
    """An upstream call as the engine sees it: it records what the engine asks of it."""

    def __init__(self) -> None:
        self.sink: Any = None
        self.cancelled: list[str] = []
        self.replies: list[tuple[Any, dict[str, Any]]] = []
        self.ticket: Ticket | None = None
        self.failure: Exception | None = None  # the gateway's error, when it failed it

    @property
    def upstream(self) -> str:
        return "fake"

    def adopt(self, sink: Any) -> None:
        self.sink = sink

    def when_running(self, run: Any) -> None:
        if self.ticket is None:
            run()
        else:
            self.ticket.when_running(run)

    def cancel(self, why: str) -> None:
        self.cancelled.append(why)
        if self.ticket is not None:  # as a real call: it leaves its queue
            self.ticket.release()

    def reply(self, asked_id: Any, msg: dict[str, Any]) -> None:
        self.replies.append((asked_id, msg))


def policy(ttl_ms: int = 60_000, timeout_ms: int | None = None) -> Policy:
    """A policy whose tasks live `ttl_ms` whatever their time bound: the operator's cap
    (max_ttl_ms) set to it, so a run can expire (Policy.ttl)."""
    return Policy("always", 0, ttl_ms, ttl_ms, 500, timeout_ms)


def intent(ttl_ms: int = 60_000, timeout_ms: int | None = None) -> Intent:
    return Intent("me", "slow", "extension", "fake", policy(ttl_ms, timeout_ms))


async def running(engine: TaskEngine, ttl_ms: int = 60_000, timeout_ms: int | None = None,
                  **start: Any) -> tuple[Task, FakeCall, list[Task]]:
    """A task adopted with its fake call, the call, and what its watcher was told."""
    call, told = FakeCall(), []

    async def attach(task: Task) -> Handover:
        engine.watch(task.id, lambda t: told.append(t.copy()))
        return Handover(call, **start)  # type: ignore[arg-type]
    task = await engine.adopt(intent(ttl_ms, timeout_ms), attach)
    assert task is not None
    return task, call, told


async def attach_fake(task: Task) -> Handover:
    """A fake call handed over: the task is kept, running."""
    return Handover(FakeCall())  # type: ignore[arg-type]


async def settled() -> None:
    for _ in range(5):  # the engine writes ends in the background: let it run
        await asyncio.sleep(0)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore(StoreBounds.given(10, 10, 1000, 1500))


async def test_input_answer_progress_and_result(store: MemoryStore) -> None:
    engine = TaskEngine(store)
    task, call, told = await running(engine)
    call.sink.on_message(jsonrpc.request(41, "elicitation/create", {"message": "name?"}))
    assert task.status is Status.INPUT_REQUIRED and list(task.inputs) == ["elicitation-1"]
    await engine.answer(task, {"elicitation-1": {"action": "accept"}, "unknown": {}})
    assert call.replies == [(41, jsonrpc.result(41, {"action": "accept"}))]
    assert task.status is Status.WORKING and not task.inputs
    call.sink.on_message(jsonrpc.notification("notifications/progress",
                                              {"progress": 1, "total": 2, "message": "half"}))
    assert (await engine.find(task.id, "me")).status_message == "1/2: half"
    call.sink.on_response(jsonrpc.result(7, {"content": []}))
    await settled()
    stored = await store.get(task.id)
    assert stored is not None and stored.status is Status.COMPLETED
    assert stored.result == b'{"content":[]}' and store.stored_bytes() == len(stored.result)
    assert [t.status for t in told] == ["input_required", "working", "working", "completed"]
    assert not engine.running() and not call.cancelled


async def test_core_reply_with_an_error_goes_upstream(store: MemoryStore) -> None:
    engine = TaskEngine(store)
    task, call, _ = await running(engine)
    call.sink.on_message(jsonrpc.request("s-1", "sampling/createMessage", {}))
    assert not await engine.reply(jsonrpc.error("other", -1, "x"), "me")  # nobody asked that
    # Another owner's answer to the same id resolves nothing: the task still waits.
    assert not await engine.reply(jsonrpc.error("s-1", -1, "bob's"), "bob")
    assert task.status is Status.INPUT_REQUIRED and not call.replies
    assert await engine.reply(jsonrpc.error("s-1", -1, "declined"), "me")
    assert call.replies[0][1]["error"]["message"] == "declined"
    assert task.status is Status.WORKING


async def test_cancel_ends_at_once_and_a_late_answer_changes_nothing(store: MemoryStore
                                                                     ) -> None:
    engine = TaskEngine(store)
    released = []
    task, call, told = await running(engine, done=lambda: released.append(True))
    ended = await engine.cancel(task, "stop")
    assert ended.status is Status.CANCELLED and call.cancelled == ["stop"] and released
    call.sink.on_response(jsonrpc.result(7, {"content": ["late"]}))
    await settled()
    stored = await store.get(task.id)
    assert stored is not None and stored.status is Status.CANCELLED
    assert store.stored_bytes() == 0 and told[-1].status is Status.CANCELLED
    assert (await engine.cancel(ended)).status is Status.CANCELLED  # idempotent


async def test_timeout_fails_the_task_and_cancels_the_call(store: MemoryStore) -> None:
    engine = TaskEngine(store)
    task, call, told = await running(engine, timeout_ms=20)
    await asyncio.sleep(0.1)
    found = await engine.find(task.id, "me")
    assert found.status is Status.FAILED and found.error is not None
    assert "timed out after 20 ms" in found.error["message"]
    assert call.cancelled and told[-1].status is Status.FAILED


async def test_expiry_while_running_cancels_releases_and_returns_the_bytes(
        store: MemoryStore) -> None:
    """Regression (a): the call is cancelled, its process released, and its result, when it
    comes anyway, is never counted against the byte budget."""
    engine = TaskEngine(store)
    released = []
    task, call, _ = await running(engine, ttl_ms=30, done=lambda: released.append(True))
    await asyncio.sleep(0.1)
    assert call.cancelled and released and not engine.running()
    call.sink.on_response(jsonrpc.result(7, {"content": ["x" * 500]}))
    await settled()
    assert store.stored_bytes() == 0  # its record stays for the store's sweep, ended
    lapsed = await engine.find(task.id, "me")  # a terminal status, so a poll loop ends
    assert lapsed.status is Status.FAILED and lapsed.error is not None
    assert "ttl of 30 ms passed" in lapsed.error["message"]
    with pytest.raises(TaskNotFound):
        await engine.find(task.id, "someone else")


async def test_expiry_tells_a_waiting_watcher(store: MemoryStore) -> None:
    """Regression (b): whoever waits on the task (a core tasks/result, a listen stream) is
    told it ended; it never stays working."""
    engine = TaskEngine(store)
    task, _, told = await running(engine, ttl_ms=30)
    waiter: asyncio.Future[Task] = asyncio.get_running_loop().create_future()
    engine.watch(task.id,
                          lambda t: t.terminal and not waiter.done() and waiter.set_result(t))
    ended = await asyncio.wait_for(waiter, 2)
    assert ended.status is Status.FAILED and "expired" in (ended.status_message or "")
    assert told[-1].status is Status.FAILED


async def test_a_full_store_refuses_new_tasks(store: MemoryStore) -> None:
    engine = TaskEngine(MemoryStore(StoreBounds.given(1, 1, 100, 100)))
    await running(engine)
    with pytest.raises(StoreFull):
        await engine.adopt(intent(), attach_fake)


async def test_a_result_too_large_fails_the_task_with_a_clear_error() -> None:
    store = MemoryStore(StoreBounds.given(10, 10, 50, 1000))
    engine = TaskEngine(store)
    task, call, _ = await running(engine)
    call.sink.on_response(jsonrpc.result(7, {"content": ["y" * 100]}))
    await settled()
    found = await engine.find(task.id, "me")
    assert found.status is Status.FAILED and found.result is None
    assert found.error is not None and "at most 50 bytes" in found.error["message"]
    assert store.stored_bytes() == 0


async def test_is_error_fails_a_core_task_yet_keeps_its_result(store: MemoryStore) -> None:
    engine = TaskEngine(store)
    task, call, _ = await running(engine, fail_on_is_error=True)
    call.sink.on_response(jsonrpc.result(7, {"content": [], "isError": True}))
    await settled()
    found = await engine.find(task.id, "me")
    assert found.status is Status.FAILED and found.result == b'{"content":[],"isError":true}'


async def test_recent_failures_show_the_gateways_words_never_the_servers(
        store: MemoryStore) -> None:
    """/status's "Recent failures" (engine.failures): a message for every failure, yet none
    of what the server answered (it may quote an argument value or a secret); the client
    still reads the server's own words in its task."""
    engine = TaskEngine(store)
    quoted, call, _ = await running(engine)
    call.sink.on_response(jsonrpc.error(7, -32603, "bad value 'hunter2' for password"))
    _, soft_call, _ = await running(engine, fail_on_is_error=True)
    soft_call.sink.on_response(jsonrpc.result(8, {"content": [
        {"type": "text", "text": "no such user: alice@example.com"}], "isError": True}))
    _, exited_call, _ = await running(engine)
    exited = errors.UpstreamExited("fake", "upstream 'fake' exited (code 3)")
    exited_call.failure = exited  # as Call.fail marks it: the transport failed the call
    exited_call.sink.on_response(exited.to_message(9))
    _, spoofing, _ = await running(engine)  # a server shaping its error as the gateway's
    spoofing.sink.on_response(jsonrpc.error(10, -32603, "alice's password is hunter2", {
        "upstream": "fake", "reason": "exited"}))
    await running(engine, timeout_ms=20)
    await asyncio.sleep(0.1)
    assert (await engine.find(quoted.id, "me")).status_message == (
        "bad value 'hunter2' for password")  # the client's own call: its server's words
    assert sorted(message for _, _, _, message in engine.failures()) == sorted([
        "the server answered JSON-RPC error -32603",  # not its message
        "the server answered JSON-RPC error -32603",  # nor a message shaped as the gateway's
        "the tool's result has isError: true",  # not its text
        "upstream 'fake' exited (code 3)",  # the gateway's words, whole
        "timed out after 20 ms"])


class BrokenStore(MemoryStore):
    """A store that goes away once tasks are running (a shared store's server, say)."""

    async def save(self, task: Task) -> bool:
        raise ConnectionError("the store went away")


async def test_a_store_that_goes_away_never_leaves_a_watcher_hanging() -> None:
    engine = TaskEngine(BrokenStore(StoreBounds.given(10, 10, 1000, 1000)))
    _, call, told = await running(engine)
    call.sink.on_message(jsonrpc.notification("notifications/progress", {"progress": 1}))
    call.sink.on_response(jsonrpc.result(7, {"content": []}))
    await settled()
    assert told[-1].status is Status.COMPLETED and not engine.running()


async def test_a_call_that_cannot_be_handed_over_leaves_no_task(store: MemoryStore) -> None:
    """adopt: a call that answered meanwhile (None) or failed to open (an error) leaves no
    record behind, and the owner's count is as before."""
    engine = TaskEngine(store)

    async def failing(task: Task) -> Handover:
        raise RuntimeError("the upstream could not be reached")

    async def answered(task: Task) -> None:
        return None

    assert await engine.adopt(intent(), answered) is None
    with pytest.raises(RuntimeError):
        await engine.adopt(intent(), failing)
    assert await store.owned_by("me") == []
    assert engine.running() == []


async def test_a_queued_task_says_how_many_are_ahead_and_its_timeout_waits_for_its_turn(
        store: MemoryStore) -> None:
    engine = TaskEngine(store)
    queues, limit = Queues(), Limit("fake", "slow", 1, 10)
    busy = queues.ticket("other", limit)  # the one slot is taken
    before = queues.ticket("other", limit)
    call = FakeCall()
    call.ticket = queues.ticket("me", limit)

    async def attach(task: Task) -> Handover:
        return Handover(call)  # type: ignore[arg-type]
    task = await engine.adopt(intent(timeout_ms=30), attach)
    assert task is not None and task.status is Status.WORKING
    assert task.status_message == "queued: 1 ahead"
    await asyncio.sleep(0.06)  # longer than its timeout: queued time is not counted
    assert busy is not None and before is not None
    busy.release()
    found = await engine.find(task.id, "me")
    assert found.status is Status.WORKING and found.status_message == "queued: 0 ahead"
    before.release()  # its turn: it runs, and its timeout starts
    assert (await engine.find(task.id, "me")).status_message is None
    await asyncio.sleep(0.06)
    await settled()
    assert (await engine.find(task.id, "me")).status is Status.FAILED


async def test_a_queued_task_cancelled_leaves_the_queue(store: MemoryStore) -> None:
    engine = TaskEngine(store)
    queues, limit = Queues(), Limit("fake", "slow", 1, 10)
    busy = queues.ticket("other", limit)
    call = FakeCall()
    call.ticket = queues.ticket("me", limit)
    after = queues.ticket("later", limit)

    async def attach(task: Task) -> Handover:
        return Handover(call)  # type: ignore[arg-type]
    task = await engine.adopt(intent(), attach)
    assert task is not None and after is not None and busy is not None
    assert after.ahead == 1
    await engine.cancel(task)
    assert after.ahead == 0 and queues.depths() == {("fake", "slow"): 1}
    busy.release()
    assert not after.queued  # the cancelled call never ran


async def test_a_time_bound_armed_late_still_fails_the_task_after_it_not_before(
        store: MemoryStore) -> None:
    """Times of 100 ms and more are armed once the run has lasted a tick (laggards.py):
    the bound still ends the task when due, not before."""
    engine, started = TaskEngine(store), time.time()  # the engine's clock
    task, call, told = await running(engine, timeout_ms=150)
    await asyncio.sleep(0.1)
    assert (await engine.find(task.id, "me")).status is Status.WORKING
    await asyncio.sleep(0.15)
    found = await engine.find(task.id, "me")
    assert found.status is Status.FAILED and call.cancelled
    assert told[-1].updated_at - started >= 0.14  # 150 ms, less the clocks' granularity


async def test_a_run_that_ends_within_a_tick_arms_no_timer(store: MemoryStore) -> None:
    engine = TaskEngine(store)
    task, call, _ = await running(engine, ttl_ms=60_000, timeout_ms=60_000)
    call.sink.on_response(jsonrpc.result(7, {"content": []}))
    await settled()
    assert (await engine.find(task.id, "me")).status is Status.COMPLETED
    late = engine._local._hooks.late
    assert not late.young and not late.old  # let go before a tick: nothing armed
