"""The 2025-11-25 core task dialect's wire shapes: pure units over a real store and engine."""

from __future__ import annotations

import time

import orjson
import pytest
from test_task_store import Clock, add

from gateway import errors
from gateway.tasks.dialects import core, handlers
from gateway.tasks.engine import TaskEngine
from gateway.tasks.model import Status
from gateway.tasks.store import StoreBounds
from gateway.tasks.store.memory import MemoryStore


async def engine_with(n: int, clock: Clock) -> TaskEngine:
    store = MemoryStore(StoreBounds.given(1000, 1000, 1 << 20, 1 << 24), clock=clock)
    for i in range(n):
        clock.now += 1
        t = await add(store, "me", 1000 * (100 + i))
        t.dialect = core.NAME
        await store.save(t)
    other = await add(store, "someone else", None)
    other.dialect = core.NAME
    await store.save(other)
    await add(store, "me", None)  # another dialect: never listed
    return TaskEngine(store, clock=clock)


async def test_pages_survive_tasks_expiring_between_them() -> None:
    clock = Clock()
    engine = await engine_with(core.PAGE_SIZE + 5, clock)
    first = await handlers.core_list(engine, {}, "me")
    shown = [t["taskId"] for t in first["tasks"]]
    assert len(shown) == core.PAGE_SIZE and first["tasks"][0]["ttl"] == 100_000
    clock.now += 145  # task i expires at 101 + 2i s: the 50 shown are gone, the cursor holds
    second = await handlers.core_list(engine, {"cursor": first["nextCursor"]}, "me")
    assert len(await engine.owned("me", core.NAME)) == 5  # they did expire
    assert len(second["tasks"]) == 5 and "nextCursor" not in second
    assert not set(shown) & {t["taskId"] for t in second["tasks"]}
    with pytest.raises(errors.InvalidParams):
        await handlers.core_list(engine, {"cursor": "%%%"}, "me")


async def test_final_message_per_status() -> None:
    engine = await engine_with(1, Clock())
    task = (await engine.owned("me", core.NAME))[0].copy()
    task.status = Status.WORKING
    task.result = orjson.dumps({"content": [], "_meta": {"keep": 1}})
    # isError results fail the task yet are returned as results
    task.move(Status.FAILED, now=time.time())
    final = core.final(task, 7)
    assert final["result"]["_meta"] == {"keep": 1, core.RELATED_TASK: {"taskId": task.id}}
    task.result, task.error = None, {"code": -32000, "message": "boom"}
    assert core.final(task, 7)["error"] == {"code": -32000, "message": "boom"}


@pytest.mark.parametrize("sent", [42, None, ["t"], {"id": "t"}, True])
@pytest.mark.parametrize(("method", "dialect"), [
    ("tasks/get", "core"), ("tasks/cancel", "core"), ("tasks/get", "extension"),
    ("tasks/update", "extension"), ("tasks/cancel", "extension")])
async def test_a_task_id_that_is_no_string_is_refused_as_an_unknown_one(
        sent: object, method: str, dialect: str) -> None:
    """A task id enters as a string (the MCP SDK's `as_request_id` narrows request ids so)
    or is refused exactly as an unknown id is: same code, words and data, either dialect."""
    engine = await engine_with(1, Clock())

    async def ask(task_id: object) -> errors.InvalidParams:
        params = {"taskId": task_id, "inputResponses": {}}
        served = handlers.CORE[method](engine, params, "me") if dialect == "core" else \
            handlers.extension_request(engine, method, params, "me")
        with pytest.raises(errors.InvalidParams) as refused:
            await served
        return refused.value

    odd, unknown = await ask(sent), await ask("no-such-task")
    assert (odd.code, odd.message, odd.http_status) == (
        unknown.code, unknown.message, unknown.http_status)
    assert (odd.data, unknown.data) == ({"taskId": sent}, {"taskId": "no-such-task"})
